//! The status socket (`<uds_path>/rxdm_status`) and `tcpx-rxdm status`.
//!
//! Protocol: the client sends one line, `status` or `flows`; the daemon
//! answers with one JSON document and closes the connection (no length
//! prefix: `flows` at 100 000 rules is several megabytes, written NIC by NIC).
//! An unknown or malformed request gets `{"error": "..."}` before the close.
//! The socket is created like the other endpoints (`--socket_mode`,
//! `--socket_group`), so reading the status needs the same rights as a client.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};

use super::ServerState;
use crate::config::flags::Flags;

/// The socket file's name in `--uds_path`.
pub const SOCKET: &str = "rxdm_status";
/// Longest request line accepted.
const MAX_REQUEST: u64 = 256;
/// Status connections served at once (more wait in the backlog).
const MAX_CONNECTIONS: usize = 4;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a status connection may take, reply included.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);

/// Serves `listener` until shutdown.
pub fn spawn(listener: UnixListener, state: Arc<ServerState>, mut shutdown: watch::Receiver<bool>) {
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        let mut gate = state.gate.subscribe();
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
                let gauge = state.metrics.connections.with_label_values(&["status"]);
                gauge.inc();
                state.metrics.connections_total.with_label_values(&["status"]).inc();
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

async fn serve(stream: UnixStream, state: &ServerState) -> std::io::Result<()> {
    let (rd, mut wr) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(rd.take(MAX_REQUEST));
    let read = reader.read_line(&mut line);
    let request = match tokio::time::timeout(REQUEST_TIMEOUT, read).await {
        Ok(Ok(_)) if line.ends_with('\n') => line.trim().to_string(),
        Ok(Ok(_)) => String::new(),
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            let e =
                json!({ "error": "no request line within 5 s (send \"status\" or \"flows\" and a newline)" });
            return wr.write_all(format!("{e}\n").as_bytes()).await;
        }
    };
    match request.as_str() {
        "status" => {
            let body = status_json(state).await;
            wr.write_all(format!("{body}\n").as_bytes()).await
        }
        "flows" => {
            wr.write_all(b"{\"nics\":[").await?;
            for (i, w) in state.rules.nics.iter().enumerate() {
                if let Some(s) = w.snapshot().await {
                    let mut buf = if i > 0 { b",".to_vec() } else { Vec::new() };
                    serde_json::to_writer(&mut buf, &s).map_err(std::io::Error::other)?;
                    wr.write_all(&buf).await?;
                }
            }
            wr.write_all(b"]}\n").await
        }
        other => {
            let shown: String = other.chars().take(64).collect();
            let e = json!({ "error": format!("unknown request {shown:?}: send \"status\" or \"flows\" and a newline") });
            wr.write_all(format!("{e}\n").as_bytes()).await
        }
    }
}

/// A tenant's pids and its rules per NIC.
type TenantRules = (BTreeSet<Option<u32>>, BTreeMap<String, u64>);

/// The `status` reply.
pub async fn status_json(state: &ServerState) -> Value {
    let m = &state.metrics;
    let mut nics = Vec::new();
    // pid → (rules, per NIC)
    let mut clients: BTreeMap<Option<u32>, BTreeMap<String, u64>> = BTreeMap::new();
    // tenant → (pids, rules per NIC)
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
                "tenant": id.map(|id| state.tenants.name_of(id).unwrap_or_else(|| format!("cgroup id {id}"))),
                "cgroup_id": id,
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
        "tenant_isolation": state.tenants.mode.name(),
        "tenants": tenants,
        "registered_applications": state.registry.count(),
        "lease_clients": m.leases.clients.get(),
        "connections": connections,
        "pools": pools,
        "recent_errors": m.recent_errors(),
    })
}

