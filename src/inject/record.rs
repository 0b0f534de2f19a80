//! The record inject leaves on each template it changes (the annotation
//! [`ANNOTATION`]): version, mode, NCCL source, the pod-level fields it set
//! and the variables the containers already had. The record is the
//! manifest author's to write, so it may name only the pod-level fields
//! inject sets; the command undoes each only while it holds the value
//! inject gave it, and the webhook never undoes a record at all.
//!
//! It also names what was done to a template (the [`Outcome`] reported for it).

use serde_norway::Value;

use super::daemon::s;
use super::{show, show_str, Mode, Nccl, ANNOTATION};

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
    /// Whether a daemon the Pod had was converted (and kept in
    /// [`super::restore::SAVED`]); `None`: a record written before inject
    /// kept one, which cannot tell.
    pub converted: Option<bool>,
    /// `--platform=gpu-operator` and its `--nccl-plugin` (`None`: GKE).
    pub platform: Option<String>,
    /// `--privileged` was asked for (`privileged=yes`): injecting again
    /// keeps it. A daemon that is privileged without it was written by an
    /// inject from before least privilege, whose default that was.
    pub privileged: bool,
}

impl Record {
    pub fn text(&self) -> String {
        let mut t = format!("version={} mode={} nccl={}", self.version, self.mode.name(), self.nccl.name());
        if let Some(p) = &self.platform {
            t.push_str(&format!(" platform={p}"));
        }
        if let Some(c) = self.converted {
            t.push_str(if c { " converted=yes" } else { " converted=no" });
        }
        if self.privileged {
            t.push_str(" privileged=yes");
        }
        for (k, v) in [("pod", &self.pod), ("kept", &self.kept)] {
            if !v.is_empty() {
                t.push_str(&format!(" {k}={}", v.join(",")));
            }
        }
        t
    }

    /// Reads a record; why not, where it is none this version writes. The
    /// pod-level fields it may name are those inject sets (a record is the
    /// manifest author's to write, and undoing one removes what it names).
    pub fn parse(text: &str) -> Result<Record, String> {
        let mut r = Record {
            version: String::new(),
            mode: Mode::Node,
            nccl: Nccl::File,
            pod: vec![],
            kept: vec![],
            converted: None,
            platform: None,
            privileged: false,
        };
        let mut seen = (false, false);
        for part in text.split_whitespace() {
            let Some((k, v)) = part.split_once('=') else {
                return Err(format!("{} is no key=value", show_str(part)));
            };
            let items = || v.split(',').filter(|x| !x.is_empty()).map(String::from).collect();
            let bad = |what: &str| format!("{what} {}", show_str(v));
            match k {
                "version" => r.version = v.to_string(),
                "mode" => (r.mode, seen.0) = (Mode::from_name(v).ok_or_else(|| bad("unknown mode"))?, true),
                "nccl" => (r.nccl, seen.1) = (Nccl::from_name(v).ok_or_else(|| bad("unknown nccl"))?, true),
                "pod" => r.pod = items(),
                "kept" => r.kept = items(),
                "converted" => {
                    r.converted = Some(match v {
                        "yes" => true,
                        "no" => false,
                        _ => return Err(bad("converted is yes or no, not")),
                    })
                }
                "privileged" => {
                    r.privileged = match v {
                        "yes" => true,
                        _ => return Err(bad("privileged is yes (or left out), not")),
                    }
                }
                "platform" => {
                    let (p, plugin) = v.split_once(',').map_or((v, None), |(p, x)| (p, Some(x)));
                    super::platform::Platform::from_options(Some(p), plugin)
                        .map_err(|e| format!("platform {}: {e}", show_str(v)))?;
                    r.platform = Some(v.to_string());
                }
                _ => return Err(format!("unknown key {}", show_str(k))),
            }
        }
        if let Some(f) = r.pod.iter().find(|f| !POD_FIELDS.contains(&f.as_str())) {
            return Err(format!("names pod field {}, which inject never sets", show_str(f)));
        }
        if !(seen.0 && seen.1 && !r.version.is_empty()) {
            return Err("lacks its version, mode or nccl".into());
        }
        Ok(r)
    }
}

/// What a record's `pod=` may name: the pod-level fields inject sets,
/// `dnsPolicy:ClusterFirst` (the value it replaced) and `devices` (GKE's
/// device annotation).
const POD_FIELDS: [&str; 7] = [
    "hostNetwork",
    "dnsPolicy",
    "dnsPolicy:ClusterFirst",
    "shareProcessNamespace",
    "terminationGracePeriodSeconds",
    "runtimeClassName",
    "devices",
];

/// Seconds the daemon gets to remove its rules and restore the NICs.
pub const GRACE_SECONDS: u64 = 60;

/// The value inject gives a pod-level field it sets.
pub fn set_value(field: &str) -> Option<Value> {
    Some(match field {
        "hostNetwork" | "shareProcessNamespace" => Value::Bool(true),
        "dnsPolicy" => s("ClusterFirstWithHostNet"),
        "terminationGracePeriodSeconds" => Value::Number(GRACE_SECONDS.into()),
        "runtimeClassName" => s(super::platform::RUNTIME_CLASS),
        _ => return None,
    })
}

/// The recorded injection of a template, if any: the record, or why it is
/// none this version reads.
pub fn record(tpl: &Value) -> Option<Result<Record, String>> {
    let text = tpl.get("metadata")?.get("annotations")?.get(ANNOTATION)?;
    Some(match text.as_str() {
        Some(t) => Record::parse(t).map_err(|why| format!("{}: {why}", show_str(t))),
        None => Err(format!("{} is not a text", show(text))),
    })
}

/// What inject did to a pod template (`apply`).
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
    /// No container requests GPUs, and one runs a TCPX daemon: the
    /// daemon's own template (a node-wide DaemonSet), nothing to inject.
    Daemon,
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
