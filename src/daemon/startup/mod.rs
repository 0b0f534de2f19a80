//! Startup, in order: prime the NICs → allocate the pools → bind them to
//! their queues → open the pool endpoints → turn header split on → tune
//! the host → open the rule endpoints. Each step records what it changed in
//! the [`Node`], so that a failure at any step undoes exactly that.
//!
//! Two builders give the same running daemon: [`Startup::fresh`] does each
//! step's work (`fresh.rs`), [`Startup::adopted`] takes what a daemon taken
//! over from handed on in its place (`adopted.rs`). The steps that are the
//! same either way (the shared state and the rule threads, the endpoints)
//! are here.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::config::flags::TenantIsolation;
use crate::endpoint::budget::ConnBudget;
use crate::endpoint::pause::{Gate, Parked};
use crate::endpoint::Endpoint;
use crate::gpu::ShmemType;
use crate::identity::tenant::{cgroup2_mount, GpuDevices};
use crate::identity::workload;
use crate::identity::{ClientTracker, LeasePolicy, TenantPolicy};
use crate::metrics::Metrics;
use crate::rules::table::NicRules;
use crate::server::{self, AppRegistry, GpuEntry, ServerState};
use crate::steering::apply::NicRuleThread;
use crate::steering::{intake, GpuSlot, RulePath, Shared};
use crate::types::pci::PciAddr;

use super::debug_view::config_json;
use super::events::{address_map, spawn_reaper};
use super::http_routes::Routes;
use super::takeover::{Handed, TakeoverError};
use super::teardown::Node;
use super::{ms, Backends, Config, DaemonError};

mod adopted;
mod fresh;

/// What the steps of startup share.
pub(super) struct Startup<'a> {
    pub config: &'a Config,
    pub backends: &'a Backends,
    pub metrics: &'a Arc<Metrics>,
    pub routes: &'a Arc<Routes>,
    pub shutdown: watch::Receiver<bool>,
    /// Dropped by every connection task when it ends (drain on shutdown).
    pub done: mpsc::Sender<()>,
}

