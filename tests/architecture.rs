//! The host library's modules form layers: each stage (`value`, `model`, `plugin`, `session`,
//! `doctor`) and each module inside a stage names only modules that do not name it back, through
//! any chain. This test reads `host/core/src`, collects every `crate::a::b` path outside
//! comments and unit tests, and fails naming the modules of any cycle it finds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read host/core/src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file belongs to, cut to `depth` segments (`plugin/resolve/mod.rs` at depth 2 is
/// `plugin::resolve`).
fn module_of(src: &Path, file: &Path, depth: usize) -> String {
    let rel = file
        .strip_prefix(src)
        .expect("under src")
        .with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "tests")
    ) {
        parts.pop();
    }
    parts.truncate(depth);
    if parts.is_empty() {
        "crate".into()
    } else {
        parts.join("::")
    }
}

/// Source without line comments and without the `#[cfg(test)] mod tests` block at the end.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `crate::x::y` path and every `use crate::{x::y, z}` item, cut to `depth` segments.
fn references(code: &str, depth: usize) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let mut add = |path: &str| {
        let segs: Vec<&str> = path
            .split("::")
            .take_while(|s| !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_'))
            .take(depth)
            .collect();
        if !segs.is_empty() {
            refs.insert(segs.join("::"));
        }
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            let end = list.find("};").unwrap_or(list.len());
            for item in list[..end].split(',') {
                add(item.trim().trim_start_matches('{'));
            }
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            add(&rest[..end]);
        }
    }
    refs
}

/// The cycles of a directed graph: its strongly connected components with more than one node.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let nodes: Vec<&String> = edges.keys().collect();
    let reaches = |from: &String, to: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(n) = stack.pop() {
            for m in edges.get(n).into_iter().flatten() {
                if m == to {
                    return true;
                }
                if seen.insert(m) {
                    stack.push(m);
                }
            }
        }
        false
    };
    let mut out: Vec<Vec<String>> = Vec::new();
    for a in &nodes {
        if out.iter().any(|c| c.contains(a)) {
            continue;
        }
        let mut component: Vec<String> = nodes
            .iter()
            .filter(|b| *b != a && reaches(a, b) && reaches(b, a))
            .map(|b| (*b).clone())
            .collect();
        if !component.is_empty() {
            component.push((*a).clone());
            component.sort();
            out.push(component);
        }
    }
    out
}

fn module_graph(depth: usize) -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/core/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f, depth)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let from = module_of(&src, file, depth);
        let text = std::fs::read_to_string(file).expect("read source");
        let to = edges.entry(from.clone()).or_default();
        for r in references(&code_of(&text), depth) {
            if r != from && modules.contains(&r) && !from.starts_with(&format!("{r}::")) {
                to.insert(r);
            }
        }
    }
    edges
}

#[test]
fn host_modules_have_no_import_cycles() {
    for depth in [1, 2] {
        let edges = module_graph(depth);
        assert!(
            edges.contains_key("session") && edges.contains_key("plugin"),
            "the stage folders were not found: {:?}",
            edges.keys()
        );
        let found = cycles(&edges);
        assert!(
            found.is_empty(),
            "modules that import each other (depth {depth}): {found:?}\nedges: {edges:#?}"
        );
    }
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    edges.entry("a".into()).or_default().insert("b".into());
    edges.entry("b".into()).or_default().insert("c".into());
    edges.entry("c".into()).or_default().insert("a".into());
    edges.entry("d".into()).or_default().insert("a".into());
    assert_eq!(
        cycles(&edges),
        vec![vec!["a".to_string(), "b".into(), "c".into()]]
    );
    let refs = references(
        "use crate::{plugin::admit, value::Value};\nlet x = crate::model::ir::Graph;",
        2,
    );
    assert_eq!(
        refs.into_iter().collect::<Vec<_>>(),
        ["model::ir", "plugin::admit", "value::Value"]
    );
}
