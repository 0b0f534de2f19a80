//! `nccl-env --check`: an environment (the process's or a file's) against
//! what this daemon and node need. Pure: the caller passes the variables,
//! the daemon's NICs and folder, and what it knows of the NUMA layout.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::bindings::{self, NicCpus};
use super::cpus;
use super::env::{
    NcclEnv, CTRL_DEV, MAX_PREFIX_LEN, REPORT_LIFECYCLE, RX_BINDINGS, SOCKET_IFNAME, TX_BINDINGS,
    UNIX_CLIENT_PREFIX,
};

/// What kind of problem a variable has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// Not set at all.
    Missing,
    /// Set to something that does not parse.
    Malformed,
    /// `SOCKET_IFNAME` names a NIC this daemon does not manage.
    UnmanagedIfname,
    /// `SOCKET_IFNAME` leaves out a NIC this daemon manages.
    MissingIfname,
    /// The control NIC is one of the TCPX data NICs.
    CtrlDevIsDataNic,
    /// A binding names a NIC this daemon does not manage.
    BindingUnmanagedNic,
    /// A managed NIC has no binding.
    BindingMissingNic,
    /// A binding uses CPUs outside the NIC's NUMA node.
    WrongNumaNode,
    /// A NIC's RX binding shares CPUs with its TX binding.
    TxRxOverlap,
    /// The socket folder is not this daemon's.
    WrongPrefix,
    /// The socket folder is longer than the plugin accepts.
    PrefixTooLong,
    /// Lifecycle reporting is off.
    LifecycleOff,
}

/// One problem found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub variable: String,
    pub kind: ProblemKind,
    pub message: String,
    /// The value to use instead; `None` with `unset`, or when the daemon's
    /// flags give no valid settings at all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// The fix is to unset the variable: the settings for this node leave it out.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unset: bool,
}

/// What the environment is checked against.
pub struct Expect<'a> {
    /// The daemon's TCPX NICs, topology order.
    pub ifnames: &'a [String],
    /// The daemon's socket folder, as [`super::env::prefix`] gives it (or the
    /// flag's text when it has no valid form).
    pub prefix: &'a str,
    /// Each NIC's NUMA node CPUs, when sysfs tells them.
    pub nics: &'a [NicCpus],
    /// The generated environment, for the values to suggest.
    pub generated: Option<&'a NcclEnv>,
}

/// Checks `vars` and returns every problem, in variable order.
pub fn check(vars: &BTreeMap<String, String>, expect: &Expect<'_>) -> Vec<Problem> {
    let mut out = Vec::new();
    let fix = |name: &str| expect.generated.and_then(|g| g.get(name)).map(str::to_string);
    let mut push = |name: &str, kind, message: String| {
        let fix = fix(name);
        let unset = fix.is_none() && expect.generated.is_some();
        out.push(Problem { variable: name.to_string(), kind, message, fix, unset })
    };
    // Left out of the settings for this node: not setting them is right.
    let omitted = |name: &str| expect.generated.is_some_and(|g| g.get(name).is_none());
    let managed: BTreeSet<&str> = expect.ifnames.iter().map(String::as_str).collect();

    match vars.get(SOCKET_IFNAME) {
        None => push(
            SOCKET_IFNAME,
            ProblemKind::Missing,
            "not set: the plugin does not know the TCPX NICs".into(),
        ),
        Some(v) => {
            let listed: Vec<&str> = v.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
            for nic in listed.iter().filter(|n| !managed.contains(*n)) {
                push(
                    SOCKET_IFNAME,
                    ProblemKind::UnmanagedIfname,
                    format!("{nic} is not a NIC this daemon manages"),
                );
            }
            for nic in expect.ifnames.iter().filter(|n| !listed.contains(&n.as_str())) {
                push(
                    SOCKET_IFNAME,
                    ProblemKind::MissingIfname,
                    format!("{nic} is managed by the daemon but not listed"),
                );
            }
        }
    }
    match vars.get(CTRL_DEV) {
        None if omitted(CTRL_DEV) => {}
        None => push(CTRL_DEV, ProblemKind::Missing, "not set: the plugin has no control NIC".into()),
        Some(v) if managed.contains(v.trim()) => push(
            CTRL_DEV,
            ProblemKind::CtrlDevIsDataNic,
            format!("{v} is a TCPX data NIC; control traffic belongs on the host NIC"),
        ),
        Some(_) => {}
    }
    let tx = check_bindings(vars, TX_BINDINGS, expect, &mut push);
    let rx = check_bindings(vars, RX_BINDINGS, expect, &mut push);
    if let (Some(tx), Some(rx)) = (tx, rx) {
        for (nic, rx_cpus) in &rx {
            let shared: BTreeSet<u32> =
                tx.get(nic).map(|t| t.intersection(rx_cpus).copied().collect()).unwrap_or_default();
            if !shared.is_empty() {
                push(
                    RX_BINDINGS,
                    ProblemKind::TxRxOverlap,
                    format!("{nic}: CPUs {} are in both the TX and the RX bindings", cpus::format(&shared)),
                );
            }
        }
    }
    match vars.get(UNIX_CLIENT_PREFIX) {
        None => push(
            UNIX_CLIENT_PREFIX,
            ProblemKind::Missing,
            format!("not set: the plugin looks in /tmp, not in the daemon's folder {}", expect.prefix),
        ),
        Some(v) => {
            let given = match v.trim_end_matches('/') {
                "" => "/",
                t => t,
            };
            if given != expect.prefix {
                push(
                    UNIX_CLIENT_PREFIX,
                    ProblemKind::WrongPrefix,
                    format!("{v} is not this daemon's socket folder {}", expect.prefix),
                );
            }
            if given.len() > MAX_PREFIX_LEN {
                push(
                    UNIX_CLIENT_PREFIX,
                    ProblemKind::PrefixTooLong,
                    format!("{} characters; the plugin takes at most {MAX_PREFIX_LEN}", given.len()),
                );
            }
        }
    }
    match vars.get(REPORT_LIFECYCLE).map(|v| v.trim()) {
        Some("1") => {}
        other => push(
            REPORT_LIFECYCLE,
            ProblemKind::LifecycleOff,
            format!(
                "{}: the plugin does not register, so the daemon never sees the job end",
                other.map(|v| format!("set to \"{v}\"")).unwrap_or_else(|| "not set".into())
            ),
        ),
    }
    out
}

