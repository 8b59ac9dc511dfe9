//! `include/epx_plugin.h` is generated from the ABI modules of `epx-plugin-api` by the cbindgen
//! version pinned in `tests/Cargo.toml`, with `plugin-api/cbindgen.toml`. This test regenerates
//! it and compares it with the committed file, then checks that the header compiles as C and C++.
//!
//! After changing the ABI, rewrite the header with
//!
//!     EPX_UPDATE_HEADERS=1 cargo test -p epx-tests --test headers

use std::path::{Path, PathBuf};
use std::process::Command;

use epx_tests::{TempDir, repo_root};

const UPDATE_VAR: &str = "EPX_UPDATE_HEADERS";
const UPDATE_COMMAND: &str = "EPX_UPDATE_HEADERS=1 cargo test -p epx-tests --test headers";

/// The ABI modules the header describes, relative to the repository. The SDK (`src/sdk/`) is
/// left out on purpose: it is Rust-only.
const ABI_SOURCES: [&str; 3] = [
    "plugin-api/src/abi.rs",
    "plugin-api/src/dlpack.rs",
    "plugin-api/src/dtype.rs",
];

fn header_path() -> PathBuf {
    repo_root().join("include").join("epx_plugin.h")
}

/// The header as the pinned cbindgen makes it now.
fn generate_header() -> String {
    let root = repo_root();
    let config_path = root.join("plugin-api").join("cbindgen.toml");
    let config = cbindgen::Config::from_file(&config_path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", config_path.display()));
    let mut builder = cbindgen::Builder::new().with_config(config);
    for src in ABI_SOURCES {
        builder = builder.with_src(root.join(src));
    }
    let bindings = builder
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen failed on {ABI_SOURCES:?}: {e}"));
    let mut bytes = Vec::new();
    bindings.write(&mut bytes);
    String::from_utf8(bytes).expect("cbindgen writes UTF-8")
}

/// The first line where `a` and `b` differ (1-based), with both versions of it.
fn first_difference(a: &str, b: &str) -> String {
    let mut la = a.lines();
    let mut lb = b.lines();
    let mut n = 1;
    loop {
        match (la.next(), lb.next()) {
            (Some(x), Some(y)) if x == y => n += 1,
            (None, None) => return "only in line endings".into(),
            (x, y) => {
                return format!(
                    "line {n}:\n  committed: {}\n  generated: {}",
                    x.unwrap_or("<end of file>"),
                    y.unwrap_or("<end of file>")
                );
            }
        }
    }
}

#[test]
fn committed_header_matches_the_abi() {
    let generated = generate_header();
    let path = header_path();
    if std::env::var_os(UPDATE_VAR).is_some_and(|v| !v.is_empty() && v != "0") {
        std::fs::create_dir_all(path.parent().expect("include/ has a parent"))
            .expect("create include/");
        std::fs::write(&path, &generated)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        eprintln!("{UPDATE_VAR} is set: rewrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "reading {}: {e}; generate it with `{UPDATE_COMMAND}`",
            path.display()
        )
    });
    assert!(
        committed == generated,
        "{} is out of date with the ABI in plugin-api/src (first difference at {}).\n\
         Regenerate it with `{UPDATE_COMMAND}` and commit the result.",
        path.display(),
        first_difference(&committed, &generated)
    );
}

#[test]
fn generated_header_has_the_expected_declarations() {
    use epx_plugin_api::abi;
    let h = generate_header();
    // Values the config writes by hand or cbindgen copies: they must match the Rust constants.
    for needle in [
        format!(
            "#define EPX_ABI_VERSION_MAJOR {}",
            abi::EPX_ABI_VERSION_MAJOR
        ),
        format!(
            "#define EPX_ABI_VERSION_MINOR {}",
            abi::EPX_ABI_VERSION_MINOR
        ),
        format!(
            "#define EPX_ABI_VERSION_PATCH {}",
            abi::EPX_ABI_VERSION_PATCH
        ),
        format!(
            "#define EPX_PLUGIN_ENTRY_SYMBOL {:?}",
            abi::EPX_PLUGIN_ENTRY_SYMBOL
        ),
    ] {
        assert!(h.contains(&needle), "the header lacks `{needle}`:\n{h}");
    }
    for needle in [
        "#ifndef EPX_PLUGIN_H",
        "EPX_STATUS_CODE_FAIL = 1",
        "EPX_STATUS_CODE_ABI_MISMATCH = 9",
        "typedef struct EpxStatus *(*EpxPluginEntryFn)(",
        "struct EpxStatus *epx_plugin_entry(const struct EpxHostApi *host,",
        "typedef struct EpxGraph EpxGraph;",
        "typedef struct DLTensor {",
    ] {
        assert!(h.contains(needle), "the header lacks `{needle}`:\n{h}");
    }
    // Nothing of the Rust SDK, and no Rust-only constant, leaks into the header.
    for absent in [
        "ProviderOptions",
        "ProviderInfo",
        "TensorView",
        "GraphView",
        "SubgraphView",
        "KernelContext<",
        "export_plugin",
        "SIZE_1_0",
        "_CURRENT",
        "_ALL",
        "DLDevice_CPU",
    ] {
        assert!(!h.contains(absent), "the header contains `{absent}`");
    }
}

/// Whether `tool` can be run (`tool --version` succeeds).
fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Compiles `source` (written to `dir/name`) with `compiler` and `flags`, `-I include`.
fn compile(compiler: &str, flags: &[&str], dir: &Path, name: &str, source: &str) {
    let src = dir.join(name);
    std::fs::write(&src, source).expect("write test source");
    let obj = dir.join(format!("{name}.o"));
    let include = repo_root().join("include");
    let out = Command::new(compiler)
        .args(flags)
        .arg("-I")
        .arg(&include)
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .output()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} {} failed on a file including epx_plugin.h:\n{}{}",
        flags.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(obj.is_file(), "{compiler} made no {}", obj.display());
}

