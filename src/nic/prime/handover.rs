//! A primed NIC's undo log as a takeover hands it on: the successor restores
//! exactly what the first daemon changed, at the very end.

use super::{PrimedNic, Undo};
use crate::nic::header_split::HeaderSplit;
use crate::nic::{DataSplit, RxRing};
use crate::wire::handover::{self as wire, header_split::How, nic_undo::Step};

/// Named settings (features, private flags) as the wire holds them.
pub(crate) fn flags<'a>(all: impl IntoIterator<Item = (&'a String, &'a bool)>) -> Vec<wire::Flag> {
    all.into_iter().map(|(name, on)| wire::Flag { name: name.clone(), on: *on }).collect()
}

/// Named settings from the wire, in the order sent.
pub(crate) fn unflags(flags: Vec<wire::Flag>) -> Vec<(String, bool)> {
    flags.into_iter().map(|f| (f.name, f.on)).collect()
}

impl From<DataSplit> for wire::DataSplit {
    fn from(d: DataSplit) -> Self {
        match d {
            DataSplit::Unknown => wire::DataSplit::Unknown,
            DataSplit::Disabled => wire::DataSplit::Disabled,
            DataSplit::Enabled => wire::DataSplit::Enabled,
        }
    }
}

/// tcp-data-split from the wire; a value this daemon does not know is refused.
pub fn data_split(raw: i32) -> Result<DataSplit, String> {
    match wire::DataSplit::try_from(raw) {
        Ok(wire::DataSplit::Unknown) => Ok(DataSplit::Unknown),
        Ok(wire::DataSplit::Disabled) => Ok(DataSplit::Disabled),
        Ok(wire::DataSplit::Enabled) => Ok(DataSplit::Enabled),
        Err(_) => Err(format!("unknown tcp-data-split setting {raw}")),
    }
}

impl From<RxRing> for wire::RxRing {
    fn from(r: RxRing) -> Self {
        wire::RxRing { current: r.current, max: r.max }
    }
}

impl From<wire::RxRing> for RxRing {
    fn from(r: wire::RxRing) -> Self {
        RxRing { current: r.current, max: r.max }
    }
}

impl PrimedNic {
    pub fn to_wire(&self) -> wire::PrimedNic {
        let how = match &self.header_split {
            HeaderSplit::PrivFlags { flags: f, strict, max_rx_buffer } => How::PrivFlags(wire::PrivFlags {
                flags: flags(f.iter().map(|(n, o)| (n, o))),
                strict: *strict,
                max_rx_buffer: *max_rx_buffer,
            }),
            HeaderSplit::DataSplit { start } => How::DataSplit(wire::DataSplit::from(*start).into()),
            HeaderSplit::RingSizeFallback { start } => How::RingSize((*start).into()),
            HeaderSplit::Unsupported => How::Unsupported(true),
        };
        let undo = self
            .undo
            .iter()
            .map(|u| {
                let step = match u {
                    Undo::Feature(name, on) => Step::Feature(wire::Flag { name: name.clone(), on: *on }),
                    Undo::PrivFlag(name, on) => Step::PrivFlag(wire::Flag { name: name.clone(), on: *on }),
                    Undo::DataSplit(on) => Step::DataSplit(*on),
                    Undo::Rss(table) => Step::Rss(wire::RssTable { queues: table.clone() }),
                    Undo::RxRing(size) => Step::RxRing(*size),
                };
                wire::NicUndo { step: Some(step) }
            })
            .collect();
        wire::PrimedNic {
            ifname: self.ifname.clone(),
            header_split: Some(wire::HeaderSplit { how: Some(how) }),
            channels: self.channels,
            rule_capacity: self.rule_capacity,
            undo,
        }
    }

