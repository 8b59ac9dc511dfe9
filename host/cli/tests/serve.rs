//! `epx serve` as a user starts it: prints where it listens, answers, and on SIGTERM finishes
//! and exits 0.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn serve_prints_its_address_answers_and_exits_0_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("epx-cli-serve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let version = dir.join("add").join("1");
    std::fs::create_dir_all(&version).unwrap();
    let model = epx_tests::repo_root().join("examples/models/add.onnx");
    std::fs::copy(model, version.join("model.onnx")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_epx"))
        .args(["serve", "--model-repository"])
        .arg(&dir)
        .args([
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            "--host",
            "127.0.0.1",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .rsplit("http://")
        .next()
        .expect("the address is printed")
        .to_owned();
    assert!(line.contains("Open Inference Protocol"), "{line}");
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let grpc = line
        .trim()
        .strip_prefix("epx serve: the Open Inference Protocol over gRPC at ")
        .unwrap_or_else(|| panic!("the gRPC address is printed: {line}"))
        .to_owned();
    // Something accepts connections there (the gRPC calls themselves: host/serve/tests/grpc.rs).
    TcpStream::connect(&grpc).unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let metrics = line
        .trim()
        .strip_suffix("/metrics")
        .and_then(|l| l.rsplit("http://").next())
        .expect("the metrics address is printed")
        .to_owned();

    let get = |path: &str| {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        reply
    };
    assert!(get("/v2/health/ready").starts_with("HTTP/1.1 200"));
    assert!(get("/v2/models/add").contains("\"name\":\"add\""));
    let mut s = TcpStream::connect(&metrics).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(
        text.contains("epx_runs_total{model=\"add\",version=\"1\"} 0"),
        "{text}"
    );

    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "epx serve did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
