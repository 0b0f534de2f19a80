//! The checks on a NIC's thread, which owns the rule table: whose rule a
//! client may remove, and how many rules its workload may hold. A rule
//! records its tenant's workload (`Owner::tenant`): any process of that
//! workload may remove it, and it counts against that workload's quota.

use std::fmt::Display;

use super::{Client, Denied, Refusal, TenantPolicy};

impl TenantPolicy {
    /// May `who` remove the rule for `flow`, installed by workload `owner`?
    /// `repaired`: the request named `flow` with garbled IPv6 addresses, so
    /// `flow` is a connection the client did not name, and the refusal does
    /// not name it. Nor does it name the owner; the log does.
    pub fn check_owner(
        &self,
        endpoint: &str,
        who: &Client,
        owner: Option<u64>,
        flow: &dyn Display,
        repaired: bool,
    ) -> Result<(), Denied> {
        if !self.checks() {
            return Ok(());
        }
        let Some(t) = self.tenant(endpoint, who)? else { return Ok(()) };
        match owner {
            Some(o) if o != t.workload.id => {
                let message = || {
                    let rule = match repaired {
                        false => format!("the rule for flow {flow}"),
                        true => "the rule for the connection this IPv6 flow fits".to_string(),
                    };
                    format!(
                        "{rule} was installed by another tenant (another workload), and only that workload \
                         may remove it (workload {} asked); the rule stays",
                        t.name()
                    )
                };
                let detail = || {
                    let owner = self.name_of(o).unwrap_or_else(|| format!("id {o}"));
                    format!("the rule for {flow} is workload {owner}'s")
                };
                self.refuse_detailed(endpoint, Refusal::Owner, who, message, detail)
            }
            _ => Ok(()),
        }
    }

    /// Whether rules are counted per workload (a quota in audit or enforce).
    pub fn counts_rules(&self) -> bool {
        self.max_rules != 0 && self.checks()
    }

    /// Takes one rule of workload `tenant`'s quota; `Err` when it is used up
    /// (the rule is counted anyway in audit mode, so that the count stays right).
    pub fn take_rule(&self, endpoint: &str, who: &Client, tenant: Option<u64>) -> Result<(), Denied> {
        let Some(id) = tenant else { return Ok(()) };
        if !self.counts_rules() {
            return Ok(());
        }
        let held = {
            let mut map = self.held.lock().expect("tenant quota lock");
            let n = map.entry(id).or_default();
            if *n < self.max_rules {
                *n += 1;
                return Ok(());
            }
            *n
        };
        self.refuse(endpoint, Refusal::Quota, who, || {
            // The client's own workload: `id` is the one its rule would record.
            let name = self.name_of(id).unwrap_or_else(|| format!("id {id}"));
            format!(
                "workload {name} holds {held} rules, the limit (--max_rules_per_tenant={}, counted over all \
                 of the workload's cgroups)",
                self.max_rules
            )
        })?;
        *self.held.lock().expect("tenant quota lock").entry(id).or_default() += 1;
        Ok(())
    }

    /// Gives back one rule of workload `tenant`'s quota (a rule went away, or a taken
    /// place was not used).
    pub fn give_rule(&self, tenant: Option<u64>) {
        let Some(id) = tenant else { return };
        if !self.counts_rules() {
            return;
        }
        let mut map = self.held.lock().expect("tenant quota lock");
        if let Some(n) = map.get_mut(&id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&id);
            }
        }
    }

    /// Counts rules taken over from another daemon against their workloads'
    /// quotas (over the limit or not: they exist).
    pub fn count_adopted(&self, tenants: impl IntoIterator<Item = u64>) {
        if !self.counts_rules() {
            return;
        }
        let mut map = self.held.lock().expect("tenant quota lock");
        for id in tenants {
            *map.entry(id).or_default() += 1;
        }
    }

    /// Rules held by workload `id`, as the quota counts them.
    pub fn rules_held(&self, id: u64) -> u32 {
        self.held.lock().expect("tenant quota lock").get(&id).copied().unwrap_or(0)
    }
}
