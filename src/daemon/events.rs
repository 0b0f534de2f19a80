//! What happens while the daemon serves: reasons to stop, NIC events, the
//! address map they refresh, and the reaper of exited clients' rules.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::metrics::Metrics;
use crate::nic::monitor::{spawn_link_monitor, MonitorHandle};
use crate::nic::{NicControl, NicEvent};
use crate::server::ServerState;
use crate::types::topology::Topology;

use super::DaemonError;

/// Why the daemon is stopping.
#[derive(Debug)]
pub enum StopReason {
    /// The caller's shutdown future finished (`main`: a signal), with its cause.
    Requested(String),
    LastApplicationGone,
    ShutdownFile(PathBuf),
    AllClientsExited(Duration),
    Nic(NicEvent),
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::Requested(cause) => f.write_str(cause),
            StopReason::LastApplicationGone => f.write_str("the last registered application disconnected"),
            StopReason::ShutdownFile(p) => write!(f, "the shutdown file {} appeared", p.display()),
            StopReason::AllClientsExited(d) => {
                write!(f, "no client process has been alive for {}s", d.as_secs())
            }
            StopReason::Nic(NicEvent::LinkDown(n)) => write!(f, "link of {n} went down"),
            StopReason::Nic(NicEvent::Removed(n)) => write!(f, "{n} was removed"),
            StopReason::Nic(NicEvent::Reset { ifname, before, after }) => {
                write!(f, "{ifname} was reset (reset_cnt {before} -> {after})")
            }
            StopReason::Nic(NicEvent::AddressesChanged) => f.write_str("addresses changed"),
        }
    }
}

/// Removes the rules of client processes that exited, through each NIC's thread.
pub(super) fn spawn_reaper(state: Weak<ServerState>, mut exits: mpsc::UnboundedReceiver<NonZeroU32>) {
    tokio::spawn(async move {
        while let Some(lease) = exits.recv().await {
            let Some(state) = state.upgrade() else { return };
            // Paused for a takeover: whoever serves next reclaims (the successor
            // watches the same processes).
            crate::endpoint::pause::wait_open(&mut state.shared.gate.subscribe()).await;
            for w in &state.rules.nics {
                w.reclaim(lease);
            }
        }
    });
}

/// Starts the link monitor where the backend reports link events. It
/// starts after priming, so that the drivers' own resets while being primed
/// do not read as link failures.
pub(super) fn start_link_monitor(
    nic: &Arc<dyn NicControl>,
    topo: &Topology,
    events: &mpsc::UnboundedSender<NicEvent>,
) -> Result<Option<MonitorHandle>, DaemonError> {
    if !nic.capabilities().link_events {
        return Ok(None);
    }
    let ifnames = topo.nics.iter().map(|n| n.ifname.clone()).collect();
    spawn_link_monitor(ifnames, nic.clone(), events.clone()).map(Some).map_err(DaemonError::LinkMonitor)
}

/// Waits for a NIC event that ends the daemon; address changes only refresh the map.
pub(super) async fn next_fatal_event(
    events: &mut mpsc::UnboundedReceiver<NicEvent>,
    state: &ServerState,
    nic: &dyn NicControl,
    topo: &Topology,
    metrics: &Metrics,
) -> NicEvent {
    loop {
        let Some(ev) = events.recv().await else {
            // No monitor: never fires.
            return std::future::pending().await;
        };
        let (ifname, kind) = match &ev {
            NicEvent::LinkDown(n) => (n.as_str(), "link_down"),
            NicEvent::Removed(n) => (n.as_str(), "removed"),
            NicEvent::Reset { ifname, .. } => (ifname.as_str(), "reset"),
            NicEvent::AddressesChanged => ("", "addresses_changed"),
        };
        metrics.link_events.with_label_values(&[ifname, kind]).inc();
        if ev == NicEvent::AddressesChanged {
            state.rules.set_addresses(address_map(nic, topo));
            continue;
        }
        return ev;
    }
}

/// Local address → NIC index, from the NIC backend.
pub(super) fn address_map(nic: &dyn NicControl, topo: &Topology) -> HashMap<IpAddr, usize> {
    let mut map = HashMap::new();
    for (i, n) in topo.nics.iter().enumerate() {
        match nic.addresses(&n.ifname) {
            Ok(addrs) => map.extend(addrs.into_iter().map(|a| (a.to_canonical(), i))),
            Err(e) => tracing::warn!(ifname = %n.ifname, error = %e, "could not read addresses"),
        }
    }
    map
}