/// Sends `request` to the daemon's status socket and reads the reply to the end.
pub fn ask(uds: &Path, request: &str) -> Result<Value, String> {
    let path = uds.join(SOCKET);
    let mut s = std::os::unix::net::UnixStream::connect(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => format!(
            "no daemon answers at {} ({e}): is tcpx-rxdm running with --uds_path={}? `tcpx-rxdm doctor` checks the node",
            path.display(),
            uds.display()
        ),
        std::io::ErrorKind::PermissionDenied => format!(
            "{}: permission denied: it shows every client's flows, so only the daemon's user may read it \
             (--status_socket_mode, 0600 by default); run as that user (root)",
            path.display()
        ),
        _ => format!("{}: {e}", path.display()),
    })?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    s.write_all(format!("{request}\n").as_bytes()).map_err(|e| format!("sending the request: {e}"))?;
    let mut body = String::new();
    s.read_to_string(&mut body).map_err(|e| format!("reading the reply: {e}"))?;
    let v: Value =
        serde_json::from_str(&body).map_err(|e| format!("the daemon's reply is not JSON ({e})"))?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        return Err(format!("the daemon refused the request: {e}"));
    }
    Ok(v)
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn human_duration(secs: f64) -> String {
    let s = secs as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, (s % 3600) / 60),
    }
}

/// The `status` reply for people.
pub fn status_text(v: &Value) -> String {
    let mut out = String::new();
    let ready = if v["ready"].as_bool() == Some(true) { "ready" } else { "NOT ready" };
    out += &format!(
        "tcpx-rxdm {} (pid {}): {ready}, up {}\n",
        v["version"].as_str().unwrap_or("?"),
        v["pid"],
        human_duration(v["uptime_seconds"].as_f64().unwrap_or(0.0))
    );
    out += "\nNICs\n";
    for n in v["nics"].as_array().into_iter().flatten() {
        let queues: Vec<String> = n["rules_by_queue"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| format!("{}:{}", e["queue"], e["rules"]))
            .collect();
        out += &format!(
            "  {}: {} rules, {} of {} slots free; by queue {}\n",
            n["ifname"].as_str().unwrap_or("?"),
            n["rules"],
            n["slots_free"],
            n["slots"],
            queues.join(" ")
        );
        if let Some(e) = n["nic_error"].as_str() {
            out += &format!("    NIC listing failed: {e}\n");
        }
        let role = |r: &str| n["rx_bytes_by_role"][r].as_u64().map(human_bytes).unwrap_or_else(|| "?".into());
        out +=
            &format!("    received: {} on GPU queues, {} on host (RSS) queues\n", role("gpu"), role("rss"));
        if n["steering_miss"].as_bool() == Some(true) {
            out += "    STEERING MISS: rules are installed but traffic lands on the host queues, none on the GPU queues\n";
        }
    }
    out += "\nclients\n";
    let clients = v["clients"].as_array().cloned().unwrap_or_default();
    if clients.is_empty() {
        out += "  no rules installed\n";
    }
    for c in &clients {
        let who = match c["pid"].as_u64() {
            Some(p) => format!("pid {p}"),
            None => "unknown pid".into(),
        };
        let per: Vec<String> =
            c["rules_by_nic"].as_object().into_iter().flatten().map(|(n, k)| format!("{n} {k}")).collect();
        out += &format!("  {who}: {} rules ({})\n", c["rules"], per.join(", "));
    }
    out += &format!(
        "  {} registered application(s), {} lease client(s)\n",
        v["registered_applications"], v["lease_clients"]
    );
    if v["tenant_isolation"].as_str().is_some_and(|m| m != "off") {
        out += &format!("\ntenants (tenant_isolation={})\n", v["tenant_isolation"].as_str().unwrap_or("?"));
        for t in v["tenants"].as_array().into_iter().flatten() {
            let per: Vec<String> = t["rules_by_nic"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(n, k)| format!("{n} {k}"))
                .collect();
            let pids: Vec<String> =
                t["pids"].as_array().into_iter().flatten().map(|p| p.to_string()).collect();
            out += &format!(
                "  {}: {} rules ({}), pid(s) {}\n",
                t["tenant"].as_str().unwrap_or("unidentified"),
                t["rules"],
                per.join(", "),
                if pids.is_empty() { "unknown".into() } else { pids.join(" ") }
            );
        }
    }
    out += "\npools\n";
    for p in v["pools"].as_array().into_iter().flatten() {
        out += &format!(
            "  {} ({}, queues {}): {}\n",
            p["gpu"].as_str().unwrap_or("?"),
            p["nic"].as_str().unwrap_or("?"),
            p["queues"]
                .as_array()
                .map(|q| q.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(","))
                .unwrap_or_default(),
            p["size_bytes"].as_u64().map(human_bytes).unwrap_or_else(|| "no pool".into())
        );
    }
    out += "\nrecent errors\n";
    let errors = v["recent_errors"].as_array().cloned().unwrap_or_default();
    if errors.is_empty() {
        out += "  none\n";
    }
    for e in &errors {
        out += &format!(
            "  [{:.0}] {} {}: {}\n",
            e["time"].as_f64().unwrap_or(0.0),
            e["kind"].as_str().unwrap_or("?"),
            e["nic"].as_str().unwrap_or(""),
            e["message"].as_str().unwrap_or("")
        );
    }
    out
}

