//! Which network namespace the daemon runs in: the host's (the initial
//! one), or another (a Pod's, as GKE multi-networking gives each Pod its GPU
//! NICs), as far as a process can tell without privileges it lacks.
//!
//! What is read, first answer wins:
//!
//! 1. Its own namespace's inode: kernels that number the initial network
//!    namespace with a fixed inode (`0xEFFFFFF9`, as they always have the
//!    initial pid and user namespaces) say "the host's" at once. Another
//!    number proves nothing on kernels that number it like any other.
//! 2. The sysctls it sees: `/proc/sys/net` shows the namespace of the
//!    process that opens it, and `net.core.netdev_max_backlog` is one of
//!    the initial namespace's alone; seen next to `net.core.somaxconn`
//!    (every namespace's), its presence or absence tells.
//! 3. pid 1's namespace, where pid 1 is the host's init (the daemon runs in
//!    the initial pid namespace) and the kernel lets it be read (it takes
//!    the right to inspect pid 1, which a daemon with only `CAP_NET_ADMIN`
//!    lacks).
//! 4. The two sysfs mounts: sysfs keeps one superblock per network
//!    namespace, so the host's sysfs (`/hostsysfs`) and the daemon's own
//!    `/sys` are the same device when both were mounted in one namespace,
//!    and two devices when not.
//!
//! Failing all four, the caller may add what it knows of the NICs
//! (`config::views`); the place stays unknown otherwise, and is treated as
//! the host's.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The initial network namespace's inode, where the kernel fixes it.
pub const INIT_NET_INO: u64 = 0xEFFF_FFF9;
/// The initial pid namespace's inode (fixed since Linux 3.8).
pub const INIT_PID_INO: u64 = 0xEFFF_FFFC;
/// A sysctl of the initial network namespace alone, and one of every namespace.
const INIT_ONLY_SYSCTL: &str = "netdev_max_backlog";
const EVERY_NS_SYSCTL: &str = "somaxconn";

/// Where the daemon's network namespace is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The host's (initial) network namespace.
    Host,
    /// Another one, such as a Pod's.
    Other,
    /// Not known: treated as the host's.
    Unknown,
}

/// A place and the reason, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Netns {
    pub place: Place,
    pub why: String,
}

impl Netns {
    pub fn new(place: Place, why: impl Into<String>) -> Netns {
        Netns { place, why: why.into() }
    }

    /// Whether the daemon runs in a network namespace other than the host's.
    pub fn is_other(&self) -> bool {
        self.place == Place::Other
    }
}

/// What [`detect`] reads: inodes of namespaces, devices of sysfs mounts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// This process's network and pid namespaces' inodes.
    pub own_net: Option<u64>,
    pub own_pid: Option<u64>,
    /// Whether the initial namespace's own sysctl is there, where the
    /// namespace's sysctls can be listed at all.
    pub init_only_sysctl: Option<bool>,
    /// pid 1's network namespace's inode, where the kernel lets it be read.
    pub init_net: Option<u64>,
    /// The devices of the daemon's own sysfs and the host's, where both are
    /// sysfs mounts at two paths, with the paths as they are named.
    pub sysfs: Option<(u64, u64, String, String)>,
}

/// Detects the place through `proc` (`/proc`), the daemon's own sysfs and
/// the host's (`host_sysfs`; the same path when none is mounted apart).
pub fn detect(proc: &Path, own_sysfs: &Path, host_sysfs: &Path) -> Netns {
    let ino = |p: &Path| std::fs::metadata(p).map(|m| m.ino()).ok();
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok().filter(|_| is_sysfs(p));
    let sysfs = match own_sysfs != host_sysfs {
        true => dev(own_sysfs).zip(dev(host_sysfs)),
        false => None,
    };
    let core = proc.join("sys/net/core");
    let init_only_sysctl = core.join(EVERY_NS_SYSCTL).exists().then(|| core.join(INIT_ONLY_SYSCTL).exists());
    judge(&Seen {
        own_net: ino(&proc.join("thread-self/ns/net")),
        own_pid: ino(&proc.join("thread-self/ns/pid")),
        init_only_sysctl,
        init_net: ino(&proc.join("1/ns/net")),
        sysfs: sysfs.map(|(o, h)| (o, h, own_sysfs.display().to_string(), host_sysfs.display().to_string())),
    })
}

