//! The topology against the node's PCI tree (read through `--sysfs_root`, the
//! interfaces through the daemon's own network namespace: `config::views`):
//! each NIC ↔ GPU pairing and its PCIe distance, GPUs the topology wants but
//! the bus lacks, NICs that moved to another PCI address, and GPUs or NICs
//! present but left out, with the reason.

use std::collections::HashMap;
use std::path::{Component, Path};

use crate::config::views::{parse_pci_name, SysfsViews};

use super::{plural, ranges, Ctx, Report, Status};
use crate::config::presets::{interface_has_address, Source};
use crate::types::pci::PciAddr;

const NVIDIA_VENDOR: u32 = 0x10de;
const DISPLAY_BASE_CLASS: u32 = 0x03;
const NETWORK_BASE_CLASS: u32 = 0x02;

/// One PCI function: its path of functions from the root complex down, and its ids.
#[derive(Debug, Clone)]
pub struct PciFn {
    pub chain: Vec<PciAddr>,
    pub vendor: u32,
    pub class: u32,
}

/// What sysfs shows.
#[derive(Debug, Default)]
pub struct Scan {
    pub functions: HashMap<PciAddr, PciFn>,
    /// Interfaces with a PCI device (the nearest PCI function above their
    /// device, e.g. a virtio device's), in name order.
    pub nets: Vec<(String, PciAddr)>,
    /// Driver of each interface in `nets`, where sysfs names one.
    pub drivers: HashMap<String, String>,
}

impl Scan {
    pub fn gpus(&self) -> Vec<PciAddr> {
        let mut v: Vec<PciAddr> = self
            .functions
            .iter()
            .filter(|(_, f)| f.vendor == NVIDIA_VENDOR && f.class >> 16 == DISPLAY_BASE_CLASS)
            .map(|(p, _)| *p)
            .collect();
        v.sort();
        v
    }

    fn ifname_of(&self, pci: PciAddr) -> Option<&str> {
        self.nets.iter().find(|(_, p)| *p == pci).map(|(n, _)| n.as_str())
    }

    fn pci_of(&self, ifname: &str) -> Option<PciAddr> {
        self.nets.iter().find(|(n, _)| n == ifname).map(|(_, p)| *p)
    }

    /// PCIe hops between two functions (up to the shared bridge and down), and
    /// whether they share a bridge below the root complex.
    pub fn distance(&self, a: PciAddr, b: PciAddr) -> Option<(usize, bool)> {
        let (ca, cb) = (&self.functions.get(&a)?.chain, &self.functions.get(&b)?.chain);
        let common = ca.iter().zip(cb.iter()).take_while(|(x, y)| x == y).count();
        Some(((ca.len() - common) + (cb.len() - common), common > 0))
    }
}

fn read_hex(path: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(path).ok()?;
    u32::from_str_radix(text.trim().strip_prefix("0x")?, 16).ok()
}

/// Reads the PCI tree under `<root>/devices/pci*` and the PCI interfaces
/// the views show (`config::views`: this namespace's, each one's device
/// wherever a view shows it).
pub fn scan(views: &SysfsViews) -> std::io::Result<Scan> {
    let root = views.root().canonicalize()?;
    let mut scan = Scan::default();
    for entry in std::fs::read_dir(root.join("devices"))? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with("pci") && entry.file_type()?.is_dir() {
            walk(&entry.path(), &mut Vec::new(), &mut scan.functions);
        }
    }
    for name in views.interfaces().unwrap_or_default() {
        let Ok(Some(dev)) = views.device(&name) else { continue };
        let Ok(rel) = dev.path.strip_prefix(&dev.sysfs) else { continue };
        let last = rel.components().rev().find_map(|c| match c {
            Component::Normal(s) => s.to_str().and_then(parse_pci_name),
            _ => None,
        });
        if let Some(pci) = last {
            if let Some(d) = std::fs::read_link(dev.path.join("driver"))
                .ok()
                .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
            {
                scan.drivers.insert(name.clone(), d);
            }
            scan.nets.push((name, pci));
        }
    }
    scan.nets.sort();
    Ok(scan)
}

