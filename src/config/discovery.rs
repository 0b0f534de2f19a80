//! Sysfs discovery of the GPU ↔ NIC topology.
//!
//! A NIC's GPUs are the NVIDIA display/3D functions found below the PCIe switch that
//! sits `num_hops` levels above the NIC. Everything is read through the sysfs views
//! (`config::views`: the daemon's own `/sys` for its interfaces, `--sysfs_root` for
//! the PCI tree), so tests run discovery on fabricated trees of directories and
//! relative symlinks.

use std::io;
use std::path::{Component, Path, PathBuf};

use tracing::{debug, info};

use super::views::{parse_pci_name, SysfsViews};
use crate::types::pci::PciAddr;
use crate::types::topology::{GpuSpec, NicSpec};

const NVIDIA_VENDOR: u32 = 0x10de;
/// PCI base class of display controllers (VGA 0x0300xx, 3D 0x0302xx — H100 reports
/// 0x030200). NVSwitches and NVIDIA bridges have other classes and are not GPUs.
const DISPLAY_BASE_CLASS: u32 = 0x03;

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("num_hops must be at least 1")]
    ZeroHops,
    #[error("resolving sysfs root {path}: {source}")]
    ResolveRoot { path: PathBuf, source: io::Error },
    #[error("listing {path}: {source}")]
    ReadDir { path: PathBuf, source: io::Error },
    #[error("resolving device link {path}: {source}")]
    ResolveDevice { path: PathBuf, source: io::Error },
    #[error("reading {path}: {source}")]
    ReadAttr { path: PathBuf, source: io::Error },
    #[error("{path} holds \"{}\", expected a hex number like 0x10de", .value.escape_debug())]
    BadAttr { path: PathBuf, value: String },
    #[error("NIC {ifname}: tcpd_queue_size {tcpd_queue_size} cannot be split evenly over its {gpus} GPUs")]
    UnevenQueueSplit { ifname: String, gpus: usize, tcpd_queue_size: u32 },
}

/// Discovers NICs with GPUs behind a shared PCIe switch, in one sysfs tree
/// (`sysfs_root` is both the interfaces' view and the PCI tree's): see
/// [`discover_in`].
pub fn discover(
    sysfs_root: &Path,
    num_hops: u32,
    rss_set_size: u32,
    tcpd_queue_size: u32,
    has_address: &dyn Fn(&str) -> bool,
) -> Result<Vec<NicSpec>, DiscoveryError> {
    discover_in(&SysfsViews::single(sysfs_root), num_hops, rss_set_size, tcpd_queue_size, has_address)
}

/// Discovers NICs with GPUs behind a shared PCIe switch.
///
/// The interfaces are those of `views` (the daemon's own network namespace,
/// and an explicit `--sysfs_root`'s `class/net`); each one's PCI chain is
/// taken from the view that shows its device, the host's tree by PCI
/// address where the interface's own view lacks it (`config::views`), and
/// its GPUs are looked for in that same tree.
///
/// `has_address` says whether an interface has an IPv4/IPv6 address (the daemon asks
/// netlink; tests pass closures); interfaces without one are skipped. NICs come out in
/// natural ifname order (eth2 < eth10), GPUs in PCI address order, and each NIC's
/// `tcpd_queue_size` queues from `rss_set_size` on are split evenly over its GPUs.
/// An empty result is not an error here; topology validation reports it.
pub fn discover_in(
    views: &SysfsViews,
    num_hops: u32,
    rss_set_size: u32,
    tcpd_queue_size: u32,
    has_address: &dyn Fn(&str) -> bool,
) -> Result<Vec<NicSpec>, DiscoveryError> {
    if num_hops == 0 {
        return Err(DiscoveryError::ZeroHops);
    }
    let root = views.root();
    root.canonicalize().map_err(|source| DiscoveryError::ResolveRoot { path: root.to_path_buf(), source })?;
    let ifnames = views.interfaces().map_err(|(path, source)| DiscoveryError::ReadDir { path, source })?;

    let mut nics = Vec::new();
    for ifname in ifnames {
        let device = match views.device(&ifname) {
            Ok(Some(d)) => d,
            // Virtual interfaces have no device link; one may also vanish mid-scan.
            Ok(None) => {
                debug!(%ifname, "no PCI device in either sysfs view, skipped");
                continue;
            }
            Err(source) => {
                let path = views.interface_dir(&ifname).unwrap_or_default().join("device");
                return Err(DiscoveryError::ResolveDevice { path, source });
            }
        };
        let Some(chain) = pci_chain(&device.sysfs, &device.path) else {
            debug!(%ifname, device = %device.path.display(), "not a PCI device, skipped");
            continue;
        };
        let nic_pci = *chain.last().expect("pci_chain is never empty");
        if chain.len() <= num_hops as usize {
            debug!(%ifname, %nic_pci, num_hops, "too close to the root complex, skipped");
            continue;
        }
        if !has_address(&ifname) {
            debug!(%ifname, "no IP address, skipped");
            continue;
        }
        let switch = device.path.ancestors().nth(num_hops as usize).expect("chain is deeper than num_hops");
        let mut gpus = Vec::new();
        find_gpus(switch, &mut gpus)?;
        if gpus.is_empty() {
            debug!(%ifname, %nic_pci, switch = %switch.display(), "no GPU below the switch, skipped");
            continue;
        }
        gpus.sort();
        let gpus = split_queues(&ifname, &gpus, rss_set_size, tcpd_queue_size)?;
        let tree = device.sysfs.display();
        info!(%ifname, %nic_pci, gpus = %crate::types::list(gpus.iter().map(|g| g.pci)), pci_tree = %tree, "discovered NIC");
        nics.push(NicSpec { ifname, pci: Some(nic_pci), gpus });
    }
    Ok(nics)
}

