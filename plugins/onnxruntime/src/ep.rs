//! The ONNX Runtime execution providers this adapter fronts: their epx names, ORT's names, where
//! they can run, their option keys, and how each is registered on an ORT session.

use ort::ep::{self, ArbitrarilyConfigurableExecutionProvider, ExecutionProviderDispatch};

/// One ONNX Runtime execution provider, served as its own epx EP (one thin plugin crate each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OrtEp {
    Cpu,
    Cuda,
    TensorRt,
    TensorRtRtx,
    OpenVino,
    DirectMl,
    CoreMl,
    Qnn,
    Rocm,
    MiGraphX,
    Dnnl,
    Xnnpack,
    WebGpu,
    Nnapi,
    Acl,
    ArmNn,
    Cann,
    VitisAi,
    Rknpu,
    Azure,
}

/// Where an EP can run: `(os, arch)` pairs as `std::env::consts::{OS, ARCH}` spell them, `"*"`
/// matching any.
#[derive(Clone, Copy, Debug)]
pub struct Platforms {
    pub pairs: &'static [(&'static str, &'static str)],
    /// Said to the user when this machine is not among `pairs`.
    pub needs: &'static str,
}

impl Platforms {
    pub fn allows(&self, os: &str, arch: &str) -> bool {
        self.pairs
            .iter()
            .any(|&(o, a)| (o == "*" || o == os) && (a == "*" || a == arch))
    }
}

/// Option keys every adapter EP takes besides its ORT keys.
pub const ADAPTER_KEYS: &[&str] = &["library", "ops"];

impl OrtEp {
    pub const ALL: [OrtEp; 20] = [
        OrtEp::Cpu,
        OrtEp::Cuda,
        OrtEp::TensorRt,
        OrtEp::TensorRtRtx,
        OrtEp::OpenVino,
        OrtEp::DirectMl,
        OrtEp::CoreMl,
        OrtEp::Qnn,
        OrtEp::Rocm,
        OrtEp::MiGraphX,
        OrtEp::Dnnl,
        OrtEp::Xnnpack,
        OrtEp::WebGpu,
        OrtEp::Nnapi,
        OrtEp::Acl,
        OrtEp::ArmNn,
        OrtEp::Cann,
        OrtEp::VitisAi,
        OrtEp::Rknpu,
        OrtEp::Azure,
    ];

    /// The memory the EP keeps its tensors in. CUDA and TensorRT share ORT's CUDA allocator;
    /// the others declare host memory (ORT copies to their device inside each kernel).
    pub fn memory(self) -> crate::Memory {
        match self {
            OrtEp::Cuda | OrtEp::TensorRt => crate::Memory::Cuda,
            _ => crate::Memory::Host,
        }
    }

