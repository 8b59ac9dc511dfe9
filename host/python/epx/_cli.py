"""The `epx` command a wheel installs: runs the CLI binary shipped in the package."""

import os
import sys


def main() -> None:
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "epx")
    if not os.path.exists(exe):
        sys.exit(f"epx: the CLI is not in this installation ({exe}); install the epx wheel")
    os.execv(exe, [exe, *sys.argv[1:]])
