//! Claiming NICs for the daemon's lifetime, so that two daemons never manage
//! the same interface (they would prime it twice and flush each other's rules).
//!
//! A claim is a listening Unix socket in the *abstract* namespace named after
//! the interface: `@tcpx-rxdm/nic/<ifname>`. Abstract names belong to the
//! network namespace, exactly like interface names, so every daemon that can
//! see the NIC sees the claim, whatever its `--uds_path`; there is no file to
//! delete, and the kernel drops the name when the holder exits, however it
//! exits. A second daemon's `bind` fails with `EADDRINUSE`; it then connects
//! to the name and reads the holder's pid from the peer credentials (a
//! listening socket's credentials are those of the process that listened).
//!
//! Simulated NICs (named like real ones, `eth1`...) are claimed under
//! `@tcpx-rxdm/sim/<ifname>` and only when asked (`--claim_sim_nics`): they
//! are not hardware, so simulated daemons never block a real one, and several
//! simulated daemons may run side by side unless the claim itself is tested.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use nix::errno::Errno;
use nix::sys::socket::{
    accept, bind, connect, getsockopt, listen, shutdown, socket, sockopt, AddressFamily, Backlog, Shutdown,
    SockFlag, SockType, UnixAddr,
};

use super::NicCapabilities;

/// Prefix of every claim name.
pub const CLAIM_PREFIX: &str = "tcpx-rxdm";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClaimError {
    #[error("NIC {ifname} is already managed by another tcpx-rxdm ({holder}); refusing to manage it too")]
    Held { ifname: String, holder: String },
    #[error("claiming NIC {ifname}: {err}")]
    Os {
        ifname: String,
        #[source]
        err: Errno,
    },
}

/// One claimed NIC; the claim lasts as long as this value.
#[derive(Debug)]
pub struct NicClaim {
    pub ifname: String,
    socket: Arc<OwnedFd>,
    /// Accepts and drops the probes of would-be second daemons.
    reaper: Option<JoinHandle<()>>,
}

impl Drop for NicClaim {
    fn drop(&mut self) {
        // Wakes the reaper's accept with an error; once it has returned its
        // reference, the socket closes here and the name is free again.
        let _ = shutdown(self.socket.as_raw_fd(), Shutdown::Both);
        if let Some(r) = self.reaper.take() {
            let _ = r.join();
        }
    }
}

/// The abstract socket name for `ifname` (without the leading NUL).
pub fn claim_name(kind: &str, ifname: &str) -> String {
    format!("{CLAIM_PREFIX}/{kind}/{ifname}")
}

impl NicClaim {
    /// Claims `ifname` under `@tcpx-rxdm/<kind>/<ifname>` in the current network namespace.
    pub fn acquire(kind: &str, ifname: &str) -> Result<NicClaim, ClaimError> {
        let os = |err| ClaimError::Os { ifname: ifname.to_string(), err };
        let name = claim_name(kind, ifname);
        let addr = UnixAddr::new_abstract(name.as_bytes()).map_err(os)?;
        let sock = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).map_err(os)?;
        match bind(sock.as_raw_fd(), &addr) {
            Ok(()) => {}
            Err(Errno::EADDRINUSE) => {
                return Err(ClaimError::Held { ifname: ifname.to_string(), holder: describe_holder(&addr) });
            }
            Err(e) => return Err(os(e)),
        }
        // Listening makes the holder's pid readable by a second daemon; a small
        // thread accepts and drops those probes, so the backlog never fills.
        listen(&sock, Backlog::new(16).expect("small backlog is valid")).map_err(os)?;
        NicClaim::hold(ifname, sock)
    }

    /// Holds a claim taken over from the daemon this one replaced (its
    /// bound, listening socket).
    pub fn adopt(ifname: &str, socket: OwnedFd) -> Result<NicClaim, ClaimError> {
        NicClaim::hold(ifname, socket)
    }

    /// The claim's socket, for a takeover.
    pub fn socket(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.socket.as_fd()
    }

    /// Keeps `sock` and answers probes of who holds it.
    fn hold(ifname: &str, sock: OwnedFd) -> Result<NicClaim, ClaimError> {
        let os = |err| ClaimError::Os { ifname: ifname.to_string(), err };
        let socket = Arc::new(sock);
        let fd = socket.clone();
        let reaper = std::thread::Builder::new()
            .name(format!("claim-{ifname}"))
            .spawn(move || {
                while let Ok(conn) = accept(fd.as_raw_fd()) {
                    let _ = nix::unistd::close(conn);
                }
            })
            .map_err(|e| os(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EAGAIN))))?;
        Ok(NicClaim { ifname: ifname.to_string(), socket, reaper: Some(reaper) })
    }
}