impl Startup<'_> {
    /// A daemon made here: every step does its work. On error, `node`
    /// holds what was done so far.
    pub async fn fresh(&self, node: &mut Node) -> Result<(), DaemonError> {
        self.prime(node)?;
        self.allocate(node)?;
        self.bind(node)?;
        let state = self.server_state(node, None)?;
        self.open_pool_endpoints(node, &state)?;
        self.enable_header_split(node)?;
        self.tune_host(node);
        self.open_rule_endpoints(node, &state, Vec::new())?;
        self.publish(node, state);
        Ok(())
    }

    /// A daemon made of what the daemon taken over from handed on: each
    /// step adopts its part (header split is on already: the undo log came
    /// with the NIC), and nothing is served until that daemon has committed.
    /// On error, `node` holds what was adopted so far; the rest of `handed`
    /// is closed.
    pub async fn adopted(&self, node: &mut Node, mut handed: Handed) -> Result<(), DaemonError> {
        let rules = self.adopt_nics(node, &mut handed)?;
        self.adopt_pools(node, &mut handed)?;
        node.bindings.extend(std::mem::take(&mut handed.bindings).into_iter().map(|b| Box::new(b) as _));
        let state = self.server_state(node, Some((&mut handed, rules)))?;
        self.open_pool_endpoints(node, &state)?;
        node.tuning = handed.tuning.take();
        self.open_rule_endpoints(node, &state, std::mem::take(&mut handed.conns))?;
        self.publish(node, state);
        Ok(())
    }

    /// What the HTTP routes serve from, once started.
    fn publish(&self, node: &Node, state: Arc<ServerState>) {
        let _ = self.routes.state.set(state);
        let _ = self.routes.config_json.set(config_json(self.config, self.backends, node));
    }

    /// Tenant isolation as the flags set it, with the GPUs' device nodes.
    fn tenant_policy(&self) -> TenantPolicy {
        let flags = &self.config.flags;
        let pcis: Vec<String> = self.config.topology.gpus().map(|(_, g)| g.pci.to_string()).collect();
        let simulated = self.backends.alloc.backend() == "host";
        let procfs = crate::gpu::mig::driver_procfs(&flags.procfs_root());
        let devices = GpuDevices::from_driver(&procfs, &pcis, simulated);
        let cgroup2 = std::fs::read_to_string("/proc/self/mounts").ok().and_then(|m| cgroup2_mount(&m));
        let workloads = workload::Rule::from_depth(flags.workload_cgroup_depth);
        if flags.tenant_isolation != TenantIsolation::Off {
            tracing::info!(
                mode = flags.tenant_isolation.name(),
                max_rules_per_tenant = flags.max_rules_per_tenant,
                workloads = %match workloads {
                    workload::Rule::Layouts => "Kubernetes Pods, Slurm jobs, systemd units, else cgroups".into(),
                    workload::Rule::Depth(n) => format!("the first {n} levels of the cgroup path"),
                },
                gpu_minors = %crate::types::list(&devices.minors),
                cgroup2 = cgroup2.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "not mounted".into()),
                "tenant isolation"
            );
        }
        TenantPolicy::new(
            flags.tenant_isolation,
            flags.max_rules_per_tenant,
            devices,
            cgroup2,
            Some(self.metrics.clone()),
        )
        .with_workloads(workloads)
    }

    /// What every endpoint shares: metrics, the connection budget, the
    /// client tracker, the stop flag, tenant isolation and the takeover gate
    /// (paused until a daemon taken over from has committed); and the
    /// tracker's exits, for the reaper.
    fn shared(
        &self,
        adopted: bool,
    ) -> (Arc<Shared>, tokio::sync::mpsc::UnboundedReceiver<std::num::NonZeroU32>) {
        let flags = &self.config.flags;
        let tenants = Arc::new(self.tenant_policy());
        tenants.defer_flow_checks();
        let policy = LeasePolicy {
            track: flags.leases || flags.shutdown_when_all_clients_exited || tenants.checks(),
            reclaim: flags.leases,
        };
        let (clients, exits) = ClientTracker::new(policy, self.metrics.clone(), tenants.clone());
        let idle = (flags.client_idle_timeout > 0).then(|| Duration::from_secs(flags.client_idle_timeout));
        let gate = Arc::new(Gate::default());
        if adopted {
            // Nothing is served until the daemon taken over from has committed.
            gate.pause();
        }
        let shared = Shared {
            metrics: self.metrics.clone(),
            conn_limit: Arc::new(ConnBudget::new(flags.max_connections as usize, idle)),
            clients,
            stopping: Arc::new(AtomicBool::new(false)),
            tenants,
            gate,
        };
        (Arc::new(shared), exits)
    }

    /// The state the endpoints serve from, with one rule thread per NIC. The
    /// rule threads see no request until the rule endpoints open. Adopted:
    /// the handed clients, and each NIC's rule table rebuilt for this daemon
    /// (topology order).
    fn server_state(
        &self,
        node: &mut Node,
        mut adopted: Option<(&mut Handed, Vec<Option<NicRules>>)>,
    ) -> Result<Arc<ServerState>, DaemonError> {
        let topo = &self.config.topology;
        let (shared, exits) = self.shared(adopted.is_some());
        let workloads = adopted.as_ref().map(|(h, _)| shared.clients.handed_workloads(&h.leases));
        let mut gpus = HashMap::new();
        let mut nic_threads = Vec::new();
        for (ni, (n, p)) in topo.nics.iter().zip(&node.primed).enumerate() {
            for (gi, g) in n.gpus.iter().enumerate() {
                let pool = node.pools.iter().find(|(pci, _)| *pci == g.pci).map(|(_, p)| Arc::downgrade(p));
                let ordinal = gpus.len();
                let slot = GpuSlot { nic: ni, index: gi, ordinal };
                gpus.insert(g.pci, GpuEntry { slot, queues: g.queues.clone(), pool });
            }
            let capacity = topo.max_rx_rules.min(p.rule_capacity);
            if capacity < topo.max_rx_rules {
                tracing::warn!(ifname = %n.ifname, capacity, max_rx_rules = topo.max_rx_rules, "NIC has fewer rule slots than max_rx_rules");
            }
            let gq = n.gpus.iter().map(|g| (g.pci, g.queues.clone())).collect();
            let nic = self.backends.nic.clone();
            let mut table = adopted.as_mut().and_then(|(_, rules)| rules.get_mut(ni)?.take());
            if let (Some(rules), Some(ids)) = (&mut table, &workloads) {
                rules.retenant(|t| ids.get(&t).copied().unwrap_or(t));
                shared.tenants.count_adopted(rules.iter().filter_map(|(_, e)| e.owner.tenant));
            }
            let w = NicRuleThread::new(&n.ifname, capacity, gq, nic, &shared, table)
                .map_err(|source| DaemonError::NicRuleThread { ifname: n.ifname.clone(), source })?;
            nic_threads.push(w);
        }
        if let Some((h, _)) = adopted {
            let next = h.next_lease;
            shared.clients.adopt(&h.leases, next, &mut h.fds).map_err(TakeoverError::Adopt)?;
        }
        let slots = gpus.iter().map(|(pci, g): (&PciAddr, &GpuEntry)| (*pci, g.slot));
        let rules = Arc::new(RulePath::new(nic_threads, slots, shared.clone()));
        let state = Arc::new(ServerState {
            gpus: gpus.into_iter().collect(),
            rules,
            registry: AppRegistry::default(),
            shared,
        });
        spawn_reaper(Arc::downgrade(&state), exits);
        state.rules.set_addresses(address_map(self.backends.nic.as_ref(), topo));
        node.state = Some(state.clone());
        // `tcpx-rxdm status` answers (not ready) from here on.
        let l = node
            .dir
            .bind_with_mode(server::status::SOCKET, self.config.flags.status_socket_mode)
            .map_err(DaemonError::Endpoint)?;
        server::status::spawn(l, state.clone(), self.shutdown.clone());
        Ok(state)
    }

    fn open(&self, node: &mut Node, state: &Arc<ServerState>, ep: Endpoint) -> Result<(), DaemonError> {
        let l = node.dir.bind(&ep.socket_name()).map_err(DaemonError::Endpoint)?;
        server::spawn_endpoint(l, ep, state.clone(), self.shutdown.clone(), self.done.clone());
        Ok(())
    }

    fn open_pool_endpoints(&self, node: &mut Node, state: &Arc<ServerState>) -> Result<(), DaemonError> {
        let t = Instant::now();
        for (_, g) in self.config.topology.gpus() {
            self.open(node, state, Endpoint::GpuFd(g.pci))?;
            self.open(node, state, Endpoint::GpuMetadata(g.pci))?;
        }
        if self.config.flags.gpu_shmem_type == ShmemType::File {
            self.open(node, state, Endpoint::GpuIpcHandle)?;
        }
        tracing::info!(elapsed_ms = ms(t), "pool endpoints started");
        Ok(())
    }

    /// The rule endpoints, with the handed connections (`conns`) of an
    /// adopted daemon served again.
    fn open_rule_endpoints(
        &self,
        node: &mut Node,
        state: &Arc<ServerState>,
        conns: Vec<Parked>,
    ) -> Result<(), DaemonError> {
        let t = Instant::now();
        let mut rule_listeners = Vec::new();
        for ep in [Endpoint::RuleManager, Endpoint::RuleUninstall] {
            let l = node.dir.bind(&ep.socket_name()).map_err(DaemonError::Endpoint)?;
            let socket = l.into_std().map_err(|source| DaemonError::RuleIo { source })?;
            rule_listeners.push(intake::Listener { socket, endpoint: ep });
        }
        let (rule_conns, other_conns): (Vec<_>, Vec<_>) =
            conns.into_iter().partition(|c| c.endpoint.is_rule());
        intake::spawn(
            rule_listeners,
            intake::io_threads(self.config.flags.rule_io_threads),
            state.rules.clone(),
            self.shutdown.clone(),
            self.done.clone(),
            rule_conns,
        )
        .map_err(|source| DaemonError::RuleIo { source })?;
        for ep in [Endpoint::QueueIdsByGpu, Endpoint::Registry] {
            self.open(node, state, ep)?;
        }
        for c in other_conns {
            server::spawn_adopted(c, state.clone(), self.shutdown.clone(), self.done.clone())
                .map_err(DaemonError::Endpoint)?;
        }
        for p in &node.primed {
            self.metrics.set_nic_info(&p.ifname, p.header_split.name(), self.backends.binder.backend());
        }
        tracing::info!(elapsed_ms = ms(t), "rule endpoints started");
        Ok(())
    }
}
