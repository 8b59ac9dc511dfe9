//! Every crate of the workspace is built in levels: each file names only files of its own level
//! or lower, and no two files name each other through any chain (the one recursion allowed is
//! listed per crate). This test reads the sources, follows every form an import takes —
//! `crate::`, `super::` (repeated), `self::`, nested `{…}` groups, `as` renames, `pub use`
//! re-exports and paths written inline — and fails naming the files of any cycle and any import
//! against the level table. A self-test shows it catches each form.
//!
//! A file is a module (`a/b.rs` is `a::b`, `a/mod.rs` is `a`); the crate root (`lib.rs`) only
//! declares modules and re-exports, and is left out (a `#[macro_export]` macro lives there).
//! Re-exports (`pub use child::Item`) are a module's interface, as its `mod` declarations are, and
//! are not counted as its dependencies; everything else is, relative paths to child modules
//! (`child::f()`) included. Unit tests (a `#[cfg(test)] mod tests` block at the end of a file)
//! are left out: they may use anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;
type Graph = BTreeMap<Module, BTreeSet<Module>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module of a file: `a/b.rs` → `[a, b]`, `a/mod.rs` → `[a]`, `lib.rs` → `[]`.
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file
        .strip_prefix(src)
        .expect("under src")
        .with_extension("");
    let mut parts: Module = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Source without comments, string literals and the unit tests at the end of the file.
fn code_of(text: &str) -> String {
    // `#[cfg(test)]`, `#[cfg(all(test, unix))]`, ... followed by `mod tests`.
    let cut = text.match_indices("mod tests").find_map(|(i, _)| {
        let before = text[..i].trim_end();
        let attr = before.rfind("#[cfg(")?;
        (before.ends_with(")]") && before[attr..].contains("test")).then_some(attr)
    });
    let text = match cut {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
            }
            b'"' => {
                // A string: skipped with its escapes (raw strings hold no paths worth following).
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
                out.push_str("\"\"");
            }
            b'\'' if b.get(i + 2) == Some(&b'\'') => {
                // A char literal such as '{' or '"'.
                out.push_str("' '");
                i += 3;
            }
            c => {
                out.push(c as char);
                i += 1;
            }
        }
    }
    out
}

/// The paths of a `use` tree (`a::{b, c::{d as e, self}}` → `a::b`, `a::c::d`, `a::c`).
fn expand_use(tree: &str) -> Vec<String> {
    fn rec(prefix: &str, tree: &str, out: &mut Vec<String>) {
        let tree = tree.trim();
        if tree.is_empty() {
            return;
        }
        if let Some(open) = tree.find('{') {
            let head = tree[..open].trim().trim_end_matches("::");
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let base = join(prefix, head);
            let mut depth = 0;
            let mut start = 0;
            for (k, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        rec(&base, &inner[start..k], out);
                        start = k + 1;
                    }
                    _ => {}
                }
            }
            rec(&base, &inner[start..], out);
        } else {
            let path = tree.split(" as ").next().unwrap_or(tree).trim();
            let path = path.strip_suffix("::*").unwrap_or(path);
            if path == "self" {
                out.push(prefix.to_string());
            } else {
                out.push(join(prefix, path));
            }
        }
    }
    fn join(a: &str, b: &str) -> String {
        match (a.is_empty(), b.is_empty()) {
            (true, _) => b.to_string(),
            (_, true) => a.to_string(),
            _ => format!("{a}::{b}"),
        }
    }
    let mut out = Vec::new();
    rec("", tree, &mut out);
    out
}

/// The module a path names, seen from module `at` of a crate whose modules are `modules`: the
/// longest module prefix of its absolute form; `None` for another crate's path or an item of the
/// crate root.
fn resolve(at: &Module, path: &str, modules: &BTreeSet<Module>) -> Option<Module> {
    let segs: Vec<&str> = path
        .split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let (mut abs, rest): (Module, &[&str]) = match segs.first() {
        Some(&"crate") => (Vec::new(), &segs[1..]),
        Some(&"self") => (at.clone(), &segs[1..]),
        Some(&"super") => {
            let mut m = at.clone();
            let mut k = 0;
            while segs.get(k) == Some(&"super") {
                m.pop();
                k += 1;
            }
            (m, &segs[k..])
        }
        // A path relative to this module (`use child::x`, `child::f()`): its child modules.
        Some(first) if modules.contains(&[at.as_slice(), &[first.to_string()]].concat()) => {
            (at.clone(), &segs[..])
        }
        _ => return None,
    };
    abs.extend(rest.iter().map(|s| s.to_string()));
    (1..=abs.len())
        .rev()
        .map(|n| abs[..n].to_vec())
        .find(|m| modules.contains(m))
}

