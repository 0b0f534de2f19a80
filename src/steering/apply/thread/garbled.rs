//! An uninstall named with half its address bytes (the NCCL plugin's IPv6
//! flows, see `identity::flows`), repaired against the NIC thread's own rule
//! table: the plugin uninstalls before it closes the connection, and the
//! rule it means is the one its process installed, so no connection is
//! looked up. The caller's own rules whose ports and /64 prefixes fit count:
//! its process's, as an install is narrowed to the connections its process
//! holds. Processes of one tenant often share ports and prefixes: counting
//! the whole tenant's rules would make each one's uninstall ambiguous and
//! leak all their rules until they exit. Only where the process cannot be
//! told from the tenant's others (leases off; a kernel that tells a process
//! only per connection) do the tenant's rules count.
//!
//! One: that rule goes, even if a connection with the same ports appeared
//! since the install. None: the flow is unknown, "Ok." as for any unknown
//! flow, whoever else's rules fit. Several: refused, naming them (they are
//! the caller's own); nothing goes.

use std::num::NonZeroU32;

use crate::rules::table::Owner;
use crate::types::status::StatusCode;

use super::*;

/// Why the daemon cannot tell which of a tenant's processes installed a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Untold {
    /// Leases are off (`--leases=false`): rules record no lease to tell
    /// their process by.
    NoLeases,
    /// Each connection of the process has a lease of its own (see
    /// `Lease::names_process`).
    LeasePerConnection,
}

/// Whose rules an uninstall may take for the one its garbled flow means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// The asking process's.
    Process,
    /// Its tenant's, where the process cannot be told apart.
    Tenant(Untold),
    /// Those of clients the daemon cannot identify, as it cannot identify
    /// this one (isolation off, no lease, no pid).
    Nobody,
}

/// The client asking, as far as whose rules it may remove goes.
#[derive(Debug, Clone, Copy)]
struct Asker {
    owner: Owner,
    /// Tenants are told apart (isolation on).
    by_tenant: bool,
    /// Its lease, where that names its process on any connection.
    process: Result<NonZeroU32, Untold>,
}

impl Asker {
    fn of(who: &Requester, by_tenant: bool) -> Asker {
        let process = match &who.client.lease {
            Some(l) if l.names_process() => Ok(l.id()),
            Some(_) => Err(Untold::LeasePerConnection),
            None => Err(Untold::NoLeases),
        };
        Asker { owner: who.owner, by_tenant, process }
    }

    fn scope(&self) -> Scope {
        let me = &self.owner;
        match self.process {
            Ok(_) if self.by_tenant && me.tenant.is_some() => Scope::Process,
            Err(why) if self.by_tenant && me.tenant.is_some() => Scope::Tenant(why),
            _ if me.lease.is_some() || me.pid.is_some() => Scope::Process,
            _ => Scope::Nobody,
        }
    }

    /// Whether the rule installed by `rule` is the asker's own. Where
    /// tenants are told and the rule's is known: of the asker's tenant (a
    /// client of no known tenant owns none), and of those its process's
    /// where its lease names it. Otherwise the same lease, else the same
    /// pid; a client the daemon cannot tell owns the rules of nobody else it
    /// cannot tell.
    fn owns(&self, rule: &Owner) -> bool {
        let me = &self.owner;
        if let (true, Some(theirs)) = (self.by_tenant, rule.tenant) {
            let process = match self.process {
                Ok(lease) => rule.lease == Some(lease),
                Err(_) => true,
            };
            return me.tenant == Some(theirs) && process;
        }
        match ((rule.lease, me.lease), (rule.pid, me.pid)) {
            ((Some(a), Some(b)), _) => a == b,
            (_, (Some(a), Some(b))) => a == b,
            (_, (None, None)) => rule.lease.is_none() && me.lease.is_none(),
            _ => false,
        }
    }
}

