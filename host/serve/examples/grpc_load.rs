//! A gRPC load generator for servers of the Open Inference Protocol (`epx serve`, Triton,
//! KServe's): C concurrent ModelInfer calls back to back over one HTTP/2 connection each, random
//! inputs made once from the model's metadata (dynamic extents 1), raw tensor contents. Prints
//! requests/s, p50 and p99 latency and failures per concurrency; the client costs a few
//! microseconds of CPU a request, so the server, not the client, is what saturates.
//!
//!     cargo run --release -p epx-serve --example grpc_load -- \
//!         --addr 127.0.0.1:8001 --model mnist --concurrency 1,2,4,8,16 --seconds 5 \
//!         [--shape x=1,3,640,640[:FP32]]   (an input's extents, repeatable; the inputs sent are
//!         the metadata's, or these with their datatype (FP32 if not given) when it lists none)

use std::time::{Duration, Instant};

use epx_serve::grpc::pb;
use pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use tonic::transport::Channel;

struct Args {
    addr: String,
    model: String,
    concurrency: Vec<usize>,
    seconds: f64,
    shapes: Vec<(String, Vec<i64>, String)>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        addr: "127.0.0.1:8001".into(),
        model: String::new(),
        concurrency: vec![1, 2, 4, 8, 16],
        seconds: 5.0,
        shapes: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--addr" => a.addr = value,
            "--model" => a.model = value,
            "--shape" => {
                let (name, dims) = value.split_once('=').ok_or("--shape NAME=D,D,...")?;
                let (dims, datatype) = dims.split_once(':').unwrap_or((dims, "FP32"));
                let dims = dims
                    .split(',')
                    .map(|d| d.parse().map_err(|e| format!("--shape: {e}")))
                    .collect::<Result<_, _>>()?;
                a.shapes.push((name.to_owned(), dims, datatype.to_owned()));
            }
            "--seconds" => a.seconds = value.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--concurrency" => {
                a.concurrency = value
                    .split(',')
                    .map(|c| c.parse().map_err(|e| format!("--concurrency: {e}")))
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.model.is_empty() {
        return Err("--model is required".into());
    }
    Ok(a)
}

/// A request with random inputs of the shapes and datatypes the model declares.
async fn request(
    c: &mut GrpcInferenceServiceClient<Channel>,
    model: &str,
    shapes: &[(String, Vec<i64>, String)],
) -> Result<pb::ModelInferRequest, String> {
    let meta = c
        .model_metadata(pb::ModelMetadataRequest {
            name: model.into(),
            version: String::new(),
        })
        .await
        .map_err(|e| format!("model metadata: {e}"))?
        .into_inner();
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut r = pb::ModelInferRequest {
        model_name: model.into(),
        ..Default::default()
    };
    let mut inputs = meta.inputs;
    if inputs.is_empty() {
        inputs = shapes
            .iter()
            .map(
                |(name, shape, datatype)| pb::model_metadata_response::TensorMetadata {
                    name: name.clone(),
                    datatype: datatype.clone(),
                    shape: shape.clone(),
                },
            )
            .collect();
    }
    for t in inputs {
        let shape: Vec<i64> = match shapes.iter().find(|(n, _, _)| *n == t.name) {
            Some((_, dims, _)) => dims.clone(),
            None => t.shape.iter().map(|&d| d.max(1)).collect(),
        };
        let count: i64 = shape.iter().product();
        let size = match t.datatype.as_str() {
            "FP64" | "INT64" | "UINT64" => 8,
            "FP32" | "INT32" | "UINT32" => 4,
            "FP16" | "BF16" | "INT16" | "UINT16" => 2,
            "BOOL" | "INT8" | "UINT8" => 1,
            other => {
                return Err(format!(
                    "input {}: datatype {other} is not generated",
                    t.name
                ));
            }
        };
        let raw: Vec<u8> = (0..count as usize * size)
            .map(|i| match t.datatype.as_str() {
                // Small positive floats (the sign and exponent bytes kept sane), small integers.
                "FP32" if i % 4 == 3 => 0x3e,
                "FP64" if i % 8 == 7 => 0x3f,
                "FP64" if i % 8 == 6 => 0xe0,
                "BOOL" => (next() & 1) as u8,
                _ if t.datatype.starts_with("INT") || t.datatype.starts_with("UINT") => {
                    if i % size == 0 {
                        (next() % 100) as u8
                    } else {
                        0
                    }
                }
                _ => next() as u8,
            })
            .collect();
        r.inputs.push(pb::model_infer_request::InferInputTensor {
            name: t.name,
            datatype: t.datatype,
            shape,
            ..Default::default()
        });
        r.raw_input_contents.push(raw);
    }
    Ok(r)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let a = args()?;
    let channel = |addr: String| async move {
        Channel::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {addr}: {e}"))
    };
    let mut first = GrpcInferenceServiceClient::new(channel(a.addr.clone()).await?)
        .max_decoding_message_size(usize::MAX);
    let req = request(&mut first, &a.model, &a.shapes).await?;
    println!(
        "{:>3} {:>10} {:>8} {:>8} {:>6}",
        "C", "req/s", "p50 ms", "p99 ms", "failed"
    );
    for &c in &a.concurrency {
        let mut clients = Vec::new();
        for _ in 0..c {
            clients.push(
                GrpcInferenceServiceClient::new(channel(a.addr.clone()).await?)
                    .max_decoding_message_size(usize::MAX),
            );
        }
        let warm = Instant::now() + Duration::from_secs(1);
        let stop = warm + Duration::from_secs_f64(a.seconds);
        let tasks: Vec<_> = clients
            .into_iter()
            .map(|mut client| {
                let req = req.clone();
                tokio::spawn(async move {
                    let (mut lat, mut failed) = (Vec::new(), 0usize);
                    loop {
                        let t0 = Instant::now();
                        if t0 >= stop {
                            return (lat, failed);
                        }
                        let ok = client.model_infer(req.clone()).await.is_ok();
                        if t0 >= warm {
                            if ok {
                                lat.push(t0.elapsed());
                            } else {
                                failed += 1;
                            }
                        }
                    }
                })
            })
            .collect();
        let (mut all, mut failed) = (Vec::new(), 0);
        for t in tasks {
            let (lat, f) = t.await.map_err(|e| e.to_string())?;
            all.extend(lat);
            failed += f;
        }
        all.sort();
        let pick = |q: f64| {
            all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
                .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
        };
        println!(
            "{c:>3} {:>10.1} {:>8.3} {:>8.3} {failed:>6}",
            all.len() as f64 / a.seconds,
            pick(0.5),
            pick(0.99)
        );
    }
    Ok(())
}