/// The inline modules of a file (`mod name { ... }`): their span in `code` and name.
fn inline_modules(code: &str) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices("mod ") {
        if code[..i]
            .chars()
            .last()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let rest = &code[i + 4..];
        let name_len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let after = rest[name_len..].trim_start();
        if name_len == 0 || !after.starts_with('{') {
            continue;
        }
        let open = i + 4 + name_len + (rest[name_len..].len() - after.len());
        let mut depth = 0;
        let mut end = code.len();
        for (k, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + k;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push((open, end, rest[..name_len].to_string()));
    }
    out
}

/// Every module each file names.
fn graph_of(sources: &[(Module, String)]) -> Graph {
    let modules: BTreeSet<Module> = sources.iter().map(|(m, _)| m.clone()).collect();
    let mut graph = Graph::new();
    for (m, text) in sources {
        if m.is_empty() {
            continue; // the crate root: declarations and re-exports
        }
        let code = code_of(text);
        let inline = inline_modules(&code);
        // The module a position of the file is in (inside an inline `mod x { }`, `m::x`).
        let at = |pos: usize| -> Module {
            let mut here = m.clone();
            for (start, end, name) in &inline {
                if *start < pos && pos < *end {
                    here.push(name.clone());
                }
            }
            here
        };
        let mut paths: Vec<(Module, String)> = Vec::new();
        // `use` trees, up to their `;`.
        let mut from = 0;
        while let Some(k) = code[from..].find("use ") {
            let i = from + k;
            let before = code[..i].chars().last();
            let after = &code[i + 4..];
            let end = after.find(';').unwrap_or(after.len());
            // A re-export (`pub use child::X`) is the module's interface, as `mod` is: not a
            // dependency of its code. Its paths are still checked where the code uses them.
            let reexport = code[..i].trim_end().ends_with("pub")
                || code[..i].trim_end().ends_with("pub(crate)")
                || code[..i].trim_end().ends_with("pub(super)");
            if reexport {
                from = i + 4 + end;
            } else if before.is_none_or(|c| !c.is_alphanumeric() && c != '_') {
                let here = at(i);
                paths.extend(
                    expand_use(&after[..end])
                        .into_iter()
                        .map(|p| (here.clone(), p)),
                );
                from = i + 4 + end;
            } else {
                from = i + 4;
            }
        }
        // Paths written inline: `crate::a::b`, `super::super::c`, `self::d`, and `child::e`
        // for a child module of this one.
        let children: Vec<String> = modules
            .iter()
            .filter(|c| c.len() == m.len() + 1 && c.starts_with(m))
            .map(|c| format!("{}::", c[m.len()]))
            .collect();
        let starts = ["crate::", "super::", "self::"]
            .into_iter()
            .map(str::to_string)
            .chain(children);
        // Re-export statements are skipped here too.
        let in_reexport = |i: usize| {
            let line_start = code[..i].rfind(';').map_or(0, |p| p + 1);
            let stmt = code[line_start..i].trim_start();
            stmt.starts_with("pub use")
                || stmt.starts_with("pub(crate) use")
                || stmt.starts_with("pub(super) use")
        };
        for start in starts {
            for (i, _) in code.match_indices(start.as_str()) {
                if in_reexport(i) {
                    continue;
                }
                if code[..i]
                    .chars()
                    .last()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
                {
                    continue;
                }
                let tail = &code[i..];
                let end = tail
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .unwrap_or(tail.len());
                paths.push((at(i), tail[..end].to_string()));
            }
        }
        let edges = graph.entry(m.clone()).or_default();
        for (here, p) in paths {
            if let Some(target) = resolve(&here, &p, &modules)
                && target != *m
                && !target.is_empty()
            {
                edges.insert(target);
            }
        }
    }
    graph
}

