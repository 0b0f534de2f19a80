//! `--platform`: which GPU stack the cluster runs, and so where the driver
//! and the NCCL plugin come from.
//!
//! - `gke`: GKE's driver installer puts the driver libraries and the TCPX
//!   NCCL plugin in `/home/kubernetes/bin/nvidia/lib64` on the node; the
//!   daemon and the GPU containers mount it at `/usr/local/nvidia/lib64`.
//! - `gpu-operator`: the NVIDIA GPU Operator runs the driver in a container
//!   and its toolkit injects the libraries into containers of runtime class
//!   `nvidia`. The Pod gets that runtime class, the daemon container
//!   `NVIDIA_VISIBLE_DEVICES=all` and `NVIDIA_DRIVER_CAPABILITIES` (CUDA and
//!   NVML), no GKE host path is mounted, and the NCCL plugin's folder is the
//!   user's choice: in the workload's image, or a folder on the node; by
//!   default neither, the image's own library path finding the plugin.

use serde_norway::Value;

use super::daemon::{map, s};
use super::LIBRARIES;

/// Host folder of the driver libraries and the NCCL plugin on GKE nodes.
pub const GKE_HOST_LIBRARIES: &str = "/home/kubernetes/bin/nvidia/lib64";
/// The runtime class the GPU Operator installs.
pub const RUNTIME_CLASS: &str = "nvidia";
/// What the daemon needs of the driver: CUDA (`compute`) and NVML (`utility`).
pub const DRIVER_CAPABILITIES: &str = "compute,utility";
/// Where the TCPX NCCL plugin (`libnccl-net.so`) is, with `gpu-operator`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginDir {
    /// In the workload's image, at this folder: put on `LD_LIBRARY_PATH`.
    Image(String),
    /// In this folder of the node: mounted (read-only) at
    /// `/usr/local/nvidia/lib64`, which goes on `LD_LIBRARY_PATH`.
    Host(String),
}

/// The cluster's GPU stack.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Platform {
    #[default]
    Gke,
    /// With the plugin's folder, if one was named.
    GpuOperator(Option<PluginDir>),
}

impl Platform {
    pub const NAMES: [&'static str; 2] = ["gke", "gpu-operator"];

    pub fn name(&self) -> &'static str {
        match self {
            Platform::Gke => "gke",
            Platform::GpuOperator(_) => "gpu-operator",
        }
    }

    /// From `--platform` and `--nccl-plugin` (each `None` when not given).
    pub fn from_options(platform: Option<&str>, plugin: Option<&str>) -> Result<Platform, String> {
        match (platform.unwrap_or("gke"), plugin) {
            ("gke", None) => Ok(Platform::Gke),
            ("gke", Some(_)) => Err(format!(
                "--nccl-plugin: goes with --platform=gpu-operator; on GKE the plugin installer \
                 puts the plugin in {GKE_HOST_LIBRARIES}, which inject mounts"
            )),
            ("gpu-operator", p) => Ok(Platform::GpuOperator(p.map(parse_plugin).transpose()?)),
            (other, _) => Err(format!(
                "--platform: invalid value {other:?} (expected one of {})",
                Self::NAMES.join(", ")
            )),
        }
    }

    /// The injection record's `platform=` value (`None`: GKE, the default):
    /// read back by [`Platform::from_options`] after splitting at ','.
    pub fn record_text(&self) -> Option<String> {
        match self {
            Platform::Gke => None,
            Platform::GpuOperator(None) => Some("gpu-operator".into()),
            Platform::GpuOperator(Some(PluginDir::Image(d))) => Some(format!("gpu-operator,image:{d}")),
            Platform::GpuOperator(Some(PluginDir::Host(d))) => Some(format!("gpu-operator,host:{d}")),
        }
    }

    /// The folder the GPU containers' `LD_LIBRARY_PATH` is set to hold
    /// (`None`: it is left alone).
    pub fn library_dir(&self) -> Option<&str> {
        match self {
            Platform::Gke | Platform::GpuOperator(Some(PluginDir::Host(_))) => Some(LIBRARIES),
            Platform::GpuOperator(Some(PluginDir::Image(dir))) => Some(dir),
            Platform::GpuOperator(None) => None,
        }
    }

    /// The `tcpx-libraries` volume, if the platform mounts one.
    pub fn library_volume(&self) -> Option<Value> {
        let host = |path: &str, kind: Option<&str>| {
            let mut h = vec![("path", s(path))];
            h.extend(kind.map(|k| ("type", s(k))));
            map(vec![("name", s("tcpx-libraries")), ("hostPath", map(h))])
        };
        match self {
            Platform::Gke => Some(host(GKE_HOST_LIBRARIES, None)),
            // The user named it: a missing folder is an error, not a new empty one.
            Platform::GpuOperator(Some(PluginDir::Host(dir))) => Some(host(dir, Some("Directory"))),
            Platform::GpuOperator(_) => None,
        }
    }

