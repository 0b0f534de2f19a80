//! Shared by the tests of `inject`'s output: the repository's files, YAML
//! documents, golden files, and reading a pod template's containers, mounts
//! and the daemon's flags as the daemon would.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde::Deserialize as _;
use serde_norway::Value;
use tcpx_rxdm::config::flags::Flags;

pub fn path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

pub fn read(rel: &str) -> String {
    std::fs::read_to_string(path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

pub fn docs(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// Compares with the golden file, or rewrites it.
pub fn golden(rel: &str, got: &str) {
    if std::env::var_os("TCPX_UPDATE_GOLDEN").is_some() {
        std::fs::write(path(rel), got).unwrap();
    }
    let want = read(rel);
    assert!(want == got, "{rel} differs from inject's output (TCPX_UPDATE_GOLDEN=1 rewrites it):\n{got}");
}

pub fn containers(spec: &Value) -> Vec<&Value> {
    ["initContainers", "containers"]
        .iter()
        .filter_map(|l| spec.get(*l).and_then(Value::as_sequence))
        .flatten()
        .collect()
}

pub fn mount_at<'a>(c: &'a Value, at: &str) -> Option<&'a Value> {
    c.get("volumeMounts")?.as_sequence()?.iter().find(|m| m["mountPath"].as_str() == Some(at))
}

pub fn strs(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_sequence)
        .map(|s| s.iter().map(|x| x.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// The daemon's flags as the daemon reads its command line: every word
/// inject wrote must be one it takes.
pub fn daemon_flags(c: &Value) -> Flags {
    let mut argv = strs(c.get("command"));
    if argv.is_empty() {
        argv.push("tcpx-rxdm".into());
    }
    argv.extend(strs(c.get("args")));
    Flags::parse_args(argv.clone()).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}
