//! A primed NIC's undo log as a takeover hands it on (JSON): the successor
//! restores exactly what the first daemon changed, at the very end.

use serde::{Deserialize, Serialize};

use super::{PrimedNic, Undo};
use crate::nic::header_split::HeaderSplit;
use crate::nic::{DataSplit, RxRing};

/// [`HeaderSplit`] with its values (its own `Serialize` shows the name only).
#[derive(Serialize, Deserialize)]
enum Split {
    Flags { flags: Vec<(String, bool)>, strict: bool, max_rx_buffer: bool },
    Rings { start: DataSplit },
    RingSize { start: RxRing },
    Unsupported,
}

#[derive(Serialize, Deserialize)]
struct Doc {
    ifname: String,
    header_split: Split,
    channels: u32,
    rule_capacity: u32,
    undo: Vec<Undo>,
}

impl PrimedNic {
    pub fn to_json(&self) -> Vec<u8> {
        let header_split = match &self.header_split {
            HeaderSplit::PrivFlags { flags, strict, max_rx_buffer } => {
                Split::Flags { flags: flags.clone(), strict: *strict, max_rx_buffer: *max_rx_buffer }
            }
            HeaderSplit::DataSplit { start } => Split::Rings { start: *start },
            HeaderSplit::RingSizeFallback { start } => Split::RingSize { start: *start },
            HeaderSplit::Unsupported => Split::Unsupported,
        };
        let doc = Doc {
            ifname: self.ifname.clone(),
            header_split,
            channels: self.channels,
            rule_capacity: self.rule_capacity,
            undo: self.undo.clone(),
        };
        serde_json::to_vec(&doc).expect("plain data serialises")
    }

    pub fn from_json(bytes: &[u8]) -> Result<PrimedNic, String> {
        let d: Doc = serde_json::from_slice(bytes).map_err(|e| format!("NIC undo log: {e}"))?;
        let header_split = match d.header_split {
            Split::Flags { flags, strict, max_rx_buffer } => {
                HeaderSplit::PrivFlags { flags, strict, max_rx_buffer }
            }
            Split::Rings { start } => HeaderSplit::DataSplit { start },
            Split::RingSize { start } => HeaderSplit::RingSizeFallback { start },
            Split::Unsupported => HeaderSplit::Unsupported,
        };
        Ok(PrimedNic {
            ifname: d.ifname,
            header_split,
            channels: d.channels,
            rule_capacity: d.rule_capacity,
            undo: d.undo,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::nic::prime::{prime, PrimedNic};
    use crate::nic::sim::SimNic;
    use crate::nic::{NicSetup, FEATURE_NTUPLE};

    #[test]
    fn a_handed_undo_log_restores_the_nic_as_it_was() {
        let nic = SimNic::new(&["eth1"]);
        let before = (nic.rss_table("eth1").unwrap(), nic.feature("eth1", FEATURE_NTUPLE).unwrap());
        let mut p = prime(&nic, "eth1", 8).unwrap();
        p.enable_header_split(&nic).unwrap();
        assert_ne!(before, (nic.rss_table("eth1").unwrap(), nic.feature("eth1", FEATURE_NTUPLE).unwrap()));
        let mut q = PrimedNic::from_json(&p.to_json()).unwrap();
        assert_eq!(
            (q.header_split.name(), q.channels, q.rule_capacity),
            (p.header_split.name(), p.channels, p.rule_capacity)
        );
        assert_eq!(q.undo, p.undo);
        assert!(q.restore(&nic).is_empty());
        assert_eq!(before, (nic.rss_table("eth1").unwrap(), nic.feature("eth1", FEATURE_NTUPLE).unwrap()));
        assert!(PrimedNic::from_json(b"{}").unwrap_err().starts_with("NIC undo log"));
    }
}
