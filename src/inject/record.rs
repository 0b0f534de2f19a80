//! What inject records on a pod template (the annotation), and what it did
//! to one (the [`Outcome`] reported for it).

use serde_norway::Value;

use super::{Mode, Nccl, ANNOTATION};

/// What the annotation records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub version: String,
    pub mode: Mode,
    pub nccl: Nccl,
    /// Pod-level fields set (`hostNetwork`, …; `devices` for the annotation).
    pub pod: Vec<String>,
    /// `container:VARIABLE` (or `container:envFrom`) present before.
    pub kept: Vec<String>,
}

impl Record {
    pub fn text(&self) -> String {
        let mut t = format!("version={} mode={} nccl={}", self.version, self.mode.name(), self.nccl.name());
        for (k, v) in [("pod", &self.pod), ("kept", &self.kept)] {
            if !v.is_empty() {
                t.push_str(&format!(" {k}={}", v.join(",")));
            }
        }
        t
    }

    pub fn parse(text: &str) -> Option<Record> {
        let mut r =
            Record { version: String::new(), mode: Mode::Node, nccl: Nccl::File, pod: vec![], kept: vec![] };
        let mut seen = (false, false);
        for part in text.split_whitespace() {
            let (k, v) = part.split_once('=')?;
            let items = || v.split(',').filter(|x| !x.is_empty()).map(String::from).collect();
            match k {
                "version" => r.version = v.to_string(),
                "mode" => (r.mode, seen.0) = (Mode::from_name(v)?, true),
                "nccl" => (r.nccl, seen.1) = (Nccl::from_name(v)?, true),
                "pod" => r.pod = items(),
                "kept" => r.kept = items(),
                _ => return None,
            }
        }
        (seen.0 && seen.1 && !r.version.is_empty()).then_some(r)
    }
}

/// The recorded injection of a template, if any; the annotation's text
/// when it is not a record.
pub fn record(tpl: &Value) -> Option<Result<Record, String>> {
    let text = tpl.get("metadata")?.get("annotations")?.get(ANNOTATION)?;
    Some(match text.as_str() {
        Some(t) => Record::parse(t).ok_or_else(|| format!("\"{t}\"")),
        None => Err("a value that is not a string".into()),
    })
}

/// What inject did to a pod template (`template::apply`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// TCPX added to a template that had none.
    Injected,
    /// An older injection replaced.
    Updated,
    /// Injected already, by this version with these options.
    Unchanged,
    /// No container requests GPUs: nothing injected (an older injection removed).
    NoGpu,
    /// `--uninject`: the injection removed.
    Removed,
    /// `--uninject` on a template that was never injected.
    NotInjected,
    /// An object with no pod template.
    NoTemplate,
}

impl Outcome {
    /// Whether the template has TCPX now.
    pub fn has_tcpx(self) -> bool {
        matches!(self, Outcome::Injected | Outcome::Updated | Outcome::Unchanged)
    }
}
