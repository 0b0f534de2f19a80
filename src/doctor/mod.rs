//! `tcpx-rxdm doctor`: read-only checks that answer "will GPUDirect-TCPX work
//! on this node, and if not, why". Each check is one line: a mark, what was
//! found, and what to do about it.
//!
//! Nothing here changes the node. NIC state is read through the same
//! [`NicControl`] backends the daemon uses, but only through their read calls
//! (features, private flags, rings, channels, rule count and list, RSS, stats;
//! the driver family probe reads only). GPU checks allocate one small test
//! buffer per GPU and free it at once. The socket-folder lock is tested with a
//! non-blocking shared lock on a separately opened descriptor, released at once.

pub mod node;

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use nix::errno::Errno;
use serde::Serialize;

use crate::config::flags::{Flags, GpuBackendKind, NicBackendKind, SetupParam};
use crate::config::presets::{self, Source};
use crate::gpu::binder::BinderKind;
use crate::nic::ethtool::EthtoolNic;
use crate::nic::sim::SimNic;
use crate::nic::{DataSplit, HeaderSplit, NicControl, FEATURE_NTUPLE, PRIV_HEADER_SPLIT, STAT_RESET_CNT};
use crate::types::topology::Topology;

/// The mark of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// ✔ present and as needed.
    Pass,
    /// ! works, but worth knowing (does not fail the verdict).
    Warn,
    /// ✗ missing or wrong: GPUDirect-TCPX will not work until fixed.
    Fail,
    /// – not applicable to this preset or backend.
    Skip,
}

impl Status {
    pub fn mark(self) -> &'static str {
        match self {
            Status::Pass => "✔",
            Status::Warn => "!",
            Status::Fail => "✗",
            Status::Skip => "–",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub section: String,
    pub name: String,
    pub status: Status,
    pub found: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// Every check, in the order they ran.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub preset: String,
    pub nic_backend: String,
    pub gpu_backend: String,
    pub checks: Vec<Check>,
}

impl Report {
    fn add(
        &mut self,
        section: &str,
        name: &str,
        status: Status,
        found: impl Into<String>,
        fix: Option<String>,
    ) {
        self.checks.push(Check {
            section: section.to_string(),
            name: name.to_string(),
            status,
            found: found.into(),
            fix,
        });
    }

    /// True when nothing the chosen preset needs is missing.
    pub fn ok(&self) -> bool {
        !self.checks.iter().any(|c| c.status == Status::Fail)
    }

    pub fn failures(&self) -> usize {
        self.checks.iter().filter(|c| c.status == Status::Fail).count()
    }

    /// The human-readable report.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "tcpx-rxdm doctor: preset {}, NIC backend {}, GPU backend {}",
            self.preset, self.nic_backend, self.gpu_backend
        );
        let mut section = "";
        for c in &self.checks {
            if c.section != section {
                section = &c.section;
                let _ = writeln!(out, "\n{section}");
            }
            let _ = writeln!(out, "  {} {}: {}", c.status.mark(), c.name, c.found);
            if let Some(fix) = &c.fix {
                let _ = writeln!(out, "      → {fix}");
            }
        }
        let warns = self.checks.iter().filter(|c| c.status == Status::Warn).count();
        let _ = writeln!(out);
        if self.ok() {
            let _ = writeln!(
                out,
                "verdict: ready: everything preset {} needs is here ({warns} warning{})",
                self.preset,
                if warns == 1 { "" } else { "s" }
            );
        } else {
            let n = self.failures();
            let _ = writeln!(
                out,
                "verdict: NOT ready: {n} problem{} (✗) for preset {}",
                if n == 1 { "" } else { "s" },
                self.preset
            );
        }
        out
    }

    /// The machine-readable report.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "ok": self.ok(),
            "preset": self.preset,
            "nic_backend": self.nic_backend,
            "gpu_backend": self.gpu_backend,
            "failures": self.failures(),
            "checks": self.checks,
        })
    }
}

/// What the checks share.
struct Ctx<'a> {
    flags: &'a Flags,
    topo: Option<Topology>,
    source: Option<Source>,
    sim_nic: bool,
    /// Pid of the daemon holding the socket-folder lock, if one runs.
    daemon: Option<String>,
    /// Whether pools must be bound to NIC queues (real NICs, a binder chosen).
    binding_needed: bool,
}

impl Ctx<'_> {
    /// The pid of a running daemon whose NICs are the ones checked here (a
    /// daemon on simulated NICs keeps their state in its own process).
    fn daemon_on_these_nics(&self) -> Option<&str> {
        self.daemon.as_deref().filter(|_| !self.sim_nic)
    }
}