    /// The epx EP name (also the plugin name and the `epx_<name>` library name).
    pub fn epx_name(self) -> &'static str {
        match self {
            OrtEp::Cpu => "ort_cpu",
            OrtEp::Cuda => "cuda",
            OrtEp::TensorRt => "tensorrt",
            OrtEp::TensorRtRtx => "tensorrt_rtx",
            OrtEp::OpenVino => "ort_openvino",
            OrtEp::DirectMl => "directml",
            OrtEp::CoreMl => "coreml",
            OrtEp::Qnn => "qnn",
            OrtEp::Rocm => "rocm",
            OrtEp::MiGraphX => "migraphx",
            OrtEp::Dnnl => "dnnl",
            OrtEp::Xnnpack => "xnnpack",
            OrtEp::WebGpu => "webgpu",
            OrtEp::Nnapi => "nnapi",
            OrtEp::Acl => "acl",
            OrtEp::ArmNn => "armnn",
            OrtEp::Cann => "cann",
            OrtEp::VitisAi => "vitisai",
            OrtEp::Rknpu => "rknpu",
            OrtEp::Azure => "azure",
        }
    }

    /// ONNX Runtime's name, as `GetAvailableProviders` lists it.
    pub fn ort_name(self) -> &'static str {
        match self {
            OrtEp::Cpu => "CPUExecutionProvider",
            OrtEp::Cuda => "CUDAExecutionProvider",
            OrtEp::TensorRt => "TensorrtExecutionProvider",
            OrtEp::TensorRtRtx => "NvTensorRTRTXExecutionProvider",
            OrtEp::OpenVino => "OpenVINOExecutionProvider",
            OrtEp::DirectMl => "DmlExecutionProvider",
            OrtEp::CoreMl => "CoreMLExecutionProvider",
            OrtEp::Qnn => "QNNExecutionProvider",
            OrtEp::Rocm => "ROCMExecutionProvider",
            OrtEp::MiGraphX => "MIGraphXExecutionProvider",
            OrtEp::Dnnl => "DnnlExecutionProvider",
            OrtEp::Xnnpack => "XnnpackExecutionProvider",
            OrtEp::WebGpu => "WebGpuExecutionProvider",
            OrtEp::Nnapi => "NnapiExecutionProvider",
            OrtEp::Acl => "ACLExecutionProvider",
            OrtEp::ArmNn => "ArmNNExecutionProvider",
            OrtEp::Cann => "CANNExecutionProvider",
            OrtEp::VitisAi => "VitisAIExecutionProvider",
            OrtEp::Rknpu => "RknpuExecutionProvider",
            OrtEp::Azure => "AzureExecutionProvider",
        }
    }

    /// Vendor, for `ProviderInfo`.
    pub fn vendor(self) -> &'static str {
        match self {
            OrtEp::Cpu | OrtEp::Azure | OrtEp::DirectMl => "Microsoft (ONNX Runtime)",
            OrtEp::Cuda | OrtEp::TensorRt | OrtEp::TensorRtRtx => "NVIDIA (ONNX Runtime)",
            OrtEp::OpenVino | OrtEp::Dnnl => "Intel (ONNX Runtime)",
            OrtEp::CoreMl => "Apple (ONNX Runtime)",
            OrtEp::Qnn => "Qualcomm (ONNX Runtime)",
            OrtEp::Rocm | OrtEp::MiGraphX | OrtEp::VitisAi => "AMD (ONNX Runtime)",
            OrtEp::Xnnpack | OrtEp::WebGpu | OrtEp::Nnapi => "Google (ONNX Runtime)",
            OrtEp::Acl | OrtEp::ArmNn => "Arm (ONNX Runtime)",
            OrtEp::Cann => "Huawei (ONNX Runtime)",
            OrtEp::Rknpu => "Rockchip (ONNX Runtime)",
        }
    }

    /// The OS/architecture pairs ONNX Runtime builds this EP for (its build docs and released
    /// packages).
    pub fn platforms(self) -> Platforms {
        const DESKTOP: &[(&str, &str)] = &[("linux", "*"), ("windows", "*"), ("macos", "*")];
        match self {
            OrtEp::Cpu | OrtEp::Xnnpack => Platforms {
                pairs: &[("*", "*")],
                needs: "any OS",
            },
            OrtEp::Azure => Platforms {
                pairs: DESKTOP,
                needs: "Linux, Windows or macOS",
            },
            OrtEp::Cuda | OrtEp::TensorRt => Platforms {
                pairs: &[
                    ("linux", "x86_64"),
                    ("linux", "aarch64"),
                    ("windows", "x86_64"),
                ],
                needs: "Linux (x86-64 or Arm64/Jetson) or Windows x86-64 with an NVIDIA GPU",
            },
            OrtEp::TensorRtRtx => Platforms {
                pairs: &[("linux", "x86_64"), ("windows", "x86_64")],
                needs: "Linux or Windows on x86-64 with an NVIDIA RTX GPU",
            },
            OrtEp::OpenVino => Platforms {
                pairs: &[("linux", "x86_64"), ("windows", "x86_64")],
                needs: "Linux or Windows on x86-64 (Intel CPU, GPU or NPU)",
            },
            OrtEp::DirectMl => Platforms {
                pairs: &[("windows", "*")],
                needs: "Windows (DirectX 12)",
            },
            OrtEp::CoreMl => Platforms {
                pairs: &[("macos", "*"), ("ios", "*")],
                needs: "macOS or iOS",
            },
            OrtEp::Qnn => Platforms {
                pairs: &[
                    ("android", "aarch64"),
                    ("linux", "aarch64"),
                    ("windows", "aarch64"),
                    // QNN's CPU and HTP-simulator backends run on x86-64 hosts.
                    ("windows", "x86_64"),
                    ("linux", "x86_64"),
                ],
                needs: "a Qualcomm Snapdragon device (Android, Linux or Windows on Arm64), or an \
                        x86-64 host with QNN's simulator backends",
            },
            OrtEp::Rocm => Platforms {
                pairs: &[("linux", "x86_64")],
                needs: "Linux x86-64 with an AMD GPU",
            },
            OrtEp::MiGraphX => Platforms {
                pairs: &[("linux", "x86_64"), ("windows", "x86_64")],
                needs: "Linux or Windows on x86-64 with an AMD GPU",
            },
            OrtEp::Dnnl => Platforms {
                pairs: &[
                    ("linux", "x86_64"),
                    ("linux", "aarch64"),
                    ("windows", "x86_64"),
                ],
                needs: "Linux (x86-64 or Arm64) or Windows x86-64",
            },
            OrtEp::WebGpu => Platforms {
                pairs: &[
                    ("windows", "*"),
                    ("macos", "*"),
                    ("linux", "*"),
                    ("android", "*"),
                    ("ios", "*"),
                ],
                needs: "Windows, macOS, Linux, Android or iOS with a WebGPU-capable GPU (Dawn)",
            },
            OrtEp::Nnapi => Platforms {
                pairs: &[("android", "*")],
                needs: "Android (8.1 or newer)",
            },
            OrtEp::Acl | OrtEp::ArmNn => Platforms {
                pairs: &[
                    ("linux", "aarch64"),
                    ("linux", "arm"),
                    ("android", "aarch64"),
                    ("android", "arm"),
                ],
                needs: "an Arm CPU (Linux or Android on Arm64 or 32-bit Arm)",
            },
            OrtEp::Cann => Platforms {
                pairs: &[("linux", "aarch64"), ("linux", "x86_64")],
                needs: "Linux (Arm64 or x86-64) with a Huawei Ascend NPU",
            },
            OrtEp::VitisAi => Platforms {
                pairs: &[
                    ("windows", "x86_64"),
                    ("linux", "x86_64"),
                    ("linux", "aarch64"),
                ],
                needs: "Windows x86-64 (Ryzen AI) or Linux (x86-64 or Arm64) with an AMD/Xilinx \
                        accelerator",
            },
            OrtEp::Rknpu => Platforms {
                pairs: &[("linux", "aarch64"), ("linux", "arm")],
                needs: "Linux on a Rockchip SoC with an NPU (Arm64 or 32-bit Arm)",
            },
        }
    }

    /// The ORT option keys this EP accepts (passed through to ORT as strings).
    pub fn option_keys(self) -> &'static [&'static str] {
        match self {
            OrtEp::Cpu => &["intra_op_num_threads"],
            OrtEp::Cuda => &[
                "device_id",
                "gpu_mem_limit",
                "arena_extend_strategy",
                "cudnn_conv_algo_search",
                "do_copy_in_default_stream",
                "cudnn_conv_use_max_workspace",
                "cudnn_conv1d_pad_to_nc1d",
                "enable_cuda_graph",
                "use_tf32",
                "prefer_nhwc",
            ],
            OrtEp::TensorRt => &[
                "device_id",
                "trt_fp16_enable",
                "trt_int8_enable",
                "trt_engine_cache_enable",
                "trt_engine_cache_path",
                "trt_max_workspace_size",
                "trt_min_subgraph_size",
                "trt_max_partition_iterations",
                "trt_timing_cache_enable",
                "trt_timing_cache_path",
                "trt_dla_enable",
                "trt_dla_core",
                "trt_builder_optimization_level",
                "trt_cuda_graph_enable",
            ],
            OrtEp::TensorRtRtx => &[
                "device_id",
                "enable_cuda_graph",
                "nv_max_workspace_size",
                "nv_runtime_cache_path",
                "nv_profile_min_shapes",
                "nv_profile_max_shapes",
                "nv_profile_opt_shapes",
            ],
            OrtEp::OpenVino => &[
                "device_type",
                "num_of_threads",
                "precision",
                "cache_dir",
                "num_streams",
                "enable_qdq_optimizer",
            ],
            OrtEp::DirectMl => &["device_id"],
            OrtEp::CoreMl => &[
                "MLComputeUnits",
                "ModelFormat",
                "RequireStaticInputShapes",
                "EnableOnSubgraphs",
                "ModelCacheDirectory",
            ],
            OrtEp::Qnn => &[
                "backend_path",
                "htp_performance_mode",
                "soc_model",
                "htp_arch",
                "device_id",
                "enable_htp_fp16_precision",
                "profiling_level",
            ],
            OrtEp::Rocm => &[
                "device_id",
                "gpu_mem_limit",
                "arena_extend_strategy",
                "miopen_conv_exhaustive_search",
                "do_copy_in_default_stream",
                "tunable_op_enable",
            ],
            OrtEp::MiGraphX => &[
                "device_id",
                "migraphx_fp16_enable",
                "migraphx_int8_enable",
                "migraphx_exhaustive_tune",
            ],
            OrtEp::Dnnl => &["use_arena"],
            OrtEp::Xnnpack => &["intra_op_num_threads"],
            OrtEp::WebGpu => &["deviceId", "preferredLayout", "enableGraphCapture"],
            OrtEp::Nnapi => &["use_fp16", "use_nchw", "cpu_disabled", "cpu_only"],
            OrtEp::Acl => &["enable_fast_math"],
            OrtEp::ArmNn => &["use_arena"],
            OrtEp::Cann => &[
                "device_id",
                "npu_mem_limit",
                "arena_extend_strategy",
                "enable_cann_graph",
                "precision_mode",
            ],
            OrtEp::VitisAi => &["config_file", "cache_dir", "cache_key"],
            OrtEp::Rknpu => &[],
            OrtEp::Azure => &[],
        }
    }

    /// Session-level keys (applied to the ORT session, not to the EP).
    pub fn session_keys(self) -> &'static [&'static str] {
        match self {
            OrtEp::Cpu => &["intra_op_num_threads"],
            _ => &[],
        }
    }

    /// The EP to register on a session, configured with `options` (keys from
    /// [`option_keys`](Self::option_keys) minus the session keys, values as the user gave them).
    pub fn dispatch(
        self,
        options: &[(String, String)],
    ) -> Result<ExecutionProviderDispatch, String> {
        fn arbitrary<E: ArbitrarilyConfigurableExecutionProvider>(
            mut ep: E,
            options: &[(String, String)],
        ) -> E {
            for (k, v) in options {
                ep = ep.with_arbitrary_config(k, v);
            }
            ep
        }
        let flag = |key: &str| -> Result<bool, String> {
            match options.iter().rev().find(|(k, _)| k == key) {
                None => Ok(false),
                Some((_, v)) => parse_bool(key, v),
            }
        };
        let int = |key: &str| -> Result<Option<i32>, String> {
            match options.iter().rev().find(|(k, _)| k == key) {
                None => Ok(None),
                Some((_, v)) => v
                    .trim()
                    .parse()
                    .map(Some)
                    .map_err(|_| format!("option `{key}`: `{v}` is not an integer")),
            }
        };
        let d = match self {
            OrtEp::Cpu => ep::CPU::default().with_arena_allocator(true).build(),
            OrtEp::Cuda => arbitrary(ep::CUDA::default(), options).build(),
            OrtEp::TensorRt => arbitrary(ep::TensorRT::default(), options).build(),
            OrtEp::TensorRtRtx => arbitrary(ep::NVRTX::default(), options).build(),
            OrtEp::OpenVino => arbitrary(ep::OpenVINO::default(), options).build(),
            OrtEp::CoreMl => arbitrary(ep::CoreML::default(), options).build(),
            OrtEp::Qnn => arbitrary(ep::QNN::default(), options).build(),
            OrtEp::Rocm => arbitrary(ep::ROCm::default(), options).build(),
            OrtEp::Dnnl => arbitrary(ep::OneDNN::default(), options).build(),
            OrtEp::Xnnpack => arbitrary(ep::XNNPACK::default(), options).build(),
            OrtEp::WebGpu => arbitrary(ep::WebGPU::default(), options).build(),
            OrtEp::Cann => arbitrary(ep::CANN::default(), options).build(),
            OrtEp::VitisAi => arbitrary(ep::Vitis::default(), options).build(),
            OrtEp::Azure => arbitrary(ep::Azure::default(), options).build(),
            OrtEp::DirectMl => {
                let mut e = ep::DirectML::default();
                if let Some(id) = int("device_id")? {
                    e = e.with_device_id(id);
                }
                e.build()
            }
            OrtEp::MiGraphX => {
                let mut e = ep::MIGraphX::default()
                    .with_fp16(flag("migraphx_fp16_enable")?)
                    .with_int8(flag("migraphx_int8_enable")?)
                    .with_exhaustive_tune(flag("migraphx_exhaustive_tune")?);
                if let Some(id) = int("device_id")? {
                    e = e.with_device_id(id);
                }
                e.build()
            }
            OrtEp::Nnapi => ep::NNAPI::default()
                .with_fp16(flag("use_fp16")?)
                .with_nchw(flag("use_nchw")?)
                .with_disable_cpu(flag("cpu_disabled")?)
                .with_cpu_only(flag("cpu_only")?)
                .build(),
            OrtEp::Acl => ep::ACL::default()
                .with_fast_math(flag("enable_fast_math")?)
                .build(),
            #[allow(deprecated)]
            OrtEp::ArmNn => ep::ArmNN::default()
                .with_arena_allocator(flag("use_arena")?)
                .build(),
            OrtEp::Rknpu => ep::RKNPU::default().build(),
        };
        Ok(d.error_on_failure())
    }
}

