//! The node's GPU ↔ NIC ↔ queue topology and its structural validation.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::pci::PciAddr;

/// One GPU and the receive queues of its NIC that land in its pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuSpec {
    #[serde(serialize_with = "ser_display")]
    pub pci: PciAddr,
    pub queues: Vec<u32>,
}

/// One NIC and the GPUs that receive through it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NicSpec {
    pub ifname: String,
    #[serde(serialize_with = "ser_opt_display")]
    pub pci: Option<PciAddr>,
    pub gpus: Vec<GpuSpec>,
}

/// The effective topology after presets, flags and discovery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Topology {
    pub nics: Vec<NicSpec>,
    pub max_rx_rules: u32,
    pub tcpd_queue_size: u32,
    pub rss_set_size: u32,
    pub rx_pool_size: u64,
}

pub const DEFAULT_MAX_RX_RULES: u32 = 100_000;
pub const DEFAULT_QUEUES: u32 = 8;
pub const DEFAULT_POOL_SIZE: u64 = 4 << 30;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TopologyError {
    #[error("topology is empty: no NIC with a GPU")]
    Empty,
    #[error("NIC #{0} has no ifname")]
    MissingIfname(usize),
    #[error("NIC {0} is listed twice")]
    DuplicateNic(String),
    #[error("NIC {nic} has an invalid PCI address: {err}")]
    BadNicPci { nic: String, err: String },
    #[error("GPU on NIC {nic} has an invalid PCI address: {err}")]
    BadGpuPci { nic: String, err: String },
    #[error("NIC {0} has no GPU")]
    NicWithoutGpu(String),
    #[error("GPU {gpu} has no queue on NIC {nic}")]
    GpuWithoutQueues { gpu: String, nic: String },
    #[error("GPU {0} is attached to two NICs ({1} and {2})")]
    GpuOnTwoNics(String, String, String),
    #[error("queue {queue} of NIC {nic} is shared by GPUs {a} and {b}")]
    QueueShared { nic: String, queue: u32, a: String, b: String },
    #[error("queue {queue} of NIC {nic} overlaps the RSS set 0..{rss}")]
    QueueInRssSet { nic: String, queue: u32, rss: u32 },
    #[error("queue {queue} of NIC {nic} is not below the NIC's channel count {channels}")]
    QueueBeyondChannels { nic: String, queue: u32, channels: u32 },
    #[error("{field} must be positive, got {value}")]
    NotPositive { field: &'static str, value: i64 },
    #[error("unknown NIC {0}")]
    UnknownNic(String),
}

impl Topology {
    /// Structural checks that need no hardware.
    pub fn validate(&self) -> Result<(), TopologyError> {
        if self.nics.is_empty() {
            return Err(TopologyError::Empty);
        }
        let mut gpu_home: HashMap<PciAddr, &str> = HashMap::new();
        let mut seen_nics = HashMap::new();
        for nic in &self.nics {
            if seen_nics.insert(nic.ifname.as_str(), ()).is_some() {
                return Err(TopologyError::DuplicateNic(nic.ifname.clone()));
            }
            if nic.gpus.is_empty() {
                return Err(TopologyError::NicWithoutGpu(nic.ifname.clone()));
            }
            let mut owner: BTreeMap<u32, PciAddr> = BTreeMap::new();
            for gpu in &nic.gpus {
                if let Some(other) = gpu_home.insert(gpu.pci, &nic.ifname) {
                    return Err(TopologyError::GpuOnTwoNics(
                        gpu.pci.to_string(),
                        other.to_string(),
                        nic.ifname.clone(),
                    ));
                }
                if gpu.queues.is_empty() {
                    return Err(TopologyError::GpuWithoutQueues {
                        gpu: gpu.pci.to_string(),
                        nic: nic.ifname.clone(),
                    });
                }
                for &q in &gpu.queues {
                    if q < self.rss_set_size {
                        return Err(TopologyError::QueueInRssSet {
                            nic: nic.ifname.clone(),
                            queue: q,
                            rss: self.rss_set_size,
                        });
                    }
                    if let Some(prev) = owner.insert(q, gpu.pci) {
                        return Err(TopologyError::QueueShared {
                            nic: nic.ifname.clone(),
                            queue: q,
                            a: prev.to_string(),
                            b: gpu.pci.to_string(),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Checks queue ids against the channel count a NIC reports.
    pub fn validate_channels(&self, ifname: &str, channels: u32) -> Result<(), TopologyError> {
        let nic = self
            .nics
            .iter()
            .find(|n| n.ifname == ifname)
            .ok_or_else(|| TopologyError::UnknownNic(ifname.to_string()))?;
        for gpu in &nic.gpus {
            if let Some(&q) = gpu.queues.iter().find(|&&q| q >= channels) {
                return Err(TopologyError::QueueBeyondChannels {
                    nic: ifname.to_string(),
                    queue: q,
                    channels,
                });
            }
        }
        Ok(())
    }

    pub fn gpus(&self) -> impl Iterator<Item = (&NicSpec, &GpuSpec)> {
        self.nics.iter().flat_map(|n| n.gpus.iter().map(move |g| (n, g)))
    }

    pub fn find_gpu(&self, pci: &PciAddr) -> Option<(usize, usize)> {
        self.nics
            .iter()
            .enumerate()
            .find_map(|(ni, n)| n.gpus.iter().position(|g| g.pci == *pci).map(|gi| (ni, gi)))
    }
}

fn ser_display<S: serde::Serializer, T: std::fmt::Display>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

fn ser_opt_display<S: serde::Serializer, T: std::fmt::Display>(
    v: &Option<T>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}