/// Runs every check.
pub fn run(flags: &Flags) -> Report {
    let mut r = Report { preset: flags.gpu_nic_preset.clone(), ..Default::default() };
    let resolved = presets::resolve_topology(flags);
    let source = match &resolved {
        Ok((_, s)) => Some(s.clone()),
        Err(_) => presets::select_source(flags).ok().map(|(s, _)| s),
    };
    let sim_nic = match flags.nic_backend {
        NicBackendKind::Sim => true,
        NicBackendKind::Auto => source == Some(Source::Preset("sim")),
        NicBackendKind::Ethtool => false,
    };
    r.nic_backend = if sim_nic { "sim".into() } else { "ethtool".into() };
    r.gpu_backend = match flags.gpu_backend {
        GpuBackendKind::Host => "host".into(),
        GpuBackendKind::Auto if sim_nic => "host".into(),
        _ => "cuda".into(),
    };
    let daemon = lock_holder(&flags.uds_path);
    let binding_needed = !sim_nic && flags.bind_backend != BinderKind::None;
    let mut ctx = Ctx { flags, topo: None, source, sim_nic, daemon, binding_needed };

    match resolved {
        Ok((topo, source)) => {
            let gpus = topo.gpus().count();
            r.add(
                "topology",
                "source",
                Status::Pass,
                format!(
                    "{}: {} NIC{}, {gpus} GPU{}, RSS queues 0..{}, {} rule slots per NIC",
                    source.describe(),
                    topo.nics.len(),
                    plural(topo.nics.len()),
                    plural(gpus),
                    topo.rss_set_size,
                    topo.max_rx_rules
                ),
                None,
            );
            ctx.topo = Some(topo);
        }
        Err(e) => r.add("topology", "source", Status::Fail, e.to_string(), Some(topology_fix(flags))),
    }
    node::check_topology(&mut r, &ctx);
    check_nics(&mut r, &ctx);
    check_kernel(&mut r, &ctx);
    check_gpus(&mut r, &mut ctx);
    check_host(&mut r, &ctx);
    r
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn topology_fix(flags: &Flags) -> String {
    match flags.gpu_nic_preset.as_str() {
        "auto" => format!(
            "discovery found no NIC with GPUs behind its PCIe switch: check the NICs have addresses, \
             try --num_hops (now {}), or name the layout with --gpu_nic_preset=a3vm",
            flags.num_hops
        ),
        "manual" => "fix the topology textproto named in the message".into(),
        _ => "check the preset name or file".into(),
    }
}

/// `1, 2, 3, 5` as `1-3, 5`.
pub(crate) fn ranges(q: &[u32]) -> String {
    let mut v = q.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if i == j { v[i].to_string() } else { format!("{}-{}", v[i], v[j]) });
        i = j + 1;
    }
    out.join(", ")
}

/// The pid in the lock file when a daemon holds the lock, tested with a
/// non-blocking shared lock on our own descriptor (released at once). Never
/// creates the file.
fn lock_holder(uds: &Path) -> Option<String> {
    let path = uds.join(crate::server::socket_dir::LOCK_FILE);
    let file = std::fs::File::open(&path).ok()?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock) {
        Ok(l) => {
            drop(l.unlock());
            None
        }
        Err((_, Errno::EWOULDBLOCK)) => {
            let pid = std::fs::read_to_string(&path).unwrap_or_default().trim().to_string();
            Some(if pid.is_empty() { "unknown pid".into() } else { format!("pid {pid}") })
        }
        Err(_) => None,
    }
}

fn check_nics(r: &mut Report, ctx: &Ctx) {
    let Some(topo) = &ctx.topo else {
        r.add("NICs", "NIC checks", Status::Skip, "no topology, so no NIC to check", None);
        return;
    };
    let nic: Arc<dyn NicControl> = if ctx.sim_nic {
        let names: Vec<&str> = topo.nics.iter().map(|n| n.ifname.as_str()).collect();
        Arc::new(SimNic::new(&names))
    } else {
        match EthtoolNic::open() {
            Ok(n) => Arc::new(n),
            Err(e) => {
                r.add(
                    "NICs",
                    "ethtool netlink",
                    Status::Fail,
                    e.to_string(),
                    Some("the daemon programs NICs through ethtool netlink: needs Linux ≥ 5.6 and CAP_NET_ADMIN".into()),
                );
                return;
            }
        }
    };
    for spec in &topo.nics {
        check_nic(r, ctx, topo, nic.as_ref(), &spec.ifname);
    }
}

