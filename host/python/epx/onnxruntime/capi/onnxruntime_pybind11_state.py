"""ONNX Runtime's exception classes, raised for epx's errors.

Each is an `epx.EpxError` too, carrying libepx's code and message. epx's error codes map to
them as ONNX Runtime's status codes would: an invalid argument or input is `InvalidArgument`, a
file that cannot be read `NoSuchFile`, a model that does not decode `InvalidProtobuf`, one that
is not a valid graph `InvalidGraph`, an EP that fails `EPFail`, an unsupported operator or
feature `NotImplemented`, a failed run `RuntimeException`, anything else `Fail`.
"""

from epx._capi import EpxError


class Fail(EpxError):
    pass


class InvalidArgument(EpxError):
    pass


class NoSuchFile(EpxError):
    pass


class NoModel(EpxError):
    pass


class EngineError(EpxError):
    pass


class RuntimeException(EpxError):
    pass


class InvalidProtobuf(EpxError):
    pass


class ModelLoaded(EpxError):
    pass


class NotImplemented(EpxError):  # noqa: A001 (ONNX Runtime's name)
    pass


class InvalidGraph(EpxError):
    pass


class EPFail(EpxError):
    pass


def _from_epx(e: EpxError) -> EpxError:
    """The ONNX Runtime exception for an epx error (same code and message)."""
    if e.code == 2:
        cls = InvalidProtobuf if "not a valid ONNX model" in e.message else InvalidGraph
    elif e.code == 3:
        cls = NoSuchFile if "No such file" in e.message or "not found" in e.message else Fail
    else:
        cls = {1: InvalidArgument, 4: EPFail, 5: EPFail, 6: EPFail, 7: NotImplemented,
               8: InvalidArgument, 9: RuntimeException}.get(e.code, Fail)
    return cls(e.code, e.message)