/// "pid N" of the process holding `addr`, as well as can be told.
fn describe_holder(addr: &UnixAddr) -> String {
    let probe = || -> Result<i32, Errno> {
        let s = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )?;
        connect(s.as_raw_fd(), addr)?;
        Ok(getsockopt(&s, sockopt::PeerCredentials)?.pid())
    };
    // A full backlog (EAGAIN) empties as the holder's reaper catches up.
    let mut result = probe();
    for _ in 0..50 {
        if result != Err(Errno::EAGAIN) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        result = probe();
    }
    match result {
        // 0: the holder lives in a pid namespace this process cannot see.
        Ok(0) => "pid not visible from this pid namespace".into(),
        Ok(pid) => format!("pid {pid}"),
        Err(e) => format!("pid unknown: {e}"),
    }
}

/// Claims every NIC in `ifnames`, all or none (a failure releases those
/// already claimed). `kind` is `nic` for real NICs and `sim` for simulated ones.
pub fn claim_all<'a>(
    kind: &str,
    ifnames: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<NicClaim>, ClaimError> {
    ifnames.into_iter().map(|n| NicClaim::acquire(kind, n)).collect()
}

/// The daemon's claims for `ifnames` on a NIC backend that can do `nic`:
/// real NICs always, simulated ones only with `claim_sim`. Empty when
/// nothing is claimed.
pub fn claim_managed<'a>(
    nic: NicCapabilities,
    claim_sim: bool,
    ifnames: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<NicClaim>, ClaimError> {
    match (nic.simulated, claim_sim) {
        (true, false) => Ok(Vec::new()),
        (true, true) => claim_all("sim", ifnames),
        (false, _) => claim_all("nic", ifnames),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name unique to this test run, so parallel runs never meet.
    fn unique(tag: &str) -> String {
        format!("test-{}-{tag}", std::process::id())
    }

    #[test]
    fn second_claim_fails_naming_the_nic_and_our_pid_and_release_frees_it() {
        let nic = unique("a");
        let first = NicClaim::acquire("nic", &nic).unwrap();
        let err = NicClaim::acquire("nic", &nic).unwrap_err();
        assert_eq!(
            err,
            ClaimError::Held { ifname: nic.clone(), holder: format!("pid {}", std::process::id()) }
        );
        assert!(err.to_string().contains(&nic), "{err}");
        drop(first);
        NicClaim::acquire("nic", &nic).expect("free again once released");
    }

    #[test]
    fn kinds_do_not_collide() {
        let nic = unique("b");
        let _real = NicClaim::acquire("nic", &nic).unwrap();
        let _sim = NicClaim::acquire("sim", &nic).expect("a simulated NIC never blocks a real one");
    }

    #[test]
    fn claim_all_is_all_or_none() {
        let (a, b) = (unique("c1"), unique("c2"));
        let held = NicClaim::acquire("nic", &b).unwrap();
        let err = claim_all("nic", [a.as_str(), b.as_str()]).unwrap_err();
        assert!(matches!(err, ClaimError::Held { ref ifname, .. } if *ifname == b), "{err}");
        // `a` was released when the whole claim failed.
        drop(NicClaim::acquire("nic", &a).expect("a released"));
        drop(held);
        let both = claim_all("nic", [a.as_str(), b.as_str()]).unwrap();
        assert_eq!(both.len(), 2);
    }

    #[test]
    fn managed_claims_follow_the_backend_capabilities() {
        let nic = unique("e");
        assert!(claim_managed(NicCapabilities::SIMULATED, false, [nic.as_str()]).unwrap().is_empty());
        let sim = claim_managed(NicCapabilities::SIMULATED, true, [nic.as_str()]).unwrap();
        assert!(matches!(NicClaim::acquire("sim", &nic), Err(ClaimError::Held { .. })), "claimed as sim");
        let real = claim_managed(NicCapabilities::HARDWARE, false, [nic.as_str()]).unwrap();
        assert!(matches!(NicClaim::acquire("nic", &nic), Err(ClaimError::Held { .. })), "claimed as nic");
        assert_eq!((sim.len(), real.len()), (1, 1));
    }

    #[test]
    fn many_probes_still_name_the_holder() {
        // More probes than the backlog holds: each still reads the holder's pid.
        let nic = unique("d");
        let _held = NicClaim::acquire("nic", &nic).unwrap();
        let want = ClaimError::Held { ifname: nic.clone(), holder: format!("pid {}", std::process::id()) };
        for _ in 0..100 {
            assert_eq!(NicClaim::acquire("nic", &nic).unwrap_err(), want);
        }
    }
}
