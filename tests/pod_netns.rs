//! The daemon as GKE runs it today: in a Pod's network namespace of its own
//! (multi-networking attaches the GPU NICs eth1..eth4 to the Pod), with only
//! CAP_NET_ADMIN and no new privileges, the host's sysfs read-only at
//! `/hostsysfs`, the host's `/proc/sys/net` at `/hostprocsysfs/net`, the
//! socket folder an emptyDir-like folder at `/run/tcpx`, and the job's end
//! told by `/usr/share/workload/workload_terminated`.
//!
//! The Pod is a network namespace holding veths named eth1..eth4 with
//! addresses; the host's sysfs is a fabricated a3-highgpu-8g tree whose
//! `class/net` no longer lists eth1..eth4 (they moved into the Pod). The
//! daemon runs in a private mount namespace where an overlay of `/` gives it
//! `/hostsysfs` and the rest without touching this machine's root, then
//! `chroot`, then `setpriv` down to CAP_NET_ADMIN. A veth has no ntuple
//! table: the daemon takes what it lacks from the test build's stand-in
//! (`TCPX_RXDM_TEST_VETH_NICS=1`, `nic::veth_standin`), while presence,
//! addresses, links, host tuning and each rule install's ioctl are the
//! kernel's.
//!
//! Needs root (network, mount and cgroup namespaces, veth, overlayfs): run
//! with `cargo test --test pod_netns -- --include-ignored`.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::netns::Netns;
use common::sysfs::{a3_highgpu_8g, FakeSysfs};
use common::tenant::{rule, Agent, Cgroup, Reply};
use common::{wait_until, Daemon, BIN};
use tcpx_rxdm::wire::client;

const GPU0: &str = "0000:04:00.0";
/// What the daemon's start builds: an overlay of `/` in a private mount
/// namespace, the Pod's mounts in it, then chroot and setpriv to
/// CAP_NET_ADMIN only. `$@` is the daemon's command line.
const POD_SETUP: &str = r#"set -e
mount -t tmpfs tmpfs "$BASE"
mkdir "$BASE/up" "$BASE/work" "$BASE/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$BASE/up,workdir=$BASE/work" "$BASE/root"
R=$BASE/root
for d in /proc /sys /dev /usr /lib /lib64 /bin /sbin /etc; do
  if [ -d "$d" ] && mountpoint -q "$d"; then mount --rbind "$d" "$R$d"; fi
done
bin_dir=$(dirname "$1")
mkdir -p "$R$bin_dir" "$R/hostsysfs" "$R/hostprocsysfs/net" "$R/run/tcpx" "$R/usr/share/workload"
mount --bind "$bin_dir" "$R$bin_dir"
mount --bind "$HOST_SYSFS" "$R/hostsysfs"
mount -o remount,bind,ro "$R/hostsysfs"
mount --bind /proc/sys/net "$R/hostprocsysfs/net"
mount --bind "$UDS" "$R/run/tcpx"
mount --bind "$WORKLOAD" "$R/usr/share/workload"
exec chroot "$R" setpriv --inh-caps=-all,+net_admin --ambient-caps=-all,+net_admin \
  --bounding-set=-all,+net_admin --no-new-privs "$@""#;

/// A Pod's network namespace: eth1..eth4 (16 queues each) with addresses,
/// their peers beside them.
fn pod_ns() -> Netns {
    let ns = Netns::new("pod");
    for i in 1..=4 {
        ns.add_veth(&format!("eth{i}"), &format!("fabric{i}"), Some(16));
        ns.ip(&["addr", "add", &format!("10.{i}.0.1/24"), "dev", &format!("eth{i}")]);
    }
    ns
}

/// The host's sysfs: the a3-highgpu-8g PCI tree with its GPUs, NUMA nodes,
/// cubic's parameter, and a `class/net` that lists only the host's eth0.
fn host_sysfs() -> FakeSysfs {
    let host = a3_highgpu_8g();
    host.bus_links().gce_cpus(2, 2);
    for i in 1..=4 {
        host.numa_node(&format!("eth{i}"), if i <= 2 { 0 } else { 1 }).moved_away(&format!("eth{i}"));
    }
    let hystart = host.root().join("module/tcp_cubic/parameters/hystart_detect");
    std::fs::create_dir_all(hystart.parent().unwrap()).unwrap();
    std::fs::write(&hystart, "3\n").unwrap();
    host
}

/// The folders the Pod's mounts come from, and the mount namespace's base.
struct PodDirs {
    base: tempfile::TempDir,
    uds: tempfile::TempDir,
    workload: tempfile::TempDir,
    host: FakeSysfs,
}

