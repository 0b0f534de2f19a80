//! The module graph is a stack of layers: a module may use the modules of
//! the layers below it and nothing above or beside it. This test reads the
//! sources and fails on an import that breaks the order, so a cycle cannot
//! come back unnoticed. `docs/ARCHITECTURE.md` explains the layers.
//!
//! `cargo test --test layers -- --nocapture` prints the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Layers, lowest first. Modules in one layer do not use each other.
const LAYERS: &[&[&str]] = &[
    &["types"],
    &["netlink"],
    &["wire"],
    &["nic", "host", "gpu"],
    &["rules"],
    &["config"],
    &["metrics"],
    &["server"],
    &["daemon"],
    &["doctor"],
    &["fuzz_targets"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file under `src/` belongs to (`src/nic/sim/mod.rs` → `nic`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
    first.trim_end_matches(".rs").to_string()
}

/// The top-level modules a source text names through `crate::`, including
/// grouped imports (`use crate::{a::X, b}`).
fn crate_refs(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        // `tcpx_rxdm::crate::` cannot happen; skip identifiers ending in `crate` (e.g. `subcrate::`).
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level items of the group, up to its matching brace.
            let mut depth = 1;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                if depth == 1 && c == ',' {
                    out.extend(head(&item));
                    item.clear();
                } else {
                    item.push(c);
                }
            }
            out.extend(head(&item));
        } else {
            out.extend(head(rest));
        }
    }
    out
}

fn head(path: &str) -> Option<String> {
    let name: String = path.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!name.is_empty() && name != "self").then_some(name)
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let module = module_of(&src, &f);
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let refs: Vec<_> = crate_refs(&text).into_iter().filter(|m| *m != module).collect();
        graph.entry(module).or_default().extend(refs);
    }
    graph
}

#[test]
fn no_module_imports_a_layer_above_or_beside_it() {
    let graph = graph();
    let mut broken = Vec::new();
    for (module, deps) in &graph {
        let Some(mine) = layer_of(module) else {
            broken.push(format!("{module}: not in any layer (add it to LAYERS and docs/ARCHITECTURE.md)"));
            continue;
        };
        println!("{module:>12} (layer {mine}) -> {}", deps.iter().cloned().collect::<Vec<_>>().join(", "));
        for d in deps {
            match layer_of(d) {
                Some(theirs) if theirs < mine => {}
                Some(theirs) => broken.push(format!("{module} (layer {mine}) uses {d} (layer {theirs})")),
                None => broken.push(format!("{module} uses crate::{d}, which is not a module")),
            }
        }
    }
    assert!(broken.is_empty(), "imports against the layer order:\n{}", broken.join("\n"));
}

#[test]
fn the_vocabulary_module_imports_nothing() {
    let graph = graph();
    assert_eq!(graph.get("types").map(|d| d.len()).unwrap_or(0), 0, "{:?}", graph.get("types"));
}

#[test]
fn clap_is_only_in_the_flags_module_and_main() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let users: Vec<_> = files
        .iter()
        .filter(|f| std::fs::read_to_string(f).unwrap().contains("clap::"))
        .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
        .filter(|f| !f.starts_with("config/flags") && f != "main.rs")
        .collect();
    assert!(users.is_empty(), "clap outside the flags module: {users:?}");
}

#[test]
fn the_scanner_sees_grouped_and_plain_imports() {
    let refs =
        crate_refs("use crate::{nic::X, types::{a, b}};\nlet x = crate::wire::frame::ok();\nmy_crate::no");
    assert_eq!(refs.into_iter().collect::<Vec<_>>(), ["nic", "types", "wire"]);
}
