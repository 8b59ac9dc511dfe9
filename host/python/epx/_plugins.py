"""Where Python packages put epx plugins.

libepx itself searches the folders given to an environment, then `EPX_PLUGIN_PATH`, then the
folder next to it (`epx/lib/epx/plugins` inside this package: the plugins the wheel ships). A
package installed with pip adds plugins in either of two ways:

* an entry point in the group `epx.plugins`, whose object is a plugin folder (a folder with a
  `plugin.toml`) or a folder of such folders: a module or package (its folder is used), a path,
  or a callable returning a path or a list of paths. In `pyproject.toml`:

      [project.entry-points."epx.plugins"]
      myvendor = "epx_myvendor"          # the package folder holds plugin.toml + the library

* a folder `epx_plugins/<name>/` with a `plugin.toml`, in any folder of `sys.path` (for a wheel,
  ship the files under `epx_plugins/<name>/` at the top of the wheel).
"""

from __future__ import annotations

import os
import sys
import warnings
from types import ModuleType
from importlib import metadata
from typing import Iterable, List

GROUP = "epx.plugins"
FOLDER = "epx_plugins"


def _as_paths(obj, origin: str) -> List[str]:
    if isinstance(obj, ModuleType):  # a module: its folder
        path = getattr(obj, "__file__", None)
        if path:
            return [os.path.dirname(os.path.abspath(path))]
        return [os.path.abspath(p) for p in getattr(obj, "__path__", [])]
    if callable(obj):
        return _as_paths(obj(), origin)
    if isinstance(obj, (str, bytes, os.PathLike)):
        return [os.path.abspath(os.fsdecode(obj))]
    if isinstance(obj, Iterable):
        return [p for item in obj for p in _as_paths(item, origin)]
    raise TypeError(f"{origin} gave {type(obj).__name__}, not a path, a list of paths or a module")


def entry_point_dirs() -> List[str]:
    """The folders of every `epx.plugins` entry point. One that fails to load is reported as a
    warning naming its distribution, and the others are still used."""
    dirs: List[str] = []
    for ep in metadata.entry_points(group=GROUP):
        dist = getattr(getattr(ep, "dist", None), "name", "?")
        origin = f"entry point `{ep.name} = {ep.value}` ({GROUP}, from {dist})"
        try:
            dirs.extend(_as_paths(ep.load(), origin))
        except Exception as e:  # a broken third-party package must not break epx
            warnings.warn(f"epx: {origin} is skipped: {type(e).__name__}: {e}", RuntimeWarning,
                          stacklevel=3)
    return dirs


def folder_dirs() -> List[str]:
    """Each `epx_plugins` folder found on sys.path."""
    dirs = []
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), FOLDER)
        if os.path.isdir(candidate):
            dirs.append(os.path.abspath(candidate))
    return dirs


def discovered_dirs() -> List[str]:
    """Entry-point folders, then `epx_plugins` folders, each once, in that order."""
    seen, out = set(), []
    for d in entry_point_dirs() + folder_dirs():
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


# Vendor runtimes that pip installs and plugins of the wheel load: the variable each plugin
# searches, and the folder of the library under site-packages.
RUNTIMES = (
    ("EPX_ORT_SEARCH_PATH", os.path.join("onnxruntime", "capi")),       # onnxruntime(-gpu) wheels
    ("EPX_OPENVINO_SEARCH_PATH", os.path.join("openvino", "libs")),     # the openvino wheel
)


def export_runtime_paths() -> None:
    """Appends the runtime folders of this Python environment (an `onnxruntime` or `openvino`
    wheel installed beside epx) to the search variables the plugins read, so a venv works
    without being activated. Folders already listed, and what the user set, stay first."""
    for var, sub in RUNTIMES:
        found = []
        for entry in sys.path:
            folder = os.path.join(entry or os.getcwd(), sub)
            if os.path.isdir(folder):
                found.append(os.path.abspath(folder))
        if not found:
            continue
        current = [p for p in os.environ.get(var, "").split(os.pathsep) if p]
        merged = current + [f for f in found if f not in current]
        if merged != current:
            os.environ[var] = os.pathsep.join(merged)

