"""Where Python packages put epx plugins.

libepx itself searches the folders given to an environment, then `EPX_PLUGIN_PATH`, then the
folder next to it (`epx/lib/epx/plugins` inside this package: the plugins the wheel ships). A
package installed with pip adds plugins in either of two ways:

* an entry point in the group `epx.plugins` naming a module or package: its folder is a plugin
  folder (a folder with a `plugin.toml`) or a folder of such folders. In `pyproject.toml`:

      [project.entry-points."epx.plugins"]
      myvendor = "epx_myvendor"          # the package folder holds plugin.toml + the library

  The module is found without being imported: none of its code runs, and the plugin in its
  folder goes through libepx's checks (ownership, the sha256 pin, ...) before its library is
  opened. An entry point naming an object (`module:attr`) would have to be imported to be read,
  so it is skipped with a warning saying so.

* a folder `epx_plugins/<name>/` with a `plugin.toml`, in any folder of `sys.path` (for a wheel,
  ship the files under `epx_plugins/<name>/` at the top of the wheel).
"""

from __future__ import annotations

import os
import sys
import warnings
from importlib import metadata
from typing import List, Optional

GROUP = "epx.plugins"
FOLDER = "epx_plugins"


def module_dir(name: str) -> Optional[str]:
    """The folder of module or package `name` (dotted), found on sys.path without importing it
    or any package above it; None when there is none."""
    from importlib.machinery import PathFinder
    parts = name.split(".")
    path = None
    spec = None
    for i, part in enumerate(parts):
        spec = PathFinder.find_spec(part, path)
        if spec is None:
            return None
        path = spec.submodule_search_locations
        if path is None and i < len(parts) - 1:
            return None
    if spec.submodule_search_locations:
        return os.path.abspath(list(spec.submodule_search_locations)[0])
    if spec.origin and spec.has_location:
        return os.path.dirname(os.path.abspath(spec.origin))
    return None


def entry_point_dirs() -> List[str]:
    """The folders of every `epx.plugins` entry point, read without importing anything. One
    that names an object, or a module that is not there, is reported as a warning naming its
    distribution, and the others are still used."""
    dirs: List[str] = []
    for ep in metadata.entry_points(group=GROUP):
        dist = getattr(getattr(ep, "dist", None), "name", "?")
        origin = f"entry point `{ep.name} = {ep.value}` ({GROUP}, from {dist})"
        if ep.attr:
            warnings.warn(f"epx: {origin} is skipped: it names an object, which epx would have "
                          f"to import (running the package's code) to read; name the package "
                          f"whose folder holds the plugin instead (`{ep.name} = {ep.module}`)",
                          RuntimeWarning, stacklevel=3)
            continue
        try:
            found = module_dir(ep.module)
        except Exception as e:  # a broken path entry must not break epx
            found, why = None, f"{type(e).__name__}: {e}"
        else:
            why = f"no module `{ep.module}` on sys.path"
        if found is None:
            warnings.warn(f"epx: {origin} is skipped: {why}", RuntimeWarning, stacklevel=3)
            continue
        dirs.append(found)
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

