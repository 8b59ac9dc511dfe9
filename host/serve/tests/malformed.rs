//! Malformed traffic over the wire, seeded and repeatable: mutated REST requests (bodies, header
//! lengths, request lines), raw bytes on the gRPC port, and well-framed gRPC calls carrying
//! mutated messages. Nothing takes the server down, every call gets an answer or a closed
//! connection, a good request afterwards is answered rightly, and the process's resident memory
//! stays flat over thousands of such requests.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::start;
use epx_serve::grpc::pb;
use prost::Message as _;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;

/// xorshift64*: the same cases for the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// `base` with a few bytes flipped, inserted, deleted or the tail cut.
fn mutate(rng: &mut Rng, base: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(5) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(v.len() + 1);
                v.insert(i, rng.next() as u8);
            }
            2 if !v.is_empty() => {
                let i = rng.below(v.len());
                v.remove(i);
            }
            3 => v.truncate(rng.below(v.len() + 1)),
            _ => {
                // A digit made large: sizes, shapes and lengths that lie.
                if let Some(i) = v.iter().position(|b| b.is_ascii_digit()) {
                    v.splice(i..i + 1, b"99999999999".iter().copied());
                }
            }
        }
    }
    v
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Writes `raw` to a fresh connection and reads until the server closes it (or 10 s pass);
/// the status code, if a response came. `end`: close the writing side after `raw` (for bytes
/// that may not be a whole request; a server may then drop the request, as a client that went
/// away).
fn exchange(addr: SocketAddr, raw: &[u8], end: bool) -> Option<u16> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(raw);
    if end {
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply);
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

fn http_request(addr: SocketAddr, path: &str, headers: &str, body: &[u8]) -> Vec<u8> {
    let mut raw = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n{headers}\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    raw
}

/// Messages as they are: the bytes a case sends, whatever a ModelInferResponse holds back.
#[derive(Default, Clone)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use bytes::BufMut as _;
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf as _;
        let mut v = vec![0; buf.remaining()];
        buf.copy_to_slice(&mut v);
        Ok(Some(v))
    }
}

#[test]
fn malformed_traffic_leaves_the_server_up_and_its_memory_flat() {
    let server = start();
    let (addr, grpc_addr) = (server.addr, server.grpc);
    let good = br#"{"inputs": [{"name": "a", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}, {"name": "b", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}"#;
    let header = br#"{"inputs": [{"name": "a", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}, {"name": "b", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}], "parameters": {"binary_data_output": true}}"#;
    let mut binary = header.to_vec();
    binary.extend_from_slice(&[0u8; 32]);
    let grpc_good = pb::ModelInferRequest {
        model_name: "add".into(),
        inputs: ["a", "b"]
            .iter()
            .map(|n| pb::model_infer_request::InferInputTensor {
                name: (*n).into(),
                datatype: "FP32".into(),
                shape: vec![1, 4],
                contents: Some(pb::InferTensorContents {
                    fp32_contents: vec![1.0; 4],
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
    .encode_to_vec();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let channel = rt.block_on(async {
        Channel::from_shared(format!("http://{grpc_addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap()
    });
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let round = |rounds: usize, rng: &mut Rng| {
        let mut statuses = std::collections::BTreeMap::<String, usize>::new();
        for _ in 0..rounds {
            let case = rng.below(6);
            let raw = match case {
                0 => http_request(addr, "/v2/models/add/infer", "", &mutate(rng, good)),
                1 => {
                    let body = mutate(rng, &binary);
                    let len = header.len() as i64 + rng.below(40) as i64 - 20;
                    let h = format!("Inference-Header-Content-Length: {len}\r\n");
                    http_request(addr, "/v2/models/add/infer", &h, &body)
                }
                2 => mutate(rng, &http_request(addr, "/v2/models/add/infer", "", good)),
                3 => {
                    let path =
                        String::from_utf8_lossy(&mutate(rng, b"/v2/repository/models/add/load"))
                            .into_owned();
                    http_request(addr, &path.replace([' ', '\r', '\n'], ""), "", b"")
                }
                4 => {
                    // Raw bytes on the gRPC port: a preface, or not, then garbage frames.
                    let mut raw = if rng.below(2) == 0 {
                        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec()
                    } else {
                        Vec::new()
                    };
                    raw.extend((0..rng.below(200)).map(|_| rng.next() as u8));
                    exchange(grpc_addr, &raw, true);
                    *statuses.entry("grpc raw".into()).or_default() += 1;
                    continue;
                }
                _ => {
                    let message = mutate(rng, &grpc_good);
                    let code = rt.block_on(async {
                        let mut grpc = tonic::client::Grpc::new(channel.clone());
                        grpc.ready().await.unwrap();
                        let path = "/inference.GRPCInferenceService/ModelInfer"
                            .parse()
                            .unwrap();
                        grpc.unary(tonic::Request::new(message), path, RawCodec)
                            .await
                            .map_or_else(|s| s.code(), |_| tonic::Code::Ok)
                    });
                    *statuses.entry(format!("grpc {code:?}")).or_default() += 1;
                    continue;
                }
            };
            // Whole requests (a body of its Content-Length) are answered; mutated request bytes
            // may not be whole.
            let status = exchange(addr, &raw, case == 2).map_or("closed".into(), |s| s.to_string());
            *statuses.entry(status).or_default() += 1;
        }
        statuses
    };
    let warm = round(300, &mut rng);
    let before = rss_kib();
    let statuses = round(3000, &mut rng);
    let after = rss_kib();
    eprintln!("warm-up: {warm:?}\nanswers: {statuses:?}\nRSS {before} KiB -> {after} KiB");
    // No panic reached a client: a 500 would be a run failing, and these never reach a run
    // with bad data.
    assert!(!statuses.contains_key("500"), "{statuses:?}");
    assert!(
        statuses.get("400").is_some_and(|&n| n > 100),
        "{statuses:?}"
    );
    // An undecodable message is the client's error, as a wrong one is.
    assert!(
        statuses
            .get("grpc InvalidArgument")
            .is_some_and(|&n| n > 100),
        "{statuses:?}"
    );
    assert!(!statuses.contains_key("grpc Internal"), "{statuses:?}");
    assert!(
        after < before + 32 * 1024,
        "resident memory grew from {before} KiB to {after} KiB over 3000 malformed requests"
    );
    // The server answers good requests as before, on both ports.
    let reply = exchange(
        addr,
        &http_request(addr, "/v2/models/add/infer", "", good),
        false,
    );
    assert_eq!(reply, Some(200));
    let answer = rt.block_on(async {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        grpc.ready().await.unwrap();
        let path = "/inference.GRPCInferenceService/ModelInfer"
            .parse()
            .unwrap();
        grpc.unary(tonic::Request::new(grpc_good.clone()), path, RawCodec)
            .await
            .unwrap()
            .into_inner()
    });
    let answer = pb::ModelInferResponse::decode(&answer[..]).unwrap();
    assert_eq!(
        answer.raw_output_contents[0],
        [2f32; 4]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
    );
}
