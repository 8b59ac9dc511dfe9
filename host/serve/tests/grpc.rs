//! The gRPC side of `epx serve` over a real socket, with the client compiled from the same
//! `.proto`: every call, typed and raw tensor contents in several datatypes, the refusals and
//! their codes, and the repository extension (index, unload, load, a load that fails).

mod common;

use common::start;
use epx_serve::grpc::pb;
use pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use pb::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use tonic::Code;
use tonic::transport::Channel;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn client(at: std::net::SocketAddr) -> GrpcInferenceServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{at}"))
        .unwrap()
        .connect()
        .await
        .expect("the gRPC listener accepts");
    GrpcInferenceServiceClient::new(channel)
}

fn input(
    name: &str,
    datatype: &str,
    shape: &[i64],
    contents: pb::InferTensorContents,
) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: shape.to_vec(),
        contents: Some(contents),
        ..Default::default()
    }
}

fn fp32(values: &[f32]) -> pb::InferTensorContents {
    pb::InferTensorContents {
        fp32_contents: values.to_vec(),
        ..Default::default()
    }
}

fn add_request(a: &[f32], b: &[f32]) -> pb::ModelInferRequest {
    pb::ModelInferRequest {
        model_name: "add".into(),
        id: "r1".into(),
        inputs: vec![
            input("a", "FP32", &[1, 4], fp32(a)),
            input("b", "FP32", &[1, 4], fp32(b)),
        ],
        ..Default::default()
    }
}

