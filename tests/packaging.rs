//! The release bundle (`packaging/bundle.sh`), installed into a temporary prefix: the C example
//! builds against it through `pkg-config` and runs with no environment variables, finding the
//! bundled plugins in the default folder next to libepx; the installed `epx` finds them next to
//! itself; the Python module finds the installed libepx; a vendor plugin bundle verifies and
//! loads from a plugin folder, and a tampered library is refused by its SHA-256 pin.
//!
//! Bundles what `cargo build --workspace` built for the tests' profile (`--no-build`), with three
//! plugins, so nothing is compiled twice.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use epx_tests::examples::assert_printed_mnist_probabilities;
use epx_tests::{TempDir, artifact_dir, repo_root};

const PLUGINS: &str = "cuda,ort_cpu,openvino";

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    let t = text(&out);
    assert!(out.status.success(), "{cmd:?} failed:\n{t}");
    t
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs the bundle script into `out` and returns the unpacked-bundle name.
fn bundle(out: &Path) -> String {
    let artifacts = artifact_dir();
    let profile = match artifacts.file_name().and_then(|n| n.to_str()) {
        Some("release") => "release",
        _ => "dev",
    };
    let target_dir = artifacts.parent().expect("target dir").to_path_buf();
    let log = run_ok(
        Command::new("bash")
            .arg(repo_root().join("packaging/bundle.sh"))
            .args([
                "--profile",
                profile,
                "--no-build",
                "--plugins",
                PLUGINS,
                "--out",
            ])
            .arg(out)
            .env("CARGO_TARGET_DIR", &target_dir),
    );
    assert!(log.contains("3 plugins"), "{log}");
    let version = env!("CARGO_PKG_VERSION");
    let name = format!(
        "epx-{version}-{}-{}",
        std::env::consts::OS,
        std::env::consts::ARCH
    );
    assert!(out.join(format!("{name}.tar.gz")).is_file(), "{log}");
    name
}

#[test]
fn the_installed_bundle_builds_and_runs_the_c_example_with_no_environment() {
    if !cfg!(target_os = "linux") || !have("cc") || !have("pkg-config") {
        eprintln!("skipping: needs Linux, cc and pkg-config");
        return;
    }
    let dir = TempDir::new("bundle").expect("temp dir");
    let dist = dir.path().join("dist");
    let name = bundle(&dist);

    // Every archive matches the published sums.
    run_ok(
        Command::new("sha256sum")
            .args(["--quiet", "-c", "SHA256SUMS"])
            .current_dir(&dist),
    );

    // Install: unpack the bundle as a prefix.
    let prefix = dir.path().join("prefix");
    std::fs::create_dir_all(&prefix).expect("prefix");
    run_ok(
        Command::new("tar")
            .arg("-xzf")
            .arg(dist.join(format!("{name}.tar.gz")))
            .args(["--strip-components=1", "-C"])
            .arg(&prefix),
    );
    run_ok(
        Command::new("sha256sum")
            .args(["--quiet", "-c", "SHA256SUMS"])
            .current_dir(&prefix),
    );
    for f in [
        "bin/epx",
        "lib/libepx.so",
        "lib/libepx.a",
        "include/epx.h",
        "include/epx_plugin.h",
        "lib/pkgconfig/epx.pc",
        "lib/epx/plugins/cuda/plugin.toml",
        "lib/epx/plugins/cuda/libepx_cuda.so",
        "lib/epx/plugins/ort_cpu/libepx_ort_cpu.so",
        "lib/epx/plugins/openvino/libepx_openvino.so",
        "lib/epx/adapters/libepx_ort_plugin_ep.so",
        "share/epx/sdk/plugin-api/Cargo.toml",
        "share/epx/sdk/plugin-api/src/lib.rs",
        "share/epx/sdk/plugin-api/src/sdk/mod.rs",
        "share/epx/python/epx/__init__.py",
        "share/epx/python/epx/onnxruntime/__init__.py",
    ] {
        assert!(prefix.join(f).is_file(), "the bundle lacks {f}");
    }

    // Build the C example through pkg-config.
    let flags = run_ok(
        Command::new("pkg-config")
            .args(["--cflags", "--libs", "epx"])
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")),
    );
    let exe = dir.path().join("epx-c-host");
    run_ok(
        Command::new("cc")
            .arg(repo_root().join("examples/c-host/main.c"))
            .args(flags.split_whitespace())
            .arg("-o")
            .arg(&exe),
    );

    // Run it with no environment at all: libepx through the rpath, the plugins through the
    // default folder next to libepx.
    let models = repo_root().join("examples/models");
    let stdout = run_ok(
        Command::new(&exe)
            .env_clear()
            .arg(models.join("mnist-cnn.onnx"))
            .arg(format!(
                "image={}",
                models.join("mnist-cnn.input.image.npy").display()
            )),
    );
    for ep in ["cuda", "ort_cpu", "openvino", "cpu"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.split_whitespace().next() == Some(ep)),
            "the C example does not list `{ep}` from the installed plugins:\n{stdout}"
        );
    }
    assert_printed_mnist_probabilities(&stdout);

    // The installed CLI finds the same plugins next to itself.
    let providers = run_ok(
        Command::new(prefix.join("bin/epx"))
            .env_clear()
            .arg("providers"),
    );
    let plugin_root = std::fs::canonicalize(prefix.join("lib/epx/plugins")).expect("plugins");
    for ep in ["cuda", "ort_cpu", "openvino"] {
        let line = providers
            .lines()
            .find(|l| l.starts_with(ep))
            .unwrap_or_else(|| panic!("`epx providers` lacks {ep}:\n{providers}"));
        assert!(line.contains(&*plugin_root.to_string_lossy()), "{line}");
    }

    // `epx new-plugin --lang rust` finds the SDK the bundle ships, without --sdk.
    let scaffold = TempDir::new("bundle-new-plugin").expect("temp dir");
    run_ok(
        Command::new(prefix.join("bin/epx"))
            .env_clear()
            .args(["new-plugin", "demo", "--lang", "rust", "--dir"])
            .arg(scaffold.path()),
    );
    let cargo =
        std::fs::read_to_string(scaffold.path().join("demo/Cargo.toml")).expect("Cargo.toml");
    let sdk = std::fs::canonicalize(prefix.join("share/epx/sdk/plugin-api")).expect("sdk");
    assert!(cargo.contains(&*sdk.to_string_lossy()), "{cargo}");

    // An ONNX Runtime plugin-EP library dropped into a plugin folder is hosted by the adapter
    // the bundle ships (found beside the CLI, with nothing set but where ONNX Runtime is).
    let vendor = TempDir::new("bundle-ort-ep").expect("temp dir");
    vendor
        .add_plugin(
            "fx",
            &epx_tests::fixture_library("ort_plugin_ep"),
            Some(
                "name = \"fx\"\nversion = \"0.1.0\"\nproviders = [\"fx\"]\n\
                 [library]\nlinux = \"libepx_fixture_ort_plugin_ep.so\"\n\
                 [onnxruntime_ep]\nep_names = [\"EpxFixtureExecutionProvider\"]\n",
            ),
        )
        .expect("copy the fixture");
    let listed = run_ok(
        Command::new(prefix.join("bin/epx"))
            .env_clear()
            .env(
                "EPX_ORT_SEARCH_PATH",
                repo_root().join(".testdata/onnxruntime/capi"),
            )
            .arg("--plugin-dir")
            .arg(vendor.path())
            .arg("providers"),
    );
    let line = listed
        .lines()
        .find(|l| l.starts_with("fx "))
        .unwrap_or_else(|| panic!("`epx providers` lacks fx:\n{listed}"));
    assert!(line.contains(" ok "), "{line}");

    // The Python module finds the installed libepx by itself.
    let mut python = Command::new("python3");
    python
        .arg("-c")
        .arg(
            "import sys; sys.path.insert(0, sys.argv[1]); import epx; \
             print(epx.Library.default().path); \
             print(sorted(p.name for p in epx.Environment().providers()))",
        )
        .arg(prefix.join("share/epx/python"));
    let extra = repo_root().join(".testdata/py");
    if extra.is_dir() {
        python.env("PYTHONPATH", extra);
    }
    let out = run_ok(&mut python);
    assert!(
        out.contains("lib/libepx.so") && out.contains("'ort_cpu'"),
        "{out}"
    );
}

