"""A third party with epx installed from the wheel (no repository, no network) starts a Rust EP:
`epx new-plugin NAME --lang rust` finds the SDK the wheel ships, the plugin it writes builds
offline with cargo, and passes `epx conformance` on the ONNX node tests and its model."""

import os
import shutil
import subprocess
import sys

import pytest


def test_a_rust_plugin_from_the_installed_wheel_builds_offline_and_passes_conformance(tmp_path):
    exe = shutil.which("epx", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("no epx command beside this Python")
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("no cargo on this machine: the Rust scaffold cannot be built here")
    node_tests = os.path.join(os.environ.get("EPX_REPO", ""), ".testdata", "onnx-node")
    if not os.path.isdir(node_tests):
        pytest.skip(f"no ONNX node tests at {node_tests} (bash tests/fetch-testdata.sh)")
    made = subprocess.run([exe, "new-plugin", "demo_ep", "--lang", "rust", "--dir", str(tmp_path)],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    plugin = tmp_path / "demo_ep"
    manifest = (plugin / "Cargo.toml").read_text()
    # The SDK is the wheel's own copy, inside this environment's site-packages.
    assert os.path.join("epx", "sdk", "plugin-api") in manifest, manifest
    env = dict(os.environ, CARGO_TARGET_DIR=str(tmp_path / "target"), CARGO_NET_OFFLINE="true")
    built = subprocess.run([cargo, "build", "--release", "--offline", "--quiet"], cwd=plugin,
                           capture_output=True, text=True, env=env)
    assert built.returncode == 0, built.stderr
    shutil.copy(tmp_path / "target" / "release" / "libepx_demo_ep.so", plugin)
    checked = subprocess.run(
        [exe, "--plugin-dir", str(plugin), "conformance", "--ep", "demo_ep",
         "--filter", "test_relu,test_add", "--model", str(plugin / "models" / "relu_add.onnx"),
         "--node-tests", node_tests],
        capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "demo_ep" in checked.stdout
