//! What each privilege is for, found by test (`SECURITY.md`, *Privileges*).
//!
//! Capabilities are per thread: each kernel operation of the daemon is tried
//! on a thread of its own whose effective set lacks the capability the table
//! names (the kernel answers `EPERM`, and the daemon's error names the
//! capability) and holds it (the call reaches the driver: a veth answers
//! `EOPNOTSUPP` where it has no such feature, or does it). Then the real
//! binary runs under `setpriv` with exactly the table's sets and
//! `no_new_privs`: per Pod (`CAP_NET_ADMIN` only, isolation off) and node-wide
//! (`CAP_NET_ADMIN`, `CAP_CHOWN`, `CAP_SYS_PTRACE`, `CAP_DAC_READ_SEARCH`,
//! `enforce`).
//!
//! Root only (`#[ignore = "needs root: ..."]`), with iproute2, `setpriv`
//! (util-linux) and python3 (the tenant client).

mod common;

use std::os::fd::AsFd;
use std::process::Command;
use std::time::Duration;

use common::netns::Netns;
use common::tenant::{rule, Agent, Cgroup, Reply, FRESH_DEV};
use common::{require_root, Daemon, GPU0};
use nix::errno::Errno;
use nix::sys::memfd::{memfd_create, MFdFlags};
use tcpx_rxdm::caps::Cap;
use tcpx_rxdm::gpu::{BindFailure, DevmemBinder, QueueBinder, RxPool};
use tcpx_rxdm::host::tuning::{HostTuning, TuningParams, TuningPlan};
use tcpx_rxdm::nic::ethtool::EthtoolNic;
use tcpx_rxdm::nic::{FlowSpec, NicInfo, NicResult, NicSetup, RuleControl, FEATURE_NTUPLE};
use tcpx_rxdm::wire::client::{self, FdReply};
use tcpx_rxdm::wire::proto::UnixSocketProto;

/// Sets the calling thread's effective capabilities to `caps` (they stay
/// permitted, so a later call may raise them again). Other threads keep theirs.
fn effective(caps: &[Cap]) {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    // _LINUX_CAPABILITY_VERSION_3: two data structs, 64 bits.
    let mut h = Header { version: 0x2008_0522, pid: 0 };
    let mut d = [Data::default(); 2];
    // SAFETY: capget writes the header and two data structs, which live on this stack.
    assert_eq!(unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) }, 0, "{}", Errno::last());
    let mask = caps.iter().fold(0u64, |m, c| m | 1 << c.bit());
    d[0].effective = mask as u32;
    d[1].effective = (mask >> 32) as u32;
    // SAFETY: capset reads the header and the two data structs; it changes only this thread.
    assert_eq!(unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) }, 0, "{}", Errno::last());
}

fn errno<T>(r: NicResult<T>) -> Option<Errno> {
    r.err().map(|e| e.errno)
}

