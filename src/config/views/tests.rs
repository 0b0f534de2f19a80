//! The two views over fabricated trees: a Pod's own sysfs that lists its
//! interfaces (with `device` links whose targets it lacks) and a host's
//! that holds the PCI tree.

use std::fs;
use std::os::unix::fs::symlink;

use super::*;

const NIC_FN: &str = "devices/pci0000:00/0000:00:01.0/0000:05:00.0/0000:06:00.0";

/// A host sysfs: the NIC's PCI function, its `bus/pci/devices` link, and
/// `class/net` holding only the host's `eth0` (the GPU NIC moved to the Pod).
fn host() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    fs::create_dir_all(r.join(NIC_FN)).unwrap();
    fs::write(r.join(NIC_FN).join("numa_node"), "1\n").unwrap();
    fs::create_dir_all(r.join("bus/pci/devices")).unwrap();
    symlink(format!("../../../{NIC_FN}"), r.join("bus/pci/devices/0000:06:00.0")).unwrap();
    fs::create_dir_all(r.join("devices/pci0000:00/0000:00:04.0/net/eth0")).unwrap();
    symlink("../../../0000:00:04.0", r.join("devices/pci0000:00/0000:00:04.0/net/eth0/device")).unwrap();
    fs::create_dir_all(r.join("class/net")).unwrap();
    symlink("../../devices/pci0000:00/0000:00:04.0/net/eth0", r.join("class/net/eth0")).unwrap();
    d
}

/// A Pod's sysfs: `eth1` with a `device` link into a PCI tree it lacks, and
/// a virtual `eth0` and `lo`.
fn pod() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let net = d.path().join("class/net");
    for i in ["eth0", "eth1", "lo"] {
        fs::create_dir_all(net.join(i)).unwrap();
    }
    symlink(format!("../../../{NIC_FN}"), net.join("eth1/device")).unwrap();
    d
}

#[test]
fn a_pod_nic_is_present_by_its_namespace_and_a_host_only_one_is_not() {
    let (h, p) = (host(), pod());
    let v = SysfsViews::pod(p.path(), h.path());
    assert!(v.has_nic("eth1"));
    assert!(!v.root_lists("eth1"));
    // Listed by the host's sysfs, but not in the daemon's namespace: a
    // sysfs mount's class/net alone does not count.
    fs::create_dir_all(h.path().join("class/net/eth9")).unwrap();
    assert!(!v.has_nic("eth9"));
    // A fabricated root's does.
    let fabricated = SysfsViews { fabricated: true, ..v.clone() };
    assert!(fabricated.has_nic("eth9"));
    assert!(!v.has_nic("eth7") && !fabricated.has_nic("eth7"));
}

#[test]
fn the_interfaces_are_the_namespace_s_or_a_fabricated_root_s() {
    let (h, p) = (host(), pod());
    let v = SysfsViews::pod(p.path(), h.path());
    assert_eq!(v.interfaces().unwrap(), ["eth0", "eth1", "lo"]);
    fs::create_dir_all(h.path().join("class/net/eth10")).unwrap();
    assert_eq!(v.interfaces().unwrap(), ["eth0", "eth1", "lo"]);
    let fabricated = SysfsViews { fabricated: true, ..v };
    assert_eq!(fabricated.interfaces().unwrap(), ["eth0", "eth10"]);
}

#[test]
fn the_own_view_comes_first_and_a_fabricated_root_before_it() {
    let (h, p) = (host(), pod());
    let v = SysfsViews::pod(p.path(), h.path());
    // eth0 is in both: the Pod's own (a veth here) is the one the daemon sees.
    assert_eq!(v.interface_dir("eth0").unwrap(), p.path().join("class/net/eth0"));
    assert!(!v.has_device("eth0"));
    let fabricated = SysfsViews { fabricated: true, ..v.clone() };
    assert_eq!(fabricated.interface_dir("eth0").unwrap(), h.path().join("class/net/eth0"));
    assert!(fabricated.has_device("eth0"));
    // Only one view has it: that one, either way.
    assert_eq!(v.interface_dir("eth1").unwrap(), p.path().join("class/net/eth1"));
    assert_eq!(fabricated.interface_dir("eth1").unwrap(), p.path().join("class/net/eth1"));
    assert_eq!(v.interface_dir("eth7"), None);
}

