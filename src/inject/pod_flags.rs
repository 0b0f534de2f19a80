//! Which of the daemon's flags make sense for a daemon inject puts in a
//! Pod, and the daemon's own rules for the values and the combinations it
//! checks (`--log_level`, sim flags, shared-memory pools): inject refuses,
//! naming the flag, what the daemon would refuse or what could never work
//! in a Pod, rather than writing a Pod whose daemon exits at once or is
//! restarted forever.

use crate::config::flags::{Flags, GpuBackendKind, LogLevel, NicBackendKind, PRESET_NAMES};
use crate::config::presets;
use crate::gpu::ShmemType;

use super::Mode;

/// Why a daemon flag has no place in a Pod's daemon, whatever its value.
pub fn not_for_a_pod(name: &str) -> Option<&'static str> {
    Some(match name {
        "show_version" => {
            "prints the version and exits: a daemon container that exits at once never gets ready \
             (the image's version: `docker run --rm IMAGE --show_version`)"
        }
        "help" => "prints the help and exits: a daemon container that exits at once never gets ready",
        "takeover" | "takeover_timeout" | "after_handover" => {
            "an upgrade hands a running daemon's NICs and clients to a new one on the same node \
             (`tcpx-rxdm upgrade`, the DaemonSet's rollout); a daemon in a Pod starts and ends with \
             its Pod, with nothing to take over"
        }
        "node_wide" => {
            "a node-wide daemon runs once per node (deploy/kubernetes/daemonset.yaml); Pods use it \
             with --mode=node"
        }
        _ => return None,
    })
}

/// The level a person most likely meant by a word that is none.
fn meant_level(word: &str) -> Option<&'static str> {
    Some(match word.to_ascii_lowercase().as_str() {
        "err" | "errors" | "fatal" | "critical" => "error",
        "information" | "notice" => "info",
        "verbose" => "debug",
        "all" => "trace",
        _ => return None,
    })
}

/// `--log_level` by the daemon's own rule ([`LogLevel::parse`]), with a hint
/// for a word that is no level. Returns the level's name, which inject
/// writes: a daemon built before `warning` was taken reads `warn` too.
pub fn log_level(value: &str) -> Result<&'static str, String> {
    LogLevel::parse(value).map(LogLevel::name).map_err(|e| {
        let hint = meant_level(value.trim()).map(|l| format!("; did you mean {l}?")).unwrap_or_default();
        format!("{e}{hint}")
    })
}

/// The daemon's flags as the daemon of `mode` would run with them:
/// refused, naming the flag, where they could not work (the daemon's own
/// checks of flags that go together, made before it touches a NIC).
pub fn check(flags: &Flags, mode: Mode) -> Result<(), String> {
    let sim = match flags.nic_backend {
        NicBackendKind::Sim => true,
        NicBackendKind::Auto => flags.gpu_nic_preset == "sim",
        NicBackendKind::Ethtool => false,
    };
    if (!flags.sim_fault.is_empty() || !flags.sim_delay.is_empty()) && !sim {
        return Err("--sim_fault and --sim_delay need --nic_backend=sim (or --gpu_nic_preset=sim)".into());
    }
    let host_pools =
        flags.gpu_backend == GpuBackendKind::Host || (flags.gpu_backend == GpuBackendKind::Auto && sim);
    if flags.gpu_shmem_type == ShmemType::File && host_pools {
        return Err("--gpu_shmem_type=file needs CUDA pools, but the pools would be host memory \
                    (--gpu_backend=cuda)"
            .into());
    }
    if mode == Mode::NativeSidecar {
        let ends = if flags.monitor_shutdown {
            Some("--monitor_shutdown")
        } else if flags.shutdown_when_all_clients_exited {
            Some("--shutdown_when_all_clients_exited")
        } else {
            None
        };
        if let Some(flag) = ends {
            return Err(format!(
                "{flag}: a native sidecar that exits is started again by the kubelet (restartPolicy: \
                 Always); it ends with its Pod. For a daemon that ends with its workload, use --mode=sidecar"
            ));
        }
    }
    Ok(())
}

/// Whether a `--gpu_nic_preset` value names a file (as the daemon tells
/// one: a '/' or an extension), which only the node has.
pub fn is_preset_file(value: &str) -> bool {
    !PRESET_NAMES.contains(&value)
        && (value.contains('/') || std::path::Path::new(value).extension().is_some())
}

/// `--gpu_nic_preset` as inject's command line takes it: a preset's name,
/// or a file in the daemon's container (not looked for here).
pub fn preset(value: &str) -> Result<String, String> {
    if PRESET_NAMES.contains(&value) || is_preset_file(value) {
        return Ok(value.to_string());
    }
    Err(format!(
        "unknown preset (expected one of {}, or the path of a preset file in the daemon's container)",
        PRESET_NAMES.join(", ")
    ))
}

/// The topology the flags give, where it does not depend on the node (a
/// preset by name, or `manual` with an inline one): the daemon's own
/// reading of it, so that a bad one is refused here.
pub fn topology(flags: &Flags) -> Result<(), String> {
    let on_node = ["auto", "a6"].contains(&flags.gpu_nic_preset.as_str())
        || (flags.gpu_nic_preset == "manual"
            && flags.gpu_nic_topology.is_some()
            && flags.gpu_nic_topology_proto.is_none());
    if on_node {
        return Ok(());
    }
    presets::resolve_topology(flags).map(drop).map_err(|e| format!("daemon flags: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_level_is_a_level_in_any_case_or_warning_and_a_slip_gets_the_word_meant() {
        for (good, level) in [("info", "info"), ("WARN", "warn"), ("warning", "warn"), (" Debug ", "debug")] {
            assert_eq!(log_level(good), Ok(level), "{good}");
        }
        let e = log_level("verbose").unwrap_err();
        assert_eq!(
            e,
            "invalid value 'verbose' for '--log_level': expected one of error, warn, info, debug, trace \
             (`warning` is taken for warn; per-module filters go in RUST_LOG); did you mean debug?"
        );
        for bad in ["info,h2=off", "tcpx_rxdm=debug", "off", "loud", ""] {
            assert!(log_level(bad).unwrap_err().starts_with(&format!("invalid value '{bad}'")), "{bad}");
        }
        assert!(!log_level("loud").unwrap_err().contains("did you mean"));
    }

    #[test]
    fn flags_for_one_process_or_one_node_have_a_reason() {
        for f in ["show_version", "takeover", "after_handover", "takeover_timeout", "node_wide", "help"] {
            assert!(not_for_a_pod(f).is_some(), "{f}");
        }
        for f in ["uds_path", "rx_pool_size", "log_level", "metrics_address", "tenant_isolation"] {
            assert!(not_for_a_pod(f).is_none(), "{f}");
        }
    }
}
