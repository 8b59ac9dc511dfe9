"""Shared paths for the tests of the installed `epx` package.

They run in a virtual environment made from the wheel (host/python/tests/run.sh); the test data
comes from the repository: EPX_REPO (default: three folders up from here).
`EPX_TEST_FIXTURES` is the cargo output folder holding the fixture plugins (target/debug).
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

REPO = os.environ.get("EPX_REPO") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def repo(*parts: str) -> str:
    return os.path.join(REPO, *parts)


def example(name: str) -> str:
    return repo("examples", "models", name)


def here(*parts: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), *parts)


def python(code: str, env=None, check=True) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter of this environment (plugin discovery and
    `epx.onnxruntime.install()` are process-wide)."""
    run_env = dict(os.environ, **(env or {}))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=run_env, timeout=600)
    if check and out.returncode != 0:
        raise AssertionError(f"exit {out.returncode}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}")
    return out


@pytest.fixture
def fixture_library():
    """The working fixture plugin (EPs `relu_only` and `never_available`), built by cargo."""
    folder = os.environ.get("EPX_TEST_FIXTURES")
    if not folder:
        pytest.skip("EPX_TEST_FIXTURES is not set: no fixture plugin to install (run "
                    "host/python/tests/run.sh after `cargo build --workspace --all-targets`)")
    path = os.path.join(folder, "libepx_fixture_older_minor.so")
    assert os.path.exists(path), f"{path} is missing: build the workspace first"
    return path


def plugin_folder(root, library):
    """A plugin folder as a vendor ships one: `relu_plugin/` with the fixture library and its
    plugin.toml (EPs `relu_only` and `never_available`)."""
    folder = os.path.join(root, "relu_plugin")
    os.makedirs(folder)
    shutil.copy(library, folder)
    with open(os.path.join(folder, "plugin.toml"), "w") as f:
        f.write(textwrap.dedent(f"""\
            name = "relu_plugin"
            version = "0.1.0"
            abi = "1.0"
            providers = ["relu_only", "never_available"]

            [library]
            linux = "{os.path.basename(library)}"
            """))
    return folder