/// Every NIC change the daemon makes (ethtool netlink and ioctls) needs
/// `CAP_NET_ADMIN`, and its error says so; the reads need nothing.
#[test]
#[ignore = "needs root: network namespaces, veth, capabilities"]
fn nic_changes_need_net_admin_and_reads_need_nothing() {
    let ns = Netns::with_veth("caps-nic");
    let flow = FlowSpec { src: "10.1.0.2:40000".parse().unwrap(), dst: "10.77.0.1:5000".parse().unwrap() };
    ns.run(|| {
        effective(&[]);
        let nic = EthtoolNic::open().expect("opening the sockets needs no capability");
        // Reads: what a NIC without the feature answers, with no capability at all.
        assert!(!nic.feature("eth1", "rx-gro").unwrap());
        assert_eq!(nic.channels("eth1").unwrap(), 4);
        assert!(nic.priv_flags("eth1").unwrap().is_empty());
        assert_eq!(errno(nic.rule_capacity("eth1")), Some(Errno::EOPNOTSUPP));
        assert_eq!(errno(nic.rss_table("eth1")), Some(Errno::EOPNOTSUPP));
        assert_eq!(errno(nic.tcp_data_split("eth1")), Some(Errno::EOPNOTSUPP));
        let changes = |nic: &EthtoolNic| {
            vec![
                ("set_feature rx-gro", errno(nic.set_feature("eth1", "rx-gro", true))),
                ("set_channels", errno(nic.set_channels("eth1", Some(2), None))),
                ("add_rule", errno(nic.add_rule("eth1", &flow, 1, 0))),
                ("del_rule", errno(nic.del_rule("eth1", 0))),
                ("set_rss", errno(nic.set_rss_table("eth1", &[0, 1]))),
                ("set_tcp_data_split", errno(nic.set_tcp_data_split("eth1", true))),
                ("set_rx_ring", errno(nic.set_rx_ring("eth1", 1024))),
            ]
        };
        for (op, e) in changes(&nic) {
            assert_eq!(e, Some(Errno::EPERM), "{op} without CAP_NET_ADMIN");
        }
        let text = nic.add_rule("eth1", &flow, 1, 0).unwrap_err().to_string();
        assert!(text.contains("add_rule on eth1 failed: EPERM"), "{text}");
        assert!(
            text.contains(
                "needs CAP_NET_ADMIN, which this process lacks: it is in its bounding set but not effective"
            ),
            "{text}"
        );
        // ntuple is fixed off on veth: refused by the driver before the kernel is asked.
        assert_eq!(errno(nic.set_feature("eth1", FEATURE_NTUPLE, true)), Some(Errno::EOPNOTSUPP));

        effective(&[Cap::NetAdmin]);
        let nic = EthtoolNic::open().unwrap();
        for (op, e) in changes(&nic) {
            assert_ne!(e, Some(Errno::EPERM), "{op} with CAP_NET_ADMIN");
            assert!(e.is_none() || e == Some(Errno::EOPNOTSUPP), "{op}: {e:?}");
        }
        assert_eq!(errno(nic.add_rule("eth1", &flow, 1, 0)), Some(Errno::EOPNOTSUPP));
        assert!(nic.feature("eth1", "rx-gro").unwrap());
        nic.set_feature("eth1", "rx-gro", false).unwrap();
        nic.set_channels("eth1", Some(4), None).unwrap();
    });
}

/// Host tuning: the sysctls are root's files (uid 0 writes them with no
/// capability, through a writable mount); the route metrics are rtnetlink
/// changes (`CAP_NET_ADMIN`).
#[test]
#[ignore = "needs root: network namespaces, veth, capabilities"]
fn route_metrics_need_net_admin_and_sysctls_only_root() {
    let ns = Netns::with_veth("caps-tune");
    ns.ip(&["addr", "add", "10.89.0.1/24", "dev", "eth1"]);
    let sysfs = tempfile::tempdir().unwrap();
    let hystart = sysfs.path().join("module/tcp_cubic/parameters/hystart_detect");
    std::fs::create_dir_all(hystart.parent().unwrap()).unwrap();
    std::fs::write(&hystart, "3\n").unwrap();
    let params = TuningParams { initcwnd: 128, rto_min_ms: 2, quickack: 1 };
    let plan = TuningPlan::Native { procfs_root: "/proc".into(), sysfs_root: sysfs.path().into() };
    ns.run(|| {
        effective(&[]);
        let (mut t, errors) = HostTuning::apply(&params, &plan);
        let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        assert!(!text.is_empty(), "the route change went through without CAP_NET_ADMIN");
        for e in &text {
            assert!(e.starts_with("route ") && e.contains("EPERM"), "only routes fail: {e}");
            assert!(e.contains("needs CAP_NET_ADMIN, which this process lacks"), "{e}");
        }
        let rmem = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_rmem").unwrap();
        assert_eq!(rmem.split_whitespace().collect::<Vec<_>>(), ["4096", "1048576", "15728640"]);
        assert_eq!(std::fs::read_to_string(&hystart).unwrap(), "2");
        t.restore().unwrap();

        effective(&[Cap::NetAdmin]);
        let (mut t, errors) = HostTuning::apply(&params, &plan);
        assert!(errors.is_empty(), "{errors:?}");
        t.restore().unwrap();
    });
    assert!(!ns.ip(&["route", "show"]).contains("initcwnd"));
}

#[derive(Debug)]
struct MemfdPool(std::os::fd::OwnedFd);

impl RxPool for MemfdPool {
    fn share_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.0.as_fd())
    }
    fn size(&self) -> u64 {
        0
    }
    fn alignment(&self) -> u64 {
        4096
    }
    fn dmabuf_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.0.as_fd())
    }
    fn describe(&self) -> String {
        "memfd pool".into()
    }
}

