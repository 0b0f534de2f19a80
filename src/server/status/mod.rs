//! The status socket (`<uds_path>/rxdm_status`) and `tcpx-rxdm status`.
//!
//! Protocol: the client sends one line, `status` or `flows`; the daemon
//! answers with one JSON document and closes the connection (no length
//! prefix: `flows` at 100 000 rules is several megabytes, written NIC by NIC).
//! An unknown or malformed request gets `{"error": "..."}` before the close.
//! The socket is created like the other endpoints (`--socket_mode`,
//! `--socket_group`), so reading the status needs the same rights as a client.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};

use super::ServerState;
use crate::identity::operator::Viewer;

/// The socket file's name in `--uds_path`.
pub const SOCKET: &str = "rxdm_status";
/// Longest request line accepted.
pub const MAX_REQUEST: u64 = 256;
/// Status connections served at once (more wait in the backlog).
const MAX_CONNECTIONS: usize = 4;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a status connection may take, reply included.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);

/// Serves `listener` until shutdown.
pub fn spawn(listener: UnixListener, state: Arc<ServerState>, mut shutdown: watch::Receiver<bool>) {
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        let mut gate = state.shared.gate.subscribe();
        loop {
            // Paused or handed over (a takeover): whoever serves next answers.
            tokio::select! {
                _ = crate::endpoint::stopped(&mut shutdown) => return,
                _ = crate::endpoint::pause::wait_open(&mut gate) => {}
            }
            let Ok(permit) = limit.clone().acquire_owned().await else { return };
            let stream = tokio::select! {
                _ = crate::endpoint::stopped(&mut shutdown) => return,
                _ = crate::endpoint::pause::closing(&mut gate) => continue,
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::warn!(endpoint = "status", error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                },
            };
            let state = state.clone();
            tokio::spawn(async move {
                let gauge = state.shared.metrics.connections.with_label_values(&["status"]);
                gauge.inc();
                state.shared.metrics.connections_total.with_label_values(&["status"]).inc();
                // A reader that stalls must not hold a permit for ever.
                match tokio::time::timeout(CONNECTION_TIMEOUT, serve(stream, &state)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(endpoint = "status", error = %e, "status connection ended with an error")
                    }
                    Err(_) => tracing::debug!(endpoint = "status", "status connection timed out"),
                }
                gauge.dec();
                drop(permit);
            });
        }
    });
}

/// Serves `listener` for a daemon that is still starting: `status` gets the
/// latest value of `starting` (what it waits for), `flows` an error saying
/// there are none yet. Ends when `stop` turns true (or its sender goes),
/// once the connections it took are answered (or a second has passed).
pub fn spawn_starting(
    listener: UnixListener,
    starting: watch::Receiver<Value>,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        let mut answering = tokio::task::JoinSet::new();
        loop {
            let Ok(permit) = limit.clone().acquire_owned().await else { break };
            let stream = tokio::select! {
                _ = crate::endpoint::stopped(&mut stop) => break,
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                },
            };
            let now = starting.borrow().clone();
            answering.spawn(async move {
                let _ = tokio::time::timeout(CONNECTION_TIMEOUT, serve_starting(stream, now)).await;
                drop(permit);
            });
        }
        // Those that have not sent their request within a second are dropped.
        let all_answered = async { while answering.join_next().await.is_some() {} };
        let _ = tokio::time::timeout(Duration::from_secs(1), all_answered).await;
    })
}

async fn serve_starting(stream: UnixStream, starting: Value) -> std::io::Result<()> {
    let (rd, mut wr) = stream.into_split();
    let mut line = Vec::new();
    let read = BufReader::new(rd.take(MAX_REQUEST)).read_until(b'\n', &mut line).await;
    let reply = match (read, parse_request(&line)) {
        (Err(e), _) => return Err(e),
        (_, Err(reply)) => reply,
        (_, Ok(Ask::Status)) => format!("{starting}\n"),
        (_, Ok(Ask::Flows)) => {
            let why = starting["starting"]["waiting_for"].as_str().unwrap_or("starting");
            format!(
                "{}\n",
                json!({ "error": format!("the daemon is starting ({why}): it holds no rules yet") })
            )
        }
    };
    wr.write_all(reply.as_bytes()).await
}

/// What a status client asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    Status,
    Flows,
}

