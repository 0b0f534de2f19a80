//! The takeover's wire: how a daemon about to take over and the daemon
//! serving talk, over a channel the serving daemon opened to a successor it
//! started itself ([`channel`]) or over the folder's handover socket.
//!
//! Messages in this order, each framed as a 4-byte big-endian length and a
//! `tcpx_rxdm.handover` protobuf:
//! 0. old → new [`Challenge`] (handover socket only): a descriptor of the old
//!    daemon holding a secret, which the new one reads with `pidfd_getfd`
//!    ([`proof`]);
//! 1. new → old [`Hello`]: version, pid, what it would serve, and the secret;
//! 2. old → new [`Offer`]: refused with a reason, or the whole [`State`],
//!    followed by its fds (SCM_RIGHTS, at most [`FDS_PER_MESSAGE`] per
//!    `sendmsg`, each chunk carried by one byte);
//! 3. new → old [`Verdict`]: adopted, or failed with a reason;
//! 4. old → new [`Commit`]: the old daemon will stop for good once answered;
//! 5. new → old [`Serving`]: the new daemon serves already; only now may the
//!    old one go.
//!
//! What each side does around them lives in the daemon (`daemon::takeover`);
//! this module is only the transport, the proof, the inherited channel, the
//! fd list and the peer's process ([`peer`]). It may use `wire` and the
//! layers below.

pub mod channel;
pub mod fds;
pub mod peer;
pub mod proof;

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use prost::Message;

pub use crate::wire::handover::{offer, verdict, Challenge, Commit, Hello, Offer, Serving, State, Verdict};
pub use fds::{FdList, FdSet, FDS_PER_MESSAGE};
pub use peer::Process;

/// The protocol version both daemons must speak (2: the commit is answered;
/// 3: a successor on the handover socket proves itself first, and answers
/// the commit once it serves; 4: the NICs', the host's and the simulated
/// NICs' undo logs are messages of their own, no longer JSON).
pub const VERSION: u32 = 4;
/// The refusal of a peer that speaks another [`VERSION`] (the words of
/// version 3 too, so that a successor can tell it from other refusals).
pub const OTHER_PROTOCOL: &str = "the running daemon speaks another version of the takeover protocol";
/// The handover socket's name in the socket folder (owner only).
pub const SOCKET: &str = ".rxdm-handover";
/// The whole answer to a peer on the handover socket that did not prove it
/// may take the daemon's descriptors: the same words whatever it sent.
pub const UNPROVEN: &str = "not allowed to take over: run the new daemon as the running daemon's user \
     with its capabilities, or with CAP_SYS_PTRACE, where it can see the running daemon's process";
/// The largest hello accepted before the peer has proved itself (a real one,
/// topology and all, is a few KiB).
pub const MAX_HELLO: usize = 64 << 10;
/// The largest message accepted (a State with 100 000 rules per NIC on
/// eight NICs is about 40 MiB).
pub const MAX_MESSAGE: usize = 256 << 20;

/// A failure of the handover itself: where, and why.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{what}: malformed message: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    #[error("{0}")]
    Protocol(String),
    #[error("the running daemon refused: {0}")]
    Refused(String),
}

impl HandoverError {
    /// Whether the other daemon answered with a refusal (it serves on).
    pub fn is_refusal(&self) -> bool {
        matches!(self, HandoverError::Refused(_))
    }
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> HandoverError {
    move |source| HandoverError::Io { what, source }
}

/// Sets both timeouts of the connection.
pub fn set_timeouts(s: &UnixStream, t: Duration) -> Result<(), HandoverError> {
    s.set_read_timeout(Some(t)).map_err(io_err("setting a timeout"))?;
    s.set_write_timeout(Some(t)).map_err(io_err("setting a timeout"))
}

/// Writes one framed message.
pub fn send<M: Message>(s: &mut UnixStream, what: &'static str, m: &M) -> Result<(), HandoverError> {
    let body = m.encode_to_vec();
    s.write_all(&(body.len() as u32).to_be_bytes()).map_err(io_err(what))?;
    s.write_all(&body).map_err(io_err(what))
}

/// Reads one framed message.
pub fn recv<M: Message + Default>(s: &mut UnixStream, what: &'static str) -> Result<M, HandoverError> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).map_err(io_err(what))?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(HandoverError::Protocol(format!("{what}: a message of {len} bytes is over the limit")));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).map_err(io_err(what))?;
    // From `Bytes`, the large fields are slices of this buffer, not copies.
    M::decode(prost::bytes::Bytes::from(body)).map_err(|source| HandoverError::Decode { what, source })
}

/// The uid of the process at the other end (`SO_PEERCRED`).
pub fn peer_uid(s: &UnixStream) -> Result<u32, HandoverError> {
    let cred = nix::sys::socket::getsockopt(&s.as_fd(), nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| HandoverError::Io { what: "reading the peer's credentials", source: e.into() })?;
    Ok(cred.uid())
}

/// The pid of the process at the other end, as this daemon sees it.
pub fn peer_pid(s: &UnixStream) -> Option<u32> {
    let cred = nix::sys::socket::getsockopt(&s.as_fd(), nix::sys::socket::sockopt::PeerCredentials).ok()?;
    u32::try_from(cred.pid()).ok().filter(|&p| p > 0)
}

/// Where two daemons' fingerprints first differ: the key and each side's
/// value. Its `Display` shows both values, for this daemon's log only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    pub key: String,
    pub ours: Option<String>,
    pub theirs: Option<String>,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: &Option<String>| {
            v.as_ref().map_or("(none)".to_string(), |v| format!("\"{}\"", v.escape_debug()))
        };
        write!(
            f,
            "{} differs: this daemon has {}, the other {}",
            self.key,
            show(&self.ours),
            show(&self.theirs)
        )
    }
}