/// Includes the header twice (the include guard) and uses a few of its declarations, so a
/// compiler sees every type at least once.
const USES_HEADER: &str = r#"#include "epx_plugin.h"
#include "epx_plugin.h"

static EpxStatus *entry(const EpxHostApi *host, EpxPluginDescriptor **out) {
    (void)host;
    *out = NULL;
    return NULL;
}

int epx_header_check(void);
int epx_header_check(void) {
    EpxPluginEntryFn f = entry;
    EpxPluginEntryFn declared = epx_plugin_entry;
    EpxProvider provider;
    EpxKernel kernel;
    EpxHostApi host;
    EpxPluginDescriptor descriptor;
    EpxProviderFactory factory;
    EpxNodeInfo node;
    EpxValueInfo value;
    EpxAttribute attribute;
    EpxSubgraph subgraph;
    EpxCapability capability;
    EpxBuffer buffer;
    DLTensor tensor;
    EpxStatusCode code = EPX_STATUS_CODE_RUNTIME_ERROR;
    EpxLogLevel level = EPX_LOG_LEVEL_WARN;
    EpxAttributeKind kind = EPX_ATTRIBUTE_KIND_FLOATS;
    DLDeviceType device = DL_DEVICE_TYPE_EXT_DEV;
    DLDataTypeCode type_code = DL_DATA_TYPE_CODE_FLOAT;
    EpxElementType element = EPX_ELEMENT_TYPE_FLOAT;
    size_t sizes = sizeof provider + sizeof kernel + sizeof host + sizeof descriptor
        + sizeof factory + sizeof node + sizeof value + sizeof attribute + sizeof subgraph
        + sizeof capability + sizeof buffer + sizeof tensor;
    const char *symbol = EPX_PLUGIN_ENTRY_SYMBOL;
    return (int)(sizes + EPX_ABI_VERSION_MAJOR + EPX_ABI_VERSION_MINOR + EPX_ABI_VERSION_PATCH
        + code + level + kind + (unsigned)device + type_code + (unsigned)element
        + (EPX_VALUE_NONE != 0) + EPX_VALUE_GRAPH_INPUT + EPX_VALUE_GRAPH_OUTPUT
        + EPX_VALUE_INITIALIZER + EPX_PROVIDER_CONCURRENT_KERNELS
        + (f != NULL) + (declared != NULL) + (symbol[0] == 'e'));
}
"#;

#[test]
fn header_compiles_as_c11_and_cpp17() {
    let dir = TempDir::new("headers").expect("temp dir");
    if have("cc") {
        compile(
            "cc",
            &["-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror"],
            dir.path(),
            "uses_header.c",
            USES_HEADER,
        );
    } else {
        eprintln!("skipping the C compile check: `cc` was not found");
    }
    if have("c++") {
        compile(
            "c++",
            &["-std=c++17", "-Wall", "-Wextra", "-Wpedantic", "-Werror"],
            dir.path(),
            "uses_header.cpp",
            USES_HEADER,
        );
    } else {
        eprintln!("skipping the C++ compile check: `c++` was not found");
    }
}

/// `(name, size, align, last field, offset of that field)` of every struct, as Rust lays it out.
macro_rules! rust_layouts {
    ($($ty:ident . $last:ident),* $(,)?) => {
        vec![$((
            stringify!($ty),
            std::mem::size_of::<$ty>(),
            std::mem::align_of::<$ty>(),
            stringify!($last),
            std::mem::offset_of!($ty, $last),
        )),*]
    };
}

#[test]
fn c_layout_matches_rust() {
    use epx_plugin_api::abi::*;
    use epx_plugin_api::dlpack::*;
    if !have("cc") {
        eprintln!("skipping the layout check: `cc` was not found");
        return;
    }
    let layouts = rust_layouts![
        EpxVersion.patch,
        EpxStr.len,
        EpxStatus.release,
        EpxBuffer.private_data,
        EpxNodeInfo.num_attributes,
        EpxValueInfo.producer,
        EpxAttribute.tensor,
        EpxSubgraph.outputs,
        EpxCapability.private_data,
        EpxHostApi.kernel_output,
        EpxKernel.release,
        EpxProvider.release,
        EpxProviderFactory.create,
        EpxPluginDescriptor.release,
        DLDevice.device_id,
        DLDataType.lanes,
        DLTensor.byte_offset,
    ];
    let mut source = String::from(
        "#include <stdio.h>\n#include <stdalign.h>\n#include \"epx_plugin.h\"\nint main(void) {\n",
    );
    for (name, _, _, last, _) in &layouts {
        source.push_str(&format!(
            "    printf(\"{name} %zu %zu {last} %zu\\n\", sizeof({name}), alignof({name}), \
             offsetof({name}, {last}));\n"
        ));
    }
    source.push_str("    return 0;\n}\n");
    let dir = TempDir::new("headers-layout").expect("temp dir");
    let src = dir.path().join("layout.c");
    let exe = dir.path().join("layout");
    std::fs::write(&src, source).expect("write layout.c");
    let out = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(repo_root().join("include"))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "layout.c does not compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe)
        .output()
        .expect("running the layout program");
    assert!(run.status.success());
    let c = String::from_utf8(run.stdout).expect("ASCII output");
    let rust: Vec<String> = layouts
        .iter()
        .map(|(name, size, align, last, offset)| format!("{name} {size} {align} {last} {offset}"))
        .collect();
    let c: Vec<&str> = c.lines().collect();
    assert_eq!(
        c, rust,
        "C (left) and Rust (right) disagree on struct layout"
    );
}
