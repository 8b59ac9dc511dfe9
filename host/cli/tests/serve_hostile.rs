//! `epx serve` under hostile clients on loopback: huge JSON bodies, many unfinished bodies, a
//! small request with a huge JSON answer, slow headers, endless chunked bodies and more idle
//! connections than the server takes. Its peak memory stays under a stated bound and a good
//! client is answered within a second throughout.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use epx::onnx::proto;
use epx_tests::models::{float_value, model_bytes, node};

/// `y = Tile(x, [1, 4 Mi])`: x FP32 `[1, 4]`, y FP32 `[1, 16 Mi]` (64 MiB).
fn tile_model() -> Vec<u8> {
    model_bytes(proto::GraphProto {
        name: Some("tile".into()),
        node: vec![node("Tile", &["x", "repeats"], &["y"])],
        input: vec![float_value("x", &[1, 4])],
        output: vec![float_value("y", &[1, 16 << 20])],
        initializer: vec![proto::TensorProto {
            name: Some("repeats".into()),
            dims: vec![2],
            data_type: Some(proto::tensor_proto::DataType::Int64 as i32),
            int64_data: vec![1, 4 << 20],
            ..Default::default()
        }],
        ..Default::default()
    })
}

struct Server {
    child: Child,
    addr: String,
    dir: std::path::PathBuf,
    /// Kept open: the server prints its other addresses after the first.
    _out: BufReader<std::process::ChildStdout>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Server {
    /// The process's peak and current resident memory, in MiB.
    fn memory(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kib = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{key} in /proc/PID/status"))
        };
        (kib("VmHWM:") >> 10, kib("VmRSS:") >> 10)
    }
}

fn start(tag: &str, extra: &[&str]) -> Server {
    let dir = std::env::temp_dir().join(format!("epx-serve-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (name, bytes) in [
        (
            "add",
            std::fs::read(epx_tests::repo_root().join("examples/models/add.onnx")).unwrap(),
        ),
        ("tile", tile_model()),
    ] {
        std::fs::create_dir_all(dir.join(name).join("1")).unwrap();
        std::fs::write(dir.join(name).join("1/model.onnx"), bytes).unwrap();
    }
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
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .rsplit("http://")
        .next()
        .expect("the address is printed")
        .to_owned();
    Server {
        child,
        addr,
        dir,
        _out: out,
    }
}

/// One request on a fresh connection: the status and the time to the answer.
fn exchange(addr: &str, head: &str, body: &[u8]) -> (u16, Duration, Vec<u8>) {
    let began = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    // The server may answer (and close) before the whole body is sent.
    let _ = s.write_all(body);
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply[..reply.len().min(64)]).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {text:?}"));
    (status, began.elapsed(), reply)
}

fn post(addr: &str, path: &str, body: &[u8]) -> (u16, Duration, Vec<u8>) {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    exchange(addr, &head, body)
}

const GOOD: &str = r#"{"inputs":[{"name":"a","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]},{"name":"b","shape":[1,4],"datatype":"FP32","data":[1,1,1,1]}]}"#;

/// A good client: an inference answered 200 within a second.
fn good_client(addr: &str, when: &str) {
    let (status, took, reply) = post(addr, "/v2/models/add/infer", GOOD.as_bytes());
    assert_eq!(status, 200, "{when}: {}", String::from_utf8_lossy(&reply));
    assert!(
        took < Duration::from_secs(1),
        "{when}: a good client waited {took:?}"
    );
}

/// The peak resident memory the server may reach through the memory cases, in MiB: its start
/// (the runtime and two small models) plus what the limits allow at once — a 64 MiB request
/// body, the 64 MiB tensor of the big answer and its JSON text — with room for the allocator.
const PEAK_MIB: u64 = 512;