/// The first difference between two daemons' fingerprints.
pub fn fingerprint_differs(
    ours: &std::collections::HashMap<String, String>,
    theirs: &std::collections::HashMap<String, String>,
) -> Option<Difference> {
    let mut keys: Vec<&String> = ours.keys().chain(theirs.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter().find_map(|k| {
        let (a, b) = (ours.get(k), theirs.get(k));
        (a != b).then(|| Difference { key: k.clone(), ours: a.cloned(), theirs: b.cloned() })
    })
}

/// Sends `state` and the fds it names.
pub fn send_state(s: &mut UnixStream, state: State, fds: &FdList) -> Result<(), HandoverError> {
    send(s, "sending the state", &Offer { answer: Some(offer::Answer::State(Box::new(state))) })?;
    fds::send_fds(s, fds.fds())
}

/// Reads the offer; a state comes with exactly the fds it counts.
pub fn recv_offer(s: &mut UnixStream) -> Result<(State, Vec<OwnedFd>), HandoverError> {
    let offer: Offer = recv(s, "reading the offer")?;
    match offer.answer {
        Some(offer::Answer::State(st)) => {
            let fds = fds::recv_fds(s, st.fd_count as usize)?;
            Ok((*st, fds))
        }
        Some(offer::Answer::Refused(why)) => Err(HandoverError::Refused(why)),
        None => Err(HandoverError::Protocol("an empty offer".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn messages_and_fds_cross_and_bad_frames_are_refused() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        set_timeouts(&b, Duration::from_secs(5)).unwrap();
        let hello = Hello {
            version: VERSION,
            pid: 42,
            fingerprint: HashMap::from([("a".into(), "1".into())]),
            proof: vec![7; 32],
        };
        send(&mut a, "hello", &hello).unwrap();
        assert_eq!(recv::<Hello>(&mut b, "hello").unwrap(), hello);
        // More fds than one message may carry (two chunks), with their order kept;
        // few enough for a 1024-descriptor limit shared with other tests.
        use std::os::unix::fs::MetadataExt;
        const N: u32 = FDS_PER_MESSAGE as u32 + 10;
        let files: Vec<_> = (0..N).map(|_| tempfile::tempfile().unwrap()).collect();
        let inodes: Vec<u64> = files.iter().map(|f| f.metadata().unwrap().ino()).collect();
        let mut list = FdList::default();
        let idx: Vec<u32> = files.into_iter().map(|f| list.push_owned(f.into())).collect();
        assert_eq!(idx, (0..N).collect::<Vec<u32>>());
        let state = State { version: VERSION, pid: 7, fd_count: list.len(), ..State::default() };
        let sender = std::thread::spawn(move || send_state(&mut a, state, &list).map(|()| a));
        let (st, fds) = recv_offer(&mut b).unwrap();
        let mut a = sender.join().unwrap().unwrap();
        assert_eq!((st.pid, fds.len()), (7, N as usize));
        for (ino, got) in inodes.iter().zip(fds) {
            assert_eq!(*ino, std::fs::File::from(got).metadata().unwrap().ino());
        }
        // A refusal reads as an error naming the reason; a huge length is refused.
        send(&mut a, "offer", &Offer { answer: Some(offer::Answer::Refused("busy".into())) }).unwrap();
        assert!(recv_offer(&mut b).unwrap_err().to_string().contains("refused: busy"));
        a.write_all(&u32::MAX.to_be_bytes()).unwrap();
        assert!(recv::<Hello>(&mut b, "hello").unwrap_err().to_string().contains("over the limit"));
    }

    #[test]
    fn fingerprints_name_their_first_difference() {
        let m = |v: &[(&str, &str)]| {
            v.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>()
        };
        assert_eq!(fingerprint_differs(&m(&[("a", "1")]), &m(&[("a", "1")])), None);
        let d = fingerprint_differs(&m(&[("a", "1"), ("b", "2")]), &m(&[("a", "1"), ("b", "3")])).unwrap();
        assert_eq!(d.key, "b");
        assert_eq!(d.to_string(), "b differs: this daemon has \"2\", the other \"3\"");
        let d = fingerprint_differs(&m(&[("a", "1")]), &m(&[("a", "1"), ("c", "x")])).unwrap();
        assert_eq!((d.ours, d.theirs.as_deref()), (None, Some("x")));
    }

    #[test]
    fn the_peer_is_named_by_its_credentials() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert_eq!(peer_pid(&a), Some(std::process::id()));
        assert_eq!(peer_uid(&a).unwrap(), nix::unistd::geteuid().as_raw());
    }
}