fn floats(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn health_metadata_and_inference_over_grpc() {
    let server = start();
    runtime().block_on(async {
        let mut c = client(server.grpc).await;
        assert!(
            c.server_live(pb::ServerLiveRequest {})
                .await
                .unwrap()
                .into_inner()
                .live
        );
        // `broken` and `badconfig` failed to load: not ready, as over REST.
        assert!(
            !c.server_ready(pb::ServerReadyRequest {})
                .await
                .unwrap()
                .into_inner()
                .ready
        );
        let meta = c
            .server_metadata(pb::ServerMetadataRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(meta.name, "epx");
        assert!(
            meta.extensions.iter().any(|e| e == "model_repository"),
            "{meta:?}"
        );
        let ready = |name: &str, version: &str| pb::ModelReadyRequest {
            name: name.into(),
            version: version.into(),
        };
        assert!(
            c.model_ready(ready("add", ""))
                .await
                .unwrap()
                .into_inner()
                .ready
        );
        assert!(
            c.model_ready(ready("add", "1"))
                .await
                .unwrap()
                .into_inner()
                .ready
        );
        assert!(
            !c.model_ready(ready("add", "7"))
                .await
                .unwrap()
                .into_inner()
                .ready
        );
        assert!(
            !c.model_ready(ready("broken", ""))
                .await
                .unwrap()
                .into_inner()
                .ready
        );
        assert!(
            !c.model_ready(ready("nope", ""))
                .await
                .unwrap()
                .into_inner()
                .ready
        );

        let m = c
            .model_metadata(pb::ModelMetadataRequest {
                name: "mixed".into(),
                version: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (m.platform.as_str(), m.versions.as_slice()),
            ("onnx", &["1".to_owned()][..])
        );
        let described: Vec<(&str, &str, &[i64])> = m
            .inputs
            .iter()
            .map(|t| (t.name.as_str(), t.datatype.as_str(), t.shape.as_slice()))
            .collect();
        assert_eq!(
            described,
            [
                ("i", "INT32", &[-1, 2][..]),
                ("s", "BYTES", &[-1][..]),
                ("b", "BOOL", &[2][..]),
                ("h", "FP16", &[2][..])
            ]
        );

        // Typed contents in, raw contents out.
        let r = c
            .model_infer(add_request(&[1., 2., 3., 4.], &[10., 20., 30., 40.]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (
                r.model_name.as_str(),
                r.model_version.as_str(),
                r.id.as_str()
            ),
            ("add", "1", "r1")
        );
        assert_eq!(r.outputs.len(), 1);
        assert_eq!(
            (
                r.outputs[0].datatype.as_str(),
                r.outputs[0].shape.as_slice()
            ),
            ("FP32", &[1, 4][..])
        );
        assert_eq!(floats(&r.raw_output_contents[0]), [11., 22., 33., 44.]);

        // Raw contents in, every datatype of `mixed` (FP16 only travels raw), one output asked.
        let strings: Vec<u8> = [&b"ab"[..], b"", "ünï".as_bytes()]
            .iter()
            .flat_map(|s| [&(s.len() as u32).to_le_bytes()[..], s].concat())
            .collect();
        let half: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        let raw_input = |name: &str, datatype: &str, shape: &[i64]| InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape: shape.to_vec(),
            ..Default::default()
        };
        let mixed = pb::ModelInferRequest {
            model_name: "mixed".into(),
            model_version: "1".into(),
            inputs: vec![
                raw_input("i", "INT32", &[3, 2]),
                raw_input("s", "BYTES", &[3]),
                raw_input("b", "BOOL", &[2]),
                raw_input("h", "FP16", &[2]),
            ],
            raw_input_contents: vec![
                (1..=6i32).flat_map(i32::to_le_bytes).collect(),
                strings.clone(),
                vec![1, 0],
                half.clone(),
            ],
            outputs: ["s_out", "b_out", "h_out"]
                .iter()
                .map(|n| InferRequestedOutputTensor {
                    name: (*n).into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let r = c.model_infer(mixed).await.unwrap().into_inner();
        let names: Vec<&str> = r.outputs.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["s_out", "b_out", "h_out"]);
        assert_eq!(r.raw_output_contents, [strings, vec![0, 1], half]);

        // Typed INT32 and BYTES contents.
        let typed = pb::ModelInferRequest {
            model_name: "mixed".into(),
            inputs: vec![
                input(
                    "i",
                    "INT32",
                    &[1, 2],
                    pb::InferTensorContents {
                        int_contents: vec![-5, 7],
                        ..Default::default()
                    },
                ),
                input(
                    "s",
                    "BYTES",
                    &[1],
                    pb::InferTensorContents {
                        bytes_contents: vec![b"x".to_vec()],
                        ..Default::default()
                    },
                ),
                input(
                    "b",
                    "BOOL",
                    &[2],
                    pb::InferTensorContents {
                        bool_contents: vec![true, true],
                        ..Default::default()
                    },
                ),
                raw_input("h", "FP16", &[2]),
            ],
            ..Default::default()
        };
        let refused = c.model_infer(typed.clone()).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert!(
            refused.message().contains("FP16 has no typed contents"),
            "{}",
            refused.message()
        );

        // The statistics extension counts what happened.
        let stats = c
            .model_statistics(pb::ModelStatisticsRequest {
                name: "add".into(),
                version: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        let s = &stats.model_stats[0];
        assert_eq!((s.name.as_str(), s.inference_count), ("add", 1));
        assert_eq!(
            s.inference_stats
                .as_ref()
                .unwrap()
                .success
                .as_ref()
                .unwrap()
                .count,
            1
        );
    });
}

#[test]
fn grpc_refusals_carry_their_codes_and_the_server_goes_on() {
    let server = start();
    runtime().block_on(async {
        let mut c = client(server.grpc).await;
        let with = |f: &dyn Fn(&mut pb::ModelInferRequest)| {
            let mut r = add_request(&[1., 2., 3., 4.], &[1., 1., 1., 1.]);
            f(&mut r);
            r
        };
        let cases: Vec<(pb::ModelInferRequest, Code, &str)> = vec![
            (
                with(&|r| r.model_name = "nope".into()),
                Code::NotFound,
                "no model named `nope`",
            ),
            (
                with(&|r| r.model_version = "3".into()),
                Code::NotFound,
                "no version 3",
            ),
            (
                with(&|r| r.model_name = "broken".into()),
                Code::NotFound,
                "is not loaded",
            ),
            (
                with(&|r| r.inputs[0].datatype = "FP64".into()),
                Code::InvalidArgument,
                "datatype FP64 but the model declares FP32",
            ),
            (
                with(&|r| r.inputs[0].shape = vec![2, 2]),
                Code::InvalidArgument,
                "does not fit the model's",
            ),
            (
                with(&|r| r.inputs[0].shape = vec![1, -4]),
                Code::InvalidArgument,
                "negative extent",
            ),
            (
                with(&|r| r.inputs[0].contents = Some(fp32(&[1., 2., 3.]))),
                Code::InvalidArgument,
                "holds 4 elements but fp32_contents has 3",
            ),
            (
                with(&|r| r.inputs[0].contents.as_mut().unwrap().int_contents = vec![1]),
                Code::InvalidArgument,
                "FP32 values go in fp32_contents, but int_contents holds 1",
            ),
            (
                with(&|r| r.inputs[1].name = "a".into()),
                Code::InvalidArgument,
                "input `a` is given twice",
            ),
            (
                with(&|r| r.inputs[1].name = "z".into()),
                Code::InvalidArgument,
                "the model has no input `z`",
            ),
            (
                with(&|r| {
                    r.inputs.pop();
                }),
                Code::InvalidArgument,
                "lacks the model's input(s) b",
            ),
            (
                with(&|r| r.raw_input_contents = vec![vec![0; 16]]),
                Code::InvalidArgument,
                "raw_input_contents has 1 entries for 2 inputs",
            ),
            (
                with(&|r| {
                    r.raw_input_contents = vec![vec![0; 16], vec![0; 12]];
                    r.inputs[0].contents = None;
                    r.inputs[1].contents = None;
                }),
                Code::InvalidArgument,
                "needs 16 bytes but binary_data_size is 12",
            ),
            (
                with(&|r| r.raw_input_contents = vec![vec![0; 16], vec![0; 16]]),
                Code::InvalidArgument,
                "both contents and raw_input_contents",
            ),
            (
                with(&|r| {
                    r.outputs = vec![InferRequestedOutputTensor {
                        name: "nope".into(),
                        ..Default::default()
                    }]
                }),
                Code::InvalidArgument,
                "the model has no output `nope`",
            ),
            (
                with(&|r| {
                    let mut o = InferRequestedOutputTensor {
                        name: "sum".into(),
                        ..Default::default()
                    };
                    o.parameters.insert(
                        "classification".into(),
                        pb::InferParameter {
                            parameter_choice: Some(
                                pb::infer_parameter::ParameterChoice::Int64Param(3),
                            ),
                        },
                    );
                    r.outputs = vec![o];
                }),
                Code::InvalidArgument,
                "the classification extension is not served",
            ),
        ];
        for (request, code, says) in cases {
            let status = c.model_infer(request).await.unwrap_err();
            assert_eq!(status.code(), code, "{}", status.message());
            assert!(
                status.message().contains(says),
                "{:?} lacks {says:?}",
                status.message()
            );
        }
        // After every refusal, the server answers.
        let r = c
            .model_infer(add_request(&[1., 2., 3., 4.], &[1., 1., 1., 1.]))
            .await
            .unwrap();
        assert_eq!(
            floats(&r.into_inner().raw_output_contents[0]),
            [2., 3., 4., 5.]
        );
        // A message over the server's limit (1 MiB in these tests) is refused by the transport.
        let big = with(&|r| r.raw_input_contents = vec![vec![0; 2 << 20], vec![]]);
        let status = c.model_infer(big).await.unwrap_err();
        assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
        assert!(
            c.server_live(pb::ServerLiveRequest {})
                .await
                .unwrap()
                .into_inner()
                .live
        );
    });
}

#[test]
fn the_repository_extension_over_grpc_indexes_unloads_and_loads() {
    let server = start();
    runtime().block_on(async {
        let mut c = client(server.grpc).await;
        let index = |ready: bool| pb::RepositoryIndexRequest {
            repository_name: String::new(),
            ready,
        };
        let all = c
            .repository_index(index(false))
            .await
            .unwrap()
            .into_inner()
            .models;
        let states: Vec<(&str, &str)> = all
            .iter()
            .map(|m| (m.name.as_str(), m.state.as_str()))
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
        let broken = all.iter().find(|m| m.name == "broken").unwrap();
        assert!(broken.reason.contains("model.onnx"), "{}", broken.reason);
        let badconfig = all.iter().find(|m| m.name == "badconfig").unwrap();
        assert!(
            badconfig.reason.contains("config.toml") && badconfig.reason.contains("instance"),
            "{}",
            badconfig.reason
        );
        assert_eq!(
            c.repository_index(index(true))
                .await
                .unwrap()
                .into_inner()
                .models
                .len(),
            3
        );

        let unload = |name: &str| pb::RepositoryModelUnloadRequest {
            model_name: name.into(),
            ..Default::default()
        };
        let load = |name: &str| pb::RepositoryModelLoadRequest {
            model_name: name.into(),
            ..Default::default()
        };
        c.repository_model_unload(unload("add")).await.unwrap();
        let status = c
            .model_infer(add_request(&[1.; 4], &[1.; 4]))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::NotFound);
        assert!(
            status.message().contains("unloaded"),
            "{}",
            status.message()
        );
        // Unloading is not a failure: the server is as ready as before.
        let all = c
            .repository_index(index(false))
            .await
            .unwrap()
            .into_inner()
            .models;
        assert_eq!(all[0].reason, "unloaded");
        c.repository_model_load(load("add")).await.unwrap();
        c.model_infer(add_request(&[1.; 4], &[1.; 4]))
            .await
            .unwrap();

        // Fixing a broken model on disk and loading it again makes it serve.
        std::fs::write(
            server.dir.join("badconfig").join("config.toml"),
            "instances = 2\n",
        )
        .unwrap();
        c.repository_model_load(load("badconfig")).await.unwrap();
        assert!(c.server_ready(pb::ServerReadyRequest {}).await.is_ok());
        // A load that fails says why and leaves a serving model serving.
        std::fs::write(
            server.dir.join("badconfig").join("config.toml"),
            "instances = 0\n",
        )
        .unwrap();
        let status = c
            .repository_model_load(load("badconfig"))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().contains("instances must be at least 1"),
            "{}",
            status.message()
        );
        assert!(
            c.model_ready(pb::ModelReadyRequest {
                name: "badconfig".into(),
                version: String::new()
            })
            .await
            .unwrap()
            .into_inner()
            .ready
        );

        for (name, code, says) in [
            ("nope", Code::NotFound, "no folder"),
            ("../add", Code::InvalidArgument, "not a model name"),
            (".hidden", Code::InvalidArgument, "not a model name"),
        ] {
            let status = c.repository_model_load(load(name)).await.unwrap_err();
            assert_eq!(status.code(), code, "{name}: {}", status.message());
            assert!(
                status.message().contains(says),
                "{name}: {}",
                status.message()
            );
        }
        let mut with_config = load("add");
        with_config.parameters.insert(
            "config".into(),
            pb::ModelRepositoryParameter {
                parameter_choice: Some(
                    pb::model_repository_parameter::ParameterChoice::StringParam("{}".into()),
                ),
            },
        );
        let status = c.repository_model_load(with_config).await.unwrap_err();
        assert!(
            status.message().contains("parameter `config`"),
            "{}",
            status.message()
        );
    });
}

/// The gRPC side of the access rules: a restricted group needs its metadata key, and the default
/// control mode refuses loads and unloads, both with PERMISSION_DENIED.
#[test]
fn grpc_restricted_groups_and_the_control_mode_refuse_with_permission_denied() {
    let server = common::start_with(|o| {
        o.grpc_restricted = vec!["inference:x-epx-key=k1".parse().unwrap()];
    });
    runtime().block_on(async {
        let mut c = client(server.grpc).await;
        let status = c
            .model_infer(add_request(&[1.; 4], &[1.; 4]))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        assert!(
            status.message().contains("x-epx-key"),
            "{}",
            status.message()
        );
        let mut keyed = tonic::Request::new(add_request(&[1.; 4], &[1.; 4]));
        keyed
            .metadata_mut()
            .insert("x-epx-key", "k1".parse().unwrap());
        c.model_infer(keyed).await.unwrap();
        // Not restricted.
        c.server_live(pb::ServerLiveRequest {}).await.unwrap();
        let status = c
            .repository_model_unload(pb::RepositoryModelUnloadRequest {
                model_name: "add".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
        assert!(
            status.message().contains("--model-control-mode explicit"),
            "{}",
            status.message()
        );
    });
}
