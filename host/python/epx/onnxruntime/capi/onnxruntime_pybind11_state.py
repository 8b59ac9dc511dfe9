"""ONNX Runtime's exception classes, raised for epx's errors.

Each is an `epx.EpxError` too, carrying libepx's code and message. epx's error codes map to
them as ONNX Runtime's status codes would: an invalid argument or input is `InvalidArgument`, a
file that cannot be read `NoSuchFile`, a model that does not decode `InvalidProtobuf`, one that
is not a valid graph `InvalidGraph`, an EP that fails `EPFail`, an unsupported operator or
feature `NotImplemented`, a failed run `RuntimeException`, anything else `Fail`.
"""

from epx._capi import EpxError


class _OrtError(EpxError):
    """The base of ONNX Runtime's exception classes here: `str()` reads as ONNX Runtime's
    (`[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : ...`); `code` and `message` are libepx's."""

    _status = (1, "FAIL")

    def __init__(self, code: int, message: str):
        super().__init__(code, message)
        number, name = self._status
        self.args = (f"[ONNXRuntimeError] : {number} : {name} : {message}",)

    def __str__(self) -> str:
        return self.args[0]


def _status(number: int, name: str):
    def make(cls):
        cls._status = (number, name)
        return cls
    return make


@_status(1, "FAIL")
class Fail(_OrtError):
    pass


@_status(2, "INVALID_ARGUMENT")
class InvalidArgument(_OrtError):
    pass


@_status(3, "NO_SUCHFILE")
class NoSuchFile(_OrtError):
    pass


@_status(4, "NO_MODEL")
class NoModel(_OrtError):
    pass


@_status(5, "ENGINE_ERROR")
class EngineError(_OrtError):
    pass


@_status(6, "RUNTIME_EXCEPTION")
class RuntimeException(_OrtError):
    pass


@_status(7, "INVALID_PROTOBUF")
class InvalidProtobuf(_OrtError):
    pass


@_status(8, "MODEL_LOADED")
class ModelLoaded(_OrtError):
    pass


@_status(9, "NOT_IMPLEMENTED")
class NotImplemented(_OrtError):  # noqa: A001 (ONNX Runtime's name)
    pass


@_status(10, "INVALID_GRAPH")
class InvalidGraph(_OrtError):
    pass


@_status(11, "EP_FAIL")
class EPFail(_OrtError):
    pass


@_status(12, "MODEL_LOAD_CANCELED")
class ModelLoadCanceled(_OrtError):
    pass


@_status(13, "MODEL_REQUIRES_COMPILATION")
class ModelRequiresCompilation(_OrtError):
    pass


@_status(1, "FAIL")
class DeviceReset(_OrtError):
    """ONNX Runtime raises it when a GPU device was reset; epx's Python binding never does."""


@_status(14, "NOT_FOUND")
class NotFound(_OrtError):
    pass


def _from_epx(e: EpxError) -> EpxError:
    """The ONNX Runtime exception for an epx error (same code and message)."""
    if isinstance(e, _OrtError):
        return e
    if e.code == 2:
        cls = InvalidProtobuf if "not a valid ONNX model" in e.message else InvalidGraph
    elif e.code == 3:
        cls = NoSuchFile if "No such file" in e.message or "not found" in e.message else Fail
    else:
        cls = {1: InvalidArgument, 4: EPFail, 5: EPFail, 6: EPFail, 7: NotImplemented,
               8: InvalidArgument, 9: RuntimeException}.get(e.code, Fail)
    return cls(e.code, e.message)
