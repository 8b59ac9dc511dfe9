//! The REST side of `epx serve` over a real socket: every endpoint, JSON and binary tensor data
//! in several datatypes, and the refusals (malformed bodies, wrong datatypes and shapes, binary
//! sizes that lie, unknown models and versions, bodies over the limit, a full queue), none of
//! which disturbs the next request.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use common::{linear_model, put, start};
use serde_json::{Value as Json, json};

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Json {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn error(&self) -> String {
        self.json()["error"].as_str().unwrap_or("").to_owned()
    }
}

/// One HTTP/1.1 exchange on a fresh connection.
fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(120)))
        .unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete response head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

fn get(addr: SocketAddr, path: &str) -> Reply {
    call(addr, "GET", path, &[], b"")
}

fn infer(addr: SocketAddr, model: &str, body: &Json) -> Reply {
    let path = format!("/v2/models/{model}/infer");
    call(addr, "POST", &path, &[], &serde_json::to_vec(body).unwrap())
}

/// A request with the binary tensor data extension: `header` as JSON, then `data`.
fn call_binary(addr: SocketAddr, model: &str, header: &Json, data: &[u8]) -> Reply {
    let header = serde_json::to_vec(header).unwrap();
    let mut body = header.clone();
    body.extend_from_slice(data);
    let len = [("Inference-Header-Content-Length", header.len().to_string())];
    call(
        addr,
        "POST",
        &format!("/v2/models/{model}/infer"),
        &len,
        &body,
    )
}

/// A successful binary response's JSON header and binary data.
fn split_binary(r: &Reply) -> (Json, &[u8]) {
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let header = r
        .header(epx_serve::http::HEADER_LENGTH)
        .expect("a header length");
    let json_len: usize = header.parse().unwrap();
    let head = serde_json::from_slice(&r.body[..json_len]).unwrap();
    (head, &r.body[json_len..])
}

fn add_request() -> Json {
    json!({
        "id": "r1",
        "inputs": [
            {"name": "a", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]},
            {"name": "b", "shape": [1, 4], "datatype": "FP32", "data": [[0.5, 0.25, -1.0, 10.0]]},
        ]
    })
}

