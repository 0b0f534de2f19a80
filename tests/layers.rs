//! The module graph is a stack of layers: a module may use the modules of
//! the layers below it and nothing above or beside it. This test reads the
//! sources and fails on an import that breaks the order, so a cycle cannot
//! come back unnoticed. `docs/ARCHITECTURE.md` explains the layers.
//!
//! Inside a module the same holds file by file: no file uses a file that
//! uses it back, directly or through others (a child module using its
//! parent's items is fine). And the rooms stay small: no source file over
//! [`MAX_FILE_LINES`], no top-level module over [`MAX_MODULE_SHARE`] of the
//! crate.
//!
//! `cargo test --test layers -- --nocapture` prints the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Layers, lowest first. Modules in one layer do not use each other.
const LAYERS: &[&[&str]] = &[
    &["types"],
    &["caps", "pidfd"],
    &["netlink"],
    &["wire"],
    &["nic", "host", "gpu", "handover"],
    &["rules"],
    &["config"],
    &["metrics", "nccl"],
    &["identity", "endpoint"],
    &["steering"],
    &["server"],
    &["daemon"],
    &["doctor", "inject", "upgrade"],
    &["cli"],
    &["fuzz_targets"],
];

/// Longest source file, in lines.
const MAX_FILE_LINES: usize = 450;
/// Largest share of the crate's code (tests aside) one top-level module may hold.
const MAX_MODULE_SHARE: f64 = 0.20;

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

/// clap stays in the command line: the flags (`config/flags*.rs`,
/// `config/flag_values.rs`) and their absl forms, the command tree, and `main`. The commands' own modules take plain options.
#[test]
fn clap_is_only_in_the_flags_module_the_command_tree_and_main() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let users: Vec<_> = files
        .iter()
        .filter(|f| std::fs::read_to_string(f).unwrap().contains("clap::"))
        .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
        .filter(|f| {
            !f.starts_with("config/flag") && f != "config/absl.rs" && !f.starts_with("cli/") && f != "main.rs"
        })
        .collect();
    assert!(users.is_empty(), "clap outside the flags module: {users:?}");
}

#[test]
fn the_scanner_sees_grouped_and_plain_imports() {
    let refs =
        crate_refs("use crate::{nic::X, types::{a, b}};\nlet x = crate::wire::frame::ok();\nmy_crate::no");
    assert_eq!(refs.into_iter().collect::<Vec<_>>(), ["nic", "types", "wire"]);
}

// ---- files ----

/// The module path of a file under `src/` (`src/nic/sim/mod.rs` → `["nic", "sim"]`,
/// `src/lib.rs` → `[]`).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> =
        rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    parts
}

/// Every path a source text names, with grouped imports expanded:
/// `use crate::{a::X, b::{c, d}}` → `crate::a::X`, `crate::b::c`, `crate::b::d`.
/// Only paths that start with one of `roots` are returned.
fn paths(text: &str, roots: &BTreeSet<String>) -> Vec<Vec<String>> {
    let b = text.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if ident(b[i]) && (i == 0 || (!ident(b[i - 1]) && b[i - 1] != b':')) {
            let start = i;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            let word = &text[start..i];
            if roots.contains(word) && text[i..].starts_with("::") {
                let mut end = i;
                expand(text, &mut end, vec![word.to_string()], &mut out);
                i = end;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Reads `::seg::seg...` or `::{...}` after `prefix`, from `*at`.
fn expand(text: &str, at: &mut usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let b = text.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    loop {
        if !text[*at..].starts_with("::") {
            out.push(prefix);
            return;
        }
        *at += 2;
        if text[*at..].starts_with('{') {
            *at += 1;
            loop {
                while *at < b.len() && (b[*at].is_ascii_whitespace() || b[*at] == b',') {
                    *at += 1;
                }
                if *at >= b.len() || b[*at] == b'}' {
                    *at += 1;
                    return;
                }
                let start = *at;
                while *at < b.len() && (ident(b[*at]) || b[*at] == b'*') {
                    *at += 1;
                }
                let seg = text[start..*at].to_string();
                let mut p = prefix.clone();
                if !seg.is_empty() && seg != "self" {
                    p.push(seg);
                }
                expand(text, at, p, out);
                // Skip `as name` and anything else up to the next item.
                while *at < b.len() && b[*at] != b',' && b[*at] != b'}' {
                    *at += 1;
                }
            }
        }
        let start = *at;
        while *at < b.len() && ident(b[*at]) {
            *at += 1;
        }
        if start == *at {
            out.push(prefix);
            return;
        }
        prefix.push(text[start..*at].to_string());
    }
}

/// The child modules a file declares (`mod x;`, `pub mod x;`, `pub(crate) mod x;`).
fn declared_children(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("pub(crate) ").or_else(|| l.strip_prefix("pub(super) ")).unwrap_or(l);
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let name = l.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.trim().to_string())
        })
        .collect()
}

