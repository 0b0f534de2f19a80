//! NICs that come up late at boot (`--wait_for_nics`). A driver may register
//! its interfaces seconds after the service manager starts the daemon; instead
//! of failing at once (exit 2, which a unit does not retry), the daemon looks
//! again every [`POLL`] until the NICs are there or the bound has passed.
//!
//! What "there" means depends on where the topology comes from: a preset or
//! file names its NICs, which must exist under `<sysfs>/class/net`;
//! discovery (`auto`) must find at least one NIC with a GPU, and `a6` the
//! NICs it names.

use std::time::{Duration, Instant};

use crate::config::flags::Flags;
use crate::config::presets::ConfigError;
use crate::types::topology::TopologyError;

use super::backends::missing_nic;
use super::{notify, Config, DaemonError};

/// How often the NICs are looked for while waiting.
pub const POLL: Duration = Duration::from_millis(250);

/// [`Config::load`], waiting up to `--wait_for_nics` for missing NICs. Other
/// errors return at once; a NIC still missing at the end returns its error,
/// wrapped in [`DaemonError::NicsNotUp`] when there was a wait.
pub async fn load(flags: Flags) -> Result<Config, DaemonError> {
    let started = Instant::now();
    let bound = flags.wait_for_nics;
    let mut waiting = false;
    loop {
        let missing = match Config::load(flags.clone()) {
            Ok(config) => match missing_nic(&config.flags, &config.topology, &config.source) {
                None => {
                    if waiting {
                        tracing::info!(waited_ms = started.elapsed().as_millis() as u64, "the NICs are up");
                    }
                    return Ok(config);
                }
                Some(e) => DaemonError::Flags(e),
            },
            Err(e) if is_missing_nic(&e, &flags) => e,
            Err(e) => return Err(e),
        };
        let elapsed = started.elapsed();
        if elapsed >= bound {
            if bound.is_zero() {
                return Err(missing);
            }
            return Err(DaemonError::NicsNotUp { waited: bound, source: Box::new(missing) });
        }
        if !waiting {
            waiting = true;
            let bound_text = crate::types::secs(bound);
            tracing::warn!(error = %missing, wait_for_nics = %bound_text, "a NIC is not up yet; waiting for it");
            notify::send(&notify::status(&format!("waiting up to {bound_text} for NICs: {missing}")));
        }
        tokio::time::sleep(POLL.min(bound - elapsed)).await;
    }
}

/// Whether `e` says a NIC is not there (yet), as opposed to a bad configuration.
fn is_missing_nic(e: &DaemonError, flags: &Flags) -> bool {
    let discovery = matches!(flags.gpu_nic_preset.as_str(), "auto" | "a6");
    match e {
        DaemonError::Topology(ConfigError::A6NicMissing { .. }) => true,
        DaemonError::Topology(ConfigError::Invalid { err: TopologyError::Empty, .. }) => discovery,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn flags(sysfs: &Path, preset: &Path, wait: &str) -> Flags {
        Flags::parse_args([
            "tcpx-rxdm".to_string(),
            format!("--sysfs_root={}", sysfs.display()),
            format!("--gpu_nic_preset={}", preset.display()),
            format!("--wait_for_nics={wait}"),
        ])
        .unwrap()
    }

    /// A fabricated sysfs with `class/net` and a preset file naming `eth7`.
    fn layout() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let sysfs = tmp.path().join("sys");
        std::fs::create_dir_all(sysfs.join("class/net/lo")).unwrap();
        let preset = tmp.path().join("late.textproto");
        std::fs::write(
            &preset,
            "gpu_rxq_configs { ifname: \"eth7\" gpu_infos { gpu_pci_addr: \"0000:04:00.0\" queue_ids: 8 } }\n",
        )
        .unwrap();
        (tmp, sysfs, preset)
    }

    #[tokio::test]
    async fn without_a_wait_a_missing_nic_fails_at_once() {
        let (_tmp, sysfs, preset) = layout();
        let t = Instant::now();
        let e = load(flags(&sysfs, &preset, "0")).await.err().unwrap();
        assert!(t.elapsed() < Duration::from_secs(1));
        assert!(matches!(e, DaemonError::Flags(_)), "{e}");
        assert!(e.to_string().contains("eth7"), "{e}");
        assert_eq!(e.exit_code(), 2);
    }

    #[tokio::test]
    async fn a_nic_that_appears_within_the_bound_is_waited_for() {
        let (_tmp, sysfs, preset) = layout();
        let nic = sysfs.join("class/net/eth7");
        let t = Instant::now();
        let appear = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(700));
            std::fs::create_dir(nic).unwrap();
        });
        let config = load(flags(&sysfs, &preset, "10s")).await.unwrap();
        let waited = t.elapsed();
        appear.join().unwrap();
        assert_eq!(config.topology.nics[0].ifname, "eth7");
        assert!(waited >= Duration::from_millis(700), "returned before the NIC was there: {waited:?}");
        // A few polls of slack for a loaded machine; far from the 10 s bound.
        assert!(waited < Duration::from_millis(700) + 8 * POLL, "noticed late: {waited:?}");
    }

    #[tokio::test]
    async fn a_nic_still_missing_after_the_bound_fails_with_the_wait_named() {
        let (_tmp, sysfs, preset) = layout();
        let t = Instant::now();
        let e = load(flags(&sysfs, &preset, "600ms")).await.err().unwrap();
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(600) && took < Duration::from_secs(3), "{took:?}");
        let msg = e.to_string();
        assert!(msg.contains("eth7") && msg.contains("--wait_for_nics"), "{msg}");
        assert_eq!(e.exit_code(), 2, "still a configuration error: a restart would not help");
    }

    #[tokio::test]
    async fn other_errors_do_not_wait() {
        let (tmp, sysfs, _) = layout();
        let bad = tmp.path().join("bad.textproto");
        std::fs::write(&bad, "gpu_rxq_configs { bogus: 1 }").unwrap();
        let t = Instant::now();
        let e = load(flags(&sysfs, &bad, "30s")).await.err().unwrap();
        assert!(t.elapsed() < Duration::from_secs(1), "waited on a syntax error");
        assert!(matches!(e, DaemonError::Topology(ConfigError::Parse { .. })), "{e}");
    }
}
