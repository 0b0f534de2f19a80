//! Who may read every tenant's flows, pids and cgroups: the node's
//! operator, as the kernel vouches for a peer, never by uid (a workload may
//! run as root) or by the path it reached the daemon through.
//!
//! An operator is a process in the daemon's own user namespace that holds
//! every capability the daemon holds (at least `CAP_NET_ADMIN` for a daemon
//! on real NICs): root on the node (`sudo tcpx-rxdm status`), a shell in the
//! daemon's own container (`kubectl exec`), a unit with those capabilities.
//! A workload, root or not, runs without them. A daemon that holds none (a
//! user's own, on simulated NICs) has its user's processes as operators:
//! they alone reach its status socket (mode 0600). The peer is held by its
//! pidfd while its capabilities and user namespace are read through its
//! pid, and counts only if the pidfd still names an unreaped process
//! afterwards (the pid was still its).

use std::os::fd::BorrowedFd;

use crate::caps::Held;
use crate::pidfd::{PidNow, Pidfd};

/// What a peer of the status socket may see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Viewer {
    /// Everything: every tenant's flows, pids and cgroups.
    Operator,
    /// What names no tenant: counts, readiness, the daemon's own pid.
    Workload,
}

impl Viewer {
    /// Who the process at the other end of the Unix socket `sock` is.
    pub fn of_peer(sock: BorrowedFd<'_>) -> Viewer {
        match Pidfd::of_peer(sock) {
            Ok(pidfd) => Viewer::of_process(&pidfd),
            Err(_) => Viewer::Workload,
        }
    }

    /// Who the process behind `pidfd` is.
    pub fn of_process(pidfd: &Pidfd) -> Viewer {
        let Ok(PidNow::Visible(pid)) = pidfd.pid_now() else { return Viewer::Workload };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok();
        let held = status.as_deref().and_then(Held::parse);
        let same_userns = same_user_namespace(pid.get());
        // Read through the pid: it counts only if the pid was still this process's.
        if !pidfd.unreaped() {
            return Viewer::Workload;
        }
        match (held, Held::this_thread(), same_userns) {
            (Some(peer), Some(daemon), true) if is_operator(&peer, &daemon) => Viewer::Operator,
            _ => Viewer::Workload,
        }
    }
}

/// Whether a peer holding `peer` (in the daemon's user namespace) is an
/// operator of a daemon holding `daemon`: it can do all the daemon can.
pub fn is_operator(peer: &Held, daemon: &Held) -> bool {
    let (p, d) = (peer.effective.0, daemon.effective.0);
    p & d == d
}

/// Whether process `pid` lives in this process's user namespace (where
/// its capabilities are what they say).
fn same_user_namespace(pid: u32) -> bool {
    let inode = |path: &str| std::fs::metadata(path).ok().map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    match (inode(&format!("/proc/{pid}/ns/user")), inode("/proc/self/ns/user")) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn held(effective: &str) -> Held {
        Held::parse(&format!("CapEff:\t{effective}\nCapBnd:\t000001ffffffffff\n")).unwrap()
    }

    #[test]
    fn an_operator_holds_every_capability_the_daemon_holds() {
        // A node-wide daemon: CAP_CHOWN, CAP_DAC_READ_SEARCH, CAP_NET_ADMIN, CAP_SYS_PTRACE.
        let node_wide = held("0000000000081005");
        assert!(is_operator(&held("000001ffffffffff"), &node_wide), "root on the node");
        assert!(is_operator(&node_wide, &node_wide), "a shell in the daemon's container");
        assert!(!is_operator(&held("0000000000000000"), &node_wide), "root without capabilities");
        assert!(!is_operator(&held("0000000000001000"), &node_wide), "CAP_NET_ADMIN alone");
        // A daemon per Pod holds CAP_NET_ADMIN only; a workload beside it none.
        let per_pod = held("0000000000001000");
        assert!(is_operator(&held("0000000000001000"), &per_pod));
        assert!(!is_operator(&held("00000000a80425fb"), &per_pod), "Docker's default set lacks it");
        // A user's own daemon on simulated NICs holds none: its user is its operator.
        assert!(is_operator(&held("0000000000000000"), &held("0000000000000000")));
    }

    #[test]
    fn this_process_is_seen_as_what_its_capabilities_make_it() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        // Itself, as its own peer: it holds what it holds.
        assert_eq!(Viewer::of_peer(a.as_fd()), Viewer::Operator);
    }

    #[test]
    fn a_reaped_process_is_no_operator() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pidfd = Pidfd::open(child.id()).unwrap();
        child.wait().unwrap();
        assert_eq!(Viewer::of_process(&pidfd), Viewer::Workload);
    }
}
