//! The daemon container's probes, which follow `--metrics_address`. The
//! kubelet probes a host-network Pod on the node's address: an HTTP probe
//! works only where the daemon listens on every address (`0.0.0.0` or
//! `::`), on that port. Anywhere else (loopback, one address, HTTP off) the
//! probe runs `tcpx-rxdm status mine` in the daemon's container, which asks
//! the daemon over its status socket and answers ready only when the daemon
//! serving is that container's own.

use serde_norway::Value;

use super::lists::{map, s};
use super::Mode;
use crate::config::flags::Flags;

/// The binary in the daemon's image (its entrypoint).
pub const IMAGE_BIN: &str = "/usr/local/bin/tcpx-rxdm";

/// How the kubelet learns that the daemon is ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// `GET /readyz` (and `/healthz` for liveness) on this port.
    Http { port: u16 },
    /// `tcpx-rxdm status mine` in the container; why HTTP would not do.
    Exec { why: String },
}

impl Probe {
    /// The probe for the daemon's `--metrics_address`.
    pub fn for_flags(flags: &Flags) -> Probe {
        let why = match flags.metrics_address.0 {
            Some(a) if a.ip().is_unspecified() => return Probe::Http { port: a.port() },
            None => "--metrics_address is empty: the daemon serves no HTTP".to_string(),
            Some(a) if a.ip().to_canonical().is_loopback() => {
                format!("the daemon's HTTP address {a} is loopback, which the kubelet cannot reach")
            }
            Some(a) => format!(
                "the daemon's HTTP address {a} is one address, and the kubelet probes the node's, which \
                 need not be it"
            ),
        };
        Probe::Exec { why }
    }

    /// The probe's fields of the daemon container for `mode`: the port,
    /// the probe that holds the workload back (native sidecar) or marks the
    /// Pod ready (sidecar), and an HTTP liveness probe.
    pub fn fields(&self, flags: &Flags, mode: Mode, uds: &str) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        if let Some(a) = flags.metrics_address.0 {
            let p = map(vec![("name", s("metrics")), ("containerPort", Value::Number(a.port().into()))]);
            out.push(("ports", Value::Sequence(vec![p])));
        }
        let ready = match self {
            Probe::Http { port } => ("httpGet", http("/readyz", *port)),
            Probe::Exec { .. } => ("exec", exec(uds)),
        };
        let (key, period, failures) = match mode {
            // 120 tries, 1 s apart: the workload starts within a second of ready.
            Mode::NativeSidecar => ("startupProbe", 1_u64, Some(120_u64)),
            _ => ("readinessProbe", 2, None),
        };
        let mut p = vec![ready, ("periodSeconds", Value::Number(period.into()))];
        p.extend(failures.map(|f| ("failureThreshold", Value::Number(f.into()))));
        out.push((key, map(p)));
        if let Probe::Http { port } = self {
            let live =
                map(vec![("httpGet", http("/healthz", *port)), ("periodSeconds", Value::Number(10.into()))]);
            out.push(("livenessProbe", live));
        }
        out
    }

    /// For the report: which probe was written, and why.
    pub fn describe(&self, mode: Mode) -> String {
        let key = if mode == Mode::NativeSidecar { "startupProbe" } else { "readinessProbe" };
        match self {
            Probe::Http { port } => format!("{key} GET /readyz on port {port}, livenessProbe GET /healthz"),
            Probe::Exec { why } => {
                format!("{key} runs `tcpx-rxdm status mine` in the container ({why}); no livenessProbe")
            }
        }
    }
}

fn http(path: &str, port: u16) -> Value {
    map(vec![("path", s(path)), ("port", Value::Number(port.into()))])
}

fn exec(uds: &str) -> Value {
    let words = [IMAGE_BIN, "status", "mine", &format!("--uds_path={uds}")].map(s);
    map(vec![("command", Value::Sequence(words.to_vec()))])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(address: &str) -> Probe {
        let argv = ["tcpx-rxdm".to_string(), format!("--metrics_address={address}")];
        Probe::for_flags(&Flags::parse_args(argv).unwrap())
    }

    #[test]
    fn http_only_where_the_daemon_listens_on_every_address() {
        assert_eq!(probe("0.0.0.0:9467"), Probe::Http { port: 9467 });
        assert_eq!(probe("[::]:9999"), Probe::Http { port: 9999 });
        for (address, says) in [
            ("127.0.0.1:9999", "127.0.0.1:9999 is loopback"),
            ("[::1]:9467", "is loopback"),
            ("", "serves no HTTP"),
            ("10.0.0.5:9467", "is one address"),
        ] {
            match probe(address) {
                Probe::Exec { why } => assert!(why.contains(says), "{address}: {why}"),
                p => panic!("{address}: {p:?}"),
            }
        }
    }

    #[test]
    fn the_exec_probe_asks_the_containers_own_daemon_on_its_folder() {
        let argv =
            ["tcpx-rxdm", "--metrics_address=127.0.0.1:9999", "--uds_path=/run/tcpx-a"].map(String::from);
        let flags = Flags::parse_args(argv).unwrap();
        let fields = Probe::for_flags(&flags).fields(&flags, Mode::NativeSidecar, "/run/tcpx-a");
        let keys: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["ports", "startupProbe"]);
        let cmd = &fields[1].1["exec"]["command"];
        assert_eq!(
            cmd,
            &Value::Sequence([IMAGE_BIN, "status", "mine", "--uds_path=/run/tcpx-a"].map(s).to_vec())
        );
        assert_eq!(fields[0].1[0]["containerPort"], Value::Number(9999.into()));
    }
}