#[test]
fn a_vendor_plugin_bundle_verifies_and_a_tampered_library_is_refused() {
    if !cfg!(target_os = "linux") || !have("sha256sum") {
        eprintln!("skipping: needs Linux and sha256sum");
        return;
    }
    let dir = TempDir::new("vendor-bundle").expect("temp dir");
    let dist = dir.path().join("dist");
    bundle(&dist);
    let archive = std::fs::read_dir(dist.join("plugins"))
        .expect("plugins/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("epx-plugin-ort_cpu-"))
                && p.extension().is_some_and(|e| e == "gz")
        })
        .expect("the ort_cpu vendor bundle");
    // A plugin folder, as an operator would make it: the bundle unpacked as `<folder>/ort_cpu`.
    let plugins = dir.path().join("plugins");
    let folder = plugins.join("ort_cpu");
    std::fs::create_dir_all(&folder).expect("plugin folder");
    run_ok(
        Command::new("tar")
            .arg("-xzf")
            .arg(&archive)
            .args(["--strip-components=1", "-C"])
            .arg(&folder),
    );
    for f in ["plugin.toml", "libepx_ort_cpu.so", "LICENSE", "SHA256SUMS"] {
        assert!(folder.join(f).is_file(), "the vendor bundle lacks {f}");
    }
    run_ok(
        Command::new("sha256sum")
            .args(["--quiet", "-c", "SHA256SUMS"])
            .current_dir(&folder),
    );
    let epx = artifact_dir().join("epx");
    let doctor = |dir: &PathBuf| {
        Command::new(&epx)
            .arg("--plugin-dir")
            .arg(dir)
            .arg("doctor")
            .env_remove("EPX_PLUGIN_PATH")
            .output()
            .expect("epx doctor")
    };
    let ok = doctor(&plugins);
    assert!(
        text(&ok).contains("✓ sha256 matches the pin"),
        "{}",
        text(&ok)
    );

    // One byte changed: the pin refuses it, before any of its code runs.
    let lib = folder.join("libepx_ort_cpu.so");
    let mut bytes = std::fs::read(&lib).expect("read");
    bytes.push(0);
    std::fs::write(&lib, bytes).expect("write");
    let bad = doctor(&plugins);
    let t = text(&bad);
    assert!(!bad.status.success(), "{t}");
    assert!(
        t.contains("SHA-256 mismatch") && t.contains("libepx_ort_cpu.so"),
        "{t}"
    );
}