/// The devmem bind (`netdev` `BIND_RX`) is an admin-only netlink command:
/// refused before the kernel looks at the dma-buf without `CAP_NET_ADMIN`.
#[test]
#[ignore = "needs root: network namespaces, veth, capabilities"]
fn the_dma_buf_bind_needs_net_admin() {
    let ns = Netns::with_veth("caps-bind");
    let pool = MemfdPool(memfd_create("not-a-dmabuf", MFdFlags::MFD_CLOEXEC).unwrap());
    let gpu = GPU0.parse().unwrap();
    let bind = |caps: &[Cap]| {
        effective(caps);
        match DevmemBinder.bind(&pool, gpu, "eth1", None, &[0]).map(drop) {
            Err(e) => match &e.cause {
                BindFailure::Devmem(d) => (d.to_string(), e.to_string()),
                other => panic!("expected a devmem refusal, got {other:?}"),
            },
            Ok(()) => panic!("a memfd bound as a dma-buf"),
        }
    };
    let (without, whole) = ns.run(|| bind(&[]));
    assert!(without.contains("): EPERM"), "{without}");
    assert!(whole.contains("needs CAP_NET_ADMIN, which this process lacks"), "{whole}");
    let (with, _) = ns.run(|| bind(&[Cap::NetAdmin]));
    assert!(!with.contains("EPERM"), "the kernel looked further with CAP_NET_ADMIN: {with}");
}

/// Entering another network namespace (to look a client's connections up
/// there) needs `CAP_SYS_ADMIN`, which no deployment gives the daemon: a
/// client outside the daemon's namespace cannot have its flows checked.
#[test]
#[ignore = "needs root: network namespaces, capabilities"]
fn entering_a_clients_network_namespace_needs_sys_admin() {
    let other = Netns::new("caps-setns");
    let handle = std::fs::File::open(format!("/run/netns/{}", other.name())).unwrap();
    let enter = |caps: &[Cap]| {
        std::thread::scope(|s| {
            s.spawn(|| {
                effective(caps);
                nix::sched::setns(handle.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
            })
            .join()
            .unwrap()
        })
    };
    assert_eq!(enter(&[Cap::NetAdmin, Cap::Chown, Cap::SysPtrace]), Err(Errno::EPERM));
    assert_eq!(enter(&[Cap::SysAdmin]), Ok(()));
}

/// The node-wide set cannot enter a client's network namespace: a tenant in
/// one of its own is refused its rule, and the refusal says why (`setns`
/// needs `CAP_SYS_ADMIN`, left out on purpose) and what to do.
#[test]
#[ignore = "needs root: setpriv, network namespaces, cgroups, mount namespaces"]
fn a_client_in_a_network_namespace_of_its_own_is_refused_saying_why() {
    let d = spawn(NODE_WIDE, &NODE_FLAGS).ready();
    let ns = Netns::new("caps-own");
    let cg = Cgroup::new("caps-own");
    let mut a = Agent::start_in(&cg, 0, ns.name());
    let (local, remote) = a.conn(false);
    let r = a.req(&d.sock("rx_rule_manager"), &rule(local, remote, GPU0));
    assert_eq!(r.code(), 7, "PERMISSION_DENIED: {}", r.text());
    let said = format!("{}\n{}", r.text(), d.log().join("\n"));
    assert!(
        said.contains("cannot look into its network namespace: EPERM: Operation not permitted (entering another network namespace needs CAP_SYS_ADMIN, which the daemon is not given, on purpose"),
        "{said}"
    );
    a.exit();
}

/// `setpriv` with the bounding set `caps` (`-all,+net_admin,...`), no
/// inherited capabilities and `no_new_privs`: what a container with
/// `drop: [ALL]`, `add: [...]` and `allowPrivilegeEscalation: false` runs as.
fn under(caps: &str) -> Vec<String> {
    require_root("setpriv");
    let bounding = format!("--bounding-set={caps}");
    let ok = Command::new("setpriv").args([bounding.as_str(), "true"]).status();
    assert!(ok.is_ok_and(|s| s.success()), "these tests need setpriv (util-linux)");
    ["setpriv", &bounding, "--inh-caps=-all", "--no-new-privs"].map(String::from).to_vec()
}

fn spawn(caps: &str, flags: &[&str]) -> Daemon {
    let prefix = under(caps);
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    Daemon::spawn_under(&prefix, flags, &[])
}

/// The daemon's `CapBnd:`, `CapEff:` and `NoNewPrivs:` as its status shows them.
fn status_of(d: &Daemon) -> (u64, u64, bool) {
    let text = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())).unwrap();
    let field = |k: &str| text.lines().find_map(|l| l.strip_prefix(k)).unwrap().trim().to_string();
    let mask = |k: &str| u64::from_str_radix(&field(k), 16).unwrap();
    (mask("CapBnd:"), mask("CapEff:"), field("NoNewPrivs:") == "1")
}

