//! The privileges check: the capabilities a daemon with these flags needs
//! (`SECURITY.md`, *Privileges*), against those this process may use. Run
//! where the daemon runs (in its container, under its unit), doctor has the
//! daemon's bounding set, so a capability missing here is missing there.

use super::{Ctx, Report, Status};
use crate::caps::{Cap, Held};
use crate::config::flags::{Flags, Takeover, TenantIsolation};

/// One capability the flags need, what for, and whether the daemon fails
/// without it (else it works, worse).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Need {
    pub cap: Cap,
    pub why: String,
    pub fatal: bool,
}

/// What a daemon with `flags` needs. `real_nics`: it drives real NICs (not
/// the simulated ones); `port_start`: the network namespace's
/// `ip_unprivileged_port_start`.
pub(super) fn needs(flags: &Flags, real_nics: bool, port_start: u16) -> Vec<Need> {
    let need = |cap, why: String, fatal| Need { cap, why, fatal };
    let mut out = Vec::new();
    if real_nics {
        out.push(need(
            Cap::NetAdmin,
            "to change the NICs (priming, header split, ntuple rules), bind pools to their queues and set \
             route metrics"
                .into(),
            true,
        ));
    }
    if let Some(group) = &flags.socket_group {
        out.push(need(Cap::Chown, format!("to give the sockets group {group} (--socket_group)"), true));
    }
    let isolation = flags.tenant_isolation;
    if isolation != TenantIsolation::Off {
        out.push(need(
            Cap::SysPtrace,
            format!(
                "to read the open files of clients of other users, or with capabilities it lacks \
                 (--tenant_isolation={})",
                isolation.name()
            ),
            isolation == TenantIsolation::Enforce,
        ));
        // Clients of root work without it: a warning, never a failure.
        out.push(need(
            Cap::DacReadSearch,
            format!(
                "to list the open files of clients of other users, whose /proc/<pid>/fd only their owner \
                 may list (--tenant_isolation={})",
                isolation.name()
            ),
            false,
        ));
    } else if flags.takeover != Takeover::Off {
        out.push(need(
            Cap::SysPtrace,
            "to prove to the running daemon that it may take over (--takeover), unless it has the same \
             capabilities"
                .into(),
            false,
        ));
    }
    if let Some(port) = flags.metrics_address.0.map(|a| a.port()).filter(|p| *p != 0 && *p < port_start) {
        out.push(need(
            Cap::NetBindService,
            format!(
                "to listen on port {port} (--metrics_address; ports below {port_start} are privileged here)"
            ),
            true,
        ));
    }
    out
}

/// The report's lines for `needs` against `held`: (name, status, found, fix).
pub(super) fn verdicts(needs: &[Need], held: &Held) -> Vec<(String, Status, String, Option<String>)> {
    needs
        .iter()
        .map(|n| {
            let name = n.cap.name().to_string();
            if held.effective.has(n.cap) {
                return (name, Status::Pass, format!("held: the daemon needs it {}", n.why), None);
            }
            let status = if n.fatal { Status::Fail } else { Status::Warn };
            let (found, fix) = match held.bounding.has(n.cap) {
                true => (
                    format!("not effective here, though in the bounding set: the daemon needs it {}", n.why),
                    "run the daemon (and doctor) as root".to_string(),
                ),
                false => (
                    format!(
                        "missing: the daemon needs it {}; this process lacks it (its bounding set: {})",
                        n.why,
                        held.bounding.describe()
                    ),
                    format!(
                        "add {} to the daemon container's securityContext.capabilities.add, or {} to the unit's \
                         CapabilityBoundingSet",
                        n.cap.short_name(),
                        n.cap
                    ),
                ),
            };
            (name, status, found, Some(fix))
        })
        .collect()
}

