//! Startup, in order: prime the NICs → allocate the pools → bind them to
//! their queues → open the pool endpoints → turn header split on → tune
//! the host → open the rule endpoints. Each step records what it changed in
//! the [`Node`], so that a failure at any step undoes exactly that.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::config::flags::SetupParam;
use crate::config::flags::TenantIsolation;
use crate::endpoint::budget::ConnBudget;
use crate::endpoint::pause::Gate;
use crate::endpoint::Endpoint;
use crate::gpu::{RxPool, ShmemType};
use crate::host::tuning::{HostTuning, TuningPlan};
use crate::identity::tenant::{cgroup2_mount, GpuDevices};
use crate::identity::{ClientTracker, LeasePolicy, TenantPolicy};
use crate::metrics::Metrics;
use crate::nic::prime;
use crate::rules::table::NicRules;
use crate::server::{self, AppRegistry, GpuEntry, ServerState};
use crate::steering::apply::NicRuleThread;
use crate::steering::{intake, GpuSlot, RulePath};
use crate::types::pci::PciAddr;

use super::debug_view::config_json;
use super::events::{address_map, spawn_reaper};
use super::http_routes::Routes;
use super::teardown::Node;
use super::{ms, Backends, Config, DaemonError};

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
    /// Runs every step; on error, `node` holds what was done so far.
    pub async fn run(&self, node: &mut Node) -> Result<(), DaemonError> {
        self.prime(node)?;
        self.allocate(node)?;
        self.bind(node)?;
        let state = self.server_state(node)?;
        self.open_pool_endpoints(node, &state)?;
        self.enable_header_split(node)?;
        self.tune_host(node);
        self.open_rule_endpoints(node, &state)?;
        let _ = self.routes.state.set(state);
        let _ = self.routes.config_json.set(config_json(self.config, self.backends, node));
        Ok(())
    }

    /// Primes every NIC, in parallel; keeps what succeeded so it can be undone.
    /// A takeover adopts the undo logs (and a simulated NIC's own state) instead.
    fn prime(&self, node: &mut Node) -> Result<(), DaemonError> {
        let (topo, nic) = (&self.config.topology, &self.backends.nic);
        if let Some(h) = node.adopting.as_mut() {
            node.primed = std::mem::take(&mut h.primed);
            let handed: Vec<&str> = node.primed.iter().map(|p| p.ifname.as_str()).collect();
            let ours: Vec<&str> = topo.nics.iter().map(|n| n.ifname.as_str()).collect();
            if handed != ours {
                return Err(DaemonError::Takeover(format!(
                    "NICs {} were handed over, this daemon manages {}",
                    crate::types::list(&handed),
                    crate::types::list(&ours)
                )));
            }
            // The simulated NICs' state and each NIC's rule table, all at once.
            let (sim, tables, primed) = (&h.sim, &h.tables, &node.primed);
            let (sim, rules) = std::thread::scope(|s| {
                let sim = s.spawn(|| nic.adopt_state(sim));
                let rules: Vec<_> = topo
                    .nics
                    .iter()
                    .zip(primed)
                    .map(|(n, p)| {
                        s.spawn(move || adopt_table(tables, n, topo.max_rx_rules.min(p.rule_capacity)))
                    })
                    .collect();
                let rules: Vec<_> = rules.into_iter().map(|r| r.join().expect("table thread")).collect();
                (sim.join().expect("sim thread"), rules)
            });
            sim.map_err(DaemonError::Takeover)?;
            let rules: Result<Vec<_>, String> = rules.into_iter().map(|r| r.map(Some)).collect();
            h.rules = rules.map_err(DaemonError::Takeover)?;
            return Ok(());
        }
        let t = Instant::now();
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = topo
                .nics
                .iter()
                .map(|n| s.spawn(|| prime::prime(nic.as_ref(), &n.ifname, topo.rss_set_size)))
                .collect();
            handles.into_iter().map(|h| h.join().expect("prime thread")).collect()
        });
        let mut first_err = None;
        for r in results {
            match r {
                Ok(p) => node.primed.push(p),
                Err(e) => {
                    self.metrics.nic_op_failed(&e.source);
                    first_err = first_err.or(Some(e))
                }
            }
        }
        if let Some(e) = first_err {
            return Err(DaemonError::Prime(e));
        }
        for p in &node.primed {
            topo.validate_channels(&p.ifname, p.channels).map_err(DaemonError::Channels)?;
        }
        tracing::info!(nics = node.primed.len(), backend = nic.backend(), elapsed_ms = ms(t), "NICs primed");
        Ok(())
    }

    /// One pool per GPU, in parallel.
    fn allocate(&self, node: &mut Node) -> Result<(), DaemonError> {
        let (topo, alloc) = (&self.config.topology, &self.backends.alloc);
        let t = Instant::now();
        if let Some(h) = node.adopting.as_mut() {
            let handed = std::mem::take(&mut h.pools);
            let gpus: Vec<PciAddr> = handed.iter().map(|p| p.gpu).collect();
            for (gpu, r) in gpus.into_iter().zip(crate::gpu::adopt_all(alloc.as_ref(), handed)) {
                let pool: Arc<dyn RxPool> = Arc::from(r.map_err(DaemonError::Allocate)?);
                self.metrics.pool_bytes.with_label_values(&[&gpu.to_string()]).set(pool.size() as i64);
                node.pools.push((gpu, pool));
            }
            let missing: Vec<_> =
                topo.gpus().filter(|(_, g)| !node.pools.iter().any(|(p, _)| *p == g.pci)).collect();
            if let Some((_, g)) = missing.first() {
                return Err(DaemonError::Takeover(format!("no pool was handed over for GPU {}", g.pci)));
            }
            return Ok(());
        }
        let gpus: Vec<PciAddr> = topo.gpus().map(|(_, g)| g.pci).collect();
        let requests: Vec<(PciAddr, u64)> = gpus.iter().map(|&g| (g, topo.rx_pool_size)).collect();
        let pools = crate::gpu::allocate_all(alloc.as_ref(), &requests, self.config.flags.gpu_shmem_type);
        for (gpu, r) in gpus.iter().zip(pools) {
            let pool: Arc<dyn RxPool> = Arc::from(r.map_err(DaemonError::Allocate)?);
            self.metrics.pool_bytes.with_label_values(&[&gpu.to_string()]).set(pool.size() as i64);
            node.pools.push((*gpu, pool));
        }
        tracing::info!(
            gpus = node.pools.len(),
            backend = alloc.backend(),
            elapsed_ms = ms(t),
            "pools allocated"
        );
        Ok(())
    }

    /// Binds each GPU's pool to that GPU's queues on its NIC.
    fn bind(&self, node: &mut Node) -> Result<(), DaemonError> {
        let binder = &self.backends.binder;
        let t = Instant::now();
        if let Some(h) = node.adopting.as_mut() {
            for b in std::mem::take(&mut h.bindings) {
                node.bindings.push(Box::new(b));
            }
            return Ok(());
        }
        for (nic, gpu) in self.config.topology.gpus() {
            let pool = &node.pools.iter().find(|(p, _)| *p == gpu.pci).expect("allocated above").1;
            let binding = binder
                .bind(pool.as_ref(), gpu.pci, &nic.ifname, nic.pci, &gpu.queues)
                .map_err(DaemonError::Bind)?;
            node.bindings.push(binding);
        }
        tracing::info!(
            bindings = node.bindings.len(),
            backend = binder.backend(),
            elapsed_ms = ms(t),
            "pools bound"
        );
        Ok(())
    }

    /// Tenant isolation as the flags set it, with the GPUs' device nodes.
    fn tenant_policy(&self) -> TenantPolicy {
        let flags = &self.config.flags;
        let pcis: Vec<String> = self.config.topology.gpus().map(|(_, g)| g.pci.to_string()).collect();
        let simulated = self.backends.alloc.backend() == "host";
        let procfs = crate::gpu::mig::driver_procfs(&flags.procfs_root());
        let devices = GpuDevices::from_driver(&procfs, &pcis, simulated);
        let cgroup2 = std::fs::read_to_string("/proc/self/mounts").ok().and_then(|m| cgroup2_mount(&m));
        if flags.tenant_isolation != TenantIsolation::Off {
            tracing::info!(
                mode = flags.tenant_isolation.name(),
                max_rules_per_tenant = flags.max_rules_per_tenant,
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
    }

    /// The state the endpoints serve from, with one rule thread per NIC. The
    /// rule threads see no request until the rule endpoints open.
    fn server_state(&self, node: &mut Node) -> Result<Arc<ServerState>, DaemonError> {
        let (flags, topo) = (&self.config.flags, &self.config.topology);
        let mut gpus = HashMap::new();
        let mut nic_threads = Vec::new();
        let stopping = Arc::new(AtomicBool::new(false));
        let tenants = Arc::new(self.tenant_policy());
        tenants.defer_flow_checks();
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
            let adopted = node.adopting.as_mut().and_then(|h| h.rules.get_mut(ni)?.take());
            if let Some(rules) = &adopted {
                tenants.count_adopted(rules.iter().filter_map(|(_, e)| e.owner.tenant));
            }
            let w = NicRuleThread::new(
                &n.ifname,
                capacity,
                gq,
                nic,
                self.metrics.clone(),
                stopping.clone(),
                tenants.clone(),
                adopted,
            )
            .map_err(|source| DaemonError::NicRuleThread { ifname: n.ifname.clone(), source })?;
            nic_threads.push(w);
        }
        let policy = LeasePolicy {
            track: flags.leases || flags.shutdown_when_all_clients_exited || tenants.checks(),
            reclaim: flags.leases,
        };
        let (clients, exits) = ClientTracker::new(policy, self.metrics.clone(), tenants.clone());
        if let Some(h) = node.adopting.as_mut() {
            let next = h.next_lease;
            clients.adopt(&h.leases, next, &mut h.fds).map_err(DaemonError::Takeover)?;
        }
        let idle = (flags.client_idle_timeout > 0).then(|| Duration::from_secs(flags.client_idle_timeout));
        let conn_limit = Arc::new(ConnBudget::new(flags.max_connections as usize, idle));
        let gate = Arc::new(Gate::default());
        if node.adopting.is_some() {
            // Nothing is served until the daemon taken over from has committed.
            gate.pause();
        }
        let rules = Arc::new(RulePath::new(
            nic_threads,
            gpus.iter().map(|(pci, g): (&PciAddr, &GpuEntry)| (*pci, g.slot)),
            self.metrics.clone(),
            conn_limit.clone(),
            clients.clone(),
            stopping.clone(),
            tenants.clone(),
            gate.clone(),
        ));
        let state = Arc::new(ServerState {
            gpus: gpus.into_iter().collect(),
            rules,
            registry: AppRegistry::default(),
            metrics: self.metrics.clone(),
            conn_limit,
            clients,
            stopping,
            tenants,
            gate,
        });
        spawn_reaper(Arc::downgrade(&state), exits);
        state.rules.set_addresses(address_map(self.backends.nic.as_ref(), topo));
        node.state = Some(state.clone());
        // `tcpx-rxdm status` answers (not ready) from here on.
        let l = node
            .dir
            .bind_with_mode(server::status::SOCKET, flags.status_socket_mode)
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

    fn enable_header_split(&self, node: &mut Node) -> Result<(), DaemonError> {
        if node.adopting.is_some() {
            return Ok(()); // on already; the undo log came with the NIC
        }
        let t = Instant::now();
        for p in &mut node.primed {
            p.enable_header_split(self.backends.nic.as_ref()).map_err(|e| {
                self.metrics.nic_op_failed(&e.source);
                DaemonError::HeaderSplit(e)
            })?;
        }
        tracing::info!(elapsed_ms = ms(t), "header split enabled");
        Ok(())
    }

    /// Host tuning, best effort: failures are logged, what was applied is
    /// undone at shutdown. Only where the NIC backend drives real NICs.
    fn tune_host(&self, node: &mut Node) {
        let flags = &self.config.flags;
        if let Some(h) = node.adopting.as_mut() {
            node.tuning = h.tuning.take();
            return;
        }
        if !self.backends.nic.capabilities().host_tuning {
            return;
        }
        let SetupParam::Tune(params) = flags.setup_param else {
            return;
        };
        let t = Instant::now();
        let plan = match &flags.tuning_script_path {
            Some(dir) => TuningPlan::Script { dir: dir.clone(), args: params.script_args() },
            None => TuningPlan::Native { procfs_root: flags.procfs_root(), sysfs_root: flags.sysfs_root() },
        };
        let (tuning, errors) = HostTuning::apply(&params, &plan);
        for e in errors {
            // The manifests mount the host's /sys read-only on purpose.
            match e.read_only_mount() {
                true => tracing::info!(error = %e, "host tuning step left out"),
                false => tracing::warn!(error = %e, "host tuning step failed"),
            }
        }
        node.tuning = Some(tuning);
        tracing::info!(elapsed_ms = ms(t), "host tuning applied");
    }

    fn open_rule_endpoints(&self, node: &mut Node, state: &Arc<ServerState>) -> Result<(), DaemonError> {
        let t = Instant::now();
        let mut rule_listeners = Vec::new();
        for ep in [Endpoint::RuleManager, Endpoint::RuleUninstall] {
            let l = node.dir.bind(&ep.socket_name()).map_err(DaemonError::Endpoint)?;
            let socket = l.into_std().map_err(|source| DaemonError::RuleIo { source })?;
            rule_listeners.push(intake::Listener { socket, endpoint: ep });
        }
        let (rule_conns, other_conns): (Vec<_>, Vec<_>) = match node.adopting.as_mut() {
            Some(h) => std::mem::take(&mut h.conns).into_iter().partition(|c| c.endpoint.is_rule()),
            None => Default::default(),
        };
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

/// NIC `n`'s rule table as handed over, rebuilt for `capacity` slots.
fn adopt_table(
    tables: &[crate::wire::handover::RuleTable],
    n: &crate::types::topology::NicSpec,
    capacity: u32,
) -> Result<NicRules, String> {
    let table = tables
        .iter()
        .find(|t| t.ifname == n.ifname)
        .ok_or_else(|| format!("no rule table was handed over for {}", n.ifname))?;
    let queues: Vec<Vec<u32>> = n.gpus.iter().map(|g| g.queues.clone()).collect();
    NicRules::from_wire(table, capacity, &queues)
}
