//! Datapath health: each NIC's per-queue receive counters, exported as
//! `tcpx_rxdm_queue_rx_bytes_total{nic,queue,role}`, and the steering-miss
//! check over them (`tcpx_rxdm_steering_miss{nic}`, one log line per
//! episode). The NIC is read when `/metrics` is scraped and on a slow tick
//! in between (so a miss is noticed without a scraper), never more than
//! once per [`MIN_READ_INTERVAL`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::metrics::Metrics;
use crate::nic::steering_miss::{Episode, MissConfig, Sample, SteeringWatch};
use crate::nic::NicControl;
use crate::types::topology::Topology;

/// The NIC is read at most this often.
pub const MIN_READ_INTERVAL: Duration = Duration::from_secs(1);
/// The reading between scrapes.
pub const TICK: Duration = Duration::from_secs(5);

/// One NIC's queues by role.
#[derive(Debug, Clone)]
struct NicQueues {
    ifname: String,
    rss: Vec<u32>,
    gpu: Vec<u32>,
}

#[derive(Debug, Default)]
struct Inner {
    last_read: Option<Instant>,
    /// The NIC's last value per (NIC, queue), to add only what is new to the counters.
    last: HashMap<(String, u32), u64>,
    watch: SteeringWatch,
    /// NICs whose counters could not be read, already logged.
    unreadable: HashMap<String, String>,
}

/// The counters and the steering check for the daemon's NICs.
pub struct Datapath {
    nic: Arc<dyn NicControl>,
    nics: Vec<NicQueues>,
    metrics: Arc<Metrics>,
    inner: Mutex<Inner>,
}

impl Datapath {
    pub fn new(
        topo: &Topology,
        nic: Arc<dyn NicControl>,
        metrics: Arc<Metrics>,
        cfg: MissConfig,
    ) -> Datapath {
        let nics = topo
            .nics
            .iter()
            .map(|n| NicQueues {
                ifname: n.ifname.clone(),
                rss: (0..topo.rss_set_size).collect(),
                gpu: n.gpus.iter().flat_map(|g| g.queues.iter().copied()).collect(),
            })
            .collect();
        let inner = Inner { watch: SteeringWatch::new(cfg), ..Default::default() };
        Datapath { nic, nics, metrics, inner: Mutex::new(inner) }
    }

    /// Reads every NIC's counters unless they were read less than
    /// [`MIN_READ_INTERVAL`] before `now`; updates the metrics and the check.
    /// Blocking (NIC calls).
    pub fn refresh(&self, now: Instant) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.last_read.is_some_and(|t| now.saturating_duration_since(t) < MIN_READ_INTERVAL) {
            return;
        }
        inner.last_read = Some(now);
        for n in &self.nics {
            let read = self.nic.queue_rx_bytes(&n.ifname).map_err(|e| e.to_string()).and_then(|c| {
                match c.is_empty() {
                    true => Err("the driver reports no per-queue receive counters".to_string()),
                    false => Ok(c),
                }
            });
            let counts: HashMap<u32, u64> = match read {
                Ok(c) => {
                    if inner.unreadable.remove(&n.ifname).is_some() {
                        tracing::info!(nic = %n.ifname, "per-queue receive counters readable again");
                    }
                    c.into_iter().collect()
                }
                Err(msg) => {
                    // Once per NIC and cause, not once a second.
                    if inner.unreadable.insert(n.ifname.clone(), msg.clone()).as_ref() != Some(&msg) {
                        tracing::warn!(nic = %n.ifname, error = %msg, "no per-queue receive counters; steering misses cannot be seen");
                    }
                    continue;
                }
            };
            let mut sum = |queues: &[u32], role: &str| -> u64 {
                let mut total = 0;
                for q in queues {
                    let Some(&v) = counts.get(q) else { continue };
                    total += v;
                    let last = inner.last.insert((n.ifname.clone(), *q), v).unwrap_or(0);
                    // A counter that went back was reset: all of its value is new.
                    let delta = if v >= last { v - last } else { v };
                    self.metrics
                        .queue_rx_bytes
                        .with_label_values(&[&n.ifname, &q.to_string(), role])
                        .inc_by(delta);
                }
                total
            };
            let rss_bytes = sum(&n.rss, "rss");
            let gpu_bytes = sum(&n.gpu, "gpu");
            let rules = self.metrics.rules_installed.with_label_values(&[&n.ifname]).get().max(0) as u64;
            let episode = inner.watch.observe(&n.ifname, Sample { at: now, rules, rss_bytes, gpu_bytes });
            self.metrics
                .steering_miss
                .with_label_values(&[&n.ifname])
                .set(inner.watch.missing(&n.ifname) as i64);
            match episode {
                Some(Episode::Started { nic, rss_bytes_per_sec, rules }) => tracing::warn!(
                    %nic,
                    rules,
                    host_queue_mb_per_sec = (rss_bytes_per_sec / 1e6).round(),
                    "steering miss: rules are installed but traffic lands on the host (RSS) queues and none on the GPU queues"
                ),
                Some(Episode::Ended { nic, reason }) => tracing::info!(%nic, reason, "steering miss over"),
                None => {}
            }
        }
    }

    /// [`Self::refresh`] off the async runtime, waiting at most a second.
    pub async fn refresh_async(self: &Arc<Self>) {
        let me = self.clone();
        let job = tokio::task::spawn_blocking(move || me.refresh(Instant::now()));
        let _ = tokio::time::timeout(Duration::from_secs(1), job).await;
    }
}