impl PodDirs {
    fn new() -> PodDirs {
        let t = || tempfile::tempdir().unwrap();
        PodDirs { base: t(), uds: t(), workload: t(), host: host_sysfs() }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        let s = |p: &Path| p.display().to_string();
        vec![
            ("BASE", s(self.base.path())),
            ("UDS", s(self.uds.path())),
            ("WORKLOAD", s(self.workload.path())),
            ("HOST_SYSFS", s(self.host.root())),
            ("TCPX_RXDM_TEST_VETH_NICS", "1".into()),
        ]
    }

    /// `ip netns exec NS unshare --mount … sh -c POD_SETUP sh`, the daemon's
    /// command line to follow.
    fn prefix(ns: &Netns) -> Vec<String> {
        let p = ["ip", "netns", "exec", ns.name(), "unshare", "--mount", "--propagation", "private"];
        let mut v: Vec<String> = p.iter().map(|s| s.to_string()).collect();
        v.extend(["sh", "-c", POD_SETUP, "sh"].map(String::from));
        v
    }

    fn sock(&self, name: &str) -> PathBuf {
        self.uds.path().join(name)
    }
}

/// A value of the Pod's namespace's `/proc/sys/net`, read by a process in it.
fn pod_sysctl(ns: &Netns, name: &str) -> String {
    let out = ns.command("cat").arg(format!("/proc/sys/net/{name}")).output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().collect::<Vec<_>>().join(" ")
}

fn host_sysctl(name: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/net/{name}"))
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn status_json(uds: &Path) -> serde_json::Value {
    let out = std::process::Command::new(BIN)
        .args(["status", "--json", &format!("--uds_path={}", uds.display())])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
}

/// The reference's flags, as GKE's manifests pass them.
const REFERENCE_FLAGS: [&str; 9] = [
    "--gpu_nic_preset",
    "a3vm",
    "--gpu_shmem_type",
    "fd",
    "--uds_path",
    "/run/tcpx",
    "--setup_param",
    "--verbose 128 2 0 ",
    "--shutdown_file=/usr/share/workload/workload_terminated",
];

#[test]
#[ignore = "needs root: network, mount and cgroup namespaces, veth, overlayfs"]
fn a_pod_s_daemon_with_only_net_admin_serves_its_nics_and_ends_with_the_job() {
    let ns = pod_ns();
    let dirs = PodDirs::new();
    let env = dirs.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let pod_rmem = pod_sysctl(&ns, "ipv4/tcp_rmem");
    let host_rmem = host_sysctl("ipv4/tcp_rmem");
    assert_ne!(pod_rmem, "4096 1048576 15728640", "the namespace starts untuned");
    let prefix = PodDirs::prefix(&ns);
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    let mut flags = REFERENCE_FLAGS.to_vec();
    flags.extend([
        "--nic_backend=ethtool",
        "--gpu_backend=host",
        "--bind_backend=none",
        "--rx_pool_size=1M",
        "--metrics_address=",
    ]);
    let mut d = Daemon::spawn_under(&prefix, &flags, &env).ready();
    let log = d.log().join("\n");

    // Only CAP_NET_ADMIN, no new privileges.
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())).unwrap();
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).unwrap().trim().to_string();
    assert_eq!(field("CapEff:"), "0000000000001000", "{status}");
    assert_eq!(field("CapBnd:"), "0000000000001000", "{status}");
    assert_eq!(field("NoNewPrivs:"), "1");
    // Its NICs were found in its own namespace, the host's sysfs lacking them.
    assert!(log.contains("a network namespace other than the host's"), "{log}");
    // Tuning: the Pod's namespace's sysctls (through /hostprocsysfs), not the host's.
    assert_eq!(pod_sysctl(&ns, "ipv4/tcp_rmem"), "4096 1048576 15728640");
    assert_eq!(host_sysctl("ipv4/tcp_rmem"), host_rmem);
    assert!(log.contains("/hostprocsysfs/net/ipv4/tcp_rmem"), "{log}");
    let routes = ns.ip(&["route", "show", "dev", "eth1"]);
    assert!(routes.contains("initcwnd 128") && routes.contains("rto_min 2ms"), "{routes}");
    // cubic's parameter is the host's: the read-only host sysfs leaves it alone.
    let hystart = d.wait_for_log("hystart_detect left alone", Duration::from_secs(5)).expect("logged");
    assert!(hystart.contains("INFO") && hystart.contains("Read-only"), "{hystart}");
    assert_eq!(
        std::fs::read_to_string(dirs.host.root().join("module/tcp_cubic/parameters/hystart_detect")).unwrap(),
        "3\n"
    );
    let nccl = std::fs::read_to_string(dirs.sock("nccl.env")).unwrap();
    assert!(nccl.contains("NCCL_GPUDIRECTTCPX_SOCKET_IFNAME=eth1,eth2,eth3,eth4"), "{nccl}");

    // A workload of the Pod: same network namespace, its GPU held open.
    let cg = Cgroup::new("pod");
    let mut agent = Agent::start_in(&cg, 0, ns.name());
    let pool = agent.req(&dirs.sock(&format!("get_gpu_fd_{GPU0}")), &client::raw_request(GPU0));
    assert!(matches!(pool, Reply::Fd), "no pool fd: {}", pool.text());
    let (local, remote) = agent.conn(false);
    let install = agent.req(&dirs.sock("rx_rule_manager"), &rule(local, remote, GPU0));
    // The install reached eth1's driver: a veth answers that it has no ntuple table.
    assert_eq!(install.code(), 13, "{}", install.text());
    assert!(install.text().contains("eth1") && install.text().contains("EOPNOTSUPP"), "{}", install.text());
    assert_eq!(status_json(dirs.uds.path())["lease_clients"], 1);
    agent.exit();
    wait_until(Duration::from_secs(20), || status_json(dirs.uds.path())["lease_clients"] == 0);

    // The job ends: the workload's file.
    std::fs::write(dirs.workload.path().join("workload_terminated"), "").unwrap();
    let code = d.wait_exit(Duration::from_secs(30)).code();
    let log = d.log().join("\n");
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("host tuning undone"), "{log}");
    assert_eq!(pod_sysctl(&ns, "ipv4/tcp_rmem"), pod_rmem);
    assert!(!ns.ip(&["route", "show", "dev", "eth1"]).contains("initcwnd"));
    let left: Vec<_> = std::fs::read_dir(dirs.uds.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "left in the socket folder: {left:?}");
}

