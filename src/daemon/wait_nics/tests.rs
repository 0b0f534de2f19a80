//! Waiting for late NICs: what ends a wait, and what a waiting daemon shows.
//! Time bounds here only stop a test that hangs; what is asserted is order
//! (nothing returns before the NIC is there, nothing waits out a bound).

use super::*;
use std::path::Path;

/// Ends a test that would otherwise hang; far above anything asserted.
const HANG: Duration = Duration::from_secs(60);

fn flags(sysfs: &Path, preset: &Path, wait: &str, uds: &Path) -> Flags {
    flags_with(sysfs, preset, wait, uds, &[])
}

fn flags_with(sysfs: &Path, preset: &Path, wait: &str, uds: &Path, extra: &[&str]) -> Flags {
    let mut args = vec![
        "tcpx-rxdm".to_string(),
        format!("--sysfs_root={}", sysfs.display()),
        format!("--gpu_nic_preset={}", preset.display()),
        format!("--wait_for_nics={wait}"),
        format!("--uds_path={}", uds.display()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    Flags::parse_args(args).unwrap()
}

/// A fabricated sysfs with `class/net`, a preset file naming `eth7`, and a socket folder.
struct Layout {
    tmp: tempfile::TempDir,
    sysfs: std::path::PathBuf,
    preset: std::path::PathBuf,
    uds: std::path::PathBuf,
}

fn layout() -> Layout {
    let tmp = tempfile::tempdir().unwrap();
    let sysfs = tmp.path().join("sys");
    std::fs::create_dir_all(sysfs.join("class/net/lo")).unwrap();
    let preset = tmp.path().join("late.textproto");
    std::fs::write(
        &preset,
        "gpu_rxq_configs { ifname: \"eth7\" gpu_infos { gpu_pci_addr: \"0000:04:00.0\" queue_ids: 8 } }\n",
    )
    .unwrap();
    let uds = tmp.path().join("uds");
    Layout { tmp, sysfs, preset, uds }
}

impl Layout {
    fn flags(&self, wait: &str) -> Flags {
        flags(&self.sysfs, &self.preset, wait, &self.uds)
    }

    fn nic_appears(&self) {
        std::fs::create_dir(self.sysfs.join("class/net/eth7")).unwrap();
    }
}

async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(HANG, f).await.expect("hung")
}

/// The waiting daemon's `status` reply, once it answers.
async fn status_while_waiting(uds: &Path) -> Value {
    let uds = uds.to_path_buf();
    within(async move {
        loop {
            let u = uds.clone();
            if let Ok(Ok(v)) = tokio::task::spawn_blocking(move || status::ask(&u, "status")).await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

#[tokio::test]
async fn without_a_wait_a_missing_nic_fails_at_once_and_makes_nothing() {
    let l = layout();
    let e = within(load(l.flags("0"))).await.err().unwrap();
    assert!(matches!(e, DaemonError::Flags(_)), "{e}");
    assert!(e.to_string().contains("interface eth7 not found"), "{e}");
    assert_eq!(e.exit_code(), 2);
    assert!(!l.uds.exists(), "no wait: the socket folder is not made");
}

#[tokio::test]
async fn a_nic_that_appears_within_the_bound_is_waited_for_and_status_says_so() {
    let l = layout();
    let waiting = tokio::spawn(load(l.flags("1h")));
    let v = status_while_waiting(&l.uds).await;
    assert_eq!(v["ready"], false);
    assert_eq!(v["starting"]["missing_nics"], json!(["eth7"]), "{v}");
    let what = v["starting"]["waiting_for"].as_str().unwrap();
    assert!(what.contains("interface eth7 to appear under") && what.contains("class/net"), "{what}");
    assert_eq!(v["starting"]["wait_for_nics_seconds"], 3600);
    // The folder is the waiting daemon's: a second one is refused at once.
    let second = SocketDir::lock(&l.uds, 0o660, None).err().expect("locked while waiting");
    assert!(second.to_string().contains(&format!("pid {}", std::process::id())), "{second}");
    assert!(!waiting.is_finished(), "returned before the NIC was there");
    l.nic_appears();
    let Loaded { config, dir } = within(waiting).await.unwrap().unwrap();
    assert_eq!(config.topology.nics[0].ifname, "eth7");
    // The folder stays locked, its status socket handed on for the daemon to serve.
    let mut dir = dir.expect("the folder locked while waiting");
    assert!(SocketDir::lock(&l.uds, 0o660, None).is_err());
    let sock = l.uds.join(status::SOCKET);
    assert!(sock.exists());
    let again = dir.bind_with_mode(status::SOCKET, 0o600).unwrap();
    drop(again);
    drop(dir);
    assert!(!sock.exists() && !l.uds.exists(), "what the wait made is removed with the folder");
    drop(l.tmp);
}

/// Discovery's view of a node: `lo` (which has an address on every host)
/// as a NIC two hops below a PCIe switch that also holds a GPU. The
/// interface's `class/net` link comes last, as the kernel adds it.
fn gpu_nic_appears(sysfs: &Path) {
    const BRIDGE: (&str, &str) = ("0x1000", "0x060400");
    let functions = [
        ("0000:00:01.0", BRIDGE),
        ("0000:00:01.0/0000:01:00.0", BRIDGE),
        ("0000:00:01.0/0000:01:00.0/0000:02:01.0", BRIDGE),
        ("0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:03:00.0", ("0x10de", "0x030200")),
        ("0000:00:01.0/0000:01:00.0/0000:02:02.0", BRIDGE),
        ("0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:04:00.0", ("0x1ae0", "0x020000")),
    ];
    let root = sysfs.join("devices/pci0000:00");
    for (path, (vendor, class)) in functions {
        let dir = root.join(path);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("vendor"), format!("{vendor}\n")).unwrap();
        std::fs::write(dir.join("class"), format!("{class}\n")).unwrap();
    }
    let nic = root.join("0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:04:00.0/net/lo");
    std::fs::create_dir_all(&nic).unwrap();
    std::os::unix::fs::symlink("../../../0000:04:00.0", nic.join("device")).unwrap();
    let link = "../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:04:00.0/net/lo";
    std::os::unix::fs::symlink(link, sysfs.join("class/net/lo")).unwrap();
}

#[tokio::test]
async fn discovery_that_finds_no_gpu_nic_yet_is_waited_for() {
    // What the systemd unit and the DaemonSet run: --gpu_nic_preset=auto with a wait.
    let l = layout();
    std::fs::remove_dir(l.sysfs.join("class/net/lo")).unwrap();
    let auto = Path::new("auto");
    let waiting = tokio::spawn(load(flags_with(&l.sysfs, auto, "1h", &l.uds, &["--nic_backend=sim"])));
    let v = status_while_waiting(&l.uds).await;
    let what = v["starting"]["waiting_for"].as_str().unwrap();
    assert!(what.contains("discovery to find a NIC with GPUs"), "{v}");
    tokio::time::sleep(POLL * 2).await;
    assert!(!waiting.is_finished(), "returned before discovery found a NIC");
    gpu_nic_appears(&l.sysfs);
    let Loaded { config, .. } = within(waiting).await.unwrap().unwrap();
    let nics: Vec<&str> = config.topology.nics.iter().map(|n| n.ifname.as_str()).collect();
    assert_eq!(nics, ["lo"]);
}

#[tokio::test]
async fn discovery_without_a_wait_fails_at_once_as_a_configuration_error() {
    let l = layout();
    let e = within(load(flags_with(&l.sysfs, Path::new("auto"), "0", &l.uds, &[]))).await.err().unwrap();
    assert!(e.to_string().contains("with a GPU behind it (PCI tree under"), "{e}");
    assert_eq!(e.exit_code(), 2);
}

#[tokio::test]
async fn an_explicit_ethtool_backend_waits_for_its_nics_too() {
    let l = layout();
    let ethtool = flags_with(&l.sysfs, &l.preset, "1h", &l.uds, &["--nic_backend=ethtool"]);
    let waiting = tokio::spawn(load(ethtool));
    let v = status_while_waiting(&l.uds).await;
    assert_eq!(v["starting"]["missing_nics"], json!(["eth7"]), "{v}");
    tokio::time::sleep(POLL * 2).await;
    assert!(!waiting.is_finished(), "returned before the NIC was there");
    l.nic_appears();
    let Loaded { config, .. } = within(waiting).await.unwrap().unwrap();
    assert_eq!(config.topology.nics[0].ifname, "eth7");
    // Without a wait the refusal names the backend the user chose.
    let e = within(load(flags_with(&l.sysfs, &l.preset, "0", &l.uds, &["--nic_backend=ethtool"]))).await;
    assert!(e.is_ok(), "eth7 is there now");
    std::fs::remove_dir(l.sysfs.join("class/net/eth7")).unwrap();
    let e = within(load(flags_with(&l.sysfs, &l.preset, "0", &l.uds, &["--nic_backend=ethtool"])))
        .await
        .err()
        .unwrap();
    assert!(e.to_string().starts_with("--nic_backend=ethtool: interface eth7 not found"), "{e}");
}

#[tokio::test]
async fn with_takeover_auto_the_folder_is_taken_only_when_no_daemon_serves_it() {
    let l = layout();
    let auto = |l: &Layout| flags_with(&l.sysfs, &l.preset, "1h", &l.uds, &["--takeover=auto"]);
    // No daemon: the waiting one answers status.
    let waiting = tokio::spawn(load(auto(&l)));
    assert_eq!(status_while_waiting(&l.uds).await["starting"]["missing_nics"], json!(["eth7"]));
    waiting.abort();
    let _ = waiting.await;
    // A daemon holds the folder: the waiting one leaves it alone, and still waits.
    let held = SocketDir::lock(&l.uds, 0o660, None).unwrap();
    let waiting = tokio::spawn(load(auto(&l)));
    let sock = l.uds.join(status::SOCKET);
    tokio::time::sleep(POLL * 4).await;
    assert!(!waiting.is_finished() && !sock.exists(), "took the folder of a daemon serving it");
    l.nic_appears();
    let Loaded { dir, .. } = within(waiting).await.unwrap().unwrap();
    assert!(dir.is_none());
    drop(held);
}

#[tokio::test]
async fn a_wait_ended_early_leaves_nothing_behind() {
    // As a signal does: the future dropped during the wait.
    let l = layout();
    let waiting = tokio::spawn(load(l.flags("1h")));
    status_while_waiting(&l.uds).await;
    waiting.abort();
    assert!(within(waiting).await.is_err_and(|e| e.is_cancelled()));
    assert!(!l.uds.exists(), "the folder, its lock and status socket are removed");
}

#[tokio::test]
async fn a_nic_still_missing_after_the_bound_fails_with_the_wait_named() {
    let l = layout();
    let t = Instant::now();
    let e = within(load(l.flags("600ms"))).await.err().unwrap();
    assert!(t.elapsed() >= Duration::from_millis(600), "gave up before the bound");
    let msg = e.to_string();
    assert!(msg.contains("eth7") && msg.contains("--wait_for_nics"), "{msg}");
    assert_eq!(e.exit_code(), 2, "still a configuration error: a restart would not help");
    assert!(!l.uds.exists(), "nothing left behind");
}

#[tokio::test]
async fn other_errors_do_not_wait() {
    let l = layout();
    let bad = l.tmp.path().join("bad.textproto");
    std::fs::write(&bad, "gpu_rxq_configs { bogus: 1 }").unwrap();
    // Returns at all (within the hang bound, the wait being an hour): it did not wait.
    let e = within(load(flags(&l.sysfs, &bad, "1h", &l.uds))).await.err().unwrap();
    assert!(matches!(e, DaemonError::Topology(ConfigError::Parse { .. })), "{e}");
}

#[test]
fn what_is_waited_for_names_every_missing_nic() {
    let e = DaemonError::Flags(FlagError::NicNotFound {
        backend: "auto",
        ifnames: vec!["eth3".into(), "eth4".into()],
        class_net: Some("/sys/class/net".into()),
        elsewhere: None,
    });
    let (what, nics) = waiting_for(&e);
    assert_eq!(what, "interfaces eth3, eth4 to appear under /sys/class/net or in this network namespace");
    assert_eq!(nics, ["eth3", "eth4"]);
}
