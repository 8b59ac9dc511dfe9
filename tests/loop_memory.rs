//! A Loop's scan output is stacked as it grows: two million scalar iterations hold their 8 MB
//! of floats, not a tensor per iteration (which held about 240 bytes each, 480 MB here). Its own
//! test binary, so the process's peak memory is this test's alone.

use epx::{Session, Tensor};
use epx_tests::models::counting_loop;

/// The process's peak resident memory in KiB.
fn peak_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM")
}

#[test]
fn a_long_loop_holds_its_scan_output_not_a_tensor_per_iteration() {
    let session = Session::builder()
        .and_then(|b| b.commit_from_memory(&counting_loop()))
        .expect("session");
    let before = peak_kib();
    let m = 2_000_000usize;
    let out = session
        .run([(
            "m",
            Tensor::from_bytes(epx::ElementType::Int64, &[], &(m as i64).to_le_bytes()).expect("m"),
        )])
        .expect("run");
    let after = peak_kib();
    let scan = out
        .into_iter()
        .next()
        .expect("one output")
        .1
        .into_host()
        .expect("a host tensor");
    assert_eq!(scan.shape(), [m]);
    let values = epx_tests::examples::f32s(scan.bytes().expect("bytes"));
    assert!(values.iter().enumerate().all(|(i, &v)| v == i as f32));
    let grew = after.saturating_sub(before);
    eprintln!(
        "{m} iterations: peak RSS grew by {grew} KiB for an {} KiB result",
        m * 4 / 1024
    );
    // The result and one copy of it, plus slack; a tensor per iteration is 60 times that.
    assert!(grew < 48 * 1024, "peak RSS grew by {grew} KiB");
}