/// Checks one binding variable; returns its CPUs per NIC when it parsed.
fn check_bindings(
    vars: &BTreeMap<String, String>,
    name: &str,
    expect: &Expect<'_>,
    push: &mut impl FnMut(&str, ProblemKind, String),
) -> Option<BTreeMap<String, BTreeSet<u32>>> {
    let Some(v) = vars.get(name) else {
        if expect.generated.is_none_or(|g| g.get(name).is_some()) {
            push(name, ProblemKind::Missing, "not set: the plugin's threads run on any CPU".into());
        }
        return None;
    };
    let entries = match bindings::parse(v) {
        Ok(e) => e,
        Err(e) => {
            push(name, ProblemKind::Malformed, e.to_string());
            return None;
        }
    };
    let mut map: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for (nic, set) in entries {
        map.entry(nic).or_default().extend(set);
    }
    for nic in map.keys().filter(|n| !expect.ifnames.contains(n)) {
        push(name, ProblemKind::BindingUnmanagedNic, format!("{nic} is not a NIC this daemon manages"));
    }
    for nic in expect.ifnames.iter().filter(|n| !map.contains_key(*n)) {
        push(name, ProblemKind::BindingMissingNic, format!("{nic} has no binding"));
    }
    for n in expect.nics {
        let Some(set) = map.get(&n.ifname) else { continue };
        let outside: BTreeSet<u32> = set.difference(&n.node_cpus).copied().collect();
        if !outside.is_empty() {
            push(
                name,
                ProblemKind::WrongNumaNode,
                format!(
                    "{}: CPUs {} are not on its NUMA node {} (CPUs {})",
                    n.ifname,
                    cpus::format(&outside),
                    n.node,
                    cpus::format(&n.node_cpus)
                ),
            );
        }
    }
    Some(map)
}

/// Reads `NAME=value` lines as a shell would for the simple files this
/// command writes: `export ` prefixes, comments, blank lines, single or
/// double quotes around the value. Returns the line number of anything else.
pub fn parse_env_file(text: &str) -> Result<BTreeMap<String, String>, usize> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line).trim_start();
        let (name, value) = line.split_once('=').ok_or(i + 1)?;
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(i + 1);
        }
        out.insert(name.to_string(), unquote(value).ok_or(i + 1)?);
    }
    Ok(out)
}

/// Undoes [`super::env::shell_quote`] and plain double quotes.
fn unquote(v: &str) -> Option<String> {
    let v = v.trim();
    if let Some(inner) = v.strip_prefix('"') {
        return inner.strip_suffix('"').map(|s| s.replace("\\\"", "\"").replace("\\\\", "\\"));
    }
    if !v.contains('\'') {
        return Some(v.to_string());
    }
    // Concatenated single-quoted pieces and bare backslash-quotes: 'a'\''b'.
    let mut out = String::new();
    let mut rest = v;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("\\'") {
            out.push('\'');
            rest = r;
        } else if let Some(r) = rest.strip_prefix('\'') {
            let end = r.find('\'')?;
            out.push_str(&r[..end]);
            rest = &r[end + 1..];
        } else {
            let end = rest.find(['\'', '\\']).unwrap_or(rest.len());
            if end == 0 {
                return None;
            }
            out.push_str(&rest[..end]);
            rest = &rest[end..];
        }
    }
    Some(out)
}
