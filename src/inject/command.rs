//! `tcpx-rxdm inject [-f FILE|-] [OPTIONS] [DAEMON FLAGS]`: YAML documents
//! in, the same documents out with TCPX added; a line per object on stderr,
//! then what a person must know: templates left without TCPX for want of a
//! GPU container, and the daemon image when it was not chosen.

use std::io::Read as _;

use serde::Deserialize as _;
use serde_norway::Value;

use super::record::Outcome;
use super::{kinds, InjectError, Mode, Options, GPU_RESOURCE, VERSION};

/// What `inject` was asked, beyond what decides the change itself.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub opts: Options,
    /// The input file; `None` or `-`: stdin.
    pub file: Option<String>,
    /// A pod template without a GPU container is an error, not a note.
    pub require_gpu: bool,
    /// `--image` was given (else the default is named on stderr).
    pub image_given: bool,
}

/// Every document of `text` with `opts` applied, and the report lines.
/// Nothing is returned unless every document was accepted.
pub fn transform(text: &str, opts: &Options) -> Result<(String, Vec<String>), InjectError> {
    let (out, applied) = transform_all(text, opts)?;
    Ok((out, applied.into_iter().map(|a| a.line).collect()))
}

/// [`transform`] with what was done to each template.
pub fn transform_all(text: &str, opts: &Options) -> Result<(String, Vec<kinds::Applied>), InjectError> {
    let mut docs = Vec::new();
    for d in serde_norway::Deserializer::from_str(text) {
        let v = Value::deserialize(d).map_err(|e| InjectError::NotYaml(e.to_string()))?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    let mut report = Vec::new();
    for d in &mut docs {
        kinds::apply_doc(d, opts, &mut report)?;
    }
    let mut out = String::new();
    for (i, d) in docs.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        out.push_str(&serde_norway::to_string(d).map_err(|e| InjectError::NotYaml(e.to_string()))?);
    }
    Ok((out, report))
}

/// What stderr says after the per-object lines: templates left without
/// TCPX, and where the daemon image comes from. Empty when all is said.
pub fn advice(applied: &[kinds::Applied], inv: &Invocation) -> Vec<String> {
    let mut out = Vec::new();
    let no_gpu = applied.iter().filter(|a| a.outcome == Outcome::NoGpu).count();
    let injected = applied.iter().filter(|a| a.outcome.has_tcpx()).count();
    if no_gpu > 0 {
        let which = if injected == 0 {
            "nothing was injected: no pod template has a container that requests".to_string()
        } else {
            format!("{no_gpu} pod template(s) left without TCPX: no container requests")
        };
        out.push(format!(
            "{which} {GPU_RESOURCE}. TCPX goes only to GPU containers: add `resources: {{limits: \
             {{{GPU_RESOURCE}: 8}}}}` to the container that runs NCCL and run inject again \
             (--require-gpu makes this an error)."
        ));
    }
    let daemon_image = inv.opts.mode != Mode::Node && !inv.opts.uninject && injected > 0;
    if daemon_image && !inv.image_given {
        let image = &inv.opts.image;
        out.push(format!(
            "the daemon container's image is {image}, the default, which no public registry serves: \
             build it from this repository and push it where your nodes pull from \
             (`docker build -t REGISTRY/tcpx-rxdm:{VERSION} . && docker push REGISTRY/tcpx-rxdm:{VERSION}`), \
             then pass --image=REGISTRY/tcpx-rxdm:{VERSION}."
        ));
    }
    out
}

/// Runs the command; returns the exit code.
pub fn main(inv: Invocation) -> u8 {
    let mut text = String::new();
    let read = match inv.file.as_deref() {
        None | Some("-") => std::io::stdin().read_to_string(&mut text).map(|_| ()),
        Some(p) => std::fs::read_to_string(p).map(|t| text = t),
    };
    if let Err(e) = read {
        eprintln!("tcpx-rxdm inject: {}: {e}", inv.file.as_deref().unwrap_or("stdin"));
        return 1;
    }
    let (out, applied) = match transform_all(&text, &inv.opts) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("tcpx-rxdm inject: {e}; nothing written");
            return if matches!(e, InjectError::Option(_)) { 2 } else { 1 };
        }
    };
    for a in &applied {
        eprintln!("{}", a.line);
    }
    if inv.require_gpu && !inv.opts.uninject {
        if let Some(a) = applied.iter().find(|a| a.outcome == Outcome::NoGpu) {
            eprintln!(
                "tcpx-rxdm inject: {}: no container requests {GPU_RESOURCE} (--require-gpu); nothing written",
                a.place
            );
            return 1;
        }
    }
    for line in advice(&applied, &inv) {
        eprintln!("tcpx-rxdm inject: {line}");
    }
    print!("{out}");
    0
}
