//! How a NIC turns header split on, probed from what the driver reports
//! over any [`NicSetup`] backend, with what prime needs to put it back.
//!
//! Prime uses the result so:
//! - [`HeaderSplit::PrivFlags`]: header split off at prime, the
//!   `enable-max-rx-buffer-size` flag on if listed, and after the pools are
//!   bound `enable-header-split` (and `enable-strict-header-split` if listed)
//!   on; restore puts back each flag's value read at startup.
//! - [`HeaderSplit::DataSplit`]: `set_tcp_data_split(false)` at prime, `true`
//!   after binding; restore puts back the [`DataSplit`] read at startup.
//! - [`HeaderSplit::RingSizeFallback`]: after binding, `set_rx_ring` to
//!   [`FALLBACK_RING_SMALL`] then [`FALLBACK_RING_LARGE`] (forces the driver to
//!   rebuild its page pools over the bound memory); restore sets the size
//!   read at startup (`RxRing::current`).
//! - [`HeaderSplit::Unsupported`]: nothing to toggle.

use nix::errno::Errno;
use serde::{Serialize, Serializer};

use super::{
    DataSplit, NicResult, NicSetup, RxRing, PRIV_HEADER_SPLIT, PRIV_MAX_RX_BUFFER, PRIV_STRICT_HEADER_SPLIT,
};

pub const FALLBACK_RING_SMALL: u32 = 512;
pub const FALLBACK_RING_LARGE: u32 = 1024;

/// How this driver turns header split on, and what it reported at the probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderSplit {
    /// gve with Google's private flags (COS driver, kernels < 6.8 out of tree).
    PrivFlags {
        /// The starting private flags, in driver order.
        flags: Vec<(String, bool)>,
        strict: bool,
        max_rx_buffer: bool,
    },
    /// Upstream header split through rings `tcp-data-split` (gve ≥ 6.9, mlx5, bnxt…).
    DataSplit { start: DataSplit },
    /// Neither, but ring sizes are settable: resize the ring after binding so
    /// the driver rebuilds its page pools over the bound memory.
    RingSizeFallback { start: RxRing },
    /// No header split and no ring control (veth, virtio without rings).
    Unsupported,
}

impl HeaderSplit {
    /// Probes `ifname`: private flags first, then rings `tcp-data-split`, then
    /// ring sizes. EOPNOTSUPP at a step means "not this way"; any other error
    /// is returned (naming the op that failed).
    pub fn probe(nic: &(impl NicSetup + ?Sized), ifname: &str) -> NicResult<HeaderSplit> {
        let flags = nic.priv_flags(ifname)?;
        let has = |name: &str| flags.iter().any(|(n, _)| n == name);
        if has(PRIV_HEADER_SPLIT) {
            let (strict, max_rx_buffer) = (has(PRIV_STRICT_HEADER_SPLIT), has(PRIV_MAX_RX_BUFFER));
            return Ok(HeaderSplit::PrivFlags { flags, strict, max_rx_buffer });
        }
        match nic.tcp_data_split(ifname) {
            Ok(start @ (DataSplit::Disabled | DataSplit::Enabled)) => {
                return Ok(HeaderSplit::DataSplit { start })
            }
            Ok(DataSplit::Unknown) => {}
            Err(e) if e.errno == Errno::EOPNOTSUPP => {}
            Err(e) => return Err(e),
        }
        match nic.rx_ring(ifname) {
            Ok(start) => Ok(HeaderSplit::RingSizeFallback { start }),
            Err(e) if e.errno == Errno::EOPNOTSUPP => Ok(HeaderSplit::Unsupported),
            Err(e) => Err(e),
        }
    }

    /// Short name for metrics labels and reports.
    pub fn name(&self) -> &'static str {
        match self {
            HeaderSplit::PrivFlags { .. } => "priv_flags",
            HeaderSplit::DataSplit { .. } => "tcp_data_split",
            HeaderSplit::RingSizeFallback { .. } => "ring_size_fallback",
            HeaderSplit::Unsupported => "none",
        }
    }

    /// The variant's name alone, as `/debug/config` shows it.
    fn variant(&self) -> (u32, &'static str) {
        match self {
            HeaderSplit::PrivFlags { .. } => (0, "PrivFlags"),
            HeaderSplit::DataSplit { .. } => (1, "DataSplit"),
            HeaderSplit::RingSizeFallback { .. } => (2, "RingSizeFallback"),
            HeaderSplit::Unsupported => (3, "Unsupported"),
        }
    }
}

