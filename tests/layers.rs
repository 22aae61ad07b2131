//! The library's layers point one way: a top-level module imports only from
//! modules of a lower layer (the table in `src/lib.rs`), and no two files
//! import each other, directly or around a loop. Read from the sources'
//! `crate::` paths (comments and `#[cfg(test)]` modules left out).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module's layer, as `src/lib.rs` lists them. (The rigs
/// are another package, `rigs/`, above the whole library.)
const LAYERS: &[(&str, u8)] = &[
    ("batch_id", 0),
    ("human", 0),
    ("phone", 0),
    ("seq_ranges", 0),
    ("redact", 0),
    ("results", 0),
    ("events", 1),
    ("keys", 2),
    ("projection", 3),
    ("protocol", 4),
    ("store", 5),
    ("provider", 5),
    ("verify", 6),
    ("producer", 6),
    ("metrics", 6),
    ("worker", 7),
    ("cli", 8),
];

/// `src/a/b.rs` and `src/a/b/mod.rs` → `a::b`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|l| l == "mod" || l == "lib") {
        parts.pop();
    }
    parts.join("::")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its test module and its comments.
fn code(text: &str) -> String {
    let before_tests = text.split("#[cfg(test)]").next().unwrap_or(text);
    before_tests
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every module path that follows `crate::` in `code`, cut to the longest
/// prefix that names a module of `modules`.
fn imports(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut paths: Vec<String> = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::X, b};`: each item of the group.
            let group = group.split('}').next().unwrap_or("");
            paths.extend(group.split(',').map(|p| p.trim().to_string()));
        } else {
            paths.push(
                rest.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                    .collect(),
            );
        }
    }
    for path in paths {
        let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
        if let Some(m) = (1..=segs.len())
            .rev()
            .map(|n| segs[..n].join("::"))
            .find(|m| modules.contains(m))
        {
            out.insert(m);
        }
    }
    out
}

fn top(module: &str) -> &str {
    module.split("::").next().unwrap_or(module)
}

#[test]
fn every_import_points_down_and_no_files_import_each_other() {
    let src = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    let layer: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut upward = Vec::new();
    for f in &files {
        let from = module_of(&src, f);
        let text = std::fs::read_to_string(f).expect("read");
        let mut to = imports(&code(&text), &modules);
        // A module's own descendants and ancestors are its own business.
        to.retain(|m| {
            m != &from
                && !m.starts_with(&format!("{from}::"))
                && !from.starts_with(&format!("{m}::"))
        });
        if from.is_empty() {
            continue; // lib.rs declares every module
        }
        let (a, b) = (top(&from), &to);
        let la = *layer
            .get(a)
            .unwrap_or_else(|| panic!("{a} (src/{a}) has no layer in the table: add it"));
        for m in b {
            let t = top(m);
            if t == a {
                continue;
            }
            let lt = *layer
                .get(t)
                .unwrap_or_else(|| panic!("{t} has no layer in the table: add it"));
            if lt >= la {
                upward.push(format!("{from} (layer {la}) imports {m} (layer {lt})"));
            }
        }
        graph.insert(from, to);
    }
    assert!(
        upward.is_empty(),
        "imports that do not point down:\n{}",
        upward.join("\n")
    );

    // No loop between files: a depth-first search that meets a file on its
    // own path has found one.
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut cycle = path[i..].to_vec();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for next in graph.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        if let Some(cycle) = visit(m, &graph, &mut Vec::new(), &mut done) {
            panic!("files that import each other: {}", cycle.join(" → "));
        }
    }
}

#[test]
fn the_reader_finds_imports_and_skips_comments_and_tests() {
    let modules: BTreeSet<String> = ["store", "store::batch", "worker"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let text = "use crate::store::batch::BatchLog;\n// crate::worker in a comment\nfn f() { crate::store::Store::x(); }\n#[cfg(test)]\nmod tests { use crate::worker::Ctx; }";
    let got = imports(&code(text), &modules);
    assert_eq!(
        got,
        ["store", "store::batch"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    let grouped = imports("use crate::{store::batch::X, worker};", &modules);
    assert_eq!(
        grouped,
        ["store::batch", "worker"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
}
