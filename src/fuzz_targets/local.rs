//! Inputs from the node: `nccl-env --check --env-file`, the status
//! socket's request line, the HTTP request line and `/debug/flows?nic=`,
//! and the daemon's command line.

use std::path::Path;
use std::sync::OnceLock;

use crate::config::flags::{normalize_args, Flags};
use crate::config::presets;
use crate::daemon::http_routes::flows_nic;
use crate::nccl::{self, check, env, FakeNode};
use crate::server::http::{request_line, Request};
use crate::server::status::{self, Ask};
use crate::types::topology::Topology;

/// An env file as `nccl-env --check --env-file` reads it, checked against
/// an a3-highgpu-8g node managing a3vm's NICs from `/run/tcpx`. A line it
/// refuses is one of the file's; the variables it reads come back the same
/// when written as `nccl-env` writes them; the report names only the
/// plugin's variables, a problem is one line, and `ok` means no problem.
pub fn envfile(data: &[u8]) {
    // read_to_string refuses a file that is not UTF-8 before this.
    let Ok(text) = std::str::from_utf8(data) else { return };
    let vars = match check::parse_env_file(text) {
        Ok(vars) => vars,
        Err(line) => {
            assert!(line >= 1 && line <= text.lines().count(), "line {line} of {}", text.lines().count());
            return;
        }
    };
    for name in vars.keys() {
        assert!(!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{name:?}");
    }
    let written: String =
        vars.iter().map(|(k, v)| format!("# why\nexport {k}={}\n", env::shell_quote(v))).collect();
    assert_eq!(check::parse_env_file(&written).as_ref(), Ok(&vars), "written back:\n{written}");
    static TOPOLOGY: OnceLock<Topology> = OnceLock::new();
    let topo = TOPOLOGY.get_or_init(|| {
        let flags =
            Flags::parse_args(["tcpx-rxdm", "--gpu_nic_preset=a3vm"].map(String::from)).expect("flags");
        presets::resolve_topology(&flags).expect("the a3vm preset").0
    });
    let report = nccl::check_env(&FakeNode::a3_highgpu_8g(), topo, Path::new("/run/tcpx"), &vars);
    assert_eq!(report.ok, report.problems.is_empty());
    let known = [
        env::SOCKET_IFNAME,
        env::CTRL_DEV,
        env::TX_BINDINGS,
        env::RX_BINDINGS,
        env::UNIX_CLIENT_PREFIX,
        env::REPORT_LIFECYCLE,
    ];
    for p in &report.problems {
        assert!(known.contains(&p.variable.as_str()), "{p:?}");
        assert!(!p.message.is_empty() && !p.message.contains('\n'), "{p:?}");
    }
    let lines = report.text().lines().count();
    let fixes = report.problems.iter().filter(|p| p.fix.is_some()).count();
    assert_eq!(lines, report.problems.len() + fixes + report.notes.len() + 1, "{}", report.text());
    serde_json::to_string(&report).expect("the JSON report");
}

/// The status socket: what a client sends, read as the daemon reads it (up
/// to the first newline, at most `MAX_REQUEST` bytes). `status` and `flows`
/// are requests; anything else gets one JSON line naming the problem, with
/// at most 64 characters of what was sent.
pub fn status(data: &[u8]) {
    let limit = data.len().min(status::MAX_REQUEST as usize);
    let sent = match data[..limit].iter().position(|&b| b == b'\n') {
        Some(i) => &data[..=i],
        None => &data[..limit],
    };
    match status::parse_request(sent) {
        Ok(ask) => {
            let text = std::str::from_utf8(sent).expect("a request is text").trim();
            assert_eq!(text, if ask == Ask::Status { "status" } else { "flows" });
        }
        Err(reply) => {
            assert!(reply.ends_with('\n') && reply.matches('\n').count() == 1, "{reply:?}");
            let v: serde_json::Value = serde_json::from_str(&reply).expect("a JSON reply");
            let message = v["error"].as_str().expect("an error");
            assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{reply}");
            // 64 characters shown, each escaped to at most 10.
            assert!(message.chars().count() < 64 * 10 + 200, "{message}");
        }
    }
}

/// Managed NICs for the `http` target (one with a `-`, one with a blank).
const NICS: [&str; 4] = ["eth1", "eth2", "eth-3", "e 4"];

/// The HTTP head as the daemon reads it: method and target from the request
/// line, the target split into path and query, and `/debug/flows?nic=`
/// checked against the managed NICs. The method and target hold no blank or
/// line end; the path no `?`; a NIC chosen is a managed one, a refusal is
/// one line; the value asked for comes back from any percent-encoding of it.
pub fn http(data: &[u8]) {
    let head = &data[..data.len().min(8192)];
    let (method, target) = request_line(head);
    for part in [&method, &target] {
        assert!(!part.contains([' ', '\r', '\n']), "{part:?}");
    }
    let req = Request::new(&target, "127.0.0.1:40000".parse().expect("an address"));
    assert!(!req.path.contains('?'));
    assert!(target.starts_with(&req.path));
    match flows_nic(&req, NICS.into_iter()) {
        Ok(Some(nic)) => assert!(NICS.contains(&nic.as_str())),
        Ok(None) => assert!(req.param("nic").is_none()),
        Err(text) => assert!(text.ends_with('\n') && text.matches('\n').count() == 1, "{text:?}"),
    }
    if let Some(asked) = req.param("nic") {
        let encoded: String = asked.bytes().map(|b| format!("%{b:02X}")).collect();
        let again = Request::new(&format!("/debug/flows?nic={encoded}&nic=x"), req.peer);
        assert_eq!(again.param("nic"), Some(asked));
    }
}

/// The daemon's long flag names, as its `--help` lists them.
fn flag_names() -> &'static [String] {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let help =
            Flags::parse_args(["tcpx-rxdm", "--help"].map(String::from)).expect_err("help").to_string();
        let mut names: Vec<String> = help
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
            .filter_map(|w| w.strip_prefix("--"))
            .filter(|w| w.len() > 1 && !w.starts_with('-'))
            .map(String::from)
            .collect();
        names.sort();
        names.dedup();
        names
    })
}

