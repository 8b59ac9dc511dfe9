//! `epx new-plugin NAME --lang rust|c`: writes a plugin folder that builds as it is and passes
//! `epx conformance` for its ops: the repository's example EP (float32 Relu, and Add of two
//! tensors of one shape) under the new name, its `plugin.toml`, a test model and a README.

use std::path::{Path, PathBuf};

use epx::onnx::proto;
use epx::{Error, Result};
use prost::Message;

/// The examples the scaffold is made from (the test suite builds and checks both as they are).
const RUST_SOURCE: &str = include_str!("../../../examples/rust-plugin/src/lib.rs");
const C_SOURCE: &str = include_str!("../../../examples/c-toy/epx_c_toy.c");
const PLUGIN_HEADER: &str = include_str!("../../../include/epx_plugin.h");

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    C,
}

#[derive(clap::Args)]
pub struct NewPluginArgs {
    /// The plugin's and its EP's name: lowercase letters, digits and `_`, starting with a letter.
    name: String,
    /// The language of the plugin.
    #[arg(long, value_enum)]
    lang: Lang,
    /// The folder to create the plugin folder `NAME` in.
    #[arg(long, default_value = ".", value_name = "DIR")]
    dir: PathBuf,
    /// (Rust) The SDK's `plugin-api` folder, for the crate's path dependency (default: the one
    /// shipped beside this `epx` in the wheel or the bundle, or of the checkout it was built in).
    #[arg(long, value_name = "DIR")]
    sdk: Option<PathBuf>,
}

pub fn new_plugin(args: NewPluginArgs) -> Result<()> {
    let name = &args.name;
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid {
        return Err(Error::InvalidInput(format!(
            "`{name}` is not a plugin name: use lowercase letters, digits and `_`, starting with a \
             letter"
        )));
    }
    let root = args.dir.join(name);
    if root.exists() {
        return Err(Error::InvalidInput(format!(
            "{} exists already; choose another name or --dir",
            root.display()
        )));
    }
    let lib = format!("libepx_{name}.so");
    let (files, build): (Vec<(PathBuf, String)>, String) = match args.lang {
        Lang::Rust => {
            let sdk = sdk_path(args.sdk.as_deref())?;
            let cargo = format!(
                "[package]\nname = \"epx-{crate_name}\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
                 [lib]\nname = \"epx_{name}\"\ncrate-type = [\"cdylib\"]\n\n\
                 [dependencies]\nepx-plugin-api = {{ path = {sdk:?} }}\n\n\
                 # A workspace of its own, wherever the folder is put.\n[workspace]\n",
                crate_name = name.replace('_', "-"),
                sdk = sdk.display().to_string(),
            );
            let source = RUST_SOURCE
                .replace("`toy`", &format!("`{name}`"))
                .replace("\"toy\"", &format!("\"{name}\""));
            (
                vec![
                    (PathBuf::from("Cargo.toml"), cargo),
                    (PathBuf::from("src/lib.rs"), source),
                ],
                format!("cargo build --release && cp target/release/{lib} ."),
            )
        }
        Lang::C => {
            let file = format!("epx_{name}.c");
            let source = C_SOURCE
                .replace(
                    "-I include examples/c-toy/epx_c_toy.c -o libepx_c_toy.so",
                    &format!("-I . {file} -o {lib}"),
                )
                .replace("epx_c_toy.c", &file)
                .replace("toy_c", name);
            (
                vec![
                    (PathBuf::from(&file), source),
                    (PathBuf::from("epx_plugin.h"), PLUGIN_HEADER.to_string()),
                ],
                format!("cc -std=c11 -O2 -shared -fPIC -I . {file} -o {lib}"),
            )
        }
    };
    let manifest = format!(
        "name = \"{name}\"\nversion = \"0.1.0\"\nabi = \"{abi}\"\n\
         description = \"{name}: float32 Relu, and Add of two tensors of one shape\"\n\
         providers = [\"{name}\"]\n\n[library]\nlinux = \"{lib}\"\n",
        abi = epx::plugin_abi_version()
    );
    let readme = format!(
        "# {name}\n\nAn epx execution provider, made by `epx new-plugin`: float32 Relu, and Add \
         of two tensors of one static shape. Change the ops it claims and runs, and keep it \
         passing `epx conformance`.\n\n\
         Build, from this folder (the library goes next to `plugin.toml`, which makes this folder \
         a plugin folder):\n\n    {build}\n\n\
         Check it:\n\n    epx --plugin-dir . doctor\n    epx --plugin-dir . conformance --ep {name} \
         --filter test_relu,test_add --model models/relu_add.onnx\n    epx --plugin-dir . run \
         models/relu_add.onnx --ep {name}\n\n\
         The node tests come from the epx repository (`bash tests/fetch-testdata.sh`, or pass \
         `--node-tests` with the `onnx/backend/test/data/node` folder of an onnx wheel). The \
         contract is docs/ABI.md of epx.\n"
    );
    let mut all = files;
    all.push((PathBuf::from("plugin.toml"), manifest));
    all.push((PathBuf::from("README.md"), readme));
    for (path, text) in &all {
        write(&root.join(path), text.as_bytes())?;
    }
    write(&root.join("models/relu_add.onnx"), &test_model())?;
    println!(
        "created {} ({} files); build it with:",
        root.display(),
        all.len() + 1
    );
    println!("    cd {} && {build}", root.display());
    Ok(())
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::write(path, bytes).map_err(io)
}