fn mask(caps: &[Cap]) -> u64 {
    caps.iter().fold(0, |m, c| m | 1 << c.bit())
}

fn pool_request(gpu: &str) -> UnixSocketProto {
    client::raw_request(gpu)
}

/// The per-Pod set: only `CAP_NET_ADMIN` in the bounding set and
/// `no_new_privs`. The daemon starts on the sim preset, hands out a pool fd
/// and installs a rule, and exits 0 on SIGTERM.
#[test]
#[ignore = "needs root: setpriv"]
fn the_daemon_with_only_net_admin_serves_a_pool_and_exits_0() {
    let mut d = spawn("-all,+net_admin", &["--tenant_isolation=off"]).ready();
    assert_eq!(status_of(&d), (mask(&[Cap::NetAdmin]), mask(&[Cap::NetAdmin]), true));
    let mut c = d.client(&format!("get_gpu_fd_{GPU0}"));
    c.stream().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.send(&pool_request(GPU0)).unwrap();
    assert!(matches!(c.recv_fd_reply().unwrap(), FdReply::Fd(_)), "no pool fd");
    let r = d.client("rx_rule_manager").request(&common::install_rule(4100, Some(GPU0))).unwrap();
    assert_eq!(client::raw_bytes(&r), Some(&b"Ok."[..]));
    d.signal(nix::sys::signal::Signal::SIGTERM);
    let st = d.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0), "{}", d.log().join("\n"));
    assert_eq!(d.files(), Vec::<String>::new());
}

const NODE_WIDE: &str = "-all,+net_admin,+chown,+sys_ptrace,+dac_read_search";
const NODE_FLAGS: [&str; 4] =
    ["--tenant_isolation=enforce", "--node_wide", "--socket_group=4242", "--leases"];

/// The node-wide set with `enforce`: a tenant (root with every capability,
/// in a cgroup and mount namespace of its own) gets its pool fd and a rule
/// for its own connection; the daemon reads its open files with `CAP_SYS_PTRACE`.
#[test]
#[ignore = "needs root: setpriv, cgroups, mount namespaces"]
fn the_node_wide_set_serves_a_tenant_its_pool_and_its_rule() {
    let mut d = spawn(NODE_WIDE, &NODE_FLAGS).ready();
    let set = [Cap::NetAdmin, Cap::Chown, Cap::SysPtrace, Cap::DacReadSearch];
    assert_eq!(status_of(&d), (mask(&set), mask(&set), true));
    let cg = Cgroup::new("caps");
    let mut a = Agent::start(&cg, 0);
    assert!(matches!(a.req(&d.sock(&format!("get_gpu_fd_{GPU0}")), &pool_request(GPU0)), Reply::Fd));
    let (local, remote) = a.conn(false);
    let r = a.req(&d.sock("rx_rule_manager"), &rule(local, remote, GPU0));
    assert_eq!(r.code(), 0, "{}", r.text());
    a.exit();
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(d.wait_exit(Duration::from_secs(10)).code(), Some(0), "{}", d.log().join("\n"));
}

/// Without `CAP_SYS_PTRACE` the daemon cannot read a tenant's open files:
/// no GPU is the tenant's (refused under `enforce`), and the log names the capability.
#[test]
#[ignore = "needs root: setpriv, cgroups, mount namespaces"]
fn without_sys_ptrace_no_gpu_is_a_tenants_and_the_log_says_why() {
    let d = spawn("-all,+net_admin,+chown", &NODE_FLAGS).ready();
    let cg = Cgroup::new("noptrace");
    let mut a = Agent::start(&cg, 0);
    let r = a.req(&d.sock(&format!("get_gpu_fd_{GPU0}")), &pool_request(GPU0));
    assert_eq!(r.code(), 7, "PERMISSION_DENIED: {}", r.text());
    let line =
        d.wait_for_log("cannot read a client's open files", Duration::from_secs(5)).expect("a warning");
    assert!(line.contains("needs CAP_SYS_PTRACE, which this process lacks"), "{line}");
    assert!(line.contains("its bounding set holds only CAP_CHOWN, CAP_NET_ADMIN; add SYS_PTRACE"), "{line}");
}