#[test]
#[ignore = "needs root: network and mount namespaces, veth, overlayfs"]
fn doctor_in_a_pod_explains_the_layout() {
    let ns = pod_ns();
    let dirs = PodDirs::new();
    let prefix = PodDirs::prefix(&ns);
    let mut cmd = std::process::Command::new(&prefix[0]);
    // Of the reference's flags, those doctor reads (it refuses the others).
    cmd.args(&prefix[1..]).arg(BIN).arg("doctor").args(&REFERENCE_FLAGS[..2]).args(&REFERENCE_FLAGS[4..6]);
    cmd.args(["--nic_backend=ethtool", "--gpu_backend=host", "--bind_backend=none"]);
    for (k, v) in dirs.env() {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{stdout}");
    let has = |needle: &str| assert!(stdout.contains(needle), "missing {needle:?} in:\n{stdout}");
    has("✔ place: a network namespace of its own, not the host's");
    has("✔ NICs: in this namespace: eth1 (no PCI device), eth2");
    has("✔ host sysfs: /hostsysfs (the host's): the PCI tree with 8 NVIDIA GPUs; its class/net lists eth0, lo");
    has("✔ tuning: this namespace's TCP sysctls");
    has("✔ GPU count: 8 NVIDIA GPUs on the PCI bus");
    has("✔ present: ifindex");
    has("host-wide, the node's to set: hystart_detect \"3\"");
    // A veth is no TCPX NIC: doctor says so, and the verdict fails.
    has("✗ ntuple: not supported");
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A NIC the host's sysfs still lists but the Pod's namespace lacks (not
/// attached to the Pod): a configuration error naming where it is.
#[test]
#[ignore = "needs root: network and mount namespaces, veth, overlayfs"]
fn a_nic_left_in_the_host_s_namespace_is_named_there() {
    let ns = Netns::new("pod-short");
    for i in [1, 2, 4] {
        ns.add_veth(&format!("eth{i}"), &format!("fabric{i}"), Some(16));
    }
    let dirs = PodDirs::new();
    // eth3 was not moved into the Pod: the host's class/net lists it again.
    dirs.host.class_link("eth3", "pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:03.0/0000:86:00.0/net/eth3");
    let prefix = PodDirs::prefix(&ns);
    let mut cmd = std::process::Command::new(&prefix[0]);
    cmd.args(&prefix[1..])
        .arg(BIN)
        .args(REFERENCE_FLAGS)
        .args(["--nic_backend=ethtool", "--gpu_backend=host"]);
    for (k, v) in dirs.env() {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("interface eth3 not found in this network namespace; eth3 listed under /hostsysfs/class/net, the host's network namespace"),
        "{last}"
    );
    assert!(!last.contains("eth1"), "{last}");
    println!("{last}");
}