/// Reads every [`TICK`] until `shutdown` turns true.
pub async fn tick(dp: Arc<Datapath>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut every = tokio::time::interval(TICK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => dp.refresh_async().await,
            _ = async { drop(shutdown.wait_for(|s| *s).await) } => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::sim::SimNic;

    fn setup() -> (Arc<SimNic>, Arc<Metrics>, Datapath, Instant) {
        let topo = crate::config::presets::topology_from_text(crate::config::presets::SIM, "sim").unwrap();
        let names: Vec<&str> = topo.nics.iter().map(|n| n.ifname.as_str()).collect();
        let sim = Arc::new(SimNic::new(&names));
        let metrics = Arc::new(Metrics::new());
        metrics.init_topology(&topo);
        let dp = Datapath::new(&topo, sim.clone(), metrics.clone(), MissConfig::default());
        (sim, metrics, dp, Instant::now())
    }

    fn sample(m: &Metrics, nic: &str, q: u32, role: &str) -> u64 {
        m.queue_rx_bytes.with_label_values(&[nic, &q.to_string(), role]).get()
    }

    #[test]
    fn counters_follow_the_nic_and_are_read_at_most_once_a_second() {
        let (sim, m, dp, t0) = setup();
        sim.receive("eth1", 0, 1000);
        sim.receive("eth1", 9, 500);
        dp.refresh(t0);
        assert_eq!(sample(&m, "eth1", 0, "rss"), 1000);
        assert_eq!(sample(&m, "eth1", 9, "gpu"), 500);
        sim.receive("eth1", 0, 1000);
        dp.refresh(t0 + Duration::from_millis(900));
        assert_eq!(sample(&m, "eth1", 0, "rss"), 1000, "read again within a second");
        dp.refresh(t0 + Duration::from_secs(1));
        assert_eq!(sample(&m, "eth1", 0, "rss"), 2000);
        assert!(m
            .render()
            .contains(r#"tcpx_rxdm_queue_rx_bytes_total{nic="eth1",queue="9",role="gpu"} 500"#));
    }

    /// The daemon's NICs on a fake clock.
    struct Rig {
        sim: Arc<SimNic>,
        m: Arc<Metrics>,
        dp: Datapath,
        t: Instant,
    }

    impl Rig {
        /// `secs` seconds of `rss` and `gpu` bytes a second on eth2, with `rules` installed.
        fn drive(&mut self, secs: u32, rules: i64, rss: u64, gpu: u64) {
            self.m.rules_installed.with_label_values(&["eth2"]).set(rules);
            for _ in 0..secs {
                self.t += Duration::from_secs(1);
                self.sim.receive("eth2", 3, rss);
                self.sim.receive("eth2", 12, gpu);
                self.dp.refresh(self.t);
            }
        }

        fn miss(&self, nic: &str) -> i64 {
            self.m.steering_miss.with_label_values(&[nic]).get()
        }
    }

    #[test]
    fn a_sim_miss_is_flagged_within_the_window_and_cleared_when_gpu_queues_receive() {
        let (sim, m, dp, t) = setup();
        dp.refresh(t);
        let mut r = Rig { sim, m, dp, t };
        r.drive(30, 4, 0, 0);
        assert_eq!(r.miss("eth2"), 0, "idle with rules");
        r.drive(30, 0, 50_000_000, 0);
        assert_eq!(r.miss("eth2"), 0, "busy host queues without rules");
        r.drive(9, 4, 50_000_000, 0);
        assert_eq!(r.miss("eth2"), 0, "not before a whole window");
        r.drive(1, 4, 50_000_000, 0);
        assert_eq!(r.miss("eth2"), 1, "within the 10 s window");
        assert_eq!(r.miss("eth1"), 0);
        r.drive(1, 4, 50_000_000, 1_000_000);
        assert_eq!(r.miss("eth2"), 0, "GPU queues receive");
    }

    #[test]
    fn a_failed_read_counts_nothing_and_the_next_read_catches_up() {
        let (sim, m, dp, t) = setup();
        // Every per-queue read fails (the sim counts them as `stat` calls).
        sim.inject(crate::nic::sim::Fault {
            op: crate::nic::NicOp::Stat,
            errno: nix::errno::Errno::EIO,
            trigger: crate::nic::sim::Trigger::Probability(1.0),
        });
        sim.receive("eth3", 0, 77);
        dp.refresh(t);
        assert_eq!(sample(&m, "eth3", 0, "rss"), 0);
        sim.clear_faults();
        dp.refresh(t + MIN_READ_INTERVAL);
        assert_eq!(sample(&m, "eth3", 0, "rss"), 77);
        assert_eq!(m.steering_miss.with_label_values(&["eth3"]).get(), 0);
    }
}