/// Files (as module paths) and, for each, the files it uses.
fn file_graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    file_graph_of(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// The files of the source tree under `src` and the files each uses.
fn file_graph_of(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let src = src.to_path_buf();
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    files.retain(|f| !f.ends_with("main.rs"));
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_path(&src, f)).collect();
    let mut graph = BTreeMap::new();
    for f in &files {
        let me = module_path(&src, f);
        let text = std::fs::read_to_string(f).unwrap();
        // A file's own unit tests may use anything of it.
        let text = match text.find("#[cfg(test)]\nmod tests") {
            Some(i) => &text[..i],
            None => &text[..],
        };
        let children = declared_children(text);
        let mut roots: BTreeSet<String> = ["crate", "super"].iter().map(|s| s.to_string()).collect();
        roots.extend(children.iter().cloned());
        let mut uses = BTreeSet::new();
        for p in paths(text, &roots) {
            // Resolve to an absolute module path, then to the deepest file it names.
            let mut abs: Vec<String> = match p[0].as_str() {
                "crate" => Vec::new(),
                "super" => me.clone(),
                _ => me.clone(),
            };
            let mut rest = &p[..];
            if p[0] == "crate" {
                rest = &p[1..];
            } else {
                while rest.first().is_some_and(|s| s == "super") {
                    abs.pop();
                    rest = &rest[1..];
                }
            }
            abs.extend(rest.iter().cloned());
            while !abs.is_empty() && !modules.contains(&abs) {
                abs.pop();
            }
            if abs != me {
                uses.insert(abs);
            }
        }
        graph.insert(me, uses);
    }
    graph
}

/// Whether `a` lies inside `b` (a child, grandchild, ... of it).
fn inside(a: &[String], b: &[String]) -> bool {
    a.len() > b.len() && a.starts_with(b)
}

/// A circle of files, if any: edges from a file to a module it lies inside
/// (a child using its parent's items) do not count.
fn file_circle(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<Vec<String>>> {
    fn visit(
        n: &Vec<String>,
        graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        state.insert(n.clone(), 1);
        stack.push(n.clone());
        for m in graph.get(n).into_iter().flatten().filter(|m| !inside(n, m)) {
            match state.get(m).copied().unwrap_or(0) {
                1 => {
                    let from = stack.iter().position(|x| x == m).unwrap();
                    let mut circle = stack[from..].to_vec();
                    circle.push(m.clone());
                    return Some(circle);
                }
                0 => {
                    if let Some(c) = visit(m, graph, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if state.get(n).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(n, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn show(m: &[String]) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

#[test]
fn no_file_uses_a_file_that_uses_it_back() {
    let graph = file_graph();
    for (f, uses) in &graph {
        let shown: Vec<_> = uses.iter().filter(|u| !inside(f, u)).map(|u| show(u)).collect();
        if !shown.is_empty() {
            println!("{:>28} -> {}", show(f), shown.join(", "));
        }
    }
    if let Some(c) = file_circle(&graph) {
        panic!("files in a circle: {}", c.iter().map(|m| show(m)).collect::<Vec<_>>().join(" -> "));
    }
}

/// The module tree is the folder tree: a file's module is where it lies, so
/// that what this test reads of a file's place is what the compiler does.
#[test]
fn no_file_is_placed_with_a_path_attribute() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let placed: Vec<String> = files
        .iter()
        .filter(|f| std::fs::read_to_string(f).unwrap().lines().any(|l| l.trim_start().starts_with("#[path")))
        .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
        .collect();
    assert!(placed.is_empty(), "#[path] attributes (make the module a folder instead): {placed:?}");
}

/// Longest function allowed in the daemon's lifecycle (`src/daemon/`):
/// phases, each a function that reads in one sitting.
const MAX_DAEMON_FN_LINES: usize = 120;

/// Each function of `text` (its name, first line and length in lines): a
/// line starting with `fn` (after `pub`/`async`) up to the line that closes
/// it at the same indentation.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let body = line.trim_start();
        let indent = line.len() - body.len();
        let sig = ["pub ", "pub(crate) ", "pub(super) ", "async ", "const ", "unsafe "]
            .iter()
            .fold(body, |b, p| b.strip_prefix(p).unwrap_or(b));
        let sig = if sig.starts_with("pub(in ") { sig.split_once(") ").map_or(sig, |(_, r)| r) } else { sig };
        let sig = sig.strip_prefix("async ").unwrap_or(sig);
        if let Some(rest) = sig.strip_prefix("fn ") {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            let close = " ".repeat(indent) + "}";
            let end = (i + 1..lines.len())
                .find(|&j| lines[j] == close || lines[j].starts_with(&(close.clone() + " ")));
            if let (Some(end), false) = (end, line.trim_end().ends_with(';')) {
                out.push((name, i + 1, end - i + 1));
                i = end;
            }
        }
        i += 1;
    }
    out
}

#[test]
fn no_function_of_the_daemon_is_too_long() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/daemon");
    let mut files = Vec::new();
    rs_files(&dir, &mut files);
    let mut long = Vec::new();
    for f in files.iter().filter(|f| !f.to_string_lossy().contains("tests")) {
        for (name, line, n) in functions(&std::fs::read_to_string(f).unwrap()) {
            if n > MAX_DAEMON_FN_LINES {
                long.push(format!("{}:{line} {name} ({n} lines)", f.strip_prefix(&dir).unwrap().display()));
            }
        }
    }
    assert!(long.is_empty(), "functions over {MAX_DAEMON_FN_LINES} lines: {long:?}");
}

#[test]
fn the_function_scanner_measures_whole_functions() {
    let text =
        "fn a() {\n    x;\n}\n\npub(in crate::d) async fn b(\n    y: u8,\n) -> u8 {\n    y\n}\n    fn c();\n";
    let got = functions(text);
    assert_eq!(got, [("a".to_string(), 1, 3), ("b".to_string(), 5, 5)]);
}

/// Every pidfd system call (and its `unsafe`) is in `src/pidfd/`, to be
/// audited in one place; the rest of the crate holds processes by its type.
#[test]
fn pidfd_system_calls_are_made_in_one_module() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let calls = ["libc::SYS_pidfd_", "const SO_PEERPIDFD", "const PIDFD_GET"];
    let outside: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(src.join("pidfd")))
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            calls.iter().any(|c| text.contains(c))
        })
        .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
        .collect();
    assert!(outside.is_empty(), "pidfd system calls outside src/pidfd/: {outside:?}");
}