pub(super) fn check_privileges(r: &mut Report, ctx: &Ctx) {
    let s = "privileges";
    let port_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(1024);
    let needs = needs(ctx.flags, !ctx.sim_nic, port_start);
    let Some(held) = Held::this_thread() else {
        r.add(
            s,
            "capabilities",
            Status::Warn,
            "cannot read this process's capabilities (/proc/self/status)",
            None,
        );
        return;
    };
    if needs.is_empty() {
        let found = "the daemon needs no capability with these flags (simulated NICs, no socket group, no \
                     tenant isolation, no takeover, no port below 1024)";
        r.add(s, "capabilities", Status::Skip, found, None);
        return;
    }
    for (name, status, found, fix) in verdicts(&needs, &held) {
        r.add(s, &name, status, found, fix);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::CapSet;

    fn flags(args: &[&str]) -> Flags {
        Flags::parse_args(std::iter::once("tcpx-rxdm").chain(args.iter().copied()).map(String::from)).unwrap()
    }

    fn caps(n: &[Need]) -> Vec<Cap> {
        n.iter().map(|n| n.cap).collect()
    }

    #[test]
    fn each_mode_needs_its_set() {
        // Simulated NICs, isolation off: nothing.
        assert!(needs(&flags(&["--tenant_isolation=off"]), false, 1024).is_empty());
        // A Pod's daemon on real NICs: NET_ADMIN; a low port adds NET_BIND_SERVICE.
        let pod = needs(&flags(&["--tenant_isolation=off", "--metrics_address=0.0.0.0:80"]), true, 1024);
        assert_eq!(caps(&pod), [Cap::NetAdmin, Cap::NetBindService]);
        assert!(
            needs(&flags(&["--tenant_isolation=off", "--metrics_address=0.0.0.0:80"]), true, 0).len() == 1
        );
        // Node-wide, as the unit runs it: the four; a client of another user's
        // GPUs alone need DAC_READ_SEARCH, so the daemon works without it.
        let node =
            needs(&flags(&["--tenant_isolation=enforce", "--socket_group=tcpx", "--node_wide"]), true, 1024);
        assert_eq!(caps(&node), [Cap::NetAdmin, Cap::Chown, Cap::SysPtrace, Cap::DacReadSearch]);
        assert!(node.iter().all(|n| n.fatal == (n.cap != Cap::DacReadSearch)));
        // audit, or a takeover alone: SYS_PTRACE, but the daemon works without it.
        let audit = needs(&flags(&["--tenant_isolation=audit"]), false, 1024);
        assert_eq!((caps(&audit), audit[0].fatal), (vec![Cap::SysPtrace, Cap::DacReadSearch], false));
        let takeover = needs(&flags(&["--tenant_isolation=off", "--takeover=auto"]), false, 1024);
        assert!(takeover[0].why.contains("--takeover") && !takeover[0].fatal);
    }

    #[test]
    fn a_missing_capability_is_named_with_the_fix() {
        let node = needs(&flags(&["--tenant_isolation=enforce", "--socket_group=tcpx"]), true, 1024);
        let held = Held { effective: CapSet(1 << 12), bounding: CapSet(1 << 12 | 1) };
        let v = verdicts(&node, &held);
        assert_eq!(v[0].1, Status::Pass);
        assert!(v[0].2.starts_with("held: the daemon needs it to change the NICs"), "{}", v[0].2);
        assert_eq!((v[1].0.as_str(), v[1].1), ("CAP_CHOWN", Status::Fail));
        assert!(v[1].2.contains("not effective here, though in the bounding set"), "{}", v[1].2);
        assert_eq!((v[2].0.as_str(), v[2].1), ("CAP_SYS_PTRACE", Status::Fail));
        assert!(
            v[2].2.contains("this process lacks it (its bounding set: CAP_CHOWN, CAP_NET_ADMIN)"),
            "{}",
            v[2].2
        );
        assert!(v[2].3.as_deref().unwrap().starts_with("add SYS_PTRACE to the daemon container's"));
    }
}
