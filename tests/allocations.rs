//! The files that hold tensor data on the host side (values, the run, the C API's runs and
//! values, the CLI's run, the `.npy` and value-file codecs) allocate what an input or a model
//! sizes only through fallible reservations (`try_reserve_exact`, `Tensor::try_clone`), so an
//! address-space or container limit is an error, never an abort. `Tensor` is not `Clone`, so a
//! copy of one cannot be infallible; this test holds the rest: every `Vec::with_capacity(..)`
//! and `vec![..; n]` left in those files says on its line, or the line above, what bounds it
//! (`// bounded: ...`), and none is sized by tensor contents.

use std::path::Path;

use epx_tests::repo_root;

/// The files that move tensor data on the host side.
const FILES: &[&str] = &[
    "host/core/src/value/mod.rs",
    "host/core/src/value/tensor.rs",
    "host/core/src/value/device.rs",
    "host/core/src/value/dlpack.rs",
    "host/core/src/session/run.rs",
    "host/capi/src/run.rs",
    "host/capi/src/value.rs",
    "host/cli/src/run.rs",
    "host/io/src/npy.rs",
    "host/io/src/valuefile.rs",
];

/// Lines of `text` (outside its unit tests) that allocate with an infallible capacity and do not
/// say what bounds it, as `line number: text`.
fn unbounded(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        let sized_vec = code.find("vec![").is_some_and(|at| {
            // `vec![x; n]` with a count that is not a literal.
            let rest = &code[at..];
            rest.find(';').is_some_and(|semi| {
                let count = rest[semi + 1..].trim_start();
                !count.starts_with(|c: char| c.is_ascii_digit())
            })
        });
        if !(code.contains("with_capacity(") || sized_vec) {
            continue;
        }
        let said = |l: &str| l.contains("// bounded:");
        if said(line) || (i > 0 && said(lines[i - 1])) || (i > 1 && said(lines[i - 2])) {
            continue;
        }
        out.push(format!("{}: {}", i + 1, line.trim()));
    }
    out
}

#[test]
fn the_scan_finds_each_form_and_accepts_a_stated_bound() {
    let sample = "let a = Vec::with_capacity(n);\n\
                  let b = vec![0u8; len];\n\
                  let c = vec![0u8; 16];\n\
                  // bounded: one per model input\n\
                  let d = Vec::with_capacity(inputs.len());\n\
                  let e = HashSet::with_capacity(k); // bounded: k names\n\
                  #[cfg(test)]\n\
                  let f = Vec::with_capacity(n);\n";
    let found = unbounded(sample);
    assert_eq!(
        found,
        [
            "1: let a = Vec::with_capacity(n);",
            "2: let b = vec![0u8; len];"
        ]
    );
}

#[test]
fn host_tensor_data_is_allocated_fallibly() {
    let root = repo_root();
    let mut problems = Vec::new();
    for file in FILES {
        let text = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| {
            panic!("{file}: {e}");
        });
        for p in unbounded(&text) {
            problems.push(format!("{file}:{p}"));
        }
    }
    assert!(
        problems.is_empty(),
        "allocations sized without a stated bound (reserve fallibly, or say `// bounded: ...` \
         when the size is not a tensor's):\n{}",
        problems.join("\n")
    );
    assert!(Path::new(&root).join(FILES[0]).exists());
}
