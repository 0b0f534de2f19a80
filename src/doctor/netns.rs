//! The network namespace layout: whether doctor (and a daemon with these
//! flags beside it) runs in a network namespace other than the host's, as a
//! Pod does whose NICs are attached to it; what it sees in that namespace
//! (the NICs) and in the host's sysfs (the PCI tree, the GPUs); and whose
//! the host-wide tuning is.

use super::{plural, Ctx, Report, Status};
use crate::config::views::SysfsViews;
use crate::host::netns::Place;

const SECTION: &str = "network namespace";

pub(super) fn check_netns(r: &mut Report, ctx: &Ctx) {
    let s = SECTION;
    // Simulated NICs live in the daemon's process: no namespace holds them.
    if ctx.sim_nic {
        return;
    }
    let (views, n) = (&ctx.views, &ctx.netns);
    match n.place {
        Place::Other => r.add(
            s,
            "place",
            Status::Pass,
            format!("a network namespace of its own, not the host's, as a Pod's whose NICs are attached to it ({})", n.why),
            None,
        ),
        Place::Host => r.add(s, "place", Status::Pass, format!("the host's ({})", n.why), None),
        Place::Unknown => {
            r.add(s, "place", Status::Skip, format!("not known: {}; treated as the host's", n.why), None)
        }
    }
    if let Some(topo) = &ctx.topo {
        let names: Vec<&str> = topo.nics.iter().map(|n| n.ifname.as_str()).collect();
        nic_lines(r, views, &names);
    }
    host_view(r, ctx);
    if n.is_other() {
        r.add(
            s,
            "tuning",
            Status::Pass,
            "this namespace's TCP sysctls (net.*) and routes are the daemon's to tune: they are this \
             namespace's, whichever /proc/sys mount they are opened through (/hostprocsysfs too); \
             host-wide knobs (cubic's hystart_detect, any sysctl outside net) are the node's business: \
             a Pod's daemon leaves them alone unless the host's own tree is given to it",
            None,
        );
    }
}

/// The topology's NICs: in this namespace, or only in the host's sysfs.
fn nic_lines(r: &mut Report, views: &SysfsViews, names: &[&str]) {
    let here: Vec<&str> = names.iter().copied().filter(|i| views.in_namespace(i)).collect();
    let elsewhere: Vec<&str> = names
        .iter()
        .copied()
        .filter(|i| !views.in_namespace(i) && views.separate() && !views.fabricated() && views.root_lists(i))
        .collect();
    let list = |v: &[&str]| crate::types::list(v);
    if !elsewhere.is_empty() {
        r.add(
            SECTION,
            "NICs",
            Status::Fail,
            format!(
                "{} not in this network namespace but listed under {} (the host's): the daemon cannot program them from here",
                list(&elsewhere),
                views.root().join("class/net").display()
            ),
            Some(
                "run the daemon in the namespace that holds the NICs: the Pod's, with the NICs attached to it \
                 (GKE multi-networking), or the host's (hostNetwork: true)"
                    .into(),
            ),
        );
    } else if here.len() == names.len() {
        let how: Vec<String> = here.iter().map(|i| format!("{i} ({})", device_words(views, i))).collect();
        r.add(SECTION, "NICs", Status::Pass, format!("in this namespace: {}", how.join(", ")), None);
    } else if !here.is_empty() {
        r.add(
            SECTION,
            "NICs",
            Status::Pass,
            format!("in this namespace: {}; the NIC checks name the rest", list(&here)),
            None,
        );
    }
}

/// Where a NIC's PCI device was found.
fn device_words(views: &SysfsViews, ifname: &str) -> String {
    match views.device(ifname) {
        Ok(Some(d)) => {
            let pci = d.path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            match d.by_address {
                true => format!("PCI {pci}, by address in {}", d.sysfs.display()),
                false => format!("PCI {pci}"),
            }
        }
        Ok(None) => "no PCI device".into(),
        Err(e) => format!("its device link cannot be read: {e}"),
    }
}

/// What the host's sysfs shows, when it is apart from doctor's own `/sys`.
fn host_view(r: &mut Report, ctx: &Ctx) {
    let views = &ctx.views;
    let root = views.root();
    if !views.separate() {
        r.add(
            SECTION,
            "sysfs",
            Status::Pass,
            format!("one sysfs, {}: this namespace's interfaces and the PCI tree", root.display()),
            None,
        );
        return;
    }
    let gpus = super::node::scan(views).map(|sc| sc.gpus().len()).unwrap_or(0);
    let listed = std::fs::read_dir(root.join("class/net"))
        .map(|d| d.flatten().filter_map(|e| e.file_name().into_string().ok()).collect::<Vec<_>>())
        .unwrap_or_default();
    let whose = if views.fabricated() { "a fabricated tree: its interfaces count" } else { "the host's" };
    let mut shown = listed.clone();
    shown.sort_by(|a, b| crate::types::ifname::natural_cmp(a, b));
    let more = shown.len().saturating_sub(8);
    shown.truncate(8);
    let tail = if more > 0 { format!(" and {more} more") } else { String::new() };
    r.add(
        SECTION,
        "host sysfs",
        Status::Pass,
        format!(
            "{} ({whose}): the PCI tree with {gpus} NVIDIA GPU{}; its class/net lists {}{tail}",
            root.display(),
            plural(gpus),
            if shown.is_empty() { "nothing".to_string() } else { shown.join(", ") }
        ),
        None,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    const NIC_FN: &str = "devices/pci0000:00/0000:00:01.0/0000:05:00.0/0000:06:00.0";

    /// A Pod's sysfs holding eth1 (its device only in the host's tree), and
    /// a host's whose class/net lists eth3, left in the host's namespace.
    fn trees() -> (tempfile::TempDir, tempfile::TempDir) {
        let (pod, host) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        fs::create_dir_all(pod.path().join("class/net/eth1")).unwrap();
        symlink(format!("../../../{NIC_FN}"), pod.path().join("class/net/eth1/device")).unwrap();
        fs::create_dir_all(host.path().join(NIC_FN)).unwrap();
        fs::create_dir_all(host.path().join("bus/pci/devices")).unwrap();
        symlink(format!("../../../{NIC_FN}"), host.path().join("bus/pci/devices/0000:06:00.0")).unwrap();
        fs::create_dir_all(host.path().join("class/net/eth3")).unwrap();
        (pod, host)
    }

    #[test]
    fn nics_here_pass_naming_where_each_device_was_found() {
        let (pod, host) = trees();
        let mut r = Report::default();
        nic_lines(&mut r, &SysfsViews::pod(pod.path(), host.path()), &["eth1"]);
        let c = &r.checks[0];
        assert_eq!(c.status, Status::Pass, "{c:?}");
        let root = host.path().canonicalize().unwrap();
        assert_eq!(
            c.found,
            format!("in this namespace: eth1 (PCI 0000:06:00.0, by address in {})", root.display())
        );
    }

    #[test]
    fn a_nic_only_the_host_s_sysfs_lists_fails_saying_where_to_run() {
        let (pod, host) = trees();
        let mut r = Report::default();
        nic_lines(&mut r, &SysfsViews::pod(pod.path(), host.path()), &["eth1", "eth3"]);
        let c = &r.checks[0];
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(c.found.starts_with("eth3 not in this network namespace but listed under "), "{}", c.found);
        assert!(c.fix.as_deref().unwrap().contains("run the daemon in the namespace that holds the NICs"));
    }
}