fn check_nic(r: &mut Report, ctx: &Ctx, topo: &Topology, nic: &dyn NicControl, ifname: &str) {
    let sec = format!("NIC {ifname}");
    let s = sec.as_str();
    let sysfs = ctx.flags.sysfs_root();
    let class = sysfs.join("class/net").join(ifname);
    match nic.ifindex(ifname) {
        Ok(i) if ctx.sim_nic => {
            r.add(s, "present", Status::Pass, format!("simulated NIC, ifindex {i}"), None)
        }
        Ok(i) => r.add(s, "present", Status::Pass, format!("ifindex {i}"), None),
        Err(e) => {
            r.add(
                s,
                "present",
                Status::Fail,
                format!("no interface {ifname} ({})", e.errno),
                Some("check `ip link`; if the NICs have other names, use --gpu_nic_preset=auto or a manual topology".into()),
            );
            return;
        }
    }
    if ctx.sim_nic {
        r.add(s, "link and driver", Status::Skip, "simulated NIC: no sysfs link state or driver", None);
    } else {
        let oper = std::fs::read_to_string(class.join("operstate")).map(|v| v.trim().to_string());
        match oper.as_deref() {
            Ok("up") => r.add(s, "link", Status::Pass, "operstate up", None),
            Ok(st) => r.add(
                s,
                "link",
                Status::Fail,
                format!("operstate {st}"),
                Some(format!("bring it up (`ip link set {ifname} up`) and check the VPC/network attachment")),
            ),
            Err(e) => r.add(
                s,
                "link",
                Status::Warn,
                format!("cannot read {}: {e}", class.join("operstate").display()),
                None,
            ),
        }
        let info = crate::nic::ethtool::ioctl::EthtoolIoctl::open().and_then(|io| io.drvinfo(ifname));
        let line = match info {
            Ok([driver, version, fw, bus]) => {
                let mut l = format!("{driver} {version}");
                if !fw.is_empty() && fw != "N/A" {
                    l.push_str(&format!(", firmware {fw}"));
                }
                if !bus.is_empty() && bus != "N/A" {
                    l.push_str(&format!(", bus {bus}"));
                }
                l.trim().to_string()
            }
            Err(_) => driver_line(&sysfs, &class),
        };
        r.add(s, "driver", Status::Pass, line, None);
    }

    match HeaderSplit::probe(nic, ifname) {
        Ok(f) => header_split_lines(r, ctx, s, ifname, &f),
        Err(e) => r.add(s, "header split", Status::Fail, format!("probing the driver failed: {e}"), None),
    }

    let capacity = match nic.rule_capacity(ifname) {
        Ok(cap) if cap < topo.max_rx_rules => {
            r.add(
                s,
                "ntuple",
                Status::Warn,
                format!(
                    "supported, {cap} rule slots: fewer than max_rx_rules {}; the daemon uses {cap}",
                    topo.max_rx_rules
                ),
                None,
            );
            true
        }
        Ok(cap) => {
            r.add(s, "ntuple", Status::Pass, format!("supported, {cap} rule slots"), None);
            true
        }
        Err(e) => {
            let found = if e.errno == Errno::EOPNOTSUPP {
                format!("not supported: the driver has no ntuple rule table ({e})")
            } else {
                format!("cannot read the rule table: {e}")
            };
            r.add(
                s,
                "ntuple",
                Status::Fail,
                found,
                Some(format!(
                    "flow steering needs ntuple filters (gVNIC on A3 VMs); `ethtool -n {ifname}` shows what the driver offers"
                )),
            );
            false
        }
    };
    if capacity {
        let on = nic.feature(ifname, FEATURE_NTUPLE);
        let rules = nic.list_rules(ifname);
        match (on, rules) {
            (Ok(on), Ok(rules)) => {
                let state = if on { "on" } else { "off" };
                if let Some(pid) = ctx.daemon_on_these_nics() {
                    r.add(
                        s,
                        "ntuple state",
                        Status::Pass,
                        format!("{state}, {} rules (the running daemon, {pid}, owns them)", rules.len()),
                        None,
                    );
                } else if rules.is_empty() {
                    r.add(
                        s,
                        "ntuple state",
                        Status::Pass,
                        format!("{state}, no rules (the daemon turns ntuple on at start)"),
                        None,
                    );
                } else {
                    r.add(
                        s,
                        "ntuple state",
                        Status::Warn,
                        format!("{state}, {} stale rules and no daemon running: a previous daemon did not clean up", rules.len()),
                        Some(format!(
                            "harmless: the daemon flushes them at start (ntuple off, then on); by hand: `ethtool -K {ifname} ntuple off; ethtool -K {ifname} ntuple on`"
                        )),
                    );
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                r.add(s, "ntuple state", Status::Warn, format!("cannot read: {e}"), None)
            }
        }
    }

    let spec = topo.nics.iter().find(|n| n.ifname == ifname);
    let queues: Vec<u32> =
        spec.map(|n| n.gpus.iter().flat_map(|g| g.queues.iter().copied()).collect()).unwrap_or_default();
    let top = queues.iter().copied().max().unwrap_or(0);
    match nic.channels(ifname) {
        Ok(ch) if ch > top && ch >= topo.rss_set_size => r.add(
            s,
            "channels",
            Status::Pass,
            format!(
                "{ch} rx queues; the topology uses RSS 0..{} and GPU queues {}",
                topo.rss_set_size,
                ranges(&queues)
            ),
            None,
        ),
        Ok(ch) => r.add(
            s,
            "channels",
            Status::Fail,
            format!("{ch} rx queues, but the topology uses queue {top} (GPU queues {})", ranges(&queues)),
            Some(format!(
                "`ethtool -L {ifname} combined {}` (or rx), or a topology within {ch} queues",
                top + 1
            )),
        ),
        Err(e) => r.add(s, "channels", Status::Fail, format!("cannot read: {e}"), None),
    }

    match nic.rss_table(ifname) {
        Ok(t) => {
            let used: Vec<u32> = t.to_vec();
            let into_gpu = used.iter().any(|q| queues.contains(q));
            let found = format!("{} entries over queues {}", t.len(), ranges(&used));
            if ctx.daemon_on_these_nics().is_some() && into_gpu {
                r.add(
                    s,
                    "RSS",
                    Status::Warn,
                    format!("{found}: spreads into GPU queues while the daemon runs (changed after start?)"),
                    Some("restart the daemon; it sets RSS to the first rss_set_size queues".into()),
                );
            } else {
                let note = if into_gpu { "; the daemon narrows it to 0..rss_set_size at start" } else { "" };
                r.add(s, "RSS", Status::Pass, format!("{found}{note}"), None);
            }
        }
        Err(e) => r.add(
            s,
            "RSS",
            Status::Fail,
            format!("cannot read the indirection table: {e}"),
            Some("the daemon sets RSS at start and would fail the same way".into()),
        ),
    }

    match nic.stat(ifname, STAT_RESET_CNT) {
        Ok(Some(n)) => r.add(s, "resets", Status::Pass, format!("{STAT_RESET_CNT} {n}"), None),
        Ok(None) => r.add(s, "resets", Status::Skip, format!("the driver reports no {STAT_RESET_CNT}"), None),
        Err(e) => r.add(s, "resets", Status::Warn, format!("cannot read driver stats: {e}"), None),
    }
}

/// `gve 1.4.0` style: the driver link and the module version under sysfs.
fn driver_line(sysfs: &Path, class: &Path) -> String {
    let driver = std::fs::read_link(class.join("device/driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    match driver {
        None => "no device driver link (a virtual interface)".into(),
        Some(d) => {
            let version = std::fs::read_to_string(sysfs.join("module").join(&d).join("version"))
                .map(|v| format!("version {}", v.trim()))
                .unwrap_or_else(|_| "no module version (built in)".into());
            format!("{d}, {version}")
        }
    }
}

fn header_split_lines(r: &mut Report, ctx: &Ctx, s: &str, ifname: &str, f: &HeaderSplit) {
    let running = ctx.daemon_on_these_nics().is_some();
    let (family_status, family, on) = match f {
        HeaderSplit::PrivFlags { flags, strict, max_rx_buffer } => {
            let mut extra = Vec::new();
            if *strict {
                extra.push("strict");
            }
            if *max_rx_buffer {
                extra.push("max-rx-buffer-size");
            }
            let on = flags.iter().any(|(n, v)| n == PRIV_HEADER_SPLIT && *v);
            let also = if extra.is_empty() { String::new() } else { format!("; also {}", extra.join(", ")) };
            (Status::Pass, format!("private flags ({PRIV_HEADER_SPLIT}{also})"), Some(on))
        }
        HeaderSplit::DataSplit { start } => {
            (Status::Pass, "rings tcp-data-split (upstream)".to_string(), Some(*start == DataSplit::Enabled))
        }
        HeaderSplit::RingSizeFallback { start } => (
            Status::Warn,
            format!(
                "no header-split control; rx ring {} of {} is resized after binding instead (works only where the driver rebuilds its page pools)",
                start.current, start.max
            ),
            None,
        ),
        HeaderSplit::Unsupported => (Status::Fail, "none: no private flags, no tcp-data-split, no ring control".into(), None),
    };
    let fix = (family_status == Status::Fail).then(|| {
        "GPUDirect-TCPX needs header split: gVNIC (gve) on a COS image with the TCPX driver, or a driver with rings tcp-data-split".to_string()
    });
    r.add(s, "header split", family_status, family, fix);
    match on {
        Some(true) if running => {
            r.add(s, "header split state", Status::Pass, "on (the running daemon enabled it)", None)
        }
        Some(true) => r.add(
            s,
            "header split state",
            Status::Warn,
            "already on with no daemon running: a previous daemon left the NIC primed",
            Some(format!(
                "harmless for the next start (it turns it off, binds, then on); by hand: `{}`",
                undo_header_split(ifname, f)
            )),
        ),
        Some(false) if running => r.add(
            s,
            "header split state",
            Status::Warn,
            "off although a daemon runs: it may still be starting, or the driver was reset",
            None,
        ),
        Some(false) => {
            r.add(s, "header split state", Status::Pass, "off (the daemon turns it on after binding)", None)
        }
        None => {}
    }
}

/// The `ethtool` command that turns header split off by hand.
fn undo_header_split(ifname: &str, f: &HeaderSplit) -> String {
    match f {
        HeaderSplit::DataSplit { .. } => format!("ethtool -G {ifname} tcp-data-split off"),
        _ => format!("ethtool --set-priv-flags {ifname} {PRIV_HEADER_SPLIT} off"),
    }
}

/// `CTRL_ATTR_OPS` and `CTRL_ATTR_OP_ID` of the generic netlink controller.
const CTRL_ATTR_OPS: u16 = 6;
const CTRL_ATTR_OP_ID: u16 = 1;

/// The op ids of generic netlink family `name`; `None` when the kernel lacks the family.
fn genl_family_ops(name: &str) -> Result<Option<Vec<u32>>, String> {
    use crate::netlink::genl;
    use crate::netlink::{AttrSet, NlConn, NlError};
    let mut conn = NlConn::open(neli::consts::socket::NlFamily::Generic).map_err(|e| e.to_string())?;
    let replies = match conn.transact(&genl::get_family(name)) {
        Ok(r) => r,
        Err(NlError::Kernel { errno: Errno::ENOENT, .. }) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let attrs = genl::single_reply(&replies).map_err(|e| e.to_string())?;
    let mut ops = Vec::new();
    if let Some(list) = attrs.nested(CTRL_ATTR_OPS).map_err(|e| e.to_string())? {
        for (_, op) in list.iter() {
            if let Some(id) = AttrSet::parse(op).ok().and_then(|a| a.u32(CTRL_ATTR_OP_ID)) {
                ops.push(id);
            }
        }
    }
    Ok(Some(ops))
}

fn check_kernel(r: &mut Report, ctx: &Ctx) {
    let s = "kernel";
    match nix::sys::utsname::uname() {
        Ok(u) => r.add(
            s,
            "version",
            Status::Pass,
            format!("{} {}", u.sysname().to_string_lossy(), u.release().to_string_lossy()),
            None,
        ),
        Err(e) => r.add(s, "version", Status::Warn, format!("uname: {e}"), None),
    }
    // A pool must be bound to the GPU queues by one of two kernel paths,
    // unless binding is off or the NICs are simulated.
    let bind = ctx.flags.bind_backend;
    let binding_needed = ctx.binding_needed;
    let devmem = genl_family_ops(crate::gpu::devmem::NETDEV_FAMILY_NAME);
    let devmem_ok =
        matches!(&devmem, Ok(Some(ops)) if ops.contains(&(crate::gpu::devmem::NETDEV_CMD_BIND_RX as u32)));
    let tcpx = tcpx_symbols();
    let tcpx_seen = tcpx.is_some();
    let not_needed = |wanted: bool| if wanted { Status::Warn } else { Status::Skip };
    let devmem_line = match &devmem {
        Ok(Some(_)) if devmem_ok => {
            (Status::Pass, "netdev family with BIND_RX (upstream devmem TCP)".to_string())
        }
        Ok(Some(_)) => {
            (not_needed(bind == BinderKind::Devmem), "netdev family without BIND_RX (kernel < 6.12)".into())
        }
        Ok(None) => (
            not_needed(bind == BinderKind::Devmem),
            "no netdev generic netlink family (kernel < 6.12)".into(),
        ),
        Err(e) => (Status::Warn, format!("cannot ask generic netlink: {e}")),
    };
    let devmem_status = if bind == BinderKind::Devmem && !devmem_ok { Status::Fail } else { devmem_line.0 };
    r.add(s, "devmem TCP", devmem_status, devmem_line.1, None);
    let tcpx_line = match &tcpx {
        Some(sym) => (Status::Pass, format!("likely present: kernel symbol {sym} (the ioctls themselves are only tried by the daemon: probing them creates a page pool on a GPU dma-buf)")),
        None => (
            if bind == BinderKind::Tcpx { Status::Fail } else { not_needed(binding_needed && !devmem_ok) },
            "unknown: no dma-buf page-pool symbols in /proc/kallsyms (not a COS TCPX kernel?); the ioctls cannot be probed without creating a page pool on a GPU dma-buf".into(),
        ),
    };
    r.add(s, "TCPX dma-buf ioctls", tcpx_line.0, tcpx_line.1, None);
    if !binding_needed {
        let why = if ctx.sim_nic { "simulated NICs" } else { "--bind_backend=none" };
        r.add(s, "queue binding", Status::Skip, format!("not needed ({why})"), None);
    } else if devmem_ok || tcpx_seen {
        let how = if devmem_ok { "devmem BIND_RX" } else { "TCPX dma-buf ioctls" };
        r.add(s, "queue binding", Status::Pass, format!("available through {how}"), None);
    } else {
        r.add(
            s,
            "queue binding",
            Status::Fail,
            "neither devmem TCP (netdev BIND_RX) nor the COS TCPX dma-buf ioctls were found",
            Some("use a COS image with GPUDirect-TCPX support (A3 node pools), or Linux ≥ 6.12 with devmem TCP".into()),
        );
    }

    let (status, found) = match crate::server::leases::probe_peer_pidfd() {
        Ok(()) => (Status::Pass, "SO_PEERPIDFD works (leases follow clients across pid namespaces)".to_string()),
        Err(Errno::ENOPROTOOPT) => (
            if ctx.flags.leases { Status::Warn } else { Status::Skip },
            "SO_PEERPIDFD not supported (Linux < 6.5): leases rely on peer pids, which break across pid namespaces".into(),
        ),
        Err(e) => (Status::Warn, format!("SO_PEERPIDFD: {e}")),
    };
    r.add(s, "peer pidfd", status, found, None);
}

/// A kernel symbol of the COS dma-buf page pool, if `/proc/kallsyms` lists one.
fn tcpx_symbols() -> Option<String> {
    let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .find(|sym| sym.starts_with("dma_buf_create_pages") || sym.starts_with("dma_buf_pages_"))
        .map(str::to_string)
}

/// Size of the test allocation per GPU (one VMM granule on current GPUs).
const TEST_ALLOC: u64 = 2 << 20;

fn check_gpus(r: &mut Report, ctx: &mut Ctx) {
    use crate::gpu::cuda::CudaAllocator;
    use crate::gpu::{PoolAllocator, ShmemType};
    let s = "GPUs";
    let flags = ctx.flags;
    let needs_cuda = match flags.gpu_backend {
        GpuBackendKind::Host => false,
        GpuBackendKind::Cuda => true,
        GpuBackendKind::Auto => !ctx.sim_nic,
    };
    if !needs_cuda {
        let driver = if CudaAllocator::driver_present() { "present" } else { "absent" };
        r.add(
            s,
            "pools",
            Status::Skip,
            format!("host memory pools (memfd): no GPU needed for this configuration (libcuda {driver}; --gpu_backend=cuda checks it)"),
            None,
        );
        return;
    }
    if !CudaAllocator::driver_present() {
        r.add(
            s,
            "driver",
            Status::Fail,
            "libcuda.so not found: no NVIDIA driver visible to this process",
            Some("install the NVIDIA driver (GKE: the driver installer DaemonSet) and mount its libraries into the container (e.g. /usr/local/nvidia/lib64 on LD_LIBRARY_PATH)".into()),
        );
        return;
    }
    let alloc = match CudaAllocator::new() {
        Ok(a) => a,
        Err(e) => {
            r.add(
                s,
                "driver",
                Status::Fail,
                e.to_string(),
                Some("check `nvidia-smi`; the driver must support CUDA VMM (≥ 11.x)".into()),
            );
            return;
        }
    };
    match alloc.driver_version() {
        Ok(v) => r.add(s, "driver", Status::Pass, format!("CUDA driver API {v}"), None),
        Err(e) => r.add(s, "driver", Status::Warn, e.to_string(), None),
    }
    let visible = match alloc.visible_gpus() {
        Ok(v) => v.unwrap_or_default(),
        Err(e) => {
            r.add(s, "devices", Status::Fail, e.to_string(), None);
            return;
        }
    };
    let sim_placed = ctx.source == Some(Source::Preset("sim"));
    let wanted: Vec<_> = match &ctx.topo {
        Some(t) if !sim_placed => t.gpus().map(|(_, g)| g.pci).collect(),
        _ => visible.clone(),
    };
    let missing: Vec<String> =
        wanted.iter().filter(|g| !visible.contains(g)).map(|g| g.to_string()).collect();
    if visible.is_empty() {
        r.add(
            s,
            "devices",
            Status::Fail,
            "CUDA sees no GPU",
            Some("check `nvidia-smi` and CUDA_VISIBLE_DEVICES".into()),
        );
        return;
    } else if !missing.is_empty() {
        r.add(
            s,
            "devices",
            Status::Fail,
            format!("CUDA sees {} GPUs, the topology wants {}: not visible {}", visible.len(), wanted.len(), missing.join(", ")),
            Some("a GPU missing from CUDA but present on the PCI bus: check `nvidia-smi -q` for errors (Xid) and CUDA_VISIBLE_DEVICES".into()),
        );
    } else {
        let note = if sim_placed { " (the sim preset places them on its NICs)" } else { "" };
        r.add(s, "devices", Status::Pass, format!("CUDA sees {} GPUs{note}", visible.len()), None);
    }
    for gpu in wanted.iter().filter(|g| visible.contains(g)) {
        let mut parts = Vec::new();
        let mut status = Status::Pass;
        let mut fix = None;
        // Without queue binding (simulated NICs, --bind_backend=none) RDMA and
        // dma-buf are not needed: their absence only warns.
        let needed = if ctx.binding_needed { Status::Fail } else { Status::Warn };
        let mut worse = |s: Status| {
            if s == Status::Fail || status == Status::Pass {
                status = s;
            }
        };
        match alloc.rdma_with_vmm(*gpu) {
            Ok(true) => parts.push("GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED".to_string()),
            Ok(false) => {
                worse(needed);
                parts.push("no GPUDirect RDMA with VMM".into());
                fix = Some("needs a data-center GPU and the open NVIDIA kernel module".to_string());
            }
            Err(e) => {
                worse(Status::Fail);
                parts.push(e.to_string());
            }
        }
        match alloc.allocate(*gpu, TEST_ALLOC, ShmemType::Fd) {
            Ok(pool) => {
                parts.push(if pool.share_fd().is_some() {
                    "VMM + POSIX fd".into()
                } else {
                    "no POSIX fd".into()
                });
                if pool.dmabuf_fd().is_some() {
                    parts.push("dma-buf export".into());
                } else {
                    worse(needed);
                    parts.push(format!("no dma-buf: {}", pool.describe()));
                    fix = Some("dma-buf export needs the open NVIDIA kernel module (nvidia-open) and a kernel with dma-buf".into());
                }
                drop(pool);
            }
            Err(e) => {
                worse(Status::Fail);
                parts.push(format!("test allocation failed: {e}"));
            }
        }
        r.add(s, &gpu.to_string(), status, parts.join(", "), fix);
    }
}

fn check_host(r: &mut Report, ctx: &Ctx) {
    let s = "host";
    let flags = ctx.flags;
    let uds = &flags.uds_path;
    match std::fs::metadata(uds) {
        Ok(m) if m.is_dir() => {
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            let writable = nix::unistd::access(uds, nix::unistd::AccessFlags::W_OK).is_ok();
            let found = format!(
                "{} exists, mode {:04o}, owner {}:{}{}",
                uds.display(),
                m.permissions().mode() & 0o7777,
                m.uid(),
                m.gid(),
                if writable { "" } else { ", not writable by this user" }
            );
            let status = if writable || ctx.daemon.is_some() { Status::Pass } else { Status::Fail };
            let fix = (status == Status::Fail).then(|| {
                format!("run as a user that can write {} (root in the tcpx-daemon container)", uds.display())
            });
            r.add(s, "socket folder", status, found, fix);
        }
        Ok(_) => r.add(
            s,
            "socket folder",
            Status::Fail,
            format!("{} exists and is not a folder", uds.display()),
            Some("point --uds_path at a folder (the NCCL plugin's UNIX_CLIENT_PREFIX)".into()),
        ),
        Err(_) => r.add(
            s,
            "socket folder",
            Status::Pass,
            format!("{} absent: the daemon creates it", uds.display()),
            None,
        ),
    }
    match &ctx.daemon {
        Some(pid) => r.add(
            s,
            "daemon",
            Status::Pass,
            format!(
                "a daemon holds the lock ({pid}); `tcpx-rxdm status --uds_path={}` asks it",
                uds.display()
            ),
            None,
        ),
        None => {
            r.add(s, "daemon", Status::Pass, "none running on this socket folder (the lock is free)", None)
        }
    }

    let tuning_applies =
        !ctx.sim_nic && flags.tuning_script_path.is_none() && flags.setup_param != SetupParam::Off;
    if !tuning_applies {
        let why = if ctx.sim_nic {
            "simulated NICs: the daemon does no host tuning"
        } else if flags.tuning_script_path.is_some() {
            "--tuning_script_path: the scripts tune"
        } else {
            "--setup_param empty: no host tuning"
        };
        r.add(s, "tuning", Status::Skip, why, None);
    } else {
        let knobs = crate::host::tuning::knob_states(&flags.procfs_root(), &flags.sysfs_root());
        let at = knobs.iter().filter(|k| k.ok).count();
        let differ: Vec<String> = knobs
            .iter()
            .filter(|k| !k.ok)
            .map(|k| {
                let name = k.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                match &k.current {
                    Some(c) => format!("{name} {c:?} (daemon sets {:?})", k.want),
                    None => format!("{name} absent (skipped)"),
                }
            })
            .collect();
        let status = if ctx.daemon.is_some() && knobs.iter().any(|k| !k.ok && k.current.is_some()) {
            Status::Warn
        } else {
            Status::Pass
        };
        let mut found = format!("{at}/{} knobs already at the daemon's values", knobs.len());
        if !differ.is_empty() {
            found.push_str(": ");
            found.push_str(&differ.join("; "));
        }
        if ctx.daemon.is_none() && !differ.is_empty() {
            found.push_str(" (set at start, restored at exit)");
        }
        r.add(s, "tuning", status, found, None);
        if let SetupParam::Tune(params) = flags.setup_param {
            let crate::host::tuning::TuningParams { initcwnd, rto_min_ms, quickack } = params;
            match route_states(&params) {
                Ok((total, tuned)) => r.add(
                    s,
                    "route metrics",
                    Status::Pass,
                    format!(
                        "{tuned} of {total} main-table routes already carry initcwnd {initcwnd}, rto_min {rto_min_ms} ms, quickack {quickack} (0 = left alone){}",
                        if ctx.daemon.is_none() && tuned < total { "; the daemon sets them at start" } else { "" }
                    ),
                    None,
                ),
                Err(e) => r.add(s, "route metrics", Status::Warn, format!("cannot dump routes: {e}"), None),
            }
        }
    }

    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid out-pointer for one rlimit.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let got = if rc == 0 { Ok((lim.rlim_cur, lim.rlim_max)) } else { Err(Errno::last()) };
    match got {
        Ok((soft, hard)) => {
            let need = u64::from(flags.max_connections) + 256;
            if soft < need {
                r.add(
                    s,
                    "open files",
                    Status::Warn,
                    format!("RLIMIT_NOFILE soft {soft}, hard {hard}: below --max_connections {} + 256 for the daemon's own files", flags.max_connections),
                    Some(if hard >= need {
                        format!("the hard limit allows it: raise the soft one (`ulimit -Sn {hard}`)")
                    } else {
                        format!("raise it (`ulimit -n {need}`, LimitNOFILE= in systemd, or lower --max_connections)")
                    }),
                );
            } else {
                r.add(s, "open files", Status::Pass, format!("RLIMIT_NOFILE soft {soft}, hard {hard}"), None);
            }
        }
        Err(e) => r.add(s, "open files", Status::Warn, format!("getrlimit: {e}"), None),
    }
}

/// Main-table unicast routes (IPv4 and IPv6), and how many already carry
/// every route metric native tuning sets. Reads only.
fn route_states(params: &crate::host::tuning::TuningParams) -> Result<(usize, usize), String> {
    use crate::netlink::rtnl;
    let want = params.route_metrics();
    let mut conn =
        crate::netlink::NlConn::open(neli::consts::socket::NlFamily::Route).map_err(|e| e.to_string())?;
    let (mut total, mut tuned) = (0, 0);
    for v6 in [false, true] {
        for payload in conn.transact(&rtnl::getroute_dump(v6)).map_err(|e| e.to_string())? {
            let route = rtnl::parse_route(&payload).map_err(|e| e.to_string())?;
            if !route.is_tunable() {
                continue;
            }
            total += 1;
            if want.iter().all(|(t, v)| route.metric(*t) == Some(*v)) {
                tuned += 1;
            }
        }
    }
    Ok((total, tuned))
}

/// `tcpx-rxdm doctor [--json] FLAGS…`: prints the report, returns the exit code.
pub fn main(flags: &Flags, json: bool) -> u8 {
    let report = run(flags);
    if json {
        println!("{}", serde_json::to_string_pretty(&report.json()).expect("JSON of plain data"));
    } else {
        print!("{}", report.text());
    }
    if report.ok() {
        0
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::NicOp;

    use crate::nic::sim::{SimDriver, SimNic};
    use crate::nic::{FlowSpec, NicSetup, RuleControl};

    fn flags() -> Flags {
        Flags::parse_args(
            ["tcpx-rxdm", "--gpu_nic_preset=manual", "--gpu_nic_topology_proto=x"].map(String::from),
        )
        .unwrap()
    }

    /// The NIC lines for `eth1` of a topology using queues 8-11 and `top`.
    fn nic_lines(nic: &SimNic, daemon: Option<&str>, top: u32) -> Vec<Check> {
        let flags = flags();
        let text = format!(
            r#"gpu_rxq_configs {{ gpu_infos {{ gpu_pci_addr: "0000:04:00.0" queue_ids: 8 queue_ids: 9 queue_ids: 10 queue_ids: {top} }} ifname: "eth1" }} rss_set_size: 8 max_rx_rules: 100"#
        );
        let topo = crate::config::presets::topology_from_text(&text, "test").unwrap();
        // A NIC the daemon would own (not simulated in its own process), but
        // driven through the simulated backend so its state can be prepared.
        let ctx = Ctx {
            flags: &flags,
            topo: Some(topo.clone()),
            source: Some(Source::Inline),
            sim_nic: false,
            daemon: daemon.map(str::to_string),
            binding_needed: false,
        };
        let mut r = Report::default();
        check_nic(&mut r, &ctx, &topo, nic, "eth1");
        r.checks
    }

    fn find<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no {name} in {checks:?}"))
    }

    #[test]
    fn a_nic_left_primed_warns_unless_a_daemon_owns_it() {
        let nic = SimNic::new(&["eth1"]);
        nic.set_feature("eth1", FEATURE_NTUPLE, true).unwrap();
        for port in [1u32, 2] {
            let f = FlowSpec {
                src: format!("10.0.0.2:{port}").parse().unwrap(),
                dst: "192.168.1.2:5".parse().unwrap(),
            };
            nic.add_rule("eth1", &f, 8, port).unwrap();
        }
        nic.set_priv_flag("eth1", PRIV_HEADER_SPLIT, true).unwrap();
        let before = (nic.list_rules("eth1").unwrap(), nic.priv_flags("eth1").unwrap());

        let alone = nic_lines(&nic, None, 11);
        let state = find(&alone, "ntuple state");
        assert_eq!(state.status, Status::Warn);
        assert!(state.found.contains("on, 2 stale rules"), "{state:?}");
        let hs = find(&alone, "header split state");
        assert_eq!(hs.status, Status::Warn);
        assert!(hs.fix.as_deref().unwrap().contains("ethtool --set-priv-flags eth1 enable-header-split off"));

        let owned = nic_lines(&nic, Some("pid 7"), 11);
        let state = find(&owned, "ntuple state");
        assert_eq!(state.status, Status::Pass);
        assert!(state.found.contains("the running daemon, pid 7, owns them"), "{state:?}");
        assert_eq!(find(&owned, "header split state").status, Status::Pass);
        // Only read calls were made.
        assert_eq!((nic.list_rules("eth1").unwrap(), nic.priv_flags("eth1").unwrap()), before);
        for op in [NicOp::SetFeature, NicOp::SetPrivFlag, NicOp::SetRss, NicOp::AddRule, NicOp::DelRule] {
            let setup = match op {
                NicOp::SetFeature | NicOp::SetPrivFlag => 1,
                NicOp::AddRule => 2,
                _ => 0,
            };
            assert_eq!(nic.calls(op), setup, "{op} called by the checks");
        }
    }

    #[test]
    fn too_few_channels_fail_and_small_rule_tables_warn() {
        let nic = SimNic::new(&["eth1"]);
        nic.set_capacity("eth1", 50);
        nic.model_driver("eth1", SimDriver::RingSizeOnly);
        let checks = nic_lines(&nic, None, 20);
        let ch = find(&checks, "channels");
        assert_eq!(ch.status, Status::Fail);
        assert!(ch.found.contains("16 rx queues, but the topology uses queue 20"), "{ch:?}");
        assert!(ch.fix.as_deref().unwrap().contains("ethtool -L eth1 combined 21"), "{ch:?}");
        let nt = find(&checks, "ntuple");
        assert_eq!(nt.status, Status::Warn);
        assert!(nt.found.contains("50 rule slots: fewer than max_rx_rules 100"), "{nt:?}");
        let hs = find(&checks, "header split");
        assert_eq!(hs.status, Status::Warn);
        assert!(hs.found.contains("rx ring 1024 of 4096"), "{hs:?}");
    }

    #[test]
    fn queue_ranges_are_compact() {
        assert_eq!(ranges(&[8, 9, 10, 11, 13, 15, 14]), "8-11, 13-15");
        assert_eq!(ranges(&[3]), "3");
        assert_eq!(ranges(&[]), "");
    }

    #[test]
    fn one_failure_fails_the_verdict_and_warnings_do_not() {
        let mut r = Report { preset: "sim".into(), ..Default::default() };
        r.add("a", "x", Status::Pass, "fine", None);
        r.add("a", "y", Status::Warn, "meh", None);
        r.add("b", "z", Status::Skip, "n/a", None);
        assert!(r.ok());
        assert!(r.text().contains("verdict: ready"));
        r.add("b", "w", Status::Fail, "broken", Some("fix it".into()));
        assert!(!r.ok());
        let text = r.text();
        assert!(text.contains("✗ w: broken\n      → fix it"), "{text}");
        assert!(text.contains("NOT ready: 1 problem"), "{text}");
        assert_eq!(r.json()["checks"][3]["status"], "fail");
    }
}
