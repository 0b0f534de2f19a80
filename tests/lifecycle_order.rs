//! The daemon's lifecycle in process, with recording fakes for the NIC and
//! the GPU: every NIC call and every pool/binding operation lands in one
//! ordered log, with whether the rule endpoint was open at that moment.
//! The tests assert the order of startup (prime → allocate → bind → header
//! split → serve) and of shutdown, and that a failure at each step of
//! startup rolls back exactly what had been done.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::errno::Errno;
use tcpx_rxdm::config::flags::Flags;
use tcpx_rxdm::daemon::{self, Backends, Config, DaemonError};
use tcpx_rxdm::gpu::{GpuCall, GpuRecorder};
use tcpx_rxdm::nic::{
    DataSplit, NicCall, NicSetup, RecordingNic, RuleControl, FEATURE_NTUPLE, PRIV_HEADER_SPLIT,
};
use tcpx_rxdm::types::pci::PciAddr;
use tcpx_rxdm::wire::client::Client;

/// One entry of the merged log.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    Nic(NicCall),
    Gpu(GpuCall),
}

#[derive(Debug, Clone)]
struct Entry {
    call: Call,
    /// Whether the rule endpoint's socket existed when the call was made.
    serving: bool,
}

type Log = Arc<Mutex<Vec<Entry>>>;

/// Everything a NIC's state consists of, read from the simulated NIC
/// underneath the recorder (so reading it is not recorded).
#[derive(Debug, Clone, PartialEq)]
struct NicState {
    ntuple: bool,
    priv_flags: Vec<(String, bool)>,
    data_split: DataSplit,
    rss: Vec<u32>,
    rules: usize,
}

struct Node {
    config: Config,
    nic: Arc<RecordingNic>,
    gpu: GpuRecorder,
    log: Log,
    dir: tempfile::TempDir,
    ifnames: Vec<String>,
}

const RULE_SOCKET: &str = "rx_rule_manager";

fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
}

fn node(extra: &[&str]) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = vec![
        "tcpx-rxdm".into(),
        "--gpu_nic_preset=sim".into(),
        format!("--uds_path={}", dir.path().display()),
        "--metrics_address=".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let flags = Flags::parse_args(args).expect("flags");
    let config = Config::load(flags).expect("the sim topology loads");
    let ifnames: Vec<String> = config.topology.nics.iter().map(|n| n.ifname.clone()).collect();
    let log: Log = Arc::default();
    let rule_socket = dir.path().join(RULE_SOCKET);
    let (l, s) = (log.clone(), rule_socket.clone());
    let nic = RecordingNic::new(&ifnames).with_sink(move |c| {
        l.lock().unwrap().push(Entry { call: Call::Nic(c.clone()), serving: is_socket(&s) })
    });
    let (l, s) = (log.clone(), rule_socket);
    let gpu = GpuRecorder::new().with_sink(move |c| {
        l.lock().unwrap().push(Entry { call: Call::Gpu(c.clone()), serving: is_socket(&s) })
    });
    Node { config, nic: Arc::new(nic), gpu, log, dir, ifnames }
}

impl Node {
    fn backends(&self) -> Backends {
        Backends {
            nic: self.nic.clone(),
            sim: None,
            alloc: Arc::new(self.gpu.allocator()),
            binder: Arc::new(self.gpu.binder()),
        }
    }

    fn states(&self) -> HashMap<String, NicState> {
        let sim = self.nic.sim();
        self.ifnames
            .iter()
            .map(|n| {
                let state = NicState {
                    ntuple: sim.feature(n, FEATURE_NTUPLE).unwrap(),
                    priv_flags: sim.priv_flags(n).unwrap(),
                    data_split: sim.tcp_data_split(n).unwrap(),
                    rss: sim.rss_table(n).unwrap(),
                    rules: sim.list_rules(n).unwrap().len(),
                };
                (n.clone(), state)
            })
            .collect()
    }

    fn entries(&self) -> Vec<Entry> {
        self.log.lock().unwrap().clone()
    }

    fn sockets(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| is_socket(p))
            .collect()
    }
}

/// Runs the daemon on its own runtime until ready (then `serving` runs and
/// the daemon is asked to stop) or until startup fails.
fn run(node: &Node, serving: impl FnOnce(&Path)) -> Result<(), DaemonError> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
        "the test asked".to_string()
    };
    let task = rt.spawn(daemon::run(node.config.clone(), node.backends(), shutdown));
    let rule_socket = node.dir.path().join(RULE_SOCKET);
    // The socket file exists from bind(), a moment before listen(): wait
    // until a connect gets through (that connection closes unused).
    let listening =
        || is_socket(&rule_socket) && std::os::unix::net::UnixStream::connect(&rule_socket).is_ok();
    common::wait_until(Duration::from_secs(20), || listening() || task.is_finished());
    if listening() {
        serving(node.dir.path());
        let _ = stop.send(());
    }
    rt.block_on(task).expect("run does not panic")
}

