//! Where each kind keeps its pod templates. Kinds not listed pass through
//! unchanged. Kubeflow: the training-operator jobs (`kubeflow.org/v1`
//! PyTorchJob, TFJob, XGBoostJob, PaddleJob, JAXJob; `kubeflow.org/v2beta1`
//! MPIJob) hold a pod template per replica type; a Trainer `TrainJob` holds
//! none (its Pods come from a runtime), so its `TrainingRuntime` and
//! `ClusterTrainingRuntime` (`trainer.kubeflow.org/v1alpha1`, a JobSet
//! template per replicated job) are changed instead.

use serde_norway::Value;

use super::apply::{self, Done};
use super::record::Outcome;
use super::{name_of, object_name, InjectError, Options};

/// One step from a document to its templates.
#[derive(Clone, Copy)]
enum Step {
    Key(&'static str),
    /// Every item of a list, named by its `name`.
    Each,
    /// Every value of a mapping, named by its key.
    Values,
}
use Step::{Each, Key, Values};

const TEMPLATE: &[Step] = &[Key("spec"), Key("template")];
const CRON: &[Step] = &[Key("spec"), Key("jobTemplate"), Key("spec"), Key("template")];
const JOBSET: &[Step] =
    &[Key("spec"), Key("replicatedJobs"), Each, Key("template"), Key("spec"), Key("template")];
const RUNTIME: &[Step] = &[
    Key("spec"),
    Key("template"),
    Key("spec"),
    Key("replicatedJobs"),
    Each,
    Key("template"),
    Key("spec"),
    Key("template"),
];

/// The path to the templates of `apiVersion`/`kind`, if it has any.
fn path_of(api: &str, kind: &str) -> Option<&'static [Step]> {
    let kubeflow = |field: &'static str| -> &'static [Step] {
        match field {
            "pytorchReplicaSpecs" => &[Key("spec"), Key("pytorchReplicaSpecs"), Values, Key("template")],
            "tfReplicaSpecs" => &[Key("spec"), Key("tfReplicaSpecs"), Values, Key("template")],
            "xgbReplicaSpecs" => &[Key("spec"), Key("xgbReplicaSpecs"), Values, Key("template")],
            "paddleReplicaSpecs" => &[Key("spec"), Key("paddleReplicaSpecs"), Values, Key("template")],
            "jaxReplicaSpecs" => &[Key("spec"), Key("jaxReplicaSpecs"), Values, Key("template")],
            _ => &[Key("spec"), Key("mpiReplicaSpecs"), Values, Key("template")],
        }
    };
    Some(match (api, kind) {
        ("v1", "Pod") => &[],
        ("batch/v1", "Job") => TEMPLATE,
        ("apps/v1", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet") => TEMPLATE,
        ("batch/v1", "CronJob") => CRON,
        ("jobset.x-k8s.io/v1alpha2", "JobSet") => JOBSET,
        ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime" | "ClusterTrainingRuntime") => RUNTIME,
        ("kubeflow.org/v1", "PyTorchJob") => kubeflow("pytorchReplicaSpecs"),
        ("kubeflow.org/v1", "TFJob") => kubeflow("tfReplicaSpecs"),
        ("kubeflow.org/v1", "XGBoostJob") => kubeflow("xgbReplicaSpecs"),
        ("kubeflow.org/v1", "PaddleJob") => kubeflow("paddleReplicaSpecs"),
        ("kubeflow.org/v1", "JAXJob") => kubeflow("jaxReplicaSpecs"),
        ("kubeflow.org/v2beta1", "MPIJob") => kubeflow("mpiReplicaSpecs"),
        _ => return None,
    })
}

fn walk(
    v: &mut Value,
    steps: &[Step],
    at: String,
    object: &str,
    opts: &Options,
    report: &mut Vec<Applied>,
) -> Result<(), InjectError> {
    let Some((step, rest)) = steps.split_first() else {
        let done = apply::apply(v, opts, object, &at)?;
        let place = if at.is_empty() { String::new() } else { format!(" {}", at.trim_end_matches('.')) };
        let place = format!("{object}{place}");
        let line = format!("{place}: {}", done.line);
        report.push(Applied { object: object.to_string(), place, line, done });
        return Ok(());
    };
    let missing = |at: &str, what: &str| {
        InjectError::field(object, at.trim_end_matches('.'), format!("missing or not {what}"))
    };
    match *step {
        Key(k) => {
            let next = v.get_mut(k).ok_or_else(|| missing(&format!("{at}{k}"), "present"))?;
            walk(next, rest, format!("{at}{k}."), object, opts, report)
        }
        Each => {
            let items = v.as_sequence_mut().ok_or_else(|| missing(&at, "a list"))?;
            for item in items {
                let name = name_of(item);
                walk(item, rest, format!("{}[{name}].", at.trim_end_matches('.')), object, opts, report)?;
            }
            Ok(())
        }
        Values => {
            let m = v.as_mapping_mut().ok_or_else(|| missing(&at, "a mapping"))?;
            for (k, item) in m.iter_mut() {
                let name = k.as_str().unwrap_or("?").to_string();
                walk(item, rest, format!("{}[{name}].", at.trim_end_matches('.')), object, opts, report)?;
            }
            Ok(())
        }
    }
}

/// What was done to one pod template (or to an object without one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The object: `Job/train`.
    pub object: String,
    /// The object and the template's path in it: `Job/train spec.template`.
    pub place: String,
    /// The report line: the place, then what was done.
    pub line: String,
    pub done: Done,
}

impl Applied {
    pub fn outcome(&self) -> Outcome {
        self.done.outcome
    }

    /// The report: the line, then what was added or changed, indented.
    pub fn text(&self) -> String {
        let mut t = self.line.clone();
        for d in &self.done.details {
            t.push_str(&format!("\n  {d}"));
        }
        t
    }
}

/// Applies `opts` to every template of `doc` (each item of a `List`).
/// Appends what was done to each template to `report`.
pub fn apply_doc(doc: &mut Value, opts: &Options, report: &mut Vec<Applied>) -> Result<(), InjectError> {
    let api = doc.get("apiVersion").and_then(Value::as_str).unwrap_or_default().to_string();
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
    let object = object_name(doc);
    if !doc.is_mapping() {
        return Err(InjectError::NotYaml(format!("{object}: a document is not a mapping")));
    }
    if api == "v1" && kind == "List" {
        let items = doc.get_mut("items").and_then(Value::as_sequence_mut);
        let items = items.ok_or_else(|| InjectError::field(&object, "items", "missing or not a list"))?;
        for item in items {
            apply_doc(item, opts, report)?;
        }
        return Ok(());
    }
    match path_of(&api, &kind) {
        Some(steps) => walk(doc, steps, String::new(), &object, opts, report),
        None => {
            let line = format!("{object}: no pod template ({api} {kind}); unchanged");
            let done = Done::plain(Outcome::NoTemplate, line.clone());
            report.push(Applied { place: object.clone(), object, line, done });
            Ok(())
        }
    }
}