/// The refusal of a garbled uninstall of `flow` that fits several rules,
/// `shown`, all of `scope`.
fn several(flow: &FlowSpec, shown: &[String], scope: Scope) -> String {
    let (n, list) = (shown.len(), shown.join(", "));
    let which = match scope {
        Scope::Process => format!("{n} rules this process installed fit it: {list}"),
        Scope::Tenant(why) => {
            let because = match why {
                Untold::NoLeases => "the daemon keeps no leases (--leases=false)",
                Untold::LeasePerConnection => {
                    "this kernel lets the daemon tell a process whose pid it cannot see only connection by \
                     connection (Linux 6.5 to 6.8)"
                }
            };
            format!(
                "{n} rules of this tenant fit it: {list}; {because}, so it cannot tell which of them this \
                 process installed"
            )
        }
        Scope::Nobody => format!(
            "{n} rules of processes the daemon could not identify fit it: {list}; it cannot identify this \
             one either"
        ),
    };
    format!(
        "flow {flow} names only the first 8 bytes of each address, and {which}; the daemon does not guess and \
         removes none"
    )
}

impl NicThread {
    /// The flow an uninstall of `flow` removes, and whether it was repaired
    /// to it: as named, unless `who` named it garbled and no rule is booked
    /// for it as named; then the one rule of `who`'s that fits it.
    pub(super) fn garbled_rule(
        &self,
        flow: &FlowSpec,
        who: &Requester,
    ) -> Result<(FlowSpec, bool), RuleFailure> {
        let rules = self.engine.rules();
        if !who.garbled || rules.get(flow).is_some() {
            return Ok((*flow, false));
        }
        let asker = Asker::of(who, self.tenants.checks());
        let fits = rules.fitting(flow, |o| asker.owns(o));
        match fits.as_slice() {
            [] => {
                if tracing::enabled!(tracing::Level::DEBUG) {
                    let all = rules.fitting(flow, |_| true).len();
                    tracing::debug!(ifname = %self.ifname(), sent = %flow, others_fitting = all, "garbled IPv6 uninstall fits no rule of the client's; none removed");
                }
                Ok((*flow, false))
            }
            [(f, _)] => {
                tracing::debug!(ifname = %self.ifname(), sent = %flow, rule = %f, "garbled IPv6 uninstall repaired");
                Ok((*f, true))
            }
            several_fit => {
                let shown: Vec<String> = several_fit.iter().map(|(f, _)| f.to_string()).collect();
                Err(RuleFailure::new(StatusCode::FailedPrecondition, several(flow, &shown, asker.scope())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::table::{NicRules, Reserve};

    fn id(n: u32) -> Option<NonZeroU32> {
        NonZeroU32::new(n)
    }

    /// The owner a rule records, and the asker's own fields alike.
    fn owner(tenant: Option<u64>, lease: u32, pid: u32) -> Owner {
        Owner { tenant, lease: id(lease), pid: id(pid), repaired: true }
    }

    /// An asker with lease `lease` (0: none) that names its process.
    fn asker(tenant: Option<u64>, lease: u32, pid: u32, by_tenant: bool) -> Asker {
        let process = id(lease).ok_or(Untold::NoLeases);
        Asker { owner: owner(tenant, lease, pid), by_tenant, process }
    }

    #[test]
    fn with_tenants_told_a_rule_is_the_askers_process_where_its_lease_names_it() {
        let me = asker(Some(1), 5, 9, true);
        assert_eq!(me.scope(), Scope::Process);
        assert!(me.owns(&owner(Some(1), 5, 9)));
        assert!(!me.owns(&owner(Some(1), 6, 10)), "another process of its tenant");
        assert!(!me.owns(&owner(Some(1), 0, 9)), "a rule of its tenant with no lease");
        assert!(!me.owns(&owner(Some(2), 5, 9)), "another tenant");
        // A client of no known tenant owns no known tenant's rule, whatever its process.
        let unknown = asker(None, 5, 9, true);
        assert!(!unknown.owns(&owner(Some(1), 5, 9)));
        assert!(unknown.owns(&owner(None, 5, 9)));
        assert!(!asker(None, 0, 0, true).owns(&owner(Some(1), 0, 0)), "nobody owns a tenant's rule");
    }

    #[test]
    fn a_process_the_daemon_cannot_tell_apart_counts_its_tenants_rules() {
        let mut me = asker(Some(1), 0, 9, true);
        assert_eq!(me.scope(), Scope::Tenant(Untold::NoLeases));
        assert!(me.owns(&owner(Some(1), 0, 10)));
        assert!(!me.owns(&owner(Some(2), 0, 9)));
        me = Asker { process: Err(Untold::LeasePerConnection), ..asker(Some(1), 5, 0, true) };
        assert_eq!(me.scope(), Scope::Tenant(Untold::LeasePerConnection));
        assert!(me.owns(&owner(Some(1), 6, 0)), "the install's connection had a lease of its own");
        assert!(!me.owns(&owner(Some(2), 5, 0)));
    }

    #[test]
    fn with_isolation_off_a_rule_is_the_askers_by_lease_then_process() {
        let off = |tenant, lease, pid| asker(tenant, lease, pid, false);
        assert!(!off(Some(1), 6, 9).owns(&owner(Some(1), 5, 9)), "other lease");
        assert!(off(None, 5, 10).owns(&owner(None, 5, 9)));
        assert!(off(None, 0, 9).owns(&owner(None, 0, 9)));
        assert!(!off(None, 0, 10).owns(&owner(None, 0, 9)));
        assert!(!off(None, 0, 0).owns(&owner(None, 0, 9)));
        assert!(off(None, 0, 0).owns(&owner(None, 0, 0)), "nobody and nobody");
        assert!(!off(None, 0, 0).owns(&owner(None, 5, 0)));
        assert_eq!(off(None, 0, 9).scope(), Scope::Process);
        assert_eq!(off(None, 0, 0).scope(), Scope::Nobody);
    }

    fn flow(src: &str, dst: &str) -> FlowSpec {
        FlowSpec { src: src.parse().unwrap(), dst: dst.parse().unwrap() }
    }

    /// Two processes of one tenant, whose connections share ports and
    /// prefixes: each one's garbled uninstall fits its own rule only.
    #[test]
    fn each_process_of_a_tenant_fits_only_its_own_rule() {
        let mut t = NicRules::new(16, &[vec![8, 9]]);
        let a = flow("[fd00:2::7]:40001", "[fd00:1::1]:5000");
        let b = flow("[fd00:2::7]:40001", "[fd00:1::2]:5000");
        let c = flow("[fd00:2::7]:40001", "[fd00:1::3]:5000");
        for (f, o) in [(a, owner(Some(1), 5, 50)), (b, owner(Some(1), 6, 60)), (c, owner(Some(1), 5, 50))] {
            assert!(matches!(t.reserve(f, 0, None, o), Reserve::New(_)));
        }
        let sent = flow("[fd00:2::dead:1]:40001", "[fd00:1::beef:2]:5000");
        let fits = |me: Asker| -> Vec<FlowSpec> {
            t.fitting(&sent, |o| me.owns(o)).into_iter().map(|(f, _)| f).collect()
        };
        let mut five = fits(asker(Some(1), 5, 50, true));
        five.sort();
        assert_eq!(five, [a, c]);
        assert_eq!(fits(asker(Some(1), 6, 60, true)), [b]);
        assert!(fits(asker(Some(1), 7, 70, true)).is_empty(), "a third process");
        assert!(fits(asker(Some(2), 6, 60, true)).is_empty(), "another tenant");
        assert_eq!(fits(asker(Some(1), 0, 70, true)).len(), 3, "leases off: the tenant's");
    }

    #[test]
    fn the_refusal_says_whose_rules_fit_and_why_it_cannot_choose() {
        let sent = flow("[fd00:2::dead:1]:40001", "[fd00:1::beef:2]:5000");
        let shown = ["r1".to_string(), "r2".to_string()];
        let said = |scope| several(&sent, &shown, scope);
        assert!(said(Scope::Process).contains("2 rules this process installed fit it: r1, r2;"));
        let no_leases = said(Scope::Tenant(Untold::NoLeases));
        assert!(
            no_leases.contains("rules of this tenant") && no_leases.contains("--leases=false"),
            "{no_leases}"
        );
        assert!(said(Scope::Tenant(Untold::LeasePerConnection)).contains("connection by connection"));
        assert!(said(Scope::Nobody).contains("could not identify"));
        for s in [Scope::Process, Scope::Tenant(Untold::NoLeases), Scope::Nobody] {
            assert!(said(s).ends_with("the daemon does not guess and removes none"), "{}", said(s));
        }
    }
}