fn nic_changes(entries: &[Entry]) -> Vec<(usize, NicCall)> {
    entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match &e.call {
            Call::Nic(c) if c.is_change() => Some((i, c.clone())),
            _ => None,
        })
        .collect()
}

fn gpu_calls(entries: &[Entry]) -> Vec<(usize, GpuCall)> {
    entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match &e.call {
            Call::Gpu(c) => Some((i, c.clone())),
            _ => None,
        })
        .collect()
}

fn is_header_split_on(c: &NicCall) -> bool {
    matches!(c, NicCall::SetPrivFlag { name, on: true, .. } if name.contains("header-split"))
}

#[test]
fn startup_primes_allocates_binds_splits_then_serves_and_shutdown_undoes_it_in_reverse() {
    let node = node(&[]);
    let before = node.states();
    let mut ready_len = 0;
    run(&node, |dir| {
        ready_len = node.entries().len();
        // One rule, so that shutdown has one to remove.
        let mut c = Client::connect(dir.join(RULE_SOCKET)).unwrap();
        let reply = c.request(&common::install_rule(40_000, Some(common::GPU0))).unwrap();
        assert!(reply.status.is_none(), "{reply:?}");
    })
    .expect("a clean run");
    let entries = node.entries();
    let (startup, shutdown) = entries.split_at(ready_len);

    // Startup: every step in order, and nothing served before the last one.
    let changes = nic_changes(startup);
    let gpu = gpu_calls(startup);
    let first = |f: &dyn Fn(&GpuCall) -> bool| gpu.iter().find(|(_, c)| f(c)).map(|(i, _)| *i).unwrap();
    let last = |f: &dyn Fn(&GpuCall) -> bool| gpu.iter().rev().find(|(_, c)| f(c)).map(|(i, _)| *i).unwrap();
    let first_alloc = first(&|c| matches!(c, GpuCall::Allocate { .. }));
    let last_alloc = last(&|c| matches!(c, GpuCall::Allocate { .. }));
    let first_bind = first(&|c| matches!(c, GpuCall::Bind { .. }));
    let last_bind = last(&|c| matches!(c, GpuCall::Bind { .. }));
    let splits: Vec<usize> = changes.iter().filter(|(_, c)| is_header_split_on(c)).map(|(i, _)| *i).collect();
    let primes: Vec<usize> =
        changes.iter().filter(|(_, c)| !is_header_split_on(c)).map(|(i, _)| *i).collect();
    assert!(!primes.is_empty() && !splits.is_empty());
    assert!(primes.iter().all(|&i| i < first_alloc), "priming ends before the first allocation");
    assert!(last_alloc < first_bind, "every pool is allocated before the first binding");
    assert!(splits.iter().all(|&i| i > last_bind), "header split comes after every binding");
    assert!(startup.iter().all(|e| !e.serving), "no rule endpoint before header split is on");
    let gpus = node.config.topology.gpus().count();
    assert_eq!(gpu.len(), 2 * gpus, "one allocation and one binding per GPU: {gpu:?}");
    // Bindings follow the topology: each GPU's queues on its own NIC.
    let binds: Vec<GpuCall> =
        gpu.iter().filter(|(_, c)| matches!(c, GpuCall::Bind { .. })).map(|(_, c)| c.clone()).collect();
    let want: Vec<GpuCall> = node
        .config
        .topology
        .gpus()
        .map(|(n, g)| GpuCall::Bind { gpu: g.pci, ifname: n.ifname.clone(), queues: g.queues.clone() })
        .collect();
    assert_eq!(binds, want);

    // Each NIC primed exactly so (the simulated NIC models gve with private
    // flags, header split starting off); a change to a value the NIC already
    // has is not made.
    for ifname in &node.ifnames {
        let mine: Vec<NicCall> =
            changes.iter().map(|(_, c)| c.clone()).filter(|c| c.ifname() == ifname).collect();
        let flag = |name: &str, on| NicCall::SetPrivFlag { ifname: ifname.clone(), name: name.into(), on };
        assert_eq!(
            mine,
            vec![
                flag("enable-max-rx-buffer-size", true),
                NicCall::SetFeature { ifname: ifname.clone(), name: FEATURE_NTUPLE.into(), on: true },
                NicCall::SetRssEqual { ifname: ifname.clone(), n: node.config.topology.rss_set_size },
                flag(PRIV_HEADER_SPLIT, true),
                flag("enable-strict-header-split", true),
            ],
            "{ifname}"
        );
    }

    // Shutdown: the rule goes first, then bindings, then pools, then the NICs.
    let down = nic_changes(shutdown);
    let gpu_down = gpu_calls(shutdown);
    let del = down.iter().find(|(_, c)| matches!(c, NicCall::DelRule { .. })).expect("the rule is removed").0;
    let unbinds: Vec<usize> =
        gpu_down.iter().filter(|(_, c)| matches!(c, GpuCall::Unbind { .. })).map(|(i, _)| *i).collect();
    let frees: Vec<usize> =
        gpu_down.iter().filter(|(_, c)| matches!(c, GpuCall::Free { .. })).map(|(i, _)| *i).collect();
    let restores: Vec<usize> = down
        .iter()
        .filter(|(_, c)| !matches!(c, NicCall::DelRule { .. } | NicCall::AddRule { .. }))
        .map(|(i, _)| *i)
        .collect();
    assert_eq!((unbinds.len(), frees.len()), (gpus, gpus));
    assert!(unbinds.iter().all(|&u| u > del), "rules are removed before pools are unbound");
    assert!(
        frees.iter().all(|&f| unbinds.iter().all(|&u| f > u)),
        "every binding ends before any pool is freed"
    );
    assert!(
        restores.iter().all(|&r| frees.iter().all(|&f| r > f)),
        "NICs are restored after the pools are freed"
    );
    // Per NIC, restore is the priming undone in reverse, back to the state read at startup.
    for ifname in &node.ifnames {
        let undo: Vec<NicCall> = down
            .iter()
            .map(|(_, c)| c.clone())
            .filter(|c| {
                c.ifname() == ifname && !matches!(c, NicCall::DelRule { .. } | NicCall::AddRule { .. })
            })
            .collect();
        let flag = |name: &str, on| NicCall::SetPrivFlag { ifname: ifname.clone(), name: name.into(), on };
        assert_eq!(
            undo,
            vec![
                flag("enable-strict-header-split", false),
                flag(PRIV_HEADER_SPLIT, false),
                NicCall::SetRssTable { ifname: ifname.clone(), table: before[ifname].rss.clone() },
                NicCall::SetFeature { ifname: ifname.clone(), name: FEATURE_NTUPLE.into(), on: false },
                flag("enable-max-rx-buffer-size", false),
            ],
            "{ifname}"
        );
    }
    assert_eq!(node.states(), before);
    assert!(node.sockets().is_empty(), "socket files removed: {:?}", node.sockets());
}