/// The place from what was seen (module docs, in order).
pub fn judge(seen: &Seen) -> Netns {
    if seen.own_net == Some(INIT_NET_INO) {
        return Netns::new(Place::Host, "this process is in the initial network namespace");
    }
    match seen.init_only_sysctl {
        Some(true) => {
            return Netns::new(
                Place::Host,
                "net.core.netdev_max_backlog, the initial network namespace's alone, is here",
            )
        }
        Some(false) => {
            return Netns::new(
                Place::Other,
                "net.core.netdev_max_backlog, the initial network namespace's alone, is not here",
            )
        }
        None => {}
    }
    if seen.own_pid == Some(INIT_PID_INO) {
        if let (Some(own), Some(init)) = (seen.own_net, seen.init_net) {
            return match own == init {
                true => Netns::new(Place::Host, "this process shares the host init's network namespace"),
                false => Netns::new(Place::Other, "the host's init (pid 1) is in another network namespace"),
            };
        }
    }
    if let Some((own, host, own_path, host_path)) = &seen.sysfs {
        return match own == host {
            true => Netns::new(
                Place::Host,
                format!("{host_path} and {own_path} are one sysfs: one network namespace"),
            ),
            false => Netns::new(
                Place::Other,
                format!(
                    "{host_path} was mounted in another network namespace than this process's {own_path}"
                ),
            ),
        };
    }
    Netns::new(Place::Unknown, "nothing this process may read tells which network namespace it is in")
}

fn is_sysfs(p: &Path) -> bool {
    nix::sys::statfs::statfs(p).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::SYSFS_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOME_NS: u64 = 0xF000_0123;

    #[test]
    fn the_fixed_inode_says_host_at_once() {
        let n = judge(&Seen { own_net: Some(INIT_NET_INO), ..Default::default() });
        assert_eq!(n.place, Place::Host, "{}", n.why);
    }

    #[test]
    fn the_initial_namespace_s_own_sysctl_tells_before_pid_1() {
        let seen = Seen { own_net: Some(SOME_NS), init_only_sysctl: Some(false), ..Default::default() };
        let n = judge(&seen);
        assert_eq!(n.place, Place::Other);
        assert!(n.why.contains("netdev_max_backlog") && n.why.ends_with("is not here"), "{}", n.why);
        let n = judge(&Seen {
            init_only_sysctl: Some(true),
            own_pid: Some(INIT_PID_INO),
            init_net: Some(1),
            ..seen
        });
        assert_eq!(n.place, Place::Host, "{}", n.why);
    }

    #[test]
    fn pid_1_counts_only_in_the_initial_pid_namespace() {
        let seen = Seen {
            own_net: Some(SOME_NS),
            own_pid: Some(INIT_PID_INO),
            init_net: Some(SOME_NS + 1),
            ..Default::default()
        };
        let n = judge(&seen);
        assert_eq!(n.place, Place::Other, "{}", n.why);
        assert!(n.why.contains("pid 1"), "{}", n.why);
        assert_eq!(judge(&Seen { init_net: Some(SOME_NS), ..seen.clone() }).place, Place::Host);
        // A container's pid 1 is its own init: it says nothing of the host.
        assert_eq!(judge(&Seen { own_pid: Some(SOME_NS + 7), ..seen.clone() }).place, Place::Unknown);
        // Not allowed to read pid 1's (a daemon with only CAP_NET_ADMIN).
        assert_eq!(judge(&Seen { init_net: None, ..seen }).place, Place::Unknown);
    }

    #[test]
    fn two_sysfs_mounts_of_two_devices_are_two_namespaces() {
        let two = Seen {
            own_net: Some(SOME_NS),
            sysfs: Some((21, 22, "/sys".into(), "/hostsysfs".into())),
            ..Default::default()
        };
        let n = judge(&two);
        assert_eq!(n.place, Place::Other);
        assert_eq!(n.why, "/hostsysfs was mounted in another network namespace than this process's /sys");
        let one = Seen { sysfs: Some((21, 21, "/sys".into(), "/hostsysfs".into())), ..two };
        assert_eq!(judge(&one).place, Place::Host);
        assert_eq!(judge(&Seen { own_net: Some(SOME_NS), ..Default::default() }).place, Place::Unknown);
    }

    #[test]
    fn this_process_is_placed_by_what_it_reads() {
        // Two plain folders are no sysfs mounts: nothing to compare there.
        let d = tempfile::tempdir().unwrap();
        let n = detect(Path::new("/proc"), d.path(), &d.path().join("x"));
        let own = std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino();
        let core = Path::new("/proc/sys/net/core");
        let want = judge(&Seen {
            own_net: Some(own),
            own_pid: std::fs::metadata("/proc/thread-self/ns/pid").ok().map(|m| m.ino()),
            init_only_sysctl: core
                .join("somaxconn")
                .exists()
                .then(|| core.join("netdev_max_backlog").exists()),
            init_net: std::fs::metadata("/proc/1/ns/net").ok().map(|m| m.ino()),
            sysfs: None,
        });
        assert_eq!(n, want);
        // Whichever way it was told, a namespace of this test's own is not the host's.
        if n.place == Place::Host && core.join("somaxconn").exists() {
            let other = std::thread::scope(|s| {
                s.spawn(|| {
                    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
                    Some(detect(Path::new("/proc"), d.path(), &d.path().join("x")))
                })
                .join()
                .unwrap()
            });
            // Only root may make one: without, nothing to compare.
            if let Some(other) = other {
                assert_eq!(other.place, Place::Other, "{}", other.why);
            }
        }
    }
}