/// Serialized as the bare variant name (`"PrivFlags"`): `/debug/config`
/// reports how the NIC is driven, not the values read at the probe.
impl Serialize for HeaderSplit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (index, name) = self.variant();
        s.serialize_unit_variant("HeaderSplit", index, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::sim::{SimNic, SIM_RX_RING};
    use crate::nic::{NicError, NicOp};

    #[test]
    fn sim_nic_is_the_private_flag_family() {
        let nic = SimNic::new(&["eth1"]);
        match HeaderSplit::probe(&nic, "eth1").unwrap() {
            HeaderSplit::PrivFlags { strict, max_rx_buffer, flags } => {
                assert!(strict && max_rx_buffer);
                assert_eq!(flags.len(), 3);
            }
            other => panic!("{other:?}"),
        }
    }

    /// A driver whose private flags lack header split, whose rings answer
    /// as given, and which supports nothing else the probe does not read.
    struct Upstream(NicResult<DataSplit>, NicResult<RxRing>);

    fn unsupported(ifname: &str, op: NicOp) -> NicError {
        NicError::new(ifname, op, Errno::EOPNOTSUPP)
    }

    impl NicSetup for Upstream {
        fn priv_flags(&self, _: &str) -> NicResult<Vec<(String, bool)>> {
            Ok(vec![("some-other-flag".into(), true)])
        }
        fn tcp_data_split(&self, _: &str) -> NicResult<DataSplit> {
            self.0.clone()
        }
        fn rx_ring(&self, _: &str) -> NicResult<RxRing> {
            self.1.clone()
        }
        fn rss_table(&self, ifname: &str) -> NicResult<Vec<u32>> {
            Err(unsupported(ifname, NicOp::GetRss))
        }
        fn set_rss_table(&self, ifname: &str, _: &[u32]) -> NicResult<()> {
            Err(unsupported(ifname, NicOp::SetRss))
        }
        fn feature(&self, ifname: &str, _: &str) -> NicResult<bool> {
            Err(unsupported(ifname, NicOp::GetFeature))
        }
        fn set_feature(&self, ifname: &str, _: &str, _: bool) -> NicResult<()> {
            Err(unsupported(ifname, NicOp::SetFeature))
        }
        fn set_priv_flag(&self, ifname: &str, _: &str, _: bool) -> NicResult<()> {
            Err(unsupported(ifname, NicOp::SetPrivFlag))
        }
        fn set_tcp_data_split(&self, ifname: &str, _: bool) -> NicResult<()> {
            Err(unsupported(ifname, NicOp::SetTcpDataSplit))
        }
    }

    #[test]
    fn names_and_json_are_those_of_the_bare_variant() {
        let cases = [
            (
                HeaderSplit::PrivFlags { flags: vec![], strict: true, max_rx_buffer: true },
                "priv_flags",
                "PrivFlags",
            ),
            (HeaderSplit::DataSplit { start: DataSplit::Disabled }, "tcp_data_split", "DataSplit"),
            (HeaderSplit::RingSizeFallback { start: SIM_RX_RING }, "ring_size_fallback", "RingSizeFallback"),
            (HeaderSplit::Unsupported, "none", "Unsupported"),
        ];
        for (hs, name, json) in cases {
            assert_eq!(hs.name(), name);
            assert_eq!(serde_json::to_value(&hs).unwrap(), serde_json::Value::from(json));
        }
    }

    #[test]
    fn rings_then_ring_size_then_nothing() {
        let unsupported = |op| unsupported("eth1", op);
        let nic = Upstream(Ok(DataSplit::Disabled), Ok(SIM_RX_RING));
        assert_eq!(
            HeaderSplit::probe(&nic, "eth1").unwrap(),
            HeaderSplit::DataSplit { start: DataSplit::Disabled }
        );
        let nic = Upstream(Ok(DataSplit::Unknown), Ok(SIM_RX_RING));
        assert_eq!(
            HeaderSplit::probe(&nic, "eth1").unwrap(),
            HeaderSplit::RingSizeFallback { start: SIM_RX_RING }
        );
        let nic = Upstream(Err(unsupported(NicOp::GetTcpDataSplit)), Err(unsupported(NicOp::GetRing)));
        assert_eq!(HeaderSplit::probe(&nic, "eth1").unwrap(), HeaderSplit::Unsupported);
        let nic = Upstream(Err(NicError::new("eth1", NicOp::GetTcpDataSplit, Errno::EIO)), Ok(SIM_RX_RING));
        assert_eq!(HeaderSplit::probe(&nic, "eth1").unwrap_err().op, NicOp::GetTcpDataSplit);
    }
}