fn walk(dir: &Path, chain: &mut Vec<PciAddr>, out: &mut HashMap<PciAddr, PciFn>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let Some(pci) = entry.file_name().to_str().and_then(parse_pci_name) else { continue };
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = entry.path();
        chain.push(pci);
        let f = PciFn {
            chain: chain.clone(),
            vendor: read_hex(&path.join("vendor")).unwrap_or(0),
            class: read_hex(&path.join("class")).unwrap_or(0),
        };
        out.insert(pci, f);
        walk(&path, chain, out);
        chain.pop();
    }
}

pub(super) fn check_topology(r: &mut Report, ctx: &Ctx) {
    let s = "topology";
    if ctx.source == Some(Source::Preset("sim")) {
        if let Some(t) = &ctx.topo {
            for n in &t.nics {
                let gpus: Vec<String> =
                    n.gpus.iter().map(|g| format!("{} queues {}", g.pci, ranges(&g.queues))).collect();
                r.add(s, &n.ifname, Status::Pass, gpus.join("; "), None);
            }
        }
        r.add(
            s,
            "PCI tree",
            Status::Skip,
            "sim preset: simulated NICs and GPUs, not compared with sysfs",
            None,
        );
        return;
    }
    let sysfs = ctx.views.root();
    let scan = match scan(&ctx.views) {
        Ok(sc) => sc,
        Err(e) => {
            r.add(
                s,
                "PCI tree",
                Status::Fail,
                format!("cannot read {}: {e}", sysfs.display()),
                Some("check --sysfs_root (the host's /sys mounted at /hostsysfs in the container)".into()),
            );
            return;
        }
    };
    let node_gpus = scan.gpus();
    let mut wanted_gpus = Vec::new();
    if let Some(topo) = &ctx.topo {
        for n in &topo.nics {
            let mut status = Status::Pass;
            let mut notes = Vec::new();
            let mut fix = None;
            let actual = scan.pci_of(&n.ifname);
            let nic_pci = match (n.pci, actual) {
                (Some(want), Some(got)) if want != got => {
                    status = Status::Fail;
                    let holder =
                        scan.ifname_of(want).map(|i| format!("; {want} is now {i}")).unwrap_or_default();
                    notes.push(format!("{} is at {got}, the topology says {want}{holder}", n.ifname));
                    fix = Some(
                        "an extra or missing NIC shifted PCI slots or names: use --gpu_nic_preset=auto (discovery) or a manual topology matching `ls -l /sys/class/net`".to_string(),
                    );
                    Some(got)
                }
                (_, Some(got)) => Some(got),
                (want, None) => {
                    status = Status::Fail;
                    notes.push(match ctx.views.fabricated() {
                        true => {
                            format!("{} has no PCI device in {}", n.ifname, sysfs.join("class/net").display())
                        }
                        false => format!("{} has no PCI device in this network namespace", n.ifname),
                    });
                    fix = Some(
                        "check `ip link` where the daemon runs: the preset's NIC names must be in its network namespace"
                            .to_string(),
                    );
                    want
                }
            };
            let mut pairs = Vec::new();
            for g in &n.gpus {
                wanted_gpus.push((g.pci, n.ifname.clone()));
                let dist = nic_pci.and_then(|p| scan.distance(p, g.pci));
                let pair = match dist {
                    _ if !node_gpus.contains(&g.pci) => {
                        status = Status::Fail;
                        format!("{} MISSING from the PCI bus", g.pci)
                    }
                    Some((hops, true)) => {
                        format!("{} queues {} ({hops} PCIe hops, shared switch)", g.pci, ranges(&g.queues))
                    }
                    Some((hops, false)) => {
                        if status == Status::Pass {
                            status = Status::Warn;
                        }
                        format!(
                            "{} queues {} ({hops} PCIe hops, only through the root complex: slow)",
                            g.pci,
                            ranges(&g.queues)
                        )
                    }
                    None => format!("{} queues {}", g.pci, ranges(&g.queues)),
                };
                pairs.push(pair);
            }
            let nic_desc = nic_pci.map(|p| format!(" ({p})")).unwrap_or_default();
            let mut found = format!("{}{nic_desc} ↔ {}", n.ifname, pairs.join("; "));
            if !notes.is_empty() {
                found.push_str(": ");
                found.push_str(&notes.join("; "));
            }
            r.add(s, &n.ifname, status, found, fix);
        }
        let missing: Vec<String> = wanted_gpus
            .iter()
            .filter(|(g, _)| !node_gpus.contains(g))
            .map(|(g, nic)| format!("{g} (behind {nic})"))
            .collect();
        if missing.is_empty() {
            r.add(
                s,
                "GPU count",
                Status::Pass,
                format!(
                    "{} NVIDIA GPU{} on the PCI bus, the topology uses {}",
                    node_gpus.len(),
                    plural(node_gpus.len()),
                    wanted_gpus.len()
                ),
                None,
            );
        } else {
            r.add(
                s,
                "GPU count",
                Status::Fail,
                format!(
                    "{} NVIDIA GPU{} on the PCI bus, the topology wants {}: missing {}",
                    node_gpus.len(),
                    plural(node_gpus.len()),
                    wanted_gpus.len(),
                    missing.join(", ")
                ),
                Some("a GPU fell off the bus (check `lspci -d 10de:`, dmesg for Xid/AER) or the preset does not fit this machine type".into()),
            );
        }
    } else {
        let list = if node_gpus.is_empty() {
            "none".to_string()
        } else {
            node_gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(", ")
        };
        r.add(
            s,
            "GPU count",
            Status::Skip,
            format!("{} NVIDIA GPU{} on the PCI bus: {list}", node_gpus.len(), plural(node_gpus.len())),
            None,
        );
        let nics: Vec<String> = scan
            .nets
            .iter()
            .map(|(n, p)| {
                format!("{n} ({p}, {})", scan.drivers.get(n).map(String::as_str).unwrap_or("no driver"))
            })
            .collect();
        r.add(
            s,
            "TCPX NICs",
            Status::Fail,
            format!(
                "no TCPX NIC: no NIC has NVIDIA GPUs behind its PCIe switch; PCI NICs here: {}",
                if nics.is_empty() { "none".to_string() } else { nics.join(", ") }
            ),
            Some("GPUDirect-TCPX needs an A3-class VM (gVNIC data NICs next to H100 GPUs); on other machines use --gpu_nic_preset=sim to try the daemon".into()),
        );
    }

    let used: Vec<PciAddr> = wanted_gpus.iter().map(|(g, _)| *g).collect();
    let extra: Vec<String> = node_gpus.iter().filter(|g| !used.contains(g)).map(|g| g.to_string()).collect();
    if ctx.topo.is_some() && !extra.is_empty() {
        let why = if ctx.source == Some(Source::Discovery) {
            format!("below no addressed NIC's PCIe switch at --num_hops={}", ctx.flags.num_hops)
        } else {
            "not in the topology".into()
        };
        r.add(
            s,
            "unused GPUs",
            Status::Warn,
            format!("{} ({why}): they get no receive pool", extra.join(", ")),
            None,
        );
    }

    let topo_nics: Vec<&str> =
        ctx.topo.iter().flat_map(|t| t.nics.iter().map(|n| n.ifname.as_str())).collect();
    let left: Vec<String> = scan
        .nets
        .iter()
        .filter(|(name, pci)| {
            !topo_nics.contains(&name.as_str())
                && scan.functions.get(pci).is_some_and(|f| f.class >> 16 == NETWORK_BASE_CLASS)
        })
        .map(|(name, pci)| {
            let driver = scan.drivers.get(name).map(|d| format!(", {d}")).unwrap_or_default();
            format!("{name} ({pci}{driver}): {}", nic_left_out_reason(&scan, ctx, name, *pci))
        })
        .collect();
    if !left.is_empty() {
        r.add(s, "other NICs", Status::Skip, left.join("; "), None);
    }
}

fn nic_left_out_reason(scan: &Scan, ctx: &Ctx, ifname: &str, pci: PciAddr) -> String {
    if ctx.source != Some(Source::Discovery) && ctx.topo.is_some() {
        return "not in the topology".into();
    }
    let hops = ctx.flags.num_hops as usize;
    let Some(f) = scan.functions.get(&pci) else { return "not on the PCI tree".into() };
    if f.chain.len() <= hops {
        return format!("too close to the root complex for --num_hops={hops} (host NIC)");
    }
    if !interface_has_address(ifname) {
        return "no IP address".into();
    }
    let switch = &f.chain[..f.chain.len() - hops];
    let has_gpu =
        scan.gpus().iter().any(|g| scan.functions.get(g).is_some_and(|gf| gf.chain.starts_with(switch)));
    if has_gpu {
        "skipped by discovery".into()
    } else {
        format!("no NVIDIA GPU below its PCIe switch {hops} hops up")
    }
}