    /// The undo log handed on; one it cannot read in full is refused
    /// whole, naming the NIC.
    pub fn from_wire(w: wire::PrimedNic) -> Result<PrimedNic, String> {
        let ifname = w.ifname;
        let bad = |why: &str| format!("the undo log of NIC {ifname}: {why}");
        let how = w.header_split.and_then(|h| h.how).ok_or_else(|| bad("no header split"))?;
        let header_split = match how {
            How::PrivFlags(p) => HeaderSplit::PrivFlags {
                flags: unflags(p.flags),
                strict: p.strict,
                max_rx_buffer: p.max_rx_buffer,
            },
            How::DataSplit(raw) => HeaderSplit::DataSplit { start: data_split(raw).map_err(|e| bad(&e))? },
            How::RingSize(r) => HeaderSplit::RingSizeFallback { start: r.into() },
            How::Unsupported(_) => HeaderSplit::Unsupported,
        };
        let mut undo = Vec::with_capacity(w.undo.len());
        for u in w.undo {
            undo.push(match u.step.ok_or_else(|| bad("an empty step"))? {
                Step::Feature(f) => Undo::Feature(f.name, f.on),
                Step::PrivFlag(f) => Undo::PrivFlag(f.name, f.on),
                Step::DataSplit(on) => Undo::DataSplit(on),
                Step::Rss(t) => Undo::Rss(t.queues),
                Step::RxRing(size) => Undo::RxRing(size),
            });
        }
        Ok(PrimedNic { ifname, header_split, channels: w.channels, rule_capacity: w.rule_capacity, undo })
    }
}

#[cfg(test)]
mod tests {
    use crate::nic::header_split::HeaderSplit;
    use crate::nic::prime::{prime, PrimedNic};
    use crate::nic::sim::SimNic;
    use crate::nic::{DataSplit, NicSetup, RxRing, FEATURE_NTUPLE};
    use crate::wire::handover as wire;

    #[test]
    fn a_handed_undo_log_restores_the_nic_as_it_was() {
        let nic = SimNic::new(&["eth1"]);
        let before = (nic.rss_table("eth1").unwrap(), nic.feature("eth1", FEATURE_NTUPLE).unwrap());
        let mut p = prime(&nic, "eth1", 8).unwrap();
        p.enable_header_split(&nic).unwrap();
        assert_ne!(before, (nic.rss_table("eth1").unwrap(), nic.feature("eth1", FEATURE_NTUPLE).unwrap()));
        let mut q = PrimedNic::from_wire(p.to_wire()).unwrap();
        assert_eq!(
            (q.header_split.name(), q.channels, q.rule_capacity),
            (p.header_split.name(), p.channels, p.rule_capacity)
        );
        assert_eq!(q.undo, p.undo);
        assert!(q.restore(&nic).is_empty());
        assert_eq!(before, (nic.rss_table("eth1").unwrap(), nic.feature("eth1", FEATURE_NTUPLE).unwrap()));
    }

    #[test]
    fn every_header_split_keeps_its_starting_setting() {
        let ring = RxRing { current: 1024, max: 4096 };
        let all = [
            HeaderSplit::PrivFlags {
                flags: vec![("a".into(), true), ("b".into(), false)],
                strict: true,
                max_rx_buffer: false,
            },
            HeaderSplit::DataSplit { start: DataSplit::Disabled },
            HeaderSplit::RingSizeFallback { start: ring },
            HeaderSplit::Unsupported,
        ];
        for hs in all {
            let p = PrimedNic {
                ifname: "eth2".into(),
                header_split: hs.clone(),
                channels: 4,
                rule_capacity: 9,
                undo: vec![],
            };
            assert_eq!(PrimedNic::from_wire(p.to_wire()).unwrap().header_split, hs);
        }
    }

    #[test]
    fn an_undo_log_it_cannot_read_is_refused_naming_the_nic() {
        let none = wire::PrimedNic { ifname: "eth3".into(), ..Default::default() };
        assert_eq!(PrimedNic::from_wire(none).unwrap_err(), "the undo log of NIC eth3: no header split");
        let mut p = PrimedNic {
            ifname: "eth4".into(),
            header_split: HeaderSplit::Unsupported,
            channels: 1,
            rule_capacity: 1,
            undo: vec![],
        }
        .to_wire();
        p.undo.push(wire::NicUndo { step: None });
        assert_eq!(PrimedNic::from_wire(p.clone()).unwrap_err(), "the undo log of NIC eth4: an empty step");
        p.undo.clear();
        p.header_split = Some(wire::HeaderSplit { how: Some(wire::header_split::How::DataSplit(7)) });
        let err = PrimedNic::from_wire(p).unwrap_err();
        assert_eq!(err, "the undo log of NIC eth4: unknown tcp-data-split setting 7");
    }
}
