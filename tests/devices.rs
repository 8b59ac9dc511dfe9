//! Devices (ABI 1.5): each EP lists the devices it can run on, present ones it cannot use
//! included, and the host lists them all (`Environment::devices`, `epx providers --devices`).
//!
//! The `adversarial` fixture lists a fake GPU and a fake NPU whose driver is too old; the
//! `older_minor` fixture (ABI 1.0) lists none; the built-in CPU EP lists this machine's processor.

use std::sync::Arc;

use epx::{Environment, ProviderDevice};
use epx_tests::{TempDir, artifact_dir, fixture_library, manifest};

fn plugin_dir(isolate: bool) -> TempDir {
    let dir = TempDir::new("devices").expect("temp dir");
    for (name, eps) in [
        ("adversarial", &["adversarial"][..]),
        ("older_minor", &["relu_only", "never_available"][..]),
    ] {
        let lib = fixture_library(name);
        let file = lib.file_name().and_then(|f| f.to_str()).expect("file name");
        let abi = if name == "older_minor" { "1.0" } else { "1.5" };
        let mut text = manifest(name, abi, eps, file);
        if isolate && name == "adversarial" {
            text.insert_str(0, "isolate = true\n");
        }
        dir.add_plugin(name, &lib, Some(&text))
            .expect("copy fixture");
    }
    dir
}

fn environment(dir: &TempDir) -> Arc<Environment> {
    Environment::builder()
        .with_plugin_dirs([dir.path()])
        .with_epx_executable(artifact_dir().join("epx"))
        .commit()
        .expect("environment")
}

fn of<'a>(devices: &'a [ProviderDevice], provider: &str) -> Vec<&'a ProviderDevice> {
    devices.iter().filter(|d| d.provider == provider).collect()
}

fn check_fixture_devices(devices: &[ProviderDevice]) {
    let adv = of(devices, "adversarial");
    assert_eq!(adv.len(), 2, "{adv:?}");
    let gpu = &adv[0];
    assert_eq!(gpu.selector, "adversarial:0");
    assert_eq!(gpu.plugin, "adversarial");
    assert_eq!(gpu.device.kind, "gpu");
    assert_eq!(gpu.device.name, "FG-1 (fake)");
    assert_eq!(gpu.device.vendor, "Fixture Graphics");
    assert_eq!(gpu.device.memory_bytes, Some(8 << 30));
    assert_eq!(gpu.device.driver_version, "2.5.1");
    assert_eq!(gpu.device.unusable, None);
    let npu = &adv[1];
    assert_eq!(npu.selector, "adversarial:NPU.0");
    assert_eq!((npu.device.kind, npu.device.id), ("npu", 1));
    assert_eq!(npu.device.memory_bytes, None);
    assert_eq!(
        npu.device.unusable.as_deref(),
        Some("driver 1.2.0 is older than the 2.0 this EP needs")
    );
}

#[test]
fn every_ep_lists_its_devices_and_older_plugins_list_none() {
    let dir = plugin_dir(false);
    let env = environment(&dir);
    let devices = env.devices();
    check_fixture_devices(&devices);
    // ABI 1.0: nothing said, and no error either.
    assert!(of(&devices, "relu_only").is_empty());
    let (lib, i) = env.find_provider("relu_only").expect("relu_only");
    assert!(lib.providers[i].devices.is_empty() && lib.providers[i].devices_error.is_none());
    // The built-in CPU EP: this processor, with the kernel level it runs.
    let cpu = of(&devices, "cpu");
    assert_eq!(cpu.len(), 1, "{cpu:?}");
    assert_eq!(cpu[0].selector, "cpu:0");
    assert_eq!(cpu[0].device.kind, "cpu");
    assert!(
        cpu[0].device.driver_version.contains("kernels: "),
        "{:?}",
        cpu[0].device
    );
}

#[test]
fn an_isolated_plugin_lists_the_same_devices() {
    let dir = plugin_dir(true);
    let env = environment(&dir);
    let (lib, _) = env.find_provider("adversarial").expect("adversarial");
    assert!(lib.isolation.is_some(), "the manifest asks for isolation");
    check_fixture_devices(&env.devices());
}
