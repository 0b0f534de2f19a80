//! `tcpx-rxdm inject [-f FILE|DIR|-]... [OPTIONS] [DAEMON FLAGS]`: YAML
//! documents in, the same documents out with TCPX added, one stream for
//! all inputs; a line per pod template on stderr with what was added, then
//! what a person must know: what may not work as expected, templates left
//! without TCPX for want of a GPU container, and the daemon image when it
//! was not chosen.

use serde::Deserialize as _;
use serde_norway::Value;

use super::record::Outcome;
use super::{files, kinds, InjectError, Options, DEFAULT_IMAGE, GPU_RESOURCE, VERSION};
use crate::types::exit::Exit;

/// What `inject` was asked, beyond what decides the change itself.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub opts: Options,
    /// The inputs (`-f`), in order; none or `-`: stdin; a folder: its manifests.
    pub files: Vec<String>,
    /// `-R`: a folder's subfolders too.
    pub recursive: bool,
    /// An object none of whose pod templates has a GPU container is an
    /// error, not a note.
    pub require_gpu: bool,
}

/// Every document of `text` with `opts` applied, and the report lines.
/// Nothing is returned unless every document was accepted.
pub fn transform(text: &str, opts: &Options) -> Result<(String, Vec<String>), InjectError> {
    let (out, applied) = transform_all(text, opts)?;
    Ok((out, applied.iter().map(kinds::Applied::text).collect()))
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

/// What stderr says after the per-object lines: what may not work as
/// expected, templates left without TCPX, where the daemon image comes
/// from. Empty when all is said.
pub fn advice(applied: &[kinds::Applied]) -> Vec<String> {
    let mut out = Vec::new();
    for a in applied {
        out.extend(a.done.warnings.iter().map(|w| format!("warning: {}: {w}", a.place)));
    }
    let no_gpu = applied.iter().filter(|a| a.outcome() == Outcome::NoGpu).count();
    let injected = applied.iter().filter(|a| a.outcome().has_tcpx()).count();
    if no_gpu > 0 && injected == 0 {
        out.push(format!(
            "nothing was injected: no pod template has a container that requests {GPU_RESOURCE}. \
             TCPX goes only to containers that request GPUs (resources.limits); the container that runs \
             NCCL must request them. --require-gpu makes this an error."
        ));
    } else if no_gpu > 0 {
        out.push(format!(
            "{no_gpu} pod template(s) left as they are: none of their containers requests {GPU_RESOURCE} \
             (a CPU-only coordinator needs no TCPX). --require-gpu refuses an object none of whose \
             templates requests GPUs."
        ));
    }
    if applied.iter().any(|a| a.done.default_image) {
        let image = DEFAULT_IMAGE;
        out.push(format!(
            "the daemon container's image is {image}, the default, which no public registry serves: \
             build it from this repository and push it where your nodes pull from \
             (`docker build -t REGISTRY/tcpx-rxdm:{VERSION} . && docker push REGISTRY/tcpx-rxdm:{VERSION}`), \
             then pass --image=REGISTRY/tcpx-rxdm:{VERSION}."
        ));
    }
    out
}

/// The first object that has pod templates and none with a GPU container
/// (`--require-gpu`), by its place.
fn without_gpu(applied: &[kinds::Applied]) -> Option<&kinds::Applied> {
    applied.iter().find(|a| {
        a.outcome() == Outcome::NoGpu
            && applied.iter().filter(|b| b.object == a.object).all(|b| b.outcome() == Outcome::NoGpu)
    })
}

/// Runs the command: failed when a template cannot be changed, usage for a
/// bad option or input.
pub fn main(inv: Invocation) -> Exit {
    let sources = match files::read(&inv.files, inv.recursive) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tcpx-rxdm inject: {e}");
            return e.exit();
        }
    };
    let (mut outs, mut applied) = (Vec::new(), Vec::new());
    for src in &sources {
        let from = src.path.as_deref().map(|p| format!("{p}: ")).unwrap_or_default();
        match transform_all(&src.text, &inv.opts) {
            Ok((out, a)) => {
                if inv.require_gpu && !inv.opts.uninject {
                    if let Some(a) = without_gpu(&a) {
                        eprintln!(
                            "tcpx-rxdm inject: {from}{}: no pod template has a container that requests \
                             {GPU_RESOURCE} (--require-gpu); nothing written",
                            a.object
                        );
                        return Exit::Failed;
                    }
                }
                outs.extend(Some(out).filter(|o| !o.is_empty()));
                applied.extend(a);
            }
            Err(e) => {
                eprintln!("tcpx-rxdm inject: {from}{e}; nothing written");
                return if matches!(e, InjectError::Option(_)) { Exit::Usage } else { Exit::Failed };
            }
        }
    }
    if applied.is_empty() {
        let from: Vec<&str> = sources.iter().map(|s| s.path.as_deref().unwrap_or("stdin")).collect();
        eprintln!("tcpx-rxdm inject: {}: no Kubernetes documents; nothing written", from.join(", "));
    }
    for a in &applied {
        eprintln!("{}", a.text());
    }
    for line in advice(&applied) {
        eprintln!("tcpx-rxdm inject: {line}");
    }
    print!("{}", outs.join("---\n"));
    Exit::Done
}