#[test]
fn a_device_the_pod_view_lacks_is_found_by_its_address_in_the_host_tree() {
    let (h, p) = (host(), pod());
    let v = SysfsViews::pod(p.path(), h.path());
    assert!(v.has_device("eth1"));
    let dev = v.device("eth1").unwrap().expect("found through bus/pci/devices");
    let root = h.path().canonicalize().unwrap();
    assert_eq!(dev, NicDevice { path: root.join(NIC_FN), sysfs: root, by_address: true });
    assert_eq!(v.nic_pci("eth1").map(|p| p.to_string()).as_deref(), Some("0000:06:00.0"));
    assert_eq!(fs::read_to_string(dev.path.join("numa_node")).unwrap(), "1\n");
    // Virtual interfaces have no device; unknown ones neither.
    assert_eq!(v.device("lo").unwrap(), None);
    assert_eq!(v.device("eth7").unwrap(), None);
}

#[test]
fn a_device_the_own_view_shows_is_taken_from_it() {
    let (h, p) = (host(), pod());
    // The Pod's sysfs shows the PCI tree too (as a container's /sys does).
    fs::create_dir_all(p.path().join(NIC_FN)).unwrap();
    let v = SysfsViews::pod(p.path(), h.path());
    let dev = v.device("eth1").unwrap().unwrap();
    let own = p.path().canonicalize().unwrap();
    assert_eq!(dev, NicDevice { path: own.join(NIC_FN), sysfs: own, by_address: false });
}

#[test]
fn a_device_neither_view_shows_is_none() {
    let (h, p) = (host(), pod());
    fs::remove_file(h.path().join("bus/pci/devices/0000:06:00.0")).unwrap();
    let v = SysfsViews::pod(p.path(), h.path());
    assert_eq!(v.device("eth1").unwrap(), None);
    assert_eq!(v.nic_pci("eth1"), None);
}

#[test]
fn one_tree_is_both_views() {
    let h = host();
    let v = SysfsViews::single(h.path());
    assert!(!v.separate() && v.fabricated());
    assert!(v.has_nic("eth0") && !v.has_nic("eth1"));
    let dev = v.device("eth0").unwrap().unwrap();
    assert!(!dev.by_address && dev.path.ends_with("0000:00:04.0"), "{dev:?}");
}

#[test]
fn nics_moved_into_this_namespace_tell_a_pod_where_the_kernel_does_not() {
    let (h, p) = (host(), pod());
    let v = SysfsViews::pod(p.path(), h.path());
    let unknown = || Netns::new(Place::Unknown, "nothing");
    let n = v.judge_netns(unknown(), &["eth1"]);
    assert_eq!(n.place, Place::Other, "{}", n.why);
    assert!(n.why.starts_with("eth1 is in this network namespace, and "), "{}", n.why);
    // The host's sysfs lists one of them: not moved (or not only).
    assert_eq!(v.judge_netns(unknown(), &["eth1", "eth0"]).place, Place::Unknown);
    // One of them is not here.
    assert_eq!(v.judge_netns(unknown(), &["eth1", "eth7"]).place, Place::Unknown);
    // What the kernel tells wins; a fabricated root or one tree tells nothing.
    let host_place = Netns::new(Place::Host, "kernel");
    assert_eq!(v.judge_netns(host_place.clone(), &["eth1"]), host_place);
    assert_eq!(SysfsViews { fabricated: true, ..v }.judge_netns(unknown(), &["eth1"]).place, Place::Unknown);
    assert_eq!(SysfsViews::single(p.path()).judge_netns(unknown(), &["eth1"]).place, Place::Unknown);
}

#[test]
fn pci_names_are_full_form_only() {
    assert_eq!(parse_pci_name("0000:8a:00.0").map(|p| p.to_string()).as_deref(), Some("0000:8a:00.0"));
    for s in ["8a:00.0", "pci0000:00", "10000:e0:06.0", "virtio0", "0000:8a:00.0x", "net"] {
        assert!(parse_pci_name(s).is_none(), "{s} accepted");
    }
}
