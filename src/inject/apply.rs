//! One template, whatever it holds: a template injected before is undone
//! first, then injected again with the earlier injection's options where
//! none were given now (its mode, NCCL source, platform, image,
//! `--privileged`, requests and daemon flags), so that running inject again
//! changes nothing; or it stops there with `--uninject`. A daemon an older
//! inject made privileged by default loses that.

use serde_norway::Value;

use super::daemon::{self, NODE_SOCKET_DIR};
use super::lists::LISTS;
use super::migrate;
use super::platform::Platform;
use super::record::{record, Outcome, Record};
use super::template::{self, Injected};
use super::undo::{self, Converted};
use super::{name_of, InjectError, Mode, Options, ANNOTATION, DAEMON, DEFAULT_IMAGE, GPU_RESOURCE, VERSION};

/// What was done to a template, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    pub outcome: Outcome,
    /// What was done, in a few words.
    pub line: String,
    /// What was added or changed, a line each.
    pub details: Vec<String>,
    /// What a person must know: the template may not work as they expect.
    pub warnings: Vec<String>,
    /// The daemon's image is the default one, which no registry serves.
    pub default_image: bool,
}

impl Done {
    pub fn plain(outcome: Outcome, line: String) -> Done {
        Done { outcome, line, details: vec![], warnings: vec![], default_image: false }
    }
}

/// The daemon container inject wrote, if any.
fn own_daemon(spec: &Value) -> Option<&Value> {
    LISTS.iter().filter_map(|l| spec.get(*l)?.as_sequence()).flatten().find(|c| name_of(c) == DAEMON)
}

/// The options of the earlier injection `prior` where `opts` gives none,
/// read from its record and the daemon container it wrote; and its daemon
/// flags to keep.
fn kept_options(opts: &Options, prior: &Record, spec: &Value) -> (Options, Vec<String>) {
    let mut o = opts.clone();
    let g = opts.given;
    if !g.mode {
        o.mode = prior.mode;
    }
    if !g.nccl {
        o.nccl = prior.nccl;
    }
    if !g.platform {
        o.platform = prior
            .platform
            .as_deref()
            .and_then(|p| {
                let (p, plugin) = p.split_once(',').map_or((p, None), |(p, x)| (p, Some(x)));
                Platform::from_options(Some(p), plugin).ok()
            })
            .unwrap_or_default();
    }
    let Some(d) = own_daemon(spec) else {
        // A node-mode injection: its socket folder is where the workload mounts it.
        let at = LISTS
            .iter()
            .filter_map(|l| spec.get(*l)?.as_sequence())
            .flatten()
            .flat_map(|c| c.get("volumeMounts").and_then(Value::as_sequence).into_iter().flatten())
            .find(|m| name_of(m) == "tcpx-socket")
            .and_then(|m| m.get("mountPath")?.as_str());
        let kept = at.filter(|a| *a != NODE_SOCKET_DIR).map(|a| format!("--uds_path={a}"));
        return (o, kept.into_iter().collect());
    };
    if !g.image {
        if let Some(image) = d.get("image").and_then(Value::as_str) {
            o.image = image.to_string();
        }
    }
    // Only an explicit --privileged is kept: a daemon privileged without
    // it in the record had that from an inject whose default it was.
    if !g.privileged {
        o.privileged = prior.privileged;
    }
    // The earlier injection's requests (none included) decide, as given:
    // a converted daemon's are not taken again.
    let request = |k: &str| d.get("resources")?.get("requests")?.get(k)?.as_str().map(String::from);
    if !g.cpu {
        (o.cpu, o.given.cpu) = (request("cpu"), true);
    }
    if !g.memory {
        (o.memory, o.given.memory) = (request("memory"), true);
    }
    (o, daemon::chosen(prior.mode, &migrate::argv(d)))
}

/// Whether the daemon container inject wrote runs `privileged: true`.
fn privileged_daemon(tpl: &Value) -> bool {
    let sc = tpl.get("spec").and_then(own_daemon).and_then(|d| d.get("securityContext"));
    sc.and_then(|s| s.get("privileged")) == Some(&Value::Bool(true))
}

/// What changed from the earlier injection's options, for the report.
/// `was_privileged`: its daemon ran `privileged: true`.
fn changes(prior: &Record, opts: &Options, was_privileged: bool) -> Vec<String> {
    let mut out = Vec::new();
    if was_privileged && !opts.privileged && opts.mode != Mode::Node {
        out.push(
            "the daemon is no longer privileged: only the capabilities it needs, the GPUs through the \
             platform's device mechanism (--privileged keeps privileged: true)"
                .into(),
        );
    }
    if prior.mode != opts.mode {
        out.push(format!("mode {} → {} (--mode)", prior.mode.name(), opts.mode.name()));
    }
    if prior.nccl != opts.nccl {
        out.push(format!("NCCL settings {} → {} (--nccl)", prior.nccl.name(), opts.nccl.name()));
    }
    if prior.version != VERSION {
        out.push(format!("version {} → {VERSION}", prior.version));
    }
    if prior.converted.is_none() {
        out.push("its record rewritten as this version writes it".into());
    }
    out
}