/// The PCI functions from the root complex down to `device`, if `device` is
/// `<root>/devices/pciDDDD:BB/<pci>/…/<pci>`; `None` for virtual and platform devices.
fn pci_chain(root: &Path, device: &Path) -> Option<Vec<PciAddr>> {
    let mut parts = device.strip_prefix(root).ok()?.components();
    if parts.next() != Some(Component::Normal("devices".as_ref())) {
        return None;
    }
    let root_complex = parts.next()?.as_os_str().to_str()?;
    if !root_complex.starts_with("pci") {
        return None;
    }
    let chain = parts.map(|c| c.as_os_str().to_str().and_then(parse_pci_name)).collect::<Option<Vec<_>>>()?;
    (!chain.is_empty()).then_some(chain)
}

/// Collects the NVIDIA GPUs anywhere below `dir`, descending only into real
/// directories named like PCI functions (never through symlinks such as `driver`).
fn find_gpus(dir: &Path, out: &mut Vec<PciAddr>) -> Result<(), DiscoveryError> {
    for (name, is_dir) in list_dir(dir)? {
        let Some(pci) = name.to_str().and_then(parse_pci_name) else { continue };
        if !is_dir {
            continue;
        }
        let path = dir.join(&name);
        if read_hex(&path.join("vendor"))? == NVIDIA_VENDOR
            && read_hex(&path.join("class"))? >> 16 == DISPLAY_BASE_CLASS
        {
            out.push(pci);
        }
        find_gpus(&path, out)?;
    }
    Ok(())
}

/// Gives GPU i of k the queues `rss + i*Q/k .. rss + (i+1)*Q/k`.
fn split_queues(
    ifname: &str,
    gpus: &[PciAddr],
    rss_set_size: u32,
    tcpd_queue_size: u32,
) -> Result<Vec<GpuSpec>, DiscoveryError> {
    let k = gpus.len() as u32;
    if tcpd_queue_size < k || tcpd_queue_size % k != 0 {
        return Err(DiscoveryError::UnevenQueueSplit {
            ifname: ifname.to_string(),
            gpus: gpus.len(),
            tcpd_queue_size,
        });
    }
    let per_gpu = tcpd_queue_size / k;
    Ok(gpus
        .iter()
        .zip(0..)
        .map(|(&pci, i)| {
            let first = rss_set_size + i * per_gpu;
            GpuSpec { pci, queues: (first..first + per_gpu).collect() }
        })
        .collect())
}

/// Entries of `dir` with whether each is a directory (not following symlinks).
fn list_dir(dir: &Path) -> Result<Vec<(std::ffi::OsString, bool)>, DiscoveryError> {
    let err = |source| DiscoveryError::ReadDir { path: dir.to_path_buf(), source };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(err)? {
        let entry = entry.map_err(err)?;
        let is_dir = entry.file_type().map_err(err)?.is_dir();
        out.push((entry.file_name(), is_dir));
    }
    Ok(out)
}

fn read_hex(path: &Path) -> Result<u32, DiscoveryError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| DiscoveryError::ReadAttr { path: path.to_path_buf(), source })?;
    let value = text.trim();
    value
        .strip_prefix("0x")
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or_else(|| DiscoveryError::BadAttr { path: path.to_path_buf(), value: value.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_queues_evenly() {
        let gpus: Vec<PciAddr> =
            ["0000:04:00.0", "0000:05:00.0"].iter().map(|s| s.parse().unwrap()).collect();
        let out = split_queues("eth1", &gpus, 8, 8).unwrap();
        assert_eq!(out[0].queues, [8, 9, 10, 11]);
        assert_eq!(out[1].queues, [12, 13, 14, 15]);
        assert!(matches!(
            split_queues("eth1", &gpus, 8, 3),
            Err(DiscoveryError::UnevenQueueSplit { gpus: 2, tcpd_queue_size: 3, .. })
        ));
        assert!(split_queues("eth1", &gpus, 8, 0).is_err());
    }
}