/// The request in what a client sent: its first line, newline included, as
/// read with a limit of [`MAX_REQUEST`] bytes. `Err`: the reply to send
/// instead, one JSON line (`{"error": ...}`).
pub fn parse_request(sent: &[u8]) -> Result<Ask, String> {
    const WANTED: &str = "send \"status\" or \"flows\" and a newline";
    let error = |message: String| format!("{}\n", json!({ "error": message }));
    let shown = |text: &str| text.chars().take(64).collect::<String>();
    let Some(line) = sent.strip_suffix(b"\n") else {
        return Err(error(if sent.len() as u64 >= MAX_REQUEST {
            format!("request line longer than {MAX_REQUEST} bytes: {WANTED}")
        } else {
            format!("incomplete request {:?} (no newline): {WANTED}", shown(&String::from_utf8_lossy(sent)))
        }));
    };
    let Ok(text) = std::str::from_utf8(line) else {
        return Err(error(format!("the request is not UTF-8 text: {WANTED}")));
    };
    match text.trim() {
        "status" => Ok(Ask::Status),
        "flows" => Ok(Ask::Flows),
        other => Err(error(format!("unknown request {:?}: {WANTED}", shown(other)))),
    }
}

async fn serve(stream: UnixStream, state: &ServerState) -> std::io::Result<()> {
    // Who asks, decided before anything is read from it.
    let viewer = {
        use std::os::fd::AsFd;
        Viewer::of_peer(stream.as_fd())
    };
    let (rd, mut wr) = stream.into_split();
    let mut line = Vec::new();
    let mut reader = BufReader::new(rd.take(MAX_REQUEST));
    let read = reader.read_until(b'\n', &mut line);
    match tokio::time::timeout(REQUEST_TIMEOUT, read).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            let e =
                json!({ "error": "no request line within 5 s (send \"status\" or \"flows\" and a newline)" });
            return wr.write_all(format!("{e}\n").as_bytes()).await;
        }
    }
    let ask = match parse_request(&line) {
        Ok(ask) => ask,
        Err(reply) => return wr.write_all(reply.as_bytes()).await,
    };
    match (ask, viewer) {
        (Ask::Status, Viewer::Operator) => {
            let body = status_json(state).await;
            wr.write_all(format!("{body}\n").as_bytes()).await
        }
        (Ask::Status, Viewer::Workload) => {
            let body = workload_view(status_json(state).await);
            wr.write_all(format!("{body}\n").as_bytes()).await
        }
        (Ask::Flows, Viewer::Workload) => {
            let e = json!({ "error": format!("every tenant's flows are the node operator's to read: {OPERATOR}") });
            wr.write_all(format!("{e}\n").as_bytes()).await
        }
        (Ask::Flows, Viewer::Operator) => {
            wr.write_all(b"{\"nics\":[").await?;
            // A NIC without a snapshot (its rule thread gone) is left out:
            // the comma goes before every table but the first written.
            let mut written = 0;
            for w in state.rules.nics.iter() {
                if let Some(s) = w.snapshot().await {
                    let mut buf = if written > 0 { b",".to_vec() } else { Vec::new() };
                    written += 1;
                    serde_json::to_writer(&mut buf, &s).map_err(std::io::Error::other)?;
                    wr.write_all(&buf).await?;
                }
            }
            wr.write_all(b"]}\n").await
        }
    }
}

/// Who is the node's operator, for a workload told it is not one.
pub const OPERATOR: &str = "a process that holds every capability the daemon holds (CAP_NET_ADMIN on \
    a node with real NICs), in the daemon's user namespace: root on the node, or a shell in the \
    daemon's own container";

/// The `status` reply for a workload: nothing that names a tenant (its
/// clients' pids, cgroups and rules, the recent errors, which may quote a
/// flow), and why.
pub fn workload_view(mut v: Value) -> Value {
    for key in ["clients", "tenants", "recent_errors"] {
        v[key] = Value::Null;
    }
    v["hidden"] = json!(format!(
        "clients, tenants and recent errors are shown to the node's operator only: {OPERATOR}"
    ));
    v
}

/// A tenant's (workload's) pids and its rules per NIC.
type TenantRules = (BTreeSet<Option<u32>>, BTreeMap<String, u64>);