/// The GPU whose allocation or binding a test makes fail.
enum Refused {
    Nothing,
    Allocate(PciAddr),
    Bind(PciAddr),
}

/// A startup that fails at `fail`: the error comes back, and everything done
/// before the failure is undone (NICs as found, every pool freed after its
/// binding ended, no socket left, nothing served).
fn fails_and_rolls_back(node: Node, refused: Refused, expect: impl Fn(&DaemonError) -> bool) -> Vec<Entry> {
    let before = node.states();
    let err = run(&node, |_| panic!("startup should fail")).expect_err("startup fails");
    assert!(expect(&err), "unexpected error: {err:?}");
    let entries = node.entries();
    assert!(entries.iter().all(|e| !e.serving), "no rule endpoint was ever open");
    assert_eq!(node.states(), before, "every NIC is back as it was found");
    let gpu = gpu_calls(&entries);
    let count = |f: &dyn Fn(&GpuCall) -> Option<PciAddr>| -> Vec<PciAddr> {
        let mut v: Vec<PciAddr> = gpu.iter().filter_map(|(_, c)| f(c)).collect();
        v.sort();
        v
    };
    let allocated = count(&|c| match c {
        GpuCall::Allocate { gpu, .. } => Some(*gpu),
        _ => None,
    });
    let freed = count(&|c| match c {
        GpuCall::Free { gpu } => Some(*gpu),
        _ => None,
    });
    let bound = count(&|c| match c {
        GpuCall::Bind { gpu, .. } => Some(*gpu),
        _ => None,
    });
    let unbound = count(&|c| match c {
        GpuCall::Unbind { gpu, .. } => Some(*gpu),
        _ => None,
    });
    let without =
        |v: &[PciAddr], g: Option<PciAddr>| v.iter().filter(|x| Some(**x) != g).copied().collect::<Vec<_>>();
    let (bad_alloc, bad_bind) = match refused {
        Refused::Nothing => (None, None),
        Refused::Allocate(g) => (Some(g), None),
        Refused::Bind(g) => (None, Some(g)),
    };
    assert_eq!(without(&allocated, bad_alloc), freed, "every pool allocated is freed");
    assert_eq!(without(&bound, bad_bind), unbound, "every binding made is ended");
    if let (Some(last_unbind), Some(first_free)) = (
        gpu.iter().rev().find(|(_, c)| matches!(c, GpuCall::Unbind { .. })),
        gpu.iter().find(|(_, c)| matches!(c, GpuCall::Free { .. })),
    ) {
        assert!(last_unbind.0 < first_free.0, "bindings end before pools are freed");
    }
    assert!(node.sockets().is_empty(), "socket files removed: {:?}", node.sockets());
    entries
}

