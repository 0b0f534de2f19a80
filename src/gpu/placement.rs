//! `--gpu_nic_preset sim --gpu_backend cuda`: put the GPUs CUDA can see onto
//! the simulated NICs, so the whole daemon runs on a GPU machine without
//! TCPX NICs.

use crate::types::pci::PciAddr;
use crate::types::topology::{GpuSpec, Topology};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlacementError {
    #[error("no CUDA-visible GPUs to place on the simulated NICs")]
    NoGpus,
    #[error("the topology has no NICs to place GPUs on")]
    NoNics,
    #[error("{gpus} GPUs on NIC {ifname}, which has only {queues} TCPX queues")]
    TooFewQueues { ifname: String, gpus: usize, queues: usize },
}

/// GPU `i` goes to NIC `i mod nics`; each NIC's TCPX queues (the union of its
/// GPUs' queues in the original topology) are split evenly, in order, among
/// the GPUs it receives, as discovery does. NICs left without a GPU are dropped.
pub fn spread_gpus(topo: &Topology, gpus: &[PciAddr]) -> Result<Topology, PlacementError> {
    if gpus.is_empty() {
        return Err(PlacementError::NoGpus);
    }
    if topo.nics.is_empty() {
        return Err(PlacementError::NoNics);
    }
    let n = topo.nics.len();
    let mut out = topo.clone();
    for (ni, nic) in out.nics.iter_mut().enumerate() {
        let mine: Vec<PciAddr> = gpus.iter().skip(ni).step_by(n).copied().collect();
        let mut queues: Vec<u32> = nic.gpus.iter().flat_map(|g| g.queues.iter().copied()).collect();
        queues.sort_unstable();
        queues.dedup();
        if mine.len() > queues.len() {
            return Err(PlacementError::TooFewQueues {
                ifname: nic.ifname.clone(),
                gpus: mine.len(),
                queues: queues.len(),
            });
        }
        let per = if mine.is_empty() { 0 } else { queues.len() / mine.len() };
        nic.gpus = mine
            .iter()
            .enumerate()
            .map(|(i, &pci)| GpuSpec { pci, queues: queues[i * per..(i + 1) * per].to_vec() })
            .collect();
    }
    out.nics.retain(|nic| !nic.gpus.is_empty());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::topology::NicSpec;

    fn pci(s: &str) -> PciAddr {
        s.parse().unwrap()
    }

    fn sim_like() -> Topology {
        let nic = |ifname: &str, a: &str, b: &str| NicSpec {
            ifname: ifname.into(),
            pci: None,
            gpus: vec![
                GpuSpec { pci: pci(a), queues: vec![8, 9, 10, 11] },
                GpuSpec { pci: pci(b), queues: vec![12, 13, 14, 15] },
            ],
        };
        Topology {
            nics: vec![nic("eth1", "04:00.0", "05:00.0"), nic("eth2", "0a:00.0", "0b:00.0")],
            max_rx_rules: 100_000,
            tcpd_queue_size: 8,
            rss_set_size: 8,
            rx_pool_size: 64 << 20,
        }
    }

    type Layout = Vec<(String, Vec<(String, Vec<u32>)>)>;

    fn layout(t: &Topology) -> Layout {
        t.nics
            .iter()
            .map(|n| {
                (n.ifname.clone(), n.gpus.iter().map(|g| (g.pci.to_string(), g.queues.clone())).collect())
            })
            .collect()
    }

    #[test]
    fn one_gpu_takes_all_queues_of_the_first_nic() {
        let t = spread_gpus(&sim_like(), &[pci("0000:c1:00.0")]).unwrap();
        assert_eq!(layout(&t), [("eth1".into(), vec![("0000:c1:00.0".into(), (8..16).collect())])]);
        t.validate().unwrap();
    }

    #[test]
    fn gpus_go_round_robin_and_split_queues() {
        let gpus = [pci("01:00.0"), pci("02:00.0"), pci("03:00.0")];
        let t = spread_gpus(&sim_like(), &gpus).unwrap();
        assert_eq!(
            layout(&t),
            [
                (
                    "eth1".to_string(),
                    vec![
                        ("0000:01:00.0".to_string(), vec![8, 9, 10, 11]),
                        ("0000:03:00.0".to_string(), vec![12, 13, 14, 15])
                    ]
                ),
                ("eth2".to_string(), vec![("0000:02:00.0".to_string(), (8..16).collect())]),
            ]
        );
        assert_eq!(t.rx_pool_size, 64 << 20);
        t.validate().unwrap();
    }

    #[test]
    fn refuses_nothing_to_place_and_too_many_gpus() {
        assert_eq!(spread_gpus(&sim_like(), &[]), Err(PlacementError::NoGpus));
        let many: Vec<PciAddr> =
            (1..=18u8).map(|b| PciAddr { domain: 0, bus: b, device: 0, function: 0 }).collect();
        assert!(matches!(spread_gpus(&sim_like(), &many), Err(PlacementError::TooFewQueues { gpus: 9, .. })));
    }
}
