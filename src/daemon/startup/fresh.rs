//! The steps of a fresh start that an adopted daemon takes from the one it
//! took over from instead: priming the NICs, the pools and their bindings,
//! header split and host tuning.

use std::sync::Arc;
use std::time::Instant;

use crate::config::flags::SetupParam;
use crate::gpu::RxPool;
use crate::host::tuning::{HostTuning, TuningPlan};
use crate::nic::prime;
use crate::types::pci::PciAddr;

use super::super::teardown::Node;
use super::super::{ms, DaemonError};
use super::Startup;

impl Startup<'_> {
    /// Primes every NIC, in parallel; keeps what succeeded so it can be undone.
    pub(super) fn prime(&self, node: &mut Node) -> Result<(), DaemonError> {
        let (topo, nic) = (&self.config.topology, &self.backends.nic);
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
    pub(super) fn allocate(&self, node: &mut Node) -> Result<(), DaemonError> {
        let (topo, alloc) = (&self.config.topology, &self.backends.alloc);
        let t = Instant::now();
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
    pub(super) fn bind(&self, node: &mut Node) -> Result<(), DaemonError> {
        let binder = &self.backends.binder;
        let t = Instant::now();
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

    pub(super) fn enable_header_split(&self, node: &mut Node) -> Result<(), DaemonError> {
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
    pub(super) fn tune_host(&self, node: &mut Node) {
        let flags = &self.config.flags;
        if !self.backends.nic.capabilities().host_tuning {
            return;
        }
        let SetupParam::Tune(params) = flags.setup_param else {
            return;
        };
        let t = Instant::now();
        let plan = match &flags.tuning_script_path {
            Some(dir) => TuningPlan::Script { dir: dir.clone(), args: params.script_args() },
            None => super::super::backends::native_tuning(self.config),
        };
        let (tuning, errors) = HostTuning::apply(&params, &plan);
        for e in errors {
            // The manifests mount the host's /sys read-only on purpose; a
            // Pod's namespace may lack or refuse a knob: the node's to set.
            match e.left_alone() {
                true => tracing::info!(error = %e, "host tuning step left out"),
                false => tracing::warn!(error = %e, "host tuning step failed"),
            }
        }
        node.tuning = Some(tuning);
        tracing::info!(elapsed_ms = ms(t), "host tuning applied");
    }
}