#[test]
fn a_failed_prime_undoes_the_nics_already_primed_and_allocates_nothing() {
    let node = node(&[]);
    node.nic.fail_when(
        |c| matches!(c, NicCall::SetFeature { ifname, on: true, .. } if ifname == "eth3"),
        Errno::EIO,
    );
    let entries = fails_and_rolls_back(
        node,
        Refused::Nothing,
        |e| matches!(e, DaemonError::Prime(p) if p.ifname == "eth3"),
    );
    assert!(gpu_calls(&entries).is_empty(), "no pool before every NIC is primed");
}

#[test]
fn a_failed_allocation_frees_the_other_pools_and_binds_nothing() {
    let node = node(&[]);
    let bad: PciAddr = "0000:84:00.0".parse().unwrap();
    node.gpu.fail_when(move |c| matches!(c, GpuCall::Allocate { gpu, .. } if *gpu == bad));
    let entries =
        fails_and_rolls_back(node, Refused::Allocate(bad), |e| matches!(e, DaemonError::Allocate(_)));
    assert!(!gpu_calls(&entries).iter().any(|(_, c)| matches!(c, GpuCall::Bind { .. })));
    assert!(!nic_changes(&entries).iter().any(|(_, c)| is_header_split_on(c)));
}

#[test]
fn a_failed_binding_ends_the_earlier_ones_and_frees_every_pool() {
    let node = node(&[]);
    let bad: PciAddr = "0000:85:00.0".parse().unwrap();
    node.gpu.fail_when(move |c| matches!(c, GpuCall::Bind { gpu, .. } if *gpu == bad));
    let entries = fails_and_rolls_back(node, Refused::Bind(bad), |e| matches!(e, DaemonError::Bind(_)));
    let binds = gpu_calls(&entries).iter().filter(|(_, c)| matches!(c, GpuCall::Bind { .. })).count();
    assert_eq!(binds, 6, "bindings stop at the failed one (the sixth GPU of the topology)");
    assert!(!nic_changes(&entries).iter().any(|(_, c)| is_header_split_on(c)));
}

#[test]
fn a_failed_header_split_restores_every_nic_and_frees_every_pool() {
    let node = node(&[]);
    node.nic.fail_when(
        |c| matches!(c, NicCall::SetPrivFlag { ifname, name, on: true } if ifname == "eth2" && name == PRIV_HEADER_SPLIT),
        Errno::EBUSY,
    );
    fails_and_rolls_back(
        node,
        Refused::Nothing,
        |e| matches!(e, DaemonError::HeaderSplit(p) if p.ifname == "eth2"),
    );
}

#[test]
fn a_rule_endpoint_that_cannot_open_undoes_everything() {
    let node = node(&[]);
    // A folder where the rule socket goes: binding it is refused.
    std::fs::create_dir(node.dir.path().join(RULE_SOCKET)).unwrap();
    let entries = fails_and_rolls_back(node, Refused::Nothing, |e| matches!(e, DaemonError::Endpoint(_)));
    assert_eq!(
        nic_changes(&entries).iter().filter(|(_, c)| is_header_split_on(c)).count(),
        8,
        "the failure came after header split (4 NICs, 2 flags each)"
    );
}

#[test]
fn a_pool_endpoint_that_cannot_open_undoes_everything_before_header_split() {
    let node = node(&[]);
    std::fs::create_dir(node.dir.path().join(format!("get_gpu_fd_{}", common::GPU_ETH2))).unwrap();
    let entries = fails_and_rolls_back(node, Refused::Nothing, |e| matches!(e, DaemonError::Endpoint(_)));
    assert!(
        !nic_changes(&entries).iter().any(|(_, c)| is_header_split_on(c)),
        "pool endpoints open before header split is turned on"
    );
    let binds = gpu_calls(&entries).iter().filter(|(_, c)| matches!(c, GpuCall::Bind { .. })).count();
    assert_eq!(binds, 8, "every pool was bound before the endpoints opened");
}