/// A circle planted in a source tree of folders is found by the same walk
/// that reads the crate's.
#[test]
fn a_planted_circle_of_sibling_files_fails_the_walk() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\n").unwrap();
    std::fs::write(src.join("a/mod.rs"), "mod b;\nmod c;\npub use b::B;\n").unwrap();
    std::fs::write(src.join("a/b.rs"), "use super::c::C;\npub struct B(C);\n").unwrap();
    std::fs::write(src.join("a/c.rs"), "use crate::a::b::B;\npub struct C(Box<B>);\n").unwrap();
    let c = file_circle(&file_graph_of(&src)).expect("a::b and a::c use each other");
    let names: Vec<String> = c.iter().map(|m| show(m)).collect();
    assert!(names.contains(&"a::b".to_string()) && names.contains(&"a::c".to_string()), "{names:?}");
    // Without the use back, no circle.
    std::fs::write(src.join("a/c.rs"), "pub struct C;\n").unwrap();
    assert!(file_circle(&file_graph_of(&src)).is_none());
}

#[test]
fn the_file_scanner_finds_circles_and_spares_children() {
    let roots: BTreeSet<String> = ["crate", "super", "conn"].iter().map(|s| s.to_string()).collect();
    let got = paths(
        "use crate::{a::B, c::{d, e as f}};\nuse super::super::g::H;\nconn::run();\nmy_conn::no",
        &roots,
    );
    let got: Vec<String> = got.iter().map(|p| p.join("::")).collect();
    assert_eq!(got, ["crate::a::B", "crate::c::d", "crate::c::e", "super::super::g::H", "conn::run"]);

    let m = |s: &str| s.split("::").filter(|x| !x.is_empty()).map(String::from).collect::<Vec<_>>();
    let mut g: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    // A child using its parent is no circle.
    g.insert(m("a"), [m("a::b")].into());
    g.insert(m("a::b"), [m("a")].into());
    assert!(file_circle(&g).is_none());
    // Two siblings using each other are.
    g.insert(m("a::c"), [m("a::b")].into());
    g.insert(m("a::b"), [m("a"), m("a::c")].into());
    let c = file_circle(&g).expect("a::b <-> a::c");
    assert!(c.contains(&m("a::b")) && c.contains(&m("a::c")), "{c:?}");
}

#[test]
fn no_source_file_is_too_long() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let long: Vec<_> = files
        .iter()
        .map(|f| {
            (
                f.strip_prefix(&src).unwrap().display().to_string(),
                std::fs::read_to_string(f).unwrap().lines().count(),
            )
        })
        .filter(|(_, n)| *n > MAX_FILE_LINES)
        .collect();
    assert!(long.is_empty(), "files over {MAX_FILE_LINES} lines: {long:?}");
}

/// Lines of code in a file, tests aside (a `*_tests.rs` file, a trailing `mod tests`).
fn code_lines(file: &Path) -> usize {
    if file.to_string_lossy().ends_with("_tests.rs") {
        return 0;
    }
    let text = std::fs::read_to_string(file).unwrap();
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    code.lines().count()
}

#[test]
fn no_module_holds_too_much_of_the_crate() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let mut per_module: BTreeMap<String, usize> = BTreeMap::new();
    for f in &files {
        *per_module.entry(module_of(&src, f)).or_default() += code_lines(f);
    }
    let total: usize = per_module.values().sum();
    let mut big = Vec::new();
    for (m, n) in &per_module {
        let share = *n as f64 / total as f64;
        println!("{m:>14}: {n:>5} lines, {:>4.1}%", share * 100.0);
        if share > MAX_MODULE_SHARE {
            big.push(format!("{m}: {:.1}%", share * 100.0));
        }
    }
    assert!(big.is_empty(), "modules over {:.0}% of the crate: {big:?}", MAX_MODULE_SHARE * 100.0);
}