/// Applies `opts` to one template: undo any recorded change, then inject
/// (or stop there with `--uninject`). "Already injected" only where the
/// annotation says so.
pub fn apply(tpl: &mut Value, opts: &Options, object: &str, at: &str) -> Result<Done, InjectError> {
    if !tpl.is_mapping() {
        return Err(InjectError::field(object, at.trim_end_matches('.'), "not a pod template (a mapping)"));
    }
    // The record goes into the annotations: a template whose metadata or
    // annotations hold something else would lose it (the API server
    // refuses such a template anyway).
    let meta = tpl.get("metadata");
    for (field, v) in [("metadata", meta), ("metadata.annotations", meta.and_then(|m| m.get("annotations")))]
    {
        if v.is_some_and(|v| !v.is_mapping() && !v.is_null()) {
            return Err(InjectError::field(object, format!("{at}{field}"), "not a mapping"));
        }
    }
    let before = tpl.clone();
    let was_privileged = privileged_daemon(tpl);
    let prior = match record(tpl) {
        Some(Ok(r)) => Some(r),
        Some(Err(why)) => {
            return Err(InjectError::field(
                object,
                format!("{at}metadata.annotations[{ANNOTATION}]"),
                format!("{why}; not a record this version reads"),
            ))
        }
        None => None,
    };
    let (opts, kept) = match (&prior, tpl.get("spec")) {
        (Some(r), Some(spec)) if !opts.uninject => kept_options(opts, r, spec),
        _ => (opts.clone(), Vec::new()),
    };
    let converted = match &prior {
        Some(r) => undo::remove(tpl, r, object, at)?,
        None => Converted::None,
    };
    if opts.uninject {
        let Some(r) = prior else {
            return Ok(Done::plain(Outcome::NotInjected, "not injected; unchanged".into()));
        };
        let mut done =
            Done::plain(Outcome::Removed, format!("removed ({} {} injection)", r.version, r.mode.name()));
        done.details = super::report::removed(&before, &r);
        match converted {
            Converted::Restored(what) => done.line.push_str(&format!("; {what}")),
            Converted::Unknown => done.warnings.push(
                "this injection was written by an earlier inject, which did not keep a daemon it \
                 converted: if the Pod ran tcpgpudmarxd (or a tcpx-rxdm container of its own) before \
                 inject, that container, its volumes and its mounts are not given back; copy them back \
                 from the original manifest"
                    .into(),
            ),
            Converted::None => {}
        }
        return Ok(done);
    }
    let injected = template::inject(tpl, &opts, object, at, &kept)?;
    let Some(Injected { summary, details, warnings, image }) = injected else {
        let all: Vec<&Value> = tpl
            .get("spec")
            .map(|spec| LISTS.iter().filter_map(|l| spec.get(*l)?.as_sequence()).flatten().collect())
            .unwrap_or_default();
        let daemon = all.iter().find(|c| migrate::kind(c).is_some());
        // A template of nothing but a daemon is the node-wide daemon's own.
        let only_daemons = all.iter().all(|c| migrate::kind(c).is_some());
        let outcome = match (&prior, daemon) {
            (None, Some(_)) if only_daemons => Outcome::Daemon,
            _ => Outcome::NoGpu,
        };
        let line = match prior {
            None => match daemon {
                Some(d) if only_daemons => format!(
                    "runs a TCPX daemon itself (container {}) and no container requests {GPU_RESOURCE}: \
                     nothing to inject; workloads use a node-wide daemon through inject --mode=node",
                    name_of(d)
                ),
                Some(d) => format!(
                    "runs a TCPX daemon (container {}), but no container requests {GPU_RESOURCE}; left as \
                     it is. The container that runs NCCL must request GPUs (resources.limits) for inject to \
                     wire it to a daemon",
                    name_of(d)
                ),
                None => format!(
                    "no container requests {GPU_RESOURCE}; left as it is (TCPX goes only to GPU containers)"
                ),
            },
            Some(r) => format!(
                "no container requests {GPU_RESOURCE} any more; the {} {} injection removed",
                r.version,
                r.mode.name()
            ),
        };
        return Ok(Done::plain(outcome, line));
    };
    let default_image = opts.mode != Mode::Node && image == DEFAULT_IMAGE && !opts.given.image;
    let (outcome, line, details) = match prior {
        Some(_) if *tpl == before => {
            // Kept as it was written, its order of fields included.
            *tpl = before;
            let line = format!("already injected ({VERSION}, {}); unchanged", opts.mode.name());
            (Outcome::Unchanged, line, Vec::new())
        }
        Some(r) => {
            let mut line = format!("updated from {} {}: {summary}", r.version, r.mode.name());
            let what = changes(&r, &opts, was_privileged);
            if !what.is_empty() {
                line.push_str(&format!("; {}", what.join(", ")));
            }
            (Outcome::Updated, line, details)
        }
        None => (Outcome::Injected, format!("injected: {summary}"), details),
    };
    Ok(Done { outcome, line, details, warnings, default_image })
}