#[test]
fn health_metadata_and_json_inference() {
    let server = start();
    let addr = server.addr;
    assert_eq!(get(addr, "/v2/health/live").status, 200);
    // Two models of the repository failed to load: the server is live, not ready.
    assert_eq!(get(addr, "/v2/health/ready").status, 503);
    let meta = get(addr, "/v2").json();
    assert_eq!(meta["name"], "epx");
    assert_eq!(
        meta["extensions"],
        json!(["binary_tensor_data", "statistics", "model_repository"])
    );

    let m = get(addr, "/v2/models/mixed").json();
    assert_eq!(m["versions"], json!(["1"]));
    assert_eq!(
        m["inputs"][0],
        json!({"name": "i", "datatype": "INT32", "shape": [-1, 2]})
    );
    assert_eq!(m["inputs"][1]["datatype"], "BYTES");
    assert_eq!(
        get(addr, "/v2/models/mixed/versions/1").json()["name"],
        "mixed"
    );
    assert_eq!(get(addr, "/v2/models/add/ready").status, 200);
    assert_eq!(get(addr, "/v2/models/add/versions/1/ready").status, 200);

    let r = infer(addr, "add", &add_request());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let out = r.json();
    assert_eq!(out["id"], "r1");
    assert_eq!(out["model_name"], "add");
    assert_eq!(out["model_version"], "1");
    assert_eq!(
        out["outputs"][0],
        json!({"name": "sum", "datatype": "FP32", "shape": [1, 4], "data": [1.5, 2.25, 2.0, 14.0]})
    );

    let r = infer(
        addr,
        "mixed",
        &json!({"inputs": [
            {"name": "i", "shape": [2, 2], "datatype": "INT32", "data": [[1, -2], [2147483647, -2147483648]]},
            {"name": "s", "shape": [3], "datatype": "BYTES", "data": ["a", "", "ünï"]},
            {"name": "b", "shape": [2], "datatype": "BOOL", "data": [true, false]},
            {"name": "h", "shape": [2], "datatype": "FP16", "data": [0.5, -65504.0]},
        ], "outputs": [{"name": "h_out"}, {"name": "b_out"}, {"name": "s_out"}, {"name": "i_out"}]}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let out = r.json();
    // In the order asked for.
    assert_eq!(out["outputs"][0]["data"], json!([0.5, -65504.0]));
    assert_eq!(out["outputs"][1]["data"], json!([false, true]));
    assert_eq!(out["outputs"][2]["data"], json!(["a", "", "ünï"]));
    assert_eq!(
        out["outputs"][3]["data"],
        json!([1, -2, 2147483647, -2147483648])
    );
    assert_eq!(out["outputs"][3]["shape"], json!([2, 2]));
}

#[test]
fn binary_tensor_data_in_and_out() {
    let server = start();
    let addr = server.addr;
    let a: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let header = json!({
        "inputs": [
            {"name": "a", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}},
            {"name": "b", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]},
        ],
        "outputs": [{"name": "sum", "parameters": {"binary_data": true}}],
    });
    let r = call_binary(addr, "add", &header, &a);
    let (head, data) = split_binary(&r);
    assert_eq!(head["outputs"][0]["parameters"]["binary_data_size"], 16);
    assert!(head["outputs"][0].get("data").is_none());
    let sum: Vec<f32> = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(sum, [2.0, 3.0, 4.0, 5.0]);

    // BYTES as binary: each element's 4-byte length, then its bytes.
    let mut strings = Vec::new();
    for s in [&b"xy"[..], b"", "\u{fc}\0z".as_bytes()] {
        strings.extend_from_slice(&(s.len() as u32).to_le_bytes());
        strings.extend_from_slice(s);
    }
    let header = json!({
        "inputs": [
            {"name": "i", "shape": [0, 2], "datatype": "INT32", "data": []},
            {"name": "s", "shape": [3], "datatype": "BYTES", "parameters": {"binary_data_size": strings.len()}},
            {"name": "b", "shape": [2], "datatype": "BOOL", "data": [false, false]},
            {"name": "h", "shape": [2], "datatype": "FP16", "data": [1, 2]},
        ],
        "parameters": {"binary_data_output": true},
    });
    let r = call_binary(addr, "mixed", &header, &strings);
    let (head, data) = split_binary(&r);
    let sizes: Vec<usize> = head["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["parameters"]["binary_data_size"].as_u64().unwrap() as usize)
        .collect();
    // i_out (no elements), s_out (the same bytes back), b_out, h_out.
    assert_eq!(sizes, [0, strings.len(), 2, 4]);
    assert_eq!(&data[..strings.len()], &strings[..]);
    assert_eq!(&data[strings.len()..strings.len() + 2], &[1, 1]);
}

#[test]
fn refusals_say_what_is_wrong_and_the_server_goes_on() {
    let server = start();
    let addr = server.addr;
    let post = |path: &str, body: &[u8]| call(addr, "POST", path, &[], body);
    // Input `a` of `add` varied, `b` as it should be.
    let with_a = |a: Json| {
        let b = json!({"name": "b", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]});
        infer(addr, "add", &json!({"inputs": [a, b]}))
    };
    let a = |shape: Json, datatype: &str, data: Json| json!({"name": "a", "shape": shape, "datatype": datatype, "data": data});
    let only_a = json!({"inputs": [a(json!([1, 4]), "FP32", json!([1, 2, 3, 4]))]});
    let no_such_output = json!({
        "inputs": [a(json!([1, 4]), "FP32", json!([1, 2, 3, 4])),
                   {"name": "b", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}],
        "outputs": [{"name": "nope"}]});
    let mixed_bad_int = json!({"inputs": [
        {"name": "i", "shape": [1, 2], "datatype": "INT32", "data": [1, 2147483648i64]},
        {"name": "s", "shape": [0], "datatype": "BYTES", "data": []},
        {"name": "b", "shape": [2], "datatype": "BOOL", "data": [true, false]},
        {"name": "h", "shape": [2], "datatype": "FP16", "data": [1, 2]}]});
    let cases: Vec<(Reply, u16, &str)> = vec![
        (
            post("/v2/models/add/infer", b"{not json"),
            400,
            "not an inference request",
        ),
        (
            post("/v2/models/add/infer", b"[]"),
            400,
            "not an inference request",
        ),
        (
            with_a(a(json!([1, 4]), "FP64", json!([1, 2, 3, 4]))),
            400,
            "datatype FP64 but the model declares FP32",
        ),
        (
            with_a(a(json!([2, 2]), "FP32", json!([1, 2, 3, 4]))),
            400,
            "does not fit the model's [1,4]",
        ),
        (
            with_a(a(json!([1, 4]), "FP32", json!([1, 2, 3]))),
            400,
            "holds 4 elements but data has 3",
        ),
        (
            with_a(a(json!([1, 4]), "FP32", json!([1, 2, 3, "x"]))),
            400,
            "element 3 (\"x\") is not a FP32 value",
        ),
        (
            with_a(a(json!([1, -4]), "FP32", json!([1, 2, 3, 4]))),
            400,
            "negative extent",
        ),
        (
            with_a(a(json!([1, 4]), "FP8", json!([1, 2, 3, 4]))),
            400,
            "unknown datatype",
        ),
        (
            infer(addr, "add", &only_a),
            400,
            "lacks the model's input(s) b",
        ),
        (infer(addr, "add", &no_such_output), 400, "no output `nope`"),
        (
            infer(addr, "mixed", &mixed_bad_int),
            400,
            "element 1 (2147483648) is not a INT32 value",
        ),
        (
            infer(addr, "nope", &add_request()),
            404,
            "no model named `nope`",
        ),
        (get(addr, "/v2/models/add/versions/7"), 404, "no version 7"),
        (
            get(addr, "/v2/models/broken"),
            404,
            "model `broken` is not loaded",
        ),
        (
            get(addr, "/v2/models/badconfig"),
            404,
            "unknown field `instance`",
        ),
        (get(addr, "/v2/nothing/here"), 404, "no such endpoint"),
    ];
    for (i, (reply, status, says)) in cases.iter().enumerate() {
        assert_eq!(
            reply.status,
            *status,
            "case {i}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        assert!(
            reply.error().contains(says),
            "case {i}: {:?} lacks {says:?}",
            reply.error()
        );
    }

    // Binary sizes that lie: more than the body holds, fewer than the shape needs, bytes left
    // over, a header length past the end.
    let header = |size: usize| {
        json!({"inputs": [
            {"name": "a", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": size}},
            {"name": "b", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    };
    for (size, extra, says) in [
        (32, 16, "only 16 bytes of binary data are left"),
        (12, 12, "needs 16 bytes but binary_data_size is 12"),
        (16, 20, "4 bytes of binary data follow the header"),
    ] {
        let r = call_binary(addr, "add", &header(size), &vec![0u8; extra]);
        assert_eq!(r.status, 400);
        assert!(r.error().contains(says), "{:?} lacks {says:?}", r.error());
    }
    let len = [("Inference-Header-Content-Length", "99999".to_string())];
    let r = call(addr, "POST", "/v2/models/add/infer", &len, b"{}");
    assert_eq!(r.status, 400);
    assert!(
        r.error().contains("the body holds 2 bytes"),
        "{}",
        r.error()
    );

    // Over the body limit (1 MiB here).
    let r = post("/v2/models/add/infer", &vec![b' '; 2 << 20]);
    assert_eq!(r.status, 413);

    // After all of it, the server still answers.
    assert_eq!(infer(addr, "add", &add_request()).status, 200);
}

#[test]
fn a_full_queue_refuses_with_503_and_the_running_request_finishes() {
    let server = start();
    let addr = server.addr;
    // `loop` has one instance and no queue: while a long run holds it, the next is refused.
    let long = std::thread::spawn(move || {
        infer(
            addr,
            "loop",
            &json!({"inputs": [{"name": "m", "shape": [], "datatype": "INT64", "data": [2000000]}],
                    "outputs": [{"name": "scan", "parameters": {"binary_data": true}}]}),
        )
    });
    let quick = json!({"inputs": [{"name": "m", "shape": [], "datatype": "INT64", "data": [1]}]});
    // Let the long run take the instance first.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let started = std::time::Instant::now();
    let mut refused = None;
    while started.elapsed() < std::time::Duration::from_secs(30) && !long.is_finished() {
        let r = infer(addr, "loop", &quick);
        if r.status == 503 {
            refused = Some(r.error());
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let long = long.join().unwrap();
    eprintln!("the long run took {:?}", started.elapsed());
    assert_eq!(long.status, 200, "{}", String::from_utf8_lossy(&long.body));
    let refused = refused.expect("a request made while the only instance ran was refused");
    assert!(refused.contains("limit of queued requests"), "{refused}");
    // Then it is free again.
    let r = infer(addr, "loop", &quick);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["outputs"][0]["data"], json!([0.0]));

    // The statistics extension and Prometheus count what happened.
    let stats = get(addr, "/v2/models/loop/stats").json();
    let s = &stats["model_stats"][0];
    assert_eq!(s["name"], "loop");
    assert_eq!(s["inference_stats"]["success"]["count"], 2, "{stats}");
    assert!(
        s["inference_stats"]["fail"]["count"].as_u64().unwrap() >= 1,
        "{stats}"
    );
    assert!(
        s["inference_stats"]["compute_infer"]["ns"]
            .as_u64()
            .unwrap()
            > 1_000_000_000
    );
    let all = get(addr, "/v2/models/stats").json();
    assert_eq!(all["model_stats"].as_array().unwrap().len(), 3, "{all}");
    let text = String::from_utf8(get(server.metrics, "/metrics").body).unwrap();
    assert!(
        text.contains("epx_runs_total{model=\"loop\",version=\"1\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains("epx_requests_rejected_total{model=\"loop\",version=\"1\"} "),
        "{text}"
    );
    assert!(
        !text.contains("epx_requests_rejected_total{model=\"loop\",version=\"1\"} 0\n"),
        "{text}"
    );
}

#[test]
fn the_repository_extension_indexes_unloads_and_loads() {
    let server = start();
    let addr = server.addr;
    let post = |path: &str, body: &str| call(addr, "POST", path, &[], body.as_bytes());
    let index = post("/v2/repository/index", "").json();
    let states: Vec<(&str, &str)> = index
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap(), m["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        [
            ("add", "READY"),
            ("badconfig", "UNAVAILABLE"),
            ("broken", "UNAVAILABLE"),
            ("loop", "READY"),
            ("mixed", "READY")
        ]
    );
    assert_eq!(index[0]["version"], "1");
    assert!(
        index[2]["reason"].as_str().unwrap().contains("model.onnx"),
        "{index}"
    );
    let ready = post("/v2/repository/index", r#"{"ready": true}"#).json();
    assert_eq!(ready.as_array().unwrap().len(), 3);

    assert_eq!(post("/v2/repository/models/add/unload", "").status, 200);
    let r = infer(addr, "add", &add_request());
    assert_eq!(r.status, 404);
    assert!(r.error().contains("unloaded"), "{}", r.error());
    assert_eq!(get(addr, "/v2/models/add/ready").status, 404);
    assert_eq!(post("/v2/repository/models/add/load", "{}").status, 200);
    assert_eq!(infer(addr, "add", &add_request()).status, 200);

    // A model fixed on disk loads; the server becomes ready when none is failing.
    std::fs::write(
        server.dir.join("badconfig").join("config.toml"),
        "instances = 2\n",
    )
    .unwrap();
    assert_eq!(post("/v2/repository/models/badconfig/load", "").status, 200);
    std::fs::write(
        server.dir.join("broken").join("1").join("model.onnx"),
        b"still not onnx",
    )
    .unwrap();
    let r = post("/v2/repository/models/broken/load", "");
    assert_eq!(r.status, 400);
    assert!(r.error().contains("broken"), "{}", r.error());
    assert_eq!(post("/v2/repository/models/broken/unload", "").status, 200);
    assert_eq!(get(addr, "/v2/health/ready").status, 200);

    // EPs from config.toml: one named with options loads; one that does not exist is an error
    // naming it, as is a config that expects another input.
    let add = std::fs::read(epx_tests::repo_root().join("examples/models/add.onnx")).unwrap();
    let cpu = "[[providers]]\nname = \"cpu\"\noptions = { intra_op_num_threads = 1 }\n";
    put(&server.dir, "add_cpu", &add, Some(cpu));
    assert_eq!(post("/v2/repository/models/add_cpu/load", "").status, 200);
    assert_eq!(infer(addr, "add_cpu", &add_request()).status, 200);
    put(
        &server.dir,
        "add_nope",
        &add,
        Some("[[providers]]\nname = \"nope\"\n"),
    );
    let r = post("/v2/repository/models/add_nope/load", "");
    assert_eq!(r.status, 400);
    assert!(r.error().contains("nope"), "{}", r.error());
    let typed = "[[inputs]]\nname = \"a\"\ndatatype = \"FP64\"\n[[inputs]]\nname = \"b\"\ndatatype = \"FP32\"\n";
    put(&server.dir, "add_typed", &add, Some(typed));
    let r = post("/v2/repository/models/add_typed/load", "");
    assert!(
        r.error()
            .contains("input `a` is FP32 in the model, not FP64"),
        "{}",
        r.error()
    );

    for (path, body, status, says) in [
        ("/v2/repository/models/nope/load", "", 404, "no folder"),
        (
            "/v2/repository/models/..%2Fadd/load",
            "",
            400,
            "not a model name",
        ),
        (
            "/v2/repository/models/add/load",
            r#"{"parameters": {"config": "{}"}}"#,
            400,
            "parameter `config`",
        ),
        (
            "/v2/repository/models/add/load",
            "[1]",
            400,
            "must be a JSON object",
        ),
        (
            "/v2/repository/index",
            r#"{"ready": 1}"#,
            400,
            "must be true or false",
        ),
        (
            "/v2/repository/index",
            r#"{"reddy": true}"#,
            400,
            "unknown key `reddy`",
        ),
        (
            "/v2/repository/models/nope/unload",
            "",
            404,
            "no model named `nope`",
        ),
    ] {
        let r = post(path, body);
        assert_eq!(r.status, status, "{path} {body}: {}", r.error());
        assert!(r.error().contains(says), "{path} {body}: {}", r.error());
    }
}

/// A request to `lin`: `rows` rows of x (values from `seed`) and of z (`m` wide).
fn linear_request(rows: usize, m: usize, seed: f32) -> Json {
    let x: Vec<f32> = (0..rows * 4)
        .map(|i| seed + i as f32 * 0.25 - 1.0)
        .collect();
    let z: Vec<f32> = (0..rows * m).map(|i| i as f32 - seed).collect();
    json!({"inputs": [
        {"name": "x", "shape": [rows, 4], "datatype": "FP32", "data": x},
        {"name": "z", "shape": [rows, m], "datatype": "FP32", "data": z}]})
}

#[test]
fn dynamic_batching_stacks_requests_and_answers_as_unbatched_runs_do() {
    let server = start();
    let addr = server.addr;
    // `lin` batches (a batch runs once it has 4 rows, or after 300 ms); `lin1` is the same
    // model unbatched.
    put(
        &server.dir,
        "lin",
        &linear_model(),
        Some(
            "max_batch_size = 8\n[dynamic_batching]\npreferred_sizes = [4]\nmax_queue_delay_us = 300000\n",
        ),
    );
    put(&server.dir, "lin1", &linear_model(), None);
    for m in ["lin", "lin1"] {
        let r = call(
            addr,
            "POST",
            &format!("/v2/repository/models/{m}/load"),
            &[],
            b"",
        );
        assert_eq!(r.status, 200, "{}", r.error());
    }
    let clients: Vec<_> = (0..4)
        .map(|k| {
            std::thread::spawn(move || {
                let body = linear_request(1, 2, k as f32);
                (infer(addr, "lin", &body), infer(addr, "lin1", &body))
            })
        })
        .collect();
    for c in clients {
        let (batched, alone) = c.join().unwrap();
        assert_eq!(batched.status, 200, "{}", batched.error());
        let (b, a) = (batched.json(), alone.json());
        assert_eq!(b["outputs"][0]["shape"], json!([1, 3]));
        // Bit for bit: the JSON numbers are the f32 results written out exactly.
        assert_eq!(b["outputs"], a["outputs"], "batched {b} unbatched {a}");
    }
    let stats = get(addr, "/v2/models/lin/stats").json();
    let s = &stats["model_stats"][0];
    assert_eq!(s["inference_count"], 4, "{s}");
    let runs = s["execution_count"].as_u64().unwrap();
    assert!(
        runs < 4,
        "four requests within 300 ms ran in {runs} runs: {s}"
    );
    let sizes: Vec<u64> = s["batch_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["batch_size"].as_u64().unwrap())
        .collect();
    assert!(sizes.iter().any(|&n| n > 1), "{s}");

    // Requests whose inputs do not stack (z 2 and 3 wide) run apart, each answered rightly;
    // one of 2 rows and one of 1 stack.
    let shapes = [(1, 2), (1, 3), (2, 2)];
    let clients: Vec<_> = shapes
        .iter()
        .map(|&(rows, m)| {
            std::thread::spawn(move || {
                let body = linear_request(rows, m, 0.5);
                (infer(addr, "lin", &body), infer(addr, "lin1", &body))
            })
        })
        .collect();
    for (c, (rows, m)) in clients.into_iter().zip(shapes) {
        let (batched, alone) = c.join().unwrap();
        assert_eq!(batched.status, 200, "{}", batched.error());
        let b = batched.json();
        assert_eq!(b["outputs"][1]["shape"], json!([rows, m]));
        assert_eq!(b["outputs"], alone.json()["outputs"]);
    }

    // Refused before queueing: more rows than max_batch_size, inputs that disagree on rows.
    let r = infer(addr, "lin", &linear_request(9, 2, 0.0));
    assert_eq!(r.status, 400);
    assert!(
        r.error()
            .contains("9 rows is over model `lin`'s max_batch_size of 8"),
        "{}",
        r.error()
    );
    let mut body = linear_request(2, 2, 0.0);
    body["inputs"][1] = json!({"name": "z", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]});
    let r = infer(addr, "lin", &body);
    assert_eq!(r.status, 400);
    assert!(r.error().contains("have 2 and 1 rows"), "{}", r.error());
    let metrics = String::from_utf8(get(server.metrics, "/metrics").body).unwrap();
    assert!(
        metrics.contains("epx_inferences_total{model=\"lin\",version=\"1\"} "),
        "{metrics}"
    );
    assert!(
        metrics.contains("epx_batch_runs_total{model=\"lin\",version=\"1\",size=\""),
        "{metrics}"
    );
    assert!(
        metrics.contains("epx_model_nodes{model=\"lin\",version=\"1\",provider=\"cpu\"} "),
        "{metrics}"
    );
}

#[test]
fn a_request_past_its_timeout_gets_504_and_its_run_is_cancelled() {
    let server = start();
    let addr = server.addr;
    // A Loop of 10^9 iterations, with a deadline of 200 ms given in the request.
    let endless = json!({
        "parameters": {"timeout": 200_000},
        "inputs": [{"name": "m", "shape": [], "datatype": "INT64", "data": [1_000_000_000i64]}]});
    let started = std::time::Instant::now();
    let r = infer(addr, "loop", &endless);
    assert_eq!(r.status, 504, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        r.error().contains("no answer within 200 ms"),
        "{}",
        r.error()
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    // `loop` has one instance and no queue: a request is refused (503) until the cancelled run
    // gives the instance back, which it does at its next check, not after 10^9 iterations.
    let quick = json!({"inputs": [{"name": "m", "shape": [], "datatype": "INT64", "data": [1]}]});
    let freed = std::time::Instant::now();
    loop {
        let r = infer(addr, "loop", &quick);
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503, "{}", r.error());
        assert!(
            freed.elapsed() < std::time::Duration::from_secs(10),
            "the run was not cancelled"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let r = infer(
        addr,
        "loop",
        &json!({"parameters": {"timeout": -1}, "inputs": quick["inputs"]}),
    );
    assert_eq!(r.status, 400);
    assert!(
        r.error().contains("positive count of microseconds"),
        "{}",
        r.error()
    );
}

#[test]
fn an_isolated_ep_that_crashes_fails_only_its_requests() {
    let server = start();
    let addr = server.addr;
    // Relu then Neg over FP32 [2, 3]; the Relu on the fixture EP in a child process, which
    // aborts on a NaN input.
    let model = epx_tests::models::relu_neg_model();
    let isolated = "[[providers]]\nname = \"adversarial\"\nisolated = true\noptions = { mode = \"abort_on_nan\" }\n";
    put(&server.dir, "fragile", &model, Some(isolated));
    put(&server.dir, "sturdy", &model, None);
    for m in ["fragile", "sturdy"] {
        let r = call(
            addr,
            "POST",
            &format!("/v2/repository/models/{m}/load"),
            &[],
            b"",
        );
        assert_eq!(r.status, 200, "{m}: {}", r.error());
    }
    let x = |values: [f32; 6]| -> Vec<u8> { values.iter().flat_map(|v| v.to_le_bytes()).collect() };
    let header = json!({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 24}}],
                        "outputs": [{"name": "y"}]});
    let good = x([-1.5, 0.0, 2.0, -0.25, 3.5, -4.0]);
    let nan = x([-1.5, 0.0, 2.0, -0.25, f32::NAN, -4.0]);
    let expected = json!([-0.0, -0.0, -2.0, -0.0, -3.5, -0.0]);
    let r = call_binary(addr, "fragile", &header, &good);
    assert_eq!(r.status, 200, "{}", r.error());
    assert_eq!(r.json()["outputs"][0]["data"], expected);
    let r = call_binary(addr, "fragile", &header, &nan);
    assert_eq!(r.status, 500, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.error().contains("SIGABRT"), "{}", r.error());
    // The server, the other model and the crashed model itself go on.
    assert_eq!(get(addr, "/v2/health/live").status, 200);
    let r = call_binary(addr, "sturdy", &header, &good);
    assert_eq!(r.json()["outputs"][0]["data"], expected);
    let r = call_binary(addr, "fragile", &header, &good);
    assert_eq!(r.status, 200, "{}", r.error());
    assert_eq!(r.json()["outputs"][0]["data"], expected);
}

/// By default (`--model-control-mode none`) the repository may be read, but clients load and
/// unload nothing: 403 naming the flag, and the model goes on serving.
#[test]
fn by_default_clients_cannot_load_or_unload_models() {
    let server = common::start_with(|_| {});
    let addr = server.addr;
    let post = |path: &str| call(addr, "POST", path, &[], b"");
    assert_eq!(post("/v2/repository/index").status, 200);
    for path in [
        "/v2/repository/models/add/unload",
        "/v2/repository/models/add/load",
    ] {
        let r = post(path);
        assert_eq!(r.status, 403, "{path}");
        assert!(
            r.error().contains("--model-control-mode explicit"),
            "{}",
            r.error()
        );
    }
    let infer = json!({"inputs": [
        {"name": "a", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
        {"name": "b", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]}]});
    let r = call(
        addr,
        "POST",
        "/v2/models/add/infer",
        &[],
        infer.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

/// `explicit` with `--load-model add`: only `add` serves at start; the others load on request.
#[test]
fn explicit_control_loads_only_the_named_models_at_start() {
    let server = common::start_with(|o| {
        o.control = epx_serve::access::ControlMode::Explicit;
        o.load_models = vec!["add".into()];
    });
    let addr = server.addr;
    let r = call(addr, "GET", "/v2/models/mixed", &[], b"");
    assert_eq!(r.status, 404);
    assert!(r.error().contains("not loaded"), "{}", r.error());
    assert_eq!(call(addr, "GET", "/v2/models/add", &[], b"").status, 200);
    let r = call(addr, "POST", "/v2/repository/models/mixed/load", &[], b"");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(call(addr, "GET", "/v2/models/mixed", &[], b"").status, 200);
}

/// A restricted group answers only requests with its header; the other groups answer all.
#[test]
fn a_restricted_api_group_needs_its_header() {
    let server = common::start_with(|o| {
        o.control = epx_serve::access::ControlMode::Explicit;
        o.load_models = vec!["*".into()];
        o.http_restricted = vec![
            "model-repository,statistics:Admin-Key=open sesame"
                .parse()
                .unwrap(),
        ];
    });
    let addr = server.addr;
    let key = [("admin-key", "open sesame".to_owned())];
    let wrong = [("Admin-Key", "open".to_owned())];
    for (method, path) in [
        ("POST", "/v2/repository/index"),
        ("POST", "/v2/repository/models/add/unload"),
        ("GET", "/v2/models/stats"),
        ("GET", "/v2/models/add/versions/1/stats"),
    ] {
        for h in [&[][..], &wrong[..]] {
            let r = call(addr, method, path, h, b"");
            assert_eq!(r.status, 403, "{path}");
            assert!(
                r.error().contains("`admin-key`") && !r.error().contains("sesame"),
                "{}",
                r.error()
            );
        }
    }
    assert_eq!(call(addr, "GET", "/v2/models/stats", &key, b"").status, 200);
    assert_eq!(
        call(addr, "POST", "/v2/repository/index", &key, b"").status,
        200
    );
    // Health, metadata and a model named like an endpoint are not restricted.
    for path in [
        "/v2/health/live",
        "/v2",
        "/v2/models/add",
        "/v2/models/add/ready",
    ] {
        assert_eq!(call(addr, "GET", path, &[], b"").status, 200, "{path}");
    }
}

/// `poll`: a model folder added, changed or removed is served, reloaded or dropped at the next
/// read of the repository, and clients still cannot load or unload.
#[test]
fn poll_control_follows_the_repository_folders() {
    let server = common::start_with(|o| {
        o.control = epx_serve::access::ControlMode::Poll;
        o.poll_interval = std::time::Duration::from_millis(200);
    });
    let addr = server.addr;
    let wait_for = |what: &str, ok: &dyn Fn() -> bool| {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !ok() {
            assert!(std::time::Instant::now() < until, "{what}: not within 30 s");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let status = |path: &str| call(addr, "GET", path, &[], b"").status;
    assert_eq!(status("/v2/models/linear"), 404);
    put(&server.dir, "linear", &linear_model(), None);
    wait_for("a new folder served", &|| {
        status("/v2/models/linear") == 200
    });
    // A change: the broken model fixed on disk.
    put(
        &server.dir,
        "broken",
        &std::fs::read(epx_tests::repo_root().join("examples/models/add.onnx")).unwrap(),
        None,
    );
    wait_for("a changed folder reloaded", &|| {
        status("/v2/models/broken") == 200
    });
    std::fs::remove_dir_all(server.dir.join("linear")).unwrap();
    wait_for("a removed folder dropped", &|| {
        status("/v2/models/linear") == 404
    });
    let r = call(addr, "POST", "/v2/repository/models/add/unload", &[], b"");
    assert_eq!(r.status, 403);
    assert!(r.error().contains("poll"), "{}", r.error());
}

/// Client-facing errors are JSON, and name files from the repository's root, never where the
/// server keeps it (the log has the full paths).
#[test]
fn errors_are_json_and_show_no_server_paths() {
    let server = start();
    let addr = server.addr;
    let root = server.dir.display().to_string();
    // A path whose parameter is not UTF-8 once decoded.
    let r = call(addr, "GET", "/v2/models/%FF%FE", &[], b"");
    assert_eq!(r.status, 400);
    assert!(
        !r.error().is_empty(),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    // A method the path does not take.
    let r = call(addr, "GET", "/v2/models/add/infer", &[], b"");
    assert_eq!(r.status, 405);
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("application/json")
    );
    r.json();
    let index = call(addr, "POST", "/v2/repository/index", &[], b"");
    let text = String::from_utf8_lossy(&index.body).into_owned();
    assert!(text.contains("broken/1/model.onnx"), "{text}");
    assert!(!text.contains(&root), "{text}");
    for path in [
        "/v2/models/broken",
        "/v2/models/badconfig",
        "/v2/repository/models/broken/load",
        "/v2/repository/models/nope/load",
    ] {
        let method = if path.contains("/load") {
            "POST"
        } else {
            "GET"
        };
        let r = call(addr, method, path, &[], b"");
        assert!(r.status >= 400, "{path}");
        assert!(!r.error().contains(&root), "{path}: {}", r.error());
    }
}
