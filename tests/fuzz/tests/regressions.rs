//! Every input a fuzz run found (`tests/fuzz/regressions/<target>/`) runs again through its
//! target: in a child process, so that one that crashes again fails this test instead of
//! killing it.

use std::path::Path;
use std::process::Command;

#[test]
fn saved_findings_no_longer_crash_panic_or_hang() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions");
    let mut total = 0;
    for target in ["onnx", "npy", "manifest", "capi", "elf"] {
        let Ok(entries) = std::fs::read_dir(root.join(target)) else {
            continue;
        };
        let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        if files.is_empty() {
            continue;
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_epx-fuzz"))
            .args(["replay", "--target", target])
            .args(&files)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start epx-fuzz replay");
        // A hang is a failure too: 60 s for a handful of small inputs is plenty.
        let started = std::time::Instant::now();
        while child.try_wait().expect("wait").is_none() {
            if started.elapsed().as_secs() > 60 {
                let _ = child.kill();
                panic!("{target}: replaying {files:?} took more than 60 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().expect("output");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{target}: {:?}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stdout.lines().filter(|l| l.starts_with("ok ")).count(),
            files.len(),
            "{stdout}"
        );
        total += files.len();
    }
    assert!(total > 0, "no saved findings under {}", root.display());
    eprintln!("{total} saved finding(s) replayed");
}
