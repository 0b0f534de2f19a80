//! An uninstall named with half its address bytes (the NCCL plugin's IPv6
//! flows, see `identity::flows`), repaired against the NIC thread's own rule
//! table: the plugin uninstalls before it closes the connection, and the
//! rule it means is the one it installed, so no connection is looked up.
//! The caller's own rules whose ports and /64 prefixes fit count (its
//! tenant's with isolation on, else its process's). One: that rule goes, even
//! if a connection with the same ports appeared since the install. None: the
//! flow is unknown, "Ok." as for any unknown flow. Several: refused, naming
//! them (they are the caller's own); nothing goes.

use crate::rules::table::Owner;
use crate::types::status::StatusCode;

use super::*;

/// Whether the rule installed by `rule` is `me`'s own: the same tenant
/// where tenants are told (`by_tenant`) and both are known, else the same
/// lease, else the same process; a client the daemon cannot tell owns the
/// rules of nobody else it cannot tell.
fn same_client(rule: &Owner, me: &Owner, by_tenant: bool) -> bool {
    if let (true, Some(a), Some(b)) = (by_tenant, rule.tenant, me.tenant) {
        return a == b;
    }
    match ((rule.lease, me.lease), (rule.pid, me.pid)) {
        ((Some(a), Some(b)), _) => a == b,
        (_, (Some(a), Some(b))) => a == b,
        (_, (None, None)) => rule.lease.is_none() && me.lease.is_none(),
        _ => false,
    }
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
        let by_tenant = self.tenants.checks();
        let fits = rules.fitting(flow, |o| same_client(o, &who.owner, by_tenant));
        match fits.as_slice() {
            [] => Ok((*flow, false)),
            [(f, _)] => {
                tracing::debug!(ifname = %self.ifname(), sent = %flow, rule = %f, "garbled IPv6 uninstall repaired");
                Ok((*f, true))
            }
            several => {
                let shown: Vec<String> = several.iter().map(|(f, _)| f.to_string()).collect();
                Err(RuleFailure::new(
                    StatusCode::FailedPrecondition,
                    format!(
                        "flow {flow} names only the first 8 bytes of each address, and {} rules of this client \
                         fit it: {}; the daemon does not guess and removes none",
                        shown.len(),
                        shown.join(", ")
                    ),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

    fn owner(tenant: Option<u64>, lease: Option<u32>, pid: Option<u32>) -> Owner {
        Owner {
            tenant,
            lease: lease.and_then(NonZeroU32::new),
            pid: pid.and_then(NonZeroU32::new),
            repaired: true,
        }
    }

    #[test]
    fn a_rule_is_the_callers_by_tenant_then_lease_then_process() {
        let same = |a: &Owner, b: &Owner, t| same_client(a, b, t);
        assert!(
            same(&owner(Some(1), Some(5), Some(9)), &owner(Some(1), Some(6), Some(10)), true),
            "one tenant"
        );
        assert!(!same(&owner(Some(1), Some(5), Some(9)), &owner(Some(2), Some(5), Some(9)), true));
        // Isolation off: tenants are not told, the process is.
        assert!(
            !same(&owner(Some(1), Some(5), Some(9)), &owner(Some(1), Some(6), Some(9)), false),
            "other lease"
        );
        assert!(same(&owner(None, Some(5), Some(9)), &owner(None, Some(5), Some(10)), false));
        assert!(same(&owner(None, None, Some(9)), &owner(None, None, Some(9)), false));
        assert!(!same(&owner(None, None, Some(9)), &owner(None, None, Some(10)), false));
        assert!(!same(&owner(None, None, Some(9)), &owner(None, None, None), false));
        assert!(same(&owner(None, None, None), &owner(None, None, None), false), "nobody and nobody");
        assert!(!same(&owner(None, Some(5), None), &owner(None, None, None), false));
    }
}