/// A client of another user (its `/proc/<pid>/fd` is its owner's): the
/// node-wide set lists its open files and serves it its pool; without
/// `CAP_DAC_READ_SEARCH` the daemon cannot, refuses it saying why, and the
/// log names the capability.
#[test]
#[ignore = "needs root: setpriv, cgroups, mount namespaces"]
fn a_client_of_another_user_is_read_only_with_dac_read_search() {
    let setup = format!("{FRESH_DEV} && : > /dev/nvidia0 && chmod 666 /dev/nvidia0");
    let flags: Vec<&str> = NODE_FLAGS.iter().copied().chain(["--socket_mode=0666"]).collect();
    for (caps, served) in [(NODE_WIDE, true), ("-all,+net_admin,+chown,+sys_ptrace", false)] {
        let d = spawn(caps, &flags).ready();
        std::fs::set_permissions(d.dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let cg = Cgroup::new("caps-user");
        let mut a = Agent::planted_as(&cg, &setup, &["/dev/nvidia0"], 64_321);
        let r = a.req(&d.sock(&format!("get_gpu_fd_{GPU0}")), &pool_request(GPU0));
        if served {
            assert!(matches!(r, Reply::Fd), "{caps}: {}", r.text());
            continue;
        }
        assert_eq!(r.code(), 7, "PERMISSION_DENIED: {}", r.text());
        assert!(
            r.text().contains("another user") && r.text().contains("CAP_DAC_READ_SEARCH"),
            "{}",
            r.text()
        );
        let line = d.wait_for_log("cannot list the open files", Duration::from_secs(5)).expect("a warning");
        assert!(line.contains("needs CAP_DAC_READ_SEARCH, which this process lacks"), "{line}");
    }
}

/// A DaemonSet's rollout with the node-wide set: a successor without
/// `CAP_SYS_PTRACE` cannot prove it may take the daemon's descriptors
/// (`pidfd_getfd`), exits 1 naming it, and the daemon serves on; one with
/// the same set takes over, the tenant's rule with it.
#[test]
#[ignore = "needs root: setpriv, cgroups, mount namespaces"]
fn a_successor_with_the_node_wide_set_takes_over_and_one_without_sys_ptrace_cannot() {
    let mut old = spawn(NODE_WIDE, &NODE_FLAGS).ready();
    let cg = Cgroup::new("caps-take");
    let mut a = Agent::start(&cg, 0);
    let (local, remote) = a.conn(false);
    assert_eq!(a.req(&old.sock("rx_rule_manager"), &rule(local, remote, GPU0)).code(), 0);
    let uds = old.uds_arg();
    let mut flags = NODE_FLAGS.to_vec();
    flags.extend([uds.as_str(), "--takeover=on"]);

    let mut weak = spawn("-all,+net_admin,+chown", &flags);
    assert_eq!(weak.wait_exit(Duration::from_secs(20)).code(), Some(1), "{}", weak.log().join("\n"));
    let said = weak.log().join("\n");
    assert!(said.contains("could not prove to the running daemon"), "{said}");
    assert!(said.contains("or with CAP_SYS_PTRACE"), "{said}");
    assert!(old.wait_for_log("takeover refused", Duration::from_secs(5)).is_some());
    let (local2, remote2) = a.conn(false);
    assert_eq!(a.req(&old.sock("rx_rule_manager"), &rule(local2, remote2, GPU0)).code(), 0, "serves on");

    let new = spawn(NODE_WIDE, &flags).ready();
    let took = new.wait_for_log("took over from pid", Duration::from_secs(10)).expect("a takeover");
    assert!(took.contains("took over from pid") && took.contains(" 2 rules"), "{took}");
    assert_eq!(old.wait_exit(Duration::from_secs(20)).code(), Some(0), "{}", old.log().join("\n"));
    // The folder is the old daemon's (`new.sock` names its own unused one).
    assert!(matches!(a.req(&old.sock(&format!("get_gpu_fd_{GPU0}")), &pool_request(GPU0)), Reply::Fd));
    a.exit();
    new.signal(nix::sys::signal::Signal::SIGTERM);
}

/// `--socket_group` without `CAP_CHOWN`, and an HTTP port below 1024
/// without `CAP_NET_BIND_SERVICE`: the daemon exits 1 naming the capability.
#[test]
#[ignore = "needs root: setpriv, network namespaces"]
fn a_missing_capability_is_named_when_the_daemon_stops() {
    let mut d = spawn("-all,+net_admin", &["--socket_group=4242"]);
    assert_eq!(d.wait_exit(Duration::from_secs(10)).code(), Some(1));
    let last = d.log().last().cloned().unwrap_or_default();
    assert!(last.contains("(--socket_group): Operation not permitted"), "{last}");
    assert!(
        last.contains(
            "needs CAP_CHOWN, which this process lacks: its bounding set holds only CAP_NET_ADMIN; add CHOWN"
        ),
        "{last}"
    );
    // A folder it creates: named once, then why.
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("new");
    let uds = format!("--uds_path={}", folder.display());
    let mut d = spawn("-all,+net_admin", &["--socket_group=4242", &uds]);
    assert_eq!(d.wait_exit(Duration::from_secs(10)).code(), Some(1));
    let last = d.log().last().cloned().unwrap_or_default();
    let says =
        format!("creating socket folder {}: setting its group (--socket_group): EPERM", folder.display());
    assert!(last.contains(&says), "{last}");
    assert!(last.contains("needs CAP_CHOWN, which this process lacks"), "{last}");

    // A namespace of its own: the kernel's default unprivileged port start (1024).
    let ns = Netns::new("caps-port");
    let in_ns = |caps: &str| {
        let mut prefix = vec!["ip".to_string(), "netns".into(), "exec".into(), ns.name().into()];
        prefix.extend(under(caps));
        let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
        Daemon::spawn_under(&prefix, &["--metrics_address=127.0.0.1:80"], &[])
    };
    let mut d = in_ns("-all,+net_admin");
    assert_eq!(d.wait_exit(Duration::from_secs(10)).code(), Some(1));
    let last = d.log().last().cloned().unwrap_or_default();
    assert!(last.contains("--metrics_address 127.0.0.1:80: Permission denied"), "{last}");
    assert!(
        last.contains("port 80 is below 1024: needs CAP_NET_BIND_SERVICE, which this process lacks"),
        "{last}"
    );
    let mut d = in_ns("-all,+net_admin,+net_bind_service").ready();
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(d.wait_exit(Duration::from_secs(10)).code(), Some(0), "{}", d.log().join("\n"));
}

/// `doctor`, run with the daemon's bounding set, names each capability its
/// flags need and it lacks, with the fix, and fails; with the set it passes.
#[test]
#[ignore = "needs root: setpriv"]
fn doctor_names_each_capability_the_flags_need_and_the_process_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let doctor = |caps: &str| {
        let prefix = under(caps);
        let out = Command::new(&prefix[0])
            .args(&prefix[1..])
            .arg(common::BIN)
            .args(["doctor", "--gpu_nic_preset=sim", "--tenant_isolation=enforce", "--socket_group=4242"])
            .arg(format!("--uds_path={}", dir.path().join("s").display()))
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (code, out) = doctor("-all,+chown");
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("\n  ✔ CAP_CHOWN: held: the daemon needs it to give the sockets group 4242"),
        "{out}"
    );
    assert!(
        out.contains("\n  ✗ CAP_SYS_PTRACE: missing: the daemon needs it to read the open files of clients"),
        "{out}"
    );
    assert!(out.contains("this process lacks it (its bounding set: CAP_CHOWN)"), "{out}");
    assert!(
        out.contains("→ add SYS_PTRACE to the daemon container's securityContext.capabilities.add"),
        "{out}"
    );
    assert!(!out.contains("CAP_NET_ADMIN"), "simulated NICs need no CAP_NET_ADMIN: {out}");
    assert!(
        out.contains("CAP_DAC_READ_SEARCH: missing: the daemon needs it to list the open files"),
        "{out}"
    );
    let (_, out) = doctor(NODE_WIDE);
    assert!(!out.contains("✗ CAP_") && out.contains("✔ CAP_DAC_READ_SEARCH: held"), "{out}");
}
