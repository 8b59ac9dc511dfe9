"""Runs one driver in this process and writes its result as JSON.

    python _child.py DRIVER.py ort|epx OUT.json

`epx` mode calls `epx.onnxruntime.install()` before the driver (and so before the third-party
package) is imported, so the package's own `import onnxruntime` gets epx. Network connections
are refused in both modes: the programs must run on what their wheels ship."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import socket
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))


def _no_network() -> None:
    real_connect = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0]
            if host not in ("127.0.0.1", "::1", "localhost"):
                raise OSError(f"network disabled in tests/programs (tried {address!r})")
        return real_connect(self, address)

    socket.socket.connect = connect
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if host not in (None, "127.0.0.1", "::1", "localhost"):
            raise socket.gaierror(f"network disabled in tests/programs (tried to resolve {host!r})")
        return real_getaddrinfo(host, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def main() -> int:
    driver_path, mode, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
    report = {"mode": mode, "ok": False}
    t0 = time.perf_counter()
    try:
        _no_network()
        if mode == "epx":
            import epx.onnxruntime
            epx.onnxruntime.install()
        elif mode != "ort":
            raise SystemExit(f"unknown mode {mode}")
        sys.path.insert(0, HERE)  # synth, compare
        spec = importlib.util.spec_from_file_location("_program_driver", driver_path)
        driver = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(driver)
        report["package"] = getattr(driver, "PACKAGE", os.path.basename(driver_path)[:-3])
        report["version"] = _version(report["package"])
        result = driver.run()
        json.dumps(result)  # must be JSON-able
        report["result"] = result
        if hasattr(driver, "summary"):
            try:
                report["summary"] = driver.summary(result)
            except Exception as e:  # a summary is only for the table
                report["summary"] = f"(summary failed: {e})"
        import onnxruntime
        report["onnxruntime"] = f"{onnxruntime.__name__} {getattr(onnxruntime, '__version__', '?')}"
        report["ok"] = True
    except BaseException as e:  # noqa: BLE001 - everything is reported
        report["error"] = f"{type(e).__name__}: {e}".strip()
        report["traceback"] = traceback.format_exc()
    report["seconds"] = round(time.perf_counter() - t0, 2)
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
