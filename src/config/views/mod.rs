//! The daemon's two views of sysfs: the configured root and its own `/sys`.
//!
//! `--sysfs_root` (default `/hostsysfs` when that folder exists, else
//! `/sys`) shows the node's PCI tree: which GPU sits behind which NIC. Its
//! `class/net`, though, lists the interfaces of the network namespace that
//! mounted it. In a Pod with a network namespace of its own (GKE
//! multi-networking gives each Pod its GPU NICs), `/hostsysfs` is the host's
//! sysfs and lists the host's interfaces, not the Pod's: the GPU NICs are in
//! the daemon's own namespace, which the daemon's own `/sys` lists. The PCI
//! tree (`devices/`, `bus/pci/`) is the same in every namespace.
//!
//! A `--sysfs_root` that is a plain folder rather than a sysfs mount is a
//! *fabricated* tree (tests, CI, a copy of a node's sysfs): it stands for the
//! whole node, its interfaces included. A sysfs mount (the default
//! `/hostsysfs`, `/sys`, or one given) is read for its PCI tree, while the
//! interfaces are the daemon's own namespace's.
//!
//! The rules, for every reader of per-interface files (presence, discovery,
//! NUMA nodes for NCCL, doctor):
//!
//! - **Present**: a NIC is there when the daemon's own network namespace has
//!   it (`if_nametoindex`), or when a fabricated root's `class/net` lists it.
//!   A sysfs mount's `class/net` alone does not count: it may list another
//!   namespace's interfaces, which the daemon cannot program.
//! - **An interface's folder**: for a fabricated root, `<root>/class/net/<if>`
//!   first, then the daemon's own `/sys/class/net/<if>`. Otherwise the own
//!   one first for an interface of the daemon's namespace (a host interface
//!   of the same name is another device), then the root's.
//! - **Its PCI device**: the folder's `device` link where it resolves; where
//!   its target is missing from that view (a sysfs that shows only the
//!   interfaces), the link's last part, the PCI address, looked up in
//!   `<root>/bus/pci/devices`.
//! - **The interfaces** (discovery, NCCL's control interface, doctor): a
//!   fabricated root's `class/net`; otherwise the daemon's own namespace's.

use std::io;
use std::path::{Path, PathBuf};

use crate::host::netns::{self, Netns, Place};
use crate::types::pci::PciAddr;

use super::flags::Flags;

/// The daemon's own sysfs: its `class/net` is its network namespace's.
pub const OWN_SYSFS: &str = "/sys";

/// Where per-interface and PCI files are read (module docs).
#[derive(Debug, Clone)]
pub struct SysfsViews {
    root: PathBuf,
    /// The root is a given folder that is no sysfs mount (module docs).
    fabricated: bool,
    own: PathBuf,
    /// Whether the kernel is asked which interfaces the daemon's namespace
    /// holds; off for fabricated trees, where the own view's `class/net` says.
    kernel: bool,
}

/// A NIC's PCI function as one of the views shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicDevice {
    /// The function's folder, resolved (`<sysfs>/devices/pci…/…/<pci>`).
    pub path: PathBuf,
    /// The resolved root of the view it was found in.
    pub sysfs: PathBuf,
    /// Whether it came from `<root>/bus/pci/devices` by PCI address, the
    /// interface's own view lacking the device.
    pub by_address: bool,
}

impl SysfsViews {
    /// The daemon's views: `--sysfs_root` (or its default) and `/sys`.
    pub fn new(flags: &Flags) -> SysfsViews {
        let root = flags.sysfs_root();
        let fabricated = flags.sysfs_root.is_some() && !is_sysfs_mount(&root);
        SysfsViews { root, fabricated, own: PathBuf::from(OWN_SYSFS), kernel: true }
    }

    /// One tree that is both views, read as a fabricated `--sysfs_root` is:
    /// no interface of the caller's own namespace counts (`discover`,
    /// `nccl::Sysfs::new`, tests).
    pub fn single(root: &Path) -> SysfsViews {
        SysfsViews { root: root.to_path_buf(), fabricated: true, own: root.to_path_buf(), kernel: false }
    }

    /// Two fabricated trees: a Pod's own sysfs (its interfaces) and the
    /// host's (the PCI tree), as the default `/hostsysfs` is used.
    pub fn pod(own: &Path, host: &Path) -> SysfsViews {
        SysfsViews { root: host.to_path_buf(), fabricated: false, own: own.to_path_buf(), kernel: false }
    }

    /// The configured root (`--sysfs_root` or its default).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The daemon's own sysfs.
    pub fn own(&self) -> &Path {
        &self.own
    }

    /// Whether the root is a fabricated tree that stands for the whole
    /// node, interfaces included (module docs).
    pub fn fabricated(&self) -> bool {
        self.fabricated
    }

    /// Whether the configured root is another tree than the daemon's own `/sys`.
    pub fn separate(&self) -> bool {
        self.root != self.own
    }

    /// Whether the daemon's own network namespace holds `ifname`.
    pub fn in_namespace(&self, ifname: &str) -> bool {
        if self.kernel {
            nix::net::if_::if_nametoindex(ifname).is_ok()
        } else {
            self.own.join("class/net").join(ifname).exists()
        }
    }

    /// Whether `<root>/class/net` lists `ifname`.
    pub fn root_lists(&self, ifname: &str) -> bool {
        self.root.join("class/net").join(ifname).exists()
    }

    /// Whether a topology NIC is present (module docs, *Present*).
    pub fn has_nic(&self, ifname: &str) -> bool {
        self.in_namespace(ifname) || (self.fabricated && self.root_lists(ifname))
    }