/// The `flows` reply in the layout of `ethtool -n`.
pub fn flows_text(v: &Value) -> String {
    let mut out = String::new();
    for n in v["nics"].as_array().into_iter().flatten() {
        let rules = n["rules"].as_array().cloned().unwrap_or_default();
        out += &format!(
            "{}: {} rules, {} slots\n",
            n["ifname"].as_str().unwrap_or("?"),
            rules.len(),
            n["capacity"]
        );
        for r in &rules {
            let split = |a: &str| -> (String, String) {
                match a.rsplit_once(':') {
                    Some((ip, port)) => (ip.trim_matches(['[', ']']).to_string(), port.to_string()),
                    None => (a.to_string(), String::new()),
                }
            };
            let (sip, sport) = split(r["src"].as_str().unwrap_or(""));
            let (dip, dport) = split(r["dst"].as_str().unwrap_or(""));
            let v6 = r["flow_type"] == "tcp6";
            let mask = if v6 { "::" } else { "0.0.0.0" };
            out += &format!("Filter: {}\n", r["loc"]);
            out += &format!("\tRule Type: TCP over IPv{}\n", if v6 { 6 } else { 4 });
            out += &format!("\tSrc IP addr: {sip} mask: {mask}\n");
            out += &format!("\tDest IP addr: {dip} mask: {mask}\n");
            out += &format!("\tSrc port: {sport} mask: 0x0\n");
            out += &format!("\tDest port: {dport} mask: 0x0\n");
            out += &format!("\tAction: Direct to queue {}\n", r["queue"]);
            let pid = r["pid"].as_u64().map(|p| format!(", client pid {p}")).unwrap_or_default();
            out += &format!("\tGPU: {}{pid}\n\n", r["gpu"].as_str().unwrap_or("?"));
        }
        if let Some(e) = n["nic_error"].as_str() {
            out += &format!("(the NIC's own list could not be read: {e})\n");
        } else if let Some(nic_rules) = n["nic_rules"].as_array() {
            if nic_rules.len() != rules.len() {
                out += &format!("(the NIC itself reports {} rules)\n", nic_rules.len());
            }
        }
    }
    out
}

/// `tcpx-rxdm status [flows] [--json]`: returns the exit code (0: answered and
/// ready; 1: unreachable, refused or not ready; 2: bad arguments).
pub fn client_main(flags: &Flags, words: &[String], json: bool) -> u8 {
    let request = match words {
        [] => "status",
        [w] if w == "flows" => "flows",
        [w] if w == "status" => "status",
        _ => {
            eprintln!("tcpx-rxdm status: unexpected arguments {words:?} (only `flows` may follow)");
            return 2;
        }
    };
    match ask(&flags.uds_path, request) {
        Ok(v) => {
            if json {
                println!("{}", serde_json::to_string_pretty(&v).expect("JSON of a parsed value"));
            } else if request == "flows" {
                print!("{}", flows_text(&v));
            } else {
                print!("{}", status_text(&v));
            }
            if request == "status" && v["ready"].as_bool() != Some(true) {
                1
            } else {
                0
            }
        }
        Err(e) => {
            eprintln!("tcpx-rxdm status: {e}");
            1
        }
    }
}