#[test]
fn memory_stays_bounded_under_huge_and_unfinished_requests() {
    let server = start(
        "memory",
        &["--max-inflight-bytes", &(256u64 << 20).to_string()],
    );
    let addr = server.addr.clone();
    let (start_peak, _) = server.memory();
    eprintln!("peak RSS after start: {start_peak} MiB");

    // A 60 MiB JSON body: data for a [1, 4] input, 15 Mi elements long. Refused for its length,
    // read as it streams.
    let mut huge =
        String::from(r#"{"inputs":[{"name":"a","shape":[1,4],"datatype":"FP32","data":["#);
    huge.push_str(&"0,".repeat(30 << 20));
    huge.push_str(r#"0]},{"name":"b","shape":[1,4],"datatype":"FP32","data":[1,1,1,1]}]}"#);
    let (status, _, reply) = post(&addr, "/v2/models/add/infer", huge.as_bytes());
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&reply));
    assert!(String::from_utf8_lossy(&reply).contains("holds 4 elements"));
    drop(huge);
    let (peak, _) = server.memory();
    eprintln!("peak RSS after a 60 MiB JSON body: {peak} MiB");
    assert!(peak < PEAK_MIB, "peak {peak} MiB after one huge JSON body");

    // 16 connections that each declare 63 MiB and send half of it: at most the in-flight budget
    // is held, the rest are refused at once with 503.
    let declared = 63usize << 20;
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..16 {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        write!(
            s,
            "POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {declared}\r\n\r\n"
        )
        .unwrap();
        let _ = s.write_all(&vec![b' '; declared / 2]);
        let mut first = [0u8; 12];
        match s.read(&mut first) {
            Ok(n) if n > 0 => {
                let text = String::from_utf8_lossy(&first[..n]).into_owned();
                assert!(text.contains("503"), "{text}");
                refused += 1;
            }
            _ => held.push(s),
        }
    }
    let (peak, rss) = server.memory();
    eprintln!(
        "16 unfinished 63 MiB bodies: {} held, {refused} refused; peak {peak} MiB, now {rss} MiB",
        held.len()
    );
    assert!(refused >= 14, "only {refused} of 16 refused");
    assert!(peak < PEAK_MIB, "peak {peak} MiB with unfinished bodies");
    good_client(&addr, "while unfinished bodies are held");
    drop(held);

    // A small request whose answer is a 64 MiB tensor as JSON.
    let ask = r#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[0,0,0,0]}]}"#;
    let (status, _, reply) = post(&addr, "/v2/models/tile/infer", ask.as_bytes());
    assert_eq!(status, 200);
    assert!(
        reply.len() > 16 << 20,
        "the answer is {} bytes",
        reply.len()
    );
    let (peak, _) = server.memory();
    eprintln!(
        "a 64 MiB tensor answered as {} MiB of JSON: peak {peak} MiB",
        reply.len() >> 20
    );
    assert!(peak < PEAK_MIB, "peak {peak} MiB after a huge JSON answer");
}

#[test]
fn slow_idle_and_endless_clients_do_not_lock_out_a_good_one() {
    let server = start(
        "slow",
        &[
            "--header-timeout-secs",
            "2",
            "--body-timeout-secs",
            "3",
            "--max-connections",
            "1000",
            "--max-tensor-bytes",
            "33554432",
        ],
    );
    let addr = server.addr.clone();
    // A tensor over the per-tensor limit, asked for by the request: the client's mistake.
    let ask = r#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[0,0,0,0]}]}"#;
    let (status, _, reply) = post(&addr, "/v2/models/tile/infer", ask.as_bytes());
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&reply));
    // 1,100 connections that send nothing: past the cap of 1,000, each new one closes the one
    // idle longest.
    let mut idle: Vec<TcpStream> = (0..1100)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    good_client(&addr, "with 1,100 idle connections");
    // 200 slowloris connections: a header line every 300 ms, never the end of the headers.
    let mut slow: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.write_all(b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            s
        })
        .collect();
    // 5 endless chunked bodies.
    let mut chunked: Vec<TcpStream> = (0..5)
        .map(|_| {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.write_all(
                b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
            )
            .unwrap();
            s
        })
        .collect();
    let began = Instant::now();
    let mut slow_closed = vec![false; slow.len()];
    while began.elapsed() < Duration::from_secs(5) {
        for (s, closed) in slow.iter_mut().zip(&mut slow_closed) {
            if !*closed && s.write_all(b"X-Slow: 1\r\n").is_err() {
                *closed = true;
            }
        }
        for s in &mut chunked {
            let _ = s.write_all(b"1\r\na\r\n");
        }
        good_client(&addr, "among slow, idle and endless clients");
        std::thread::sleep(Duration::from_millis(300));
    }
    // Each endless body got 408 at its deadline.
    for s in &mut chunked {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut reply = [0u8; 12];
        let n = s.read(&mut reply).unwrap_or(0);
        let text = String::from_utf8_lossy(&reply[..n]).into_owned();
        assert!(text.contains("408"), "an endless chunked body got {text:?}");
    }
    // The slow headers and the idle connections were closed by the header deadline: a read
    // sees the end (or a reset), not a timeout.
    for s in slow.iter_mut().chain(idle.iter_mut().take(50)) {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 256];
        let closed = match s.read(&mut buf) {
            Ok(_) => true,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        };
        assert!(closed, "a connection outlived the header deadline");
    }
    good_client(&addr, "after the slow clients were closed");
}