    /// Whether the daemon container mounts the libraries folder (and has it
    /// on `LD_LIBRARY_PATH`): on GKE, where libcuda is there too.
    pub fn daemon_mounts_libraries(&self) -> bool {
        *self == Platform::Gke
    }

    /// Variables the daemon container gets for the platform's runtime.
    pub fn daemon_env(&self) -> Vec<(&'static str, &'static str)> {
        match self {
            Platform::Gke => vec![],
            Platform::GpuOperator(_) => {
                vec![("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_DRIVER_CAPABILITIES", DRIVER_CAPABILITIES)]
            }
        }
    }

    /// The Pod's runtime class, if the platform needs one.
    pub fn runtime_class(&self) -> Option<&'static str> {
        match self {
            Platform::Gke => None,
            Platform::GpuOperator(_) => Some(RUNTIME_CLASS),
        }
    }

    /// Whether a daemon that is not privileged gets GKE's device-injection
    /// annotation (the GPU Operator's runtime gives the devices of
    /// NVIDIA_VISIBLE_DEVICES).
    pub fn gke_devices(&self) -> bool {
        *self == Platform::Gke
    }
}

/// `image:DIR` or `host:DIR`, DIR absolute and usable in `LD_LIBRARY_PATH`.
fn parse_plugin(v: &str) -> Result<PluginDir, String> {
    let bad = |why: &str| format!("--nccl-plugin: invalid value {v:?}: {why}");
    let (kind, dir) = v.split_once(':').ok_or_else(|| bad("expected image:DIR or host:DIR"))?;
    if !dir.starts_with('/') {
        return Err(bad("the folder must be an absolute path"));
    }
    if dir.contains(':') || dir.chars().any(char::is_whitespace) {
        return Err(bad("the folder goes on LD_LIBRARY_PATH: no ':' or spaces"));
    }
    let dir = match dir.trim_end_matches('/') {
        "" => "/".to_string(),
        d => d.to_string(),
    };
    match kind {
        "image" => Ok(PluginDir::Image(dir)),
        "host" => Ok(PluginDir::Host(dir)),
        _ => Err(bad("expected image:DIR or host:DIR")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_bad_ones_name_the_option() {
        assert_eq!(Platform::from_options(None, None), Ok(Platform::Gke));
        assert_eq!(Platform::from_options(Some("gpu-operator"), None), Ok(Platform::GpuOperator(None)));
        let host = Platform::from_options(Some("gpu-operator"), Some("host:/opt/tcpx/lib64/")).unwrap();
        assert_eq!(host, Platform::GpuOperator(Some(PluginDir::Host("/opt/tcpx/lib64".into()))));
        for (p, plugin, says) in [
            (Some("eks"), None, "--platform: invalid value \"eks\""),
            (Some("gke"), Some("image:/x"), "--nccl-plugin: goes with --platform=gpu-operator"),
            (Some("gpu-operator"), Some("/x"), "expected image:DIR or host:DIR"),
            (Some("gpu-operator"), Some("disk:/x"), "expected image:DIR or host:DIR"),
            (Some("gpu-operator"), Some("image:lib"), "absolute path"),
            (Some("gpu-operator"), Some("image:/a:/b"), "no ':'"),
        ] {
            let e = Platform::from_options(p, plugin).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn each_platform_says_where_the_libraries_are() {
        let gke = Platform::Gke;
        assert_eq!(gke.library_dir(), Some(LIBRARIES));
        assert_eq!(gke.library_volume().unwrap()["hostPath"]["path"], s(GKE_HOST_LIBRARIES));
        assert!(
            gke.runtime_class().is_none() && gke.daemon_env().is_empty() && gke.daemon_mounts_libraries()
        );
        let bare = Platform::GpuOperator(None);
        assert!(bare.library_dir().is_none() && bare.library_volume().is_none());
        assert_eq!(bare.runtime_class(), Some("nvidia"));
        let image = Platform::GpuOperator(Some(PluginDir::Image("/opt/nccl/lib".into())));
        assert_eq!(image.library_dir(), Some("/opt/nccl/lib"));
        assert!(image.library_volume().is_none() && !image.daemon_mounts_libraries());
        let host = Platform::GpuOperator(Some(PluginDir::Host("/opt/nccl/lib".into())));
        assert_eq!(host.library_dir(), Some(LIBRARIES));
        let v = host.library_volume().unwrap();
        assert_eq!((&v["hostPath"]["path"], &v["hostPath"]["type"]), (&s("/opt/nccl/lib"), &s("Directory")));
    }
}