/// Where the SDK's source is looked for, beside this executable: the wheel's
/// (`epx/bin/epx` → `epx/sdk/plugin-api`), the bundle's (`bin/epx` →
/// `share/epx/sdk/plugin-api`), then the `plugin-api` folder of the checkout it was built in.
fn sdk_candidates(exe: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(bin) = exe.parent() {
        out.push(bin.join("../sdk/plugin-api"));
        out.push(bin.join("../share/epx/sdk/plugin-api"));
    }
    out.extend(exe.ancestors().skip(1).map(|a| a.join("plugin-api")));
    out
}

/// `--sdk`, or the SDK shipped with this executable ([`sdk_candidates`]).
fn sdk_path(given: Option<&Path>) -> Result<PathBuf> {
    let sdk = match given {
        Some(p) => p.to_path_buf(),
        None => {
            let exe = std::env::current_exe().map_err(|source| Error::Io {
                path: PathBuf::from("/proc/self/exe"),
                source,
            })?;
            let exe = exe.canonicalize().unwrap_or(exe);
            let candidates = sdk_candidates(&exe);
            match candidates.iter().find(|p| p.join("Cargo.toml").is_file()) {
                Some(found) => found.clone(),
                None => {
                    let looked: Vec<String> = candidates
                        .iter()
                        .take(3)
                        .map(|p| p.display().to_string())
                        .collect();
                    return Err(Error::InvalidInput(format!(
                        "epx's Rust plugin SDK (`plugin-api`) is not beside this epx (looked in \
                         {} and the folders above it); pass --sdk with the `plugin-api` folder of \
                         an epx checkout, bundle (share/epx/sdk/plugin-api) or wheel \
                         (epx/sdk/plugin-api)",
                        looked.join(", ")
                    )));
                }
            }
        }
    };
    std::fs::canonicalize(&sdk).map_err(|source| Error::Io { path: sdk, source })
}

/// `x` [2, 3] → Relu → r; y = Add(r, x): the two ops the scaffold claims.
fn test_model() -> Vec<u8> {
    let tensor = |name: &str| proto::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(proto::TypeProto {
            value: Some(proto::type_proto::Value::TensorType(
                proto::type_proto::Tensor {
                    elem_type: Some(1),
                    shape: Some(proto::TensorShapeProto {
                        dim: [2, 3]
                            .iter()
                            .map(|&d| proto::tensor_shape_proto::Dimension {
                                value: Some(proto::tensor_shape_proto::dimension::Value::DimValue(
                                    d,
                                )),
                                denotation: None,
                            })
                            .collect(),
                    }),
                },
            )),
            denotation: None,
        }),
        ..Default::default()
    };
    let node = |op: &str, inputs: &[&str], output: &str| proto::NodeProto {
        name: Some(format!("{op}_{output}")),
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    };
    proto::ModelProto {
        ir_version: Some(8),
        producer_name: Some("epx new-plugin".into()),
        opset_import: vec![proto::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(proto::GraphProto {
            name: Some("relu_add".into()),
            node: vec![node("Relu", &["x"], "r"), node("Add", &["r", "x"], "y")],
            input: vec![tensor("x")],
            output: vec![tensor("y")],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}
