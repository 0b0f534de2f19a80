//! Link monitor: an rtnetlink multicast listener on its own
//! thread that turns kernel link and address notifications into
//! [`NicEvent`]s for the daemon. It blocks in `poll` on the netlink socket and
//! a stop eventfd; nothing is polled on a timer.
//!
//! - managed NIC administratively down, or its operstate leaving UP → `LinkDown`
//! - managed NIC deleted or renamed → `Removed`
//! - on every link message of a managed NIC, the `reset_cnt` stat is re-read;
//!   an increase → `Reset` (VF reset)
//! - any address added or removed on any interface → `AddressesChanged`

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::thread::JoinHandle;

use neli::consts::socket::NlFamily;
use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::sync::mpsc::UnboundedSender;
use tracing::{debug, error, info, warn};

use super::{NicError, NicEvent, NicInfo, STAT_RESET_CNT};
use crate::netlink::rtnl::{self, LinkMsg, IF_OPER_UP};
use crate::netlink::{NlConn, NlError};

#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    #[error("opening the rtnetlink monitor socket: {0}")]
    Socket(#[source] NlError),
    #[error("reading the initial link state: {0}")]
    InitialState(#[source] NlError),
    #[error("creating the monitor's stop eventfd: {0}")]
    EventFd(#[source] Errno),
    #[error("monitored interface: {0}")]
    Nic(#[source] NicError),
    #[error("spawning the monitor thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// Stops the monitor thread when dropped (or on [`MonitorHandle::stop`]).
#[derive(Debug)]
pub struct MonitorHandle {
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
}

impl MonitorHandle {
    /// Wakes the thread and waits for it to end. Idempotent.
    pub fn stop(&mut self) {
        if let Some(t) = self.thread.take() {
            if let Err(e) = self.stop.write(1) {
                error!(?e, "cannot signal the link monitor to stop");
                return;
            }
            if t.join().is_err() {
                error!("link monitor thread panicked");
            }
        }
    }
}

impl Drop for MonitorHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the monitor knows about one managed NIC.
#[derive(Debug, Clone)]
struct Managed {
    name: String,
    admin_up: bool,
    oper_up: bool,
    reset_cnt: Option<u64>,
    gone: bool,
}

/// The monitor's state machine, apart from the socket so tests can feed it.
pub(crate) struct MonitorState<N: ?Sized> {
    by_index: HashMap<u32, Managed>,
    nic: Arc<N>,
}

fn oper_up(link: &LinkMsg) -> bool {
    // Drivers that do not report operstate (IF_OPER_UNKNOWN = 0) count as up.
    matches!(link.operstate, None | Some(0) | Some(IF_OPER_UP))
}

impl<N: NicInfo + ?Sized> MonitorState<N> {
    /// Resolves each managed NIC's index and reads its starting state.
    pub(crate) fn new(ifnames: &[String], nic: Arc<N>, links: &[LinkMsg]) -> Result<Self, NicError> {
        let mut by_index = HashMap::new();
        for name in ifnames {
            let index = nic.ifindex(name)?;
            let link = links.iter().find(|l| l.index == index);
            let reset_cnt = match nic.stat(name, STAT_RESET_CNT) {
                Ok(v) => v,
                Err(e) => {
                    warn!(ifname = %name, error = %e, "cannot read reset_cnt; VF resets will not be detected");
                    None
                }
            };
            let (admin_up, oper) = link.map(|l| (l.admin_up(), oper_up(l))).unwrap_or((true, true));
            if !admin_up || !oper {
                warn!(ifname = %name, admin_up, oper_up = oper, "monitored NIC is not up at start");
            }
            by_index.insert(
                index,
                Managed { name: name.clone(), admin_up, oper_up: oper, reset_cnt, gone: false },
            );
        }
        Ok(MonitorState { by_index, nic })
    }

    /// The events one kernel message means.
    pub(crate) fn on_message(&mut self, nl_type: u16, payload: &[u8]) -> Vec<NicEvent> {
        match nl_type {
            rtnl::RTM_NEWADDR | rtnl::RTM_DELADDR => vec![NicEvent::AddressesChanged],
            rtnl::RTM_NEWLINK | rtnl::RTM_DELLINK => match rtnl::parse_link(payload) {
                Ok(link) => self.on_link(nl_type == rtnl::RTM_DELLINK, &link),
                Err(e) => {
                    warn!(error = %e, "unparsable link notification");
                    Vec::new()
                }
            },
            _ => Vec::new(),
        }
    }

    fn on_link(&mut self, deleted: bool, link: &LinkMsg) -> Vec<NicEvent> {
        let Some(m) = self.by_index.get_mut(&link.index) else {
            return Vec::new();
        };
        if m.gone {
            return Vec::new();
        }
        let renamed = link.name.as_deref().is_some_and(|n| n != m.name);
        if deleted || renamed {
            m.gone = true;
            info!(ifname = %m.name, deleted, renamed_to = link.name.as_deref(), "managed NIC removed");
            return vec![NicEvent::Removed(m.name.clone())];
        }
        let mut events = Vec::new();
        let (admin, oper) = (link.admin_up(), oper_up(link));
        if (m.admin_up && !admin) || (m.oper_up && !oper) {
            info!(ifname = %m.name, admin_up = admin, operstate = link.operstate, "managed NIC link down");
            events.push(NicEvent::LinkDown(m.name.clone()));
        }
        m.admin_up = admin;
        m.oper_up = oper;
        if let Some(before) = m.reset_cnt {
            match self.nic.stat(&m.name, STAT_RESET_CNT) {
                Ok(Some(after)) if after > before => {
                    info!(ifname = %m.name, before, after, "NIC reset counter increased");
                    m.reset_cnt = Some(after);
                    events.push(NicEvent::Reset { ifname: m.name.clone(), before, after });
                }
                Ok(_) => {}
                Err(e) => debug!(ifname = %m.name, error = %e, "cannot re-read reset_cnt"),
            }
        }
        events
    }
}

fn dump_links() -> Result<Vec<LinkMsg>, NlError> {
    let mut conn = NlConn::open(NlFamily::Route)?;
    conn.transact(&rtnl::getlink_dump())?.iter().map(|p| rtnl::parse_link(p)).collect()
}

/// Starts the monitor for `ifnames` on its own thread, in the calling
/// thread's network namespace. Events go to `events` until the handle is
/// stopped or dropped, or the receiver goes away.
pub fn spawn_link_monitor<N: NicInfo + Send + Sync + ?Sized + 'static>(
    ifnames: Vec<String>,
    nic: Arc<N>,
    events: UnboundedSender<NicEvent>,
) -> Result<MonitorHandle, MonitorError> {
    // Subscribe first, then read the starting state: nothing falls in between.
    let groups = rtnl::RTMGRP_LINK | rtnl::RTMGRP_IPV4_IFADDR | rtnl::RTMGRP_IPV6_IFADDR;
    let conn = NlConn::open_groups(NlFamily::Route, groups).map_err(MonitorError::Socket)?;
    let links = dump_links().map_err(MonitorError::InitialState)?;
    let state = MonitorState::new(&ifnames, nic, &links).map_err(MonitorError::Nic)?;
    let stop = EventFd::from_flags(EfdFlags::EFD_CLOEXEC).map_err(MonitorError::EventFd)?;
    let stop_rx = stop.as_fd().try_clone_to_owned().map_err(MonitorError::Spawn)?;
    let thread = std::thread::Builder::new()
        .name("link-monitor".into())
        .spawn(move || run(conn, stop_rx, state, events))
        .map_err(MonitorError::Spawn)?;
    Ok(MonitorHandle { stop, thread: Some(thread) })
}

fn run<N: NicInfo + ?Sized>(
    conn: NlConn,
    stop: std::os::fd::OwnedFd,
    mut state: MonitorState<N>,
    events: UnboundedSender<NicEvent>,
) {
    loop {
        let mut fds =
            [PollFd::new(conn.as_fd(), PollFlags::POLLIN), PollFd::new(stop.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(e) => {
                error!(error = %e, "link monitor poll failed; monitor stops");
                return;
            }
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            debug!("link monitor stopping");
            return;
        }
        let batch = match conn.recv_events() {
            Ok(msgs) => msgs.iter().flat_map(|(t, p)| state.on_message(*t, p)).collect(),
            // The socket overflowed and notifications were lost: whatever
            // changed, the address map must be rebuilt.
            Err(e) if e.errno() == Errno::ENOBUFS => {
                warn!("link monitor lost notifications (ENOBUFS); resyncing");
                let mut ev = vec![NicEvent::AddressesChanged];
                match dump_links() {
                    Ok(links) => {
                        for l in links {
                            ev.extend(state.on_link(false, &l));
                        }
                    }
                    Err(e) => error!(error = %e, "link monitor cannot resync link state"),
                }
                ev
            }
            Err(e) => {
                error!(error = %e, "link monitor receive failed; monitor stops");
                return;
            }
        };
        for ev in batch {
            if events.send(ev).is_err() {
                debug!("link monitor receiver gone; monitor stops");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::sim::SimNic;

    /// A minimal RTM_NEWLINK payload carrying `l`, as the kernel would multicast it.
    fn link_payload(l: &LinkMsg) -> Vec<u8> {
        use crate::netlink::{attr_str, attr_u8, attrs_bytes};
        let mut p = vec![0u8; 16];
        p[4..8].copy_from_slice(&l.index.to_ne_bytes());
        p[8..12].copy_from_slice(&l.flags.to_ne_bytes());
        let mut attrs = Vec::new();
        if let Some(n) = &l.name {
            attrs.push(attr_str(rtnl::IFLA_IFNAME, n));
        }
        if let Some(s) = l.operstate {
            attrs.push(attr_u8(rtnl::IFLA_OPERSTATE, s));
        }
        p.extend(attrs_bytes(attrs));
        p
    }

    fn link(index: u32, up: bool, operstate: u8, name: &str) -> LinkMsg {
        LinkMsg { index, flags: u32::from(up), name: Some(name.into()), operstate: Some(operstate) }
    }

    #[test]
    fn link_and_address_events() {
        let sim = Arc::new(SimNic::new(&["eth1", "eth2"]));
        let (i1, i2) = (sim.ifindex("eth1").unwrap(), sim.ifindex("eth2").unwrap());
        let links = [link(i1, true, IF_OPER_UP, "eth1"), link(i2, true, 2, "eth2")];
        let mut st = MonitorState::new(&["eth1".into(), "eth2".into()], sim.clone(), &links).unwrap();
        let msg = |l: &LinkMsg| link_payload(l);

        // Unmanaged interfaces and unchanged state: nothing.
        assert!(st.on_message(rtnl::RTM_NEWLINK, &msg(&link(999, false, 2, "lo"))).is_empty());
        assert!(st.on_message(rtnl::RTM_NEWLINK, &msg(&link(i1, true, IF_OPER_UP, "eth1"))).is_empty());
        // Carrier loss on a running NIC, then admin down of one without carrier.
        assert_eq!(
            st.on_message(rtnl::RTM_NEWLINK, &msg(&link(i1, true, 7, "eth1"))),
            vec![NicEvent::LinkDown("eth1".into())]
        );
        assert_eq!(
            st.on_message(rtnl::RTM_NEWLINK, &msg(&link(i2, false, 2, "eth2"))),
            vec![NicEvent::LinkDown("eth2".into())]
        );
        // A reset bumps the counter: reported once, on the next link message.
        sim.bump_stat("eth1", STAT_RESET_CNT);
        assert_eq!(
            st.on_message(rtnl::RTM_NEWLINK, &msg(&link(i1, true, IF_OPER_UP, "eth1"))),
            vec![NicEvent::Reset { ifname: "eth1".into(), before: 0, after: 1 }]
        );
        assert!(st.on_message(rtnl::RTM_NEWLINK, &msg(&link(i1, true, IF_OPER_UP, "eth1"))).is_empty());
        // Addresses anywhere.
        assert_eq!(st.on_message(rtnl::RTM_NEWADDR, &[]), vec![NicEvent::AddressesChanged]);
        assert_eq!(st.on_message(rtnl::RTM_DELADDR, &[]), vec![NicEvent::AddressesChanged]);
        // Rename and delete both mean the managed name is gone; reported once.
        assert_eq!(
            st.on_message(rtnl::RTM_NEWLINK, &msg(&link(i1, true, IF_OPER_UP, "eth9"))),
            vec![NicEvent::Removed("eth1".into())]
        );
        assert!(st.on_message(rtnl::RTM_DELLINK, &msg(&link(i1, true, IF_OPER_UP, "eth9"))).is_empty());
        assert_eq!(
            st.on_message(rtnl::RTM_DELLINK, &msg(&link(i2, false, 2, "eth2"))),
            vec![NicEvent::Removed("eth2".into())]
        );
        // Garbage is logged, not fatal.
        assert!(st.on_message(rtnl::RTM_NEWLINK, &[1, 2]).is_empty());
    }

    #[test]
    fn unknown_interface_is_an_error() {
        let sim = Arc::new(SimNic::new(&["eth1"]));
        let e = MonitorState::new(&["eth7".into()], sim, &[]).err().unwrap();
        assert_eq!(e.errno, Errno::ENODEV);
    }
}