    /// The interfaces of the daemon's own network namespace, in natural
    /// name order. Fabricated trees: an unreadable `class/net` is an error.
    pub fn namespace_interfaces(&self) -> Result<Vec<String>, (PathBuf, io::Error)> {
        let mut names = match self.kernel {
            true => nix::net::if_::if_nameindex()
                .map(|l| l.iter().filter_map(|i| i.name().to_str().ok().map(str::to_string)).collect())
                .unwrap_or_default(),
            false => list_names(&self.own.join("class/net"))?,
        };
        names.sort_by(|a, b| crate::types::ifname::natural_cmp(a, b));
        Ok(names)
    }

    /// Every interface to consider (module docs, *The interfaces*), in
    /// natural name order; the folder that could not be listed otherwise.
    pub fn interfaces(&self) -> Result<Vec<String>, (PathBuf, io::Error)> {
        if !self.fabricated {
            return self.namespace_interfaces();
        }
        let mut names = list_names(&self.root.join("class/net"))?;
        names.sort_by(|a, b| crate::types::ifname::natural_cmp(a, b));
        Ok(names)
    }

    /// `class/net/<ifname>` in the view that shows the interface (module
    /// docs, *An interface's folder*); `None` when neither does.
    pub fn interface_dir(&self, ifname: &str) -> Option<PathBuf> {
        let root = self.root.join("class/net").join(ifname);
        let own = self.own.join("class/net").join(ifname);
        let order = match self.fabricated {
            true => [Some(root), Some(own)],
            false => [self.in_namespace(ifname).then_some(own), Some(root)],
        };
        order.into_iter().flatten().find(|d| d.exists())
    }

    /// Whether the interface is backed by a device (a `device` link, even
    /// one whose target this view lacks); `false` for `lo`, veths, bridges.
    pub fn has_device(&self, ifname: &str) -> bool {
        self.interface_dir(ifname).is_some_and(|d| d.join("device").symlink_metadata().is_ok())
    }

    /// The NIC's PCI function (module docs, *Its PCI device*). `Ok(None)`:
    /// no such interface, a virtual one (no `device` link), or a device
    /// neither view shows.
    pub fn device(&self, ifname: &str) -> io::Result<Option<NicDevice>> {
        let Some(dir) = self.interface_dir(ifname) else { return Ok(None) };
        let link = dir.join("device");
        let target = match std::fs::read_link(&link) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let roots = [resolved(&self.own), resolved(&self.root)];
        match link.canonicalize() {
            Ok(path) => {
                let sysfs = roots.iter().flatten().find(|r| path.starts_with(r)).cloned();
                if let Some(sysfs) = sysfs {
                    return Ok(Some(NicDevice { path, sysfs, by_address: false }));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        // The view lacks the device: find it by its address in the root's PCI tree.
        let Some(pci) = target.file_name().and_then(|n| n.to_str()).and_then(parse_pci_name) else {
            return Ok(None);
        };
        let Some(root) = resolved(&self.root) else { return Ok(None) };
        match root.join("bus/pci/devices").join(pci.to_string()).canonicalize() {
            Ok(path) if path.starts_with(&root) => {
                Ok(Some(NicDevice { path, sysfs: root, by_address: true }))
            }
            Ok(_) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Which network namespace the daemon runs in: what the kernel tells
    /// (`host::netns`), or failing that what the NICs tell (see
    /// [`SysfsViews::judge_netns`]).
    pub fn netns(&self, nics: &[&str]) -> Netns {
        self.judge_netns(netns::detect(Path::new("/proc"), &self.own, &self.root), nics)
    }

    /// `seen`, or, where it is unknown: the topology's NICs all in the
    /// daemon's namespace while the host's sysfs (a sysfs root apart from
    /// the own one, not fabricated) lists none of them mean a namespace
    /// other than the host's: the NICs were moved into it.
    pub fn judge_netns(&self, seen: Netns, nics: &[&str]) -> Netns {
        if seen.place != Place::Unknown || nics.is_empty() || !self.separate() || self.fabricated {
            return seen;
        }
        if nics.iter().all(|n| self.in_namespace(n)) && !nics.iter().any(|n| self.root_lists(n)) {
            let why = format!(
                "{} {} in this network namespace, and {} (the host's) lists none of them",
                crate::types::list(nics),
                if nics.len() == 1 { "is" } else { "are" },
                self.root.join("class/net").display()
            );
            return Netns::new(Place::Other, why);
        }
        seen
    }

    /// The NIC's PCI address, where a view shows its device.
    pub fn nic_pci(&self, ifname: &str) -> Option<PciAddr> {
        let dev = self.device(ifname).ok()??;
        dev.path.file_name().and_then(|n| n.to_str()).and_then(parse_pci_name)
    }
}

/// Whether `path` is a sysfs mount (not a folder standing for one).
pub fn is_sysfs_mount(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::SYSFS_MAGIC)
}

fn resolved(p: &Path) -> Option<PathBuf> {
    p.canonicalize().ok()
}

/// The names in a folder.
fn list_names(dir: &Path) -> Result<Vec<String>, (PathBuf, io::Error)> {
    let err = |e| (dir.to_path_buf(), e);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(err)? {
        if let Ok(name) = entry.map_err(err)?.file_name().into_string() {
            out.push(name);
        }
    }
    Ok(out)
}

/// Parses a sysfs PCI folder name, which is always the full `dddd:bb:dd.f`
/// (`PciAddr` alone also accepts the short form clients may send).
pub fn parse_pci_name(name: &str) -> Option<PciAddr> {
    let b = name.as_bytes();
    if b.len() != 12 || b[4] != b':' || b[7] != b':' || b[10] != b'.' {
        return None;
    }
    name.parse().ok()
}

#[cfg(test)]
mod tests;