/// The strongly connected components with more than one module (Tarjan's algorithm).
fn cycles(graph: &Graph) -> Vec<Vec<Module>> {
    struct State<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g Module, usize>,
        low: BTreeMap<&'g Module, usize>,
        stack: Vec<&'g Module>,
        on: BTreeSet<&'g Module>,
        next: usize,
        out: Vec<Vec<Module>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g Module) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        if let Some(ws) = s.graph.get(v) {
            for w in ws {
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if s.on.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    let nodes: Vec<&Module> = graph
        .keys()
        .chain(graph.values().flatten())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    for v in nodes {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

fn show(m: &Module) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// A crate's level table: module prefix → level (the longest listed prefix decides), and the
/// cycles allowed (each one set of modules).
struct Levels {
    name: &'static str,
    src: &'static str,
    levels: &'static [(&'static str, u32)],
    allowed_cycles: &'static [&'static [&'static str]],
}

impl Levels {
    fn level_of(&self, m: &Module) -> Option<u32> {
        let name = show(m);
        self.levels
            .iter()
            .filter(|(p, _)| name == *p || name.starts_with(&format!("{p}::")))
            .max_by_key(|(p, _)| p.len())
            .map(|(_, l)| *l)
    }
}

/// What is wrong with one crate: cycles not allowed, imports against the table, and modules the
/// table does not place.
fn check(levels: &Levels, sources: &[(Module, String)]) -> Vec<String> {
    let graph = graph_of(sources);
    let mut problems = Vec::new();
    for c in cycles(&graph) {
        let names: BTreeSet<String> = c.iter().map(show).collect();
        let allowed = levels.allowed_cycles.iter().any(|a| {
            let a: BTreeSet<String> = a.iter().map(|s| s.to_string()).collect();
            a == names
        });
        if !allowed {
            problems.push(format!(
                "{}: files that name each other: {}",
                levels.name,
                names.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    for (from, tos) in &graph {
        let Some(lf) = levels.level_of(from) else {
            problems.push(format!(
                "{}: `{}` has no level in the table",
                levels.name,
                show(from)
            ));
            continue;
        };
        for to in tos {
            if let Some(lt) = levels.level_of(to)
                && lt > lf
            {
                problems.push(format!(
                    "{}: `{}` (level {lf}) names `{}` (level {lt}), a higher level",
                    levels.name,
                    show(from),
                    show(to)
                ));
            }
        }
    }
    problems
}

fn sources_of(src: &Path) -> Vec<(Module, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files
        .iter()
        .map(|f| {
            (
                module_of(src, f),
                std::fs::read_to_string(f).expect("read source"),
            )
        })
        .collect()
}

/// The level table of each crate, lowest level first.
const CRATES: &[Levels] = &[
    Levels {
        name: "epx (host)",
        src: "host/core/src",
        levels: &[
            ("error", 0),
            ("files", 0),
            ("child", 0),
            ("value", 1),
            ("model", 2),
            ("plugin::manifest", 3),
            ("plugin::trust", 3),
            ("plugin::refusal", 3),
            ("plugin::isolate::config", 3),
            ("plugin::isolate::shm", 3),
            ("plugin::isolate::wire", 3),
            ("plugin::hosted", 3),
            ("plugin::sealed", 4),
            ("plugin::resolve", 4),
            ("plugin::discover", 5),
            ("plugin::host_api", 5),
            ("plugin::library", 6),
            ("plugin::probe", 6),
            ("plugin::admit", 7),
            ("plugin::isolate::remote", 7),
            ("plugin::provider", 8),
            ("plugin::isolate::serve", 9),
            ("plugin::isolate", 10),
            ("plugin", 10),
            ("cache", 10),
            ("session", 11),
            ("builtin", 12),
            ("doctor", 12),
        ],
        allowed_cycles: &[],
    },
    Levels {
        name: "epx-plugin-api",
        src: "plugin-api/src",
        levels: &[
            ("dtype", 0),
            ("dlpack", 0),
            ("abi", 1),
            ("status", 2),
            ("ffi", 3),
            ("sdk", 4),
        ],
        allowed_cycles: &[],
    },
    Levels {
        name: "epx-cpu",
        src: "plugins/cpu/src",
        levels: &[
            ("error", 0),
            ("limits", 0),
            ("narrow", 0),
            ("scratch", 0),
            ("par", 0),
            ("tensor", 1),
            ("strided", 1),
            ("fast", 1),
            ("kernel", 2),
            ("ops", 3),
            ("exec", 4),
            ("provider", 5),
        ],
        // A program runs control-flow kernels, whose bodies are programs: the pipeline's
        // `build_control_flow` pass makes them.
        allowed_cycles: &[&["exec::control", "exec::passes::build", "exec::program"]],
    },
    Levels {
        name: "epx-onnxruntime",
        src: "plugins/onnxruntime/src",
        levels: &[
            ("locate", 0),
            ("logs", 0),
            ("runtime", 1),
            ("patch", 1),
            ("device", 2),
            ("ep", 3),
            ("provider", 4),
            ("library", 5),
        ],
        allowed_cycles: &[],
    },
    Levels {
        name: "epx-openvino",
        src: "plugins/openvino/src",
        levels: &[("ov", 0), ("library", 1)],
        allowed_cycles: &[],
    },
];

#[test]
fn every_crate_is_built_in_levels_without_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut problems = Vec::new();
    for levels in CRATES {
        let sources = sources_of(&root.join(levels.src));
        assert!(sources.len() > 1, "{}: no sources found", levels.name);
        problems.extend(check(levels, &sources));
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// A synthetic crate, one file per form of import: the checker finds every edge and every cycle.
#[test]
fn the_checker_follows_every_form_of_import() {
    let file = |m: &str, text: &str| -> (Module, String) {
        let m: Module = if m.is_empty() {
            Vec::new()
        } else {
            m.split("::").map(str::to_string).collect()
        };
        (m, text.to_string())
    };
    let sources = vec![
        file("", "pub mod a; pub mod b; pub use a::x;"),
        // A nested group with a rename and `self`.
        file(
            "a",
            "use crate::{b::{c::{self as cc, d}, e as ee}};\nfn f() {}",
        ),
        file("a::x", "pub fn x() {}"),
        // `b` names its child `c` by a relative path.
        file(
            "b",
            "pub mod c; pub mod e;\npub use c::d;\nfn k() { e::f(); }",
        ),
        // `super::super`, reaching back to `a`: a cycle a → b::c → a.
        file("b::c", "pub mod d;\nfn g() { super::super::a::x::x(); }"),
        // `self::` inside a child, and an inline `crate::` path; a comment and a string name
        // modules that are not imports.
        file(
            "b::c::d",
            "// crate::a::x\nconst S: &str = \"crate::b::e\";\nfn h() { self::h(); crate::a::x::x(); }",
        ),
        file(
            "b::e",
            "use super::c;\n#[cfg(test)]\nmod tests {\n use crate::a; }",
        ),
        // Inside an inline module, `super` is the file's own module.
        file("b::f", "mod inner { use super::g; fn g() {} }\nfn g() {}"),
    ];
    let graph = graph_of(&sources);
    let edges = |m: &str| -> Vec<String> {
        graph
            .get(&m.split("::").map(str::to_string).collect::<Module>())
            .map(|s| s.iter().map(show).collect())
            .unwrap_or_default()
    };
    assert_eq!(edges("a"), ["b::c", "b::c::d", "b::e"]);
    assert_eq!(edges("b::c"), ["a::x"]);
    assert_eq!(edges("b::c::d"), ["a::x"]);
    assert_eq!(edges("b::e"), ["b::c"], "the unit tests are not read");
    assert_eq!(edges("b"), ["b::e"], "a re-export is not a dependency");
    assert!(edges("a::x").is_empty());
    assert!(edges("b::f").is_empty(), "{:?}", edges("b::f"));
    let found = cycles(&graph);
    assert_eq!(found.len(), 0, "{found:?}");
    // One more file closes a cycle: a::x → b::c::d → a::x.
    let mut with_cycle = sources.clone();
    with_cycle[2] = file("a::x", "pub fn x() { crate::b::c::d::h(); }");
    let found = cycles(&graph_of(&with_cycle));
    assert_eq!(
        found
            .iter()
            .map(|c| c.iter().map(show).collect::<Vec<_>>())
            .collect::<Vec<_>>(),
        [vec!["a::x", "b::c::d"]]
    );
    // And the level table: `a` (level 0) may not name `b` (level 1).
    let table = Levels {
        name: "synthetic",
        src: "",
        levels: &[("a", 0), ("b", 1)],
        allowed_cycles: &[],
    };
    let problems = check(&table, &sources);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("`a` (level 0) names `b::c` (level 1)")),
        "{problems:?}"
    );
    assert!(
        check(
            &Levels {
                name: "synthetic",
                src: "",
                levels: &[("a", 1), ("b", 0)],
                allowed_cycles: &[],
            },
            &with_cycle
        )
        .iter()
        .any(|p| p.contains("files that name each other: a::x, b::c::d")),
    );
}