fn parse_bool(key: &str, v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!(
            "option `{key}`: `{v}` is not a boolean (1/0, true/false)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_platforms_sensible() {
        let mut names: Vec<_> = OrtEp::ALL.iter().map(|e| e.epx_name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 20);
        assert!(OrtEp::DirectMl.platforms().allows("windows", "x86_64"));
        assert!(!OrtEp::DirectMl.platforms().allows("linux", "x86_64"));
        assert!(OrtEp::CoreMl.platforms().allows("macos", "aarch64"));
        assert!(!OrtEp::Nnapi.platforms().allows("linux", "aarch64"));
        assert!(OrtEp::Acl.platforms().allows("linux", "aarch64"));
        assert!(!OrtEp::Acl.platforms().allows("linux", "x86_64"));
        assert!(OrtEp::Cpu.platforms().allows("freebsd", "riscv64"));
    }

    #[test]
    fn option_keys_do_not_clash_with_adapter_keys() {
        for ep in OrtEp::ALL {
            for k in ep.option_keys() {
                assert!(!ADAPTER_KEYS.contains(k), "{k} of {}", ep.epx_name());
            }
        }
    }

    #[test]
    fn bools_parse() {
        assert_eq!(parse_bool("k", "1"), Ok(true));
        assert_eq!(parse_bool("k", "False"), Ok(false));
        assert!(parse_bool("k", "maybe").is_err());
    }
}
