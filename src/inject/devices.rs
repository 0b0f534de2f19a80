//! GKE's device-injection annotation for the daemon container: without
//! `privileged`, GKE's NRI device injector gives the container the device
//! nodes the annotation lists. Inject writes it; a Pod may hold one
//! already (GKE's own TCPX manifests do), which is kept where it lists
//! what the daemon needs.

use serde_norway::Value;

use super::{show, DAEMON};

/// The device nodes the daemon opens: the eight GPUs, the control and the
/// UVM device.
fn paths() -> Vec<String> {
    let mut v: Vec<String> = (0..8).map(|i| format!("/dev/nvidia{i}")).collect();
    v.extend(["/dev/nvidiactl".to_string(), "/dev/nvidia-uvm".to_string()]);
    v
}

/// The annotation's key and the value inject writes.
pub fn device_annotation() -> (String, String) {
    let v: String = paths().iter().map(|p| format!("- path: {p}\n")).collect();
    (format!("devices.gke.io/container.{DAEMON}"), v)
}

/// What a Pod's own device annotation for the daemon container gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Given {
    /// None: inject writes its own.
    No,
    /// Every device the daemon needs: kept as it is.
    All,
    /// Not all of them: why, for a refusal.
    Short(String),
}

/// Reads the annotation a Pod holds: its `path:` entries, one a line (the
/// shape GKE's manifests write; other keys of an entry are left alone).
pub fn given(annotations: Option<&Value>) -> Given {
    let (key, _) = device_annotation();
    let Some(v) = annotations.and_then(|a| a.get(key.as_str())) else { return Given::No };
    let Some(text) = v.as_str() else { return Given::Short(format!("{} is not a text", show(v))) };
    let listed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().trim_start_matches("- ").trim().strip_prefix("path:"))
        .map(|p| p.trim().trim_matches(|c| c == '"' || c == '\''))
        .collect();
    let missing: Vec<String> = paths().into_iter().filter(|p| !listed.contains(&p.as_str())).collect();
    match &missing[..] {
        [] => Given::All,
        m => Given::Short(format!("lists no {}", m.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: &str) -> Given {
        let (key, _) = device_annotation();
        let mut m = serde_norway::Mapping::new();
        m.insert(Value::from(key), Value::from(value));
        given(Some(&Value::Mapping(m)))
    }

    #[test]
    fn a_pods_own_annotation_is_kept_only_where_it_lists_every_device() {
        assert_eq!(given(None), Given::No);
        let (_, ours) = device_annotation();
        assert_eq!(with(&ours), Given::All);
        // Indented, quoted, with a key beside the path, in another order.
        let theirs: String = ours
            .lines()
            .rev()
            .map(|l| format!("    {}\n      type: c\n", l.replace("path: ", "path: \"")))
            .collect();
        let theirs = theirs.replace("\n      type", "\"\n      type");
        assert_eq!(with(&theirs), Given::All, "{theirs}");
        let short = ours.replace("- path: /dev/nvidia-uvm\n", "").replace("- path: /dev/nvidia7\n", "");
        assert_eq!(with(&short), Given::Short("lists no /dev/nvidia7, /dev/nvidia-uvm".into()));
        assert_eq!(with(""), Given::Short(format!("lists no {}", paths().join(", "))));
    }
}