/// The `status` reply.
pub async fn status_json(state: &ServerState) -> Value {
    let m = &state.shared.metrics;
    let mut nics = Vec::new();
    // pid → (rules, per NIC)
    let mut clients: BTreeMap<Option<u32>, BTreeMap<String, u64>> = BTreeMap::new();
    // tenant (its workload's id) → (pids, rules per NIC)
    let mut tenants: BTreeMap<Option<u64>, TenantRules> = BTreeMap::new();
    for w in &state.rules.nics {
        let Some(s) = w.snapshot().await else { continue };
        let mut by_queue: BTreeMap<u32, u64> = BTreeMap::new();
        for r in &s.rules {
            *by_queue.entry(r.queue).or_default() += 1;
            *clients.entry(r.pid).or_default().entry(s.ifname.clone()).or_default() += 1;
            let t = tenants.entry(r.tenant).or_default();
            t.0.insert(r.pid);
            *t.1.entry(s.ifname.clone()).or_default() += 1;
        }
        let nic_index = state.rules.nics.iter().position(|t| t.ifname == s.ifname);
        for g in state.gpus.values().filter(|g| Some(g.slot.nic) == nic_index) {
            for q in &g.queues {
                by_queue.entry(*q).or_default();
            }
        }
        nics.push(json!({
            "ifname": s.ifname,
            "slots": s.capacity,
            "rules": s.rules.len(),
            "slots_free": (s.capacity as usize).saturating_sub(s.rules.len()),
            "rules_by_queue": by_queue.iter().map(|(q, n)| json!({ "queue": q, "rules": n })).collect::<Vec<_>>(),
            "nic_rules": s.nic_rules.as_ref().map(|r| r.len()),
            "nic_error": s.nic_error,
            "steering_miss": m.steering_miss.with_label_values(&[&s.ifname]).get() == 1,
            "rx_bytes_by_role": m.rx_bytes_by_role(&s.ifname),
        }));
    }
    let clients: Vec<Value> = clients
        .into_iter()
        .map(|(pid, per_nic)| {
            json!({
                "pid": pid,
                "rules": per_nic.values().sum::<u64>(),
                "rules_by_nic": per_nic,
            })
        })
        .collect();
    let tenants: Vec<Value> = tenants
        .into_iter()
        .map(|(id, (pids, per_nic))| {
            json!({
                "tenant": id.map(|id| state.shared.tenants.name_of(id).unwrap_or_else(|| format!("id {id}"))),
                // The workload's cgroup, where its id is one (see `identity::workload`).
                "cgroup_id": id.filter(|&id| crate::identity::workload::is_cgroup_id(id)),
                "pids": pids.into_iter().flatten().collect::<Vec<_>>(),
                "rules": per_nic.values().sum::<u64>(),
                "rules_by_nic": per_nic,
            })
        })
        .collect();
    let mut pools: Vec<Value> = state
        .gpus
        .iter()
        .map(|(pci, g)| {
            let pool = g.pool.as_ref().and_then(Weak::upgrade);
            json!({
                "gpu": pci.to_string(),
                "nic": state.rules.nics.get(g.slot.nic).map(|t| t.ifname.clone()),
                "queues": g.queues,
                "size_bytes": pool.as_ref().map(|p| p.size()),
                "pool": pool.as_ref().map(|p| p.describe()),
            })
        })
        .collect();
    pools.sort_by(|a, b| a["gpu"].as_str().cmp(&b["gpu"].as_str()));
    let connections: serde_json::Map<String, Value> = crate::metrics::ENDPOINT_KINDS
        .iter()
        .map(|k| (k.to_string(), json!(m.connections.with_label_values(&[k]).get())))
        .collect();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "pid": std::process::id(),
        "ready": m.ready.get() == 1,
        "uptime_seconds": m.uptime().as_secs_f64(),
        "nics": nics,
        "clients": clients,
        "tenant_isolation": state.shared.tenants.mode.name(),
        "tenants": tenants,
        "registered_applications": state.registry.count(),
        "lease_clients": m.leases.clients.get(),
        "connections": connections,
        "pools": pools,
        "recent_errors": m.recent_errors(),
    })
}

mod client;
pub use client::{ask, ask_on, client_main, connect, daemon_user, flows_text, run_as_hint, status_text};

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(sent: &[u8]) -> String {
        let reply = parse_request(sent).unwrap_err();
        assert_eq!(reply.matches('\n').count(), 1, "one line: {reply:?}");
        let v: Value = serde_json::from_str(&reply).unwrap();
        v["error"].as_str().unwrap().to_string()
    }

    #[test]
    fn requests_are_one_line_with_blanks_allowed() {
        assert_eq!(parse_request(b"status\n"), Ok(Ask::Status));
        assert_eq!(parse_request(b" flows \r\n"), Ok(Ask::Flows));
        assert!(error_of(b"hello\n").starts_with("unknown request \"hello\""));
        assert!(error_of(b"status").starts_with("incomplete request \"status\" (no newline)"));
        assert!(error_of(&[b'x'; 256]).starts_with("request line longer than 256 bytes"));
        // Bytes that are not text get a reply like any other bad request.
        assert!(error_of(b"\xffstatus\n").starts_with("the request is not UTF-8 text"));
        let long = format!("{}\n", "y".repeat(200));
        assert!(error_of(long.as_bytes()).contains(&format!("\"{}\"", "y".repeat(64))));
    }
}