/// The daemon's command line (`Flags::parse_args`): flags or an error,
/// never a panic; the same with the arguments normalised first (they are
/// "normalised or not"), and normalising twice is normalising once. A
/// node-wide daemon has no way left for a client to end it.
///
/// The input is arguments separated by NUL bytes. An argument whose first
/// byte is 1 to 5 is a flag by name: the next byte picks the flag, the
/// first byte its form (`--name=`, `-name=`, `--noname`, `--name` and a
/// separate value, bare `--name`), the rest is the value.
pub fn argv(data: &[u8]) {
    let names = flag_names();
    let mut args = vec!["tcpx-rxdm".to_string()];
    for token in data.split(|&b| b == 0) {
        match token {
            [form @ 1..=5, pick, value @ ..] => {
                let name = &names[usize::from(*pick) % names.len()];
                let value = String::from_utf8_lossy(value);
                match form {
                    1 => args.push(format!("--{name}={value}")),
                    2 => args.push(format!("-{name}={value}")),
                    3 => args.push(format!("--no{name}")),
                    4 => args.extend([format!("--{name}"), value.into_owned()]),
                    _ => args.push(format!("--{name}")),
                }
            }
            _ => args.push(String::from_utf8_lossy(token).into_owned()),
        }
    }
    let normal = normalize_args(args.clone());
    assert_eq!(normalize_args(normal.clone()), normal, "normalising twice");
    let parsed = Flags::parse_args(args.clone());
    let again = Flags::parse_args(normal);
    match (&parsed, &again) {
        (Ok(a), Ok(b)) => assert_eq!(format!("{a:?}"), format!("{b:?}"), "{args:?}"),
        (Err(a), Err(b)) => assert_eq!(a.kind(), b.kind(), "{args:?}"),
        _ => panic!("normalised or not, parsed differently: {args:?}"),
    }
    match parsed {
        Ok(f) if f.node_wide => {
            assert!(f.shutdown_file.is_empty() && !f.monitor_shutdown && !f.shutdown_when_all_clients_exited)
        }
        Ok(f) => drop((f.shutdown_file(), f.sysfs_root())),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}
