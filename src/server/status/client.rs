//! The status socket's client side: `tcpx-rxdm status`, the human text of
//! its answers, and `status mine` for a container's readiness probe.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::SOCKET;
use crate::config::flags::Flags;
use crate::types::exit::Exit;

/// Sends `request` to the daemon's status socket and reads the reply to the end.
pub fn ask(uds: &Path, request: &str) -> Result<Value, String> {
    ask_on(connect(uds)?, request, Duration::from_secs(30))
}

/// Connects to the daemon's status socket; an error says what to check.
pub fn connect(uds: &Path) -> Result<std::os::unix::net::UnixStream, String> {
    let path = uds.join(SOCKET);
    std::os::unix::net::UnixStream::connect(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => format!(
            "no daemon answers at {} ({e}): is tcpx-rxdm running with --uds_path={}? `tcpx-rxdm doctor` checks the node",
            path.display(),
            uds.display()
        ),
        std::io::ErrorKind::PermissionDenied => format!(
            "{}: permission denied: it shows every client's flows, so only the daemon's user may read it \
             (--status_socket_mode, 0600 by default); {}",
            path.display(),
            run_as_hint(uds, "status")
        ),
        _ => format!("{}: {e}", path.display()),
    })
}

/// Who the daemon serving `uds` runs as, as far as this user can tell: the
/// owner of its status socket, else of its lock file, else of the folder;
/// with the file that told.
pub fn daemon_user(uds: &Path) -> Option<(u32, std::path::PathBuf)> {
    let files = [uds.join(SOCKET), uds.join(crate::server::socket_dir::LOCK_FILE), uds.to_path_buf()];
    files.into_iter().find_map(|f| crate::host::users::owner(&f).map(|uid| (uid, f)))
}

/// What to do when the daemon's files are not this user's to use: run
/// `tcpx-rxdm COMMAND` as the user who owns them, named.
pub fn run_as_hint(uds: &Path, command: &str) -> String {
    let line = format!("tcpx-rxdm {command} --uds_path={}", uds.display());
    match daemon_user(uds) {
        Some((0, file)) => format!("run it as root, who owns {} (`sudo {line}`)", file.display()),
        Some((uid, file)) => {
            let who = crate::host::users::describe(uid);
            let name = who.split(' ').next().unwrap_or_default();
            format!(
                "run it as the daemon's user, {who}, who owns {} (`sudo -u {name} {line}`)",
                file.display()
            )
        }
        None => format!("run it as the daemon's user (`{line}`)"),
    }
}

/// Sends `request` on a connection already made to the status socket and
/// reads the reply, waiting up to `timeout` for it.
pub fn ask_on(
    mut s: std::os::unix::net::UnixStream,
    request: &str,
    timeout: Duration,
) -> Result<Value, String> {
    let _ = s.set_read_timeout(Some(timeout));
    s.write_all(format!("{request}\n").as_bytes()).map_err(|e| format!("sending the request: {e}"))?;
    let mut body = String::new();
    s.read_to_string(&mut body).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            format!("no reply within {:.1} s (is the daemon stopped or stuck?)", timeout.as_secs_f64())
        }
        _ => format!("reading the reply: {e}"),
    })?;
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
    if let Some(s) = v.get("starting") {
        // A daemon waiting for its NICs (--wait_for_nics): nothing else to show yet.
        return format!(
            "tcpx-rxdm {} (pid {}): starting, waiting for {} ({} of up to {}; --wait_for_nics)\n",
            v["version"].as_str().unwrap_or("?"),
            v["pid"],
            s["waiting_for"].as_str().unwrap_or("its NICs"),
            human_duration(s["waited_seconds"].as_f64().unwrap_or(0.0)),
            human_duration(s["wait_for_nics_seconds"].as_f64().unwrap_or(0.0)),
        );
    }
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
    let hidden = v["hidden"].as_str();
    if let Some(why) = hidden {
        out += &format!("  {why}\n");
    } else if clients.is_empty() {
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
    if v["tenant_isolation"].as_str().is_some_and(|m| m != "off") && hidden.is_none() {
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
    if hidden.is_some() {
        return out;
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
            out += &format!("\tGPU: {}{pid}\n", r["gpu"].as_str().unwrap_or("?"));
            if r["repaired"] == true {
                out += "\tRepaired: the request named only the first 8 bytes of each address\n";
            }
            out += "\n";
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

/// Whether process `pid` is in the caller's own cgroup (a container's
/// processes share one): `Err` says why it cannot tell.
fn in_my_cgroup(pid: u64) -> Result<bool, String> {
    let read = |p: &str| std::fs::read_to_string(p).map_err(|e| format!("{p}: {e}"));
    let theirs = read(&format!("/proc/{pid}/cgroup")).map_err(|e| {
        format!("the serving daemon's pid is not visible here ({e}); the probe needs hostPID")
    })?;
    Ok(theirs == read("/proc/self/cgroup")?)
}

/// `tcpx-rxdm status [flows|mine] [--json]`: done when answered and ready;
/// failed when unreachable, refused or not ready. `mine` also needs the
/// serving daemon to be in the caller's cgroup: a container's readiness
/// probe, true only once its own daemon serves (after a takeover).
pub fn client_main(flags: &Flags, what: Option<&str>, json: bool) -> Exit {
    let (request, mine) = match what {
        Some("flows") => ("flows", false),
        Some("mine") => ("status", true),
        _ => ("status", false),
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
                return Exit::Failed;
            }
            if !mine {
                return Exit::Done;
            }
            let pid = v["pid"].as_u64().unwrap_or(0);
            match in_my_cgroup(pid) {
                Ok(true) => Exit::Done,
                Ok(false) => {
                    eprintln!("tcpx-rxdm status: pid {pid} serves, from another cgroup (another container)");
                    Exit::Failed
                }
                Err(e) => {
                    eprintln!("tcpx-rxdm status: {e}");
                    Exit::Failed
                }
            }
        }
        Err(e) => {
            eprintln!("tcpx-rxdm status: {e}");
            Exit::Failed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{flows_text, in_my_cgroup};

    #[test]
    fn a_repaired_rule_says_so_under_its_filter() {
        let rule = |loc: u32, repaired: bool| {
            serde_json::json!({"loc": loc, "queue": 3, "gpu": "0000:04:00.0", "flow_type": "tcp6",
                "src": "[fd00::2]:40001", "dst": "[fd00::1]:5000", "pid": 7, "repaired": repaired})
        };
        let v = serde_json::json!({"nics": [{"ifname": "eth1", "capacity": 10,
            "rules": [rule(0, true), rule(1, false)], "nic_rules": []}]});
        let text = flows_text(&v);
        let filters: Vec<&str> = text.split("Filter: ").skip(1).collect();
        assert!(filters[0].contains("Repaired: "), "{text}");
        assert!(!filters[1].contains("Repaired"), "{text}");
        assert!(filters[0].contains("Src IP addr: fd00::2 mask: ::"), "{text}");
    }

    #[test]
    fn mine_means_the_same_cgroup_and_says_when_it_cannot_tell() {
        assert_eq!(in_my_cgroup(std::process::id().into()), Ok(true));
        let err = in_my_cgroup(u64::from(u32::MAX)).unwrap_err();
        assert!(err.contains("not visible here") && err.contains("hostPID"), "{err}");
    }
}
