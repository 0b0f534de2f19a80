//! Topology sources: presets embedded from `presets/`, manual textproto (file or
//! inline), and the flag overrides applied on top.

use std::path::{Path, PathBuf};

use prost_reflect::{DescriptorPool, DynamicMessage};

use super::discovery;
use super::flags::Flags;
use crate::types::topology::{NicSpec, Topology, TopologyError};
use crate::wire::{proto, DESCRIPTORS};

pub const A3VM: &str = include_str!("../../presets/a3vm.textproto");
pub const A3VM_4GPU_4NIC: &str = include_str!("../../presets/a3vm4gpu4nic.textproto");
pub const A6: &str = include_str!("../../presets/a6.textproto");
pub const SIM: &str = include_str!("../../presets/sim.textproto");

const MESSAGE: &str = "gpudirect_tcpxd.GpuRxqConfigurationList";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{source_name}: invalid topology textproto: {source}")]
    Parse { source_name: String, source: TextprotoError },
    #[error("reading {path}: {err}")]
    Read {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error("--gpu_nic_preset=manual needs --gpu_nic_topology or --gpu_nic_topology_proto")]
    ManualWithoutTopology,
    #[error("--gpu_nic_topology and --gpu_nic_topology_proto are both set; use one")]
    BothTopologies,
    #[error("--gpu_nic_topology/--gpu_nic_topology_proto need --gpu_nic_preset=manual (got {0})")]
    TopologyWithoutManual(String),
    #[error("topology from {source_name}: {err}")]
    Invalid { source_name: String, err: TopologyError },
    #[error("discovery: {0}")]
    Discovery(#[from] discovery::DiscoveryError),
    #[error(
        "--gpu_nic_preset=auto: sysfs discovery found no NIC of this network namespace with a GPU \
         behind it (PCI tree under {}; use --gpu_nic_preset=sim for simulated NICs)",
        sysfs.display()
    )]
    NothingDiscovered { sysfs: PathBuf },
    #[error(
        "discovery: preset a6: no {ifname} with an address and a GPU behind it in this network namespace"
    )]
    A6NicMissing { ifname: String },
    #[error("discovery: preset a6 expects one GPU behind {ifname}, discovery found {found}")]
    A6GpuCount { ifname: String, found: usize },
}

/// Why a topology text did not parse.
#[derive(Debug, thiserror::Error)]
pub enum TextprotoError {
    #[error("{0}")]
    Descriptors(#[from] prost_reflect::DescriptorError),
    #[error("{MESSAGE} missing from the descriptors")]
    MissingMessage,
    #[error("{0}")]
    Syntax(#[from] prost_reflect::text_format::ParseError),
    #[error("{0}")]
    Transcode(#[from] prost::DecodeError),
}

/// Where the topology came from, for logs and for preset-specific rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Preset(&'static str),
    File(PathBuf),
    Inline,
    Discovery,
}

impl Source {
    pub fn describe(&self) -> String {
        match self {
            Source::Preset(p) => format!("preset {p}"),
            Source::File(p) => format!("file {}", p.display()),
            Source::Inline => "--gpu_nic_topology_proto".into(),
            Source::Discovery => "sysfs discovery".into(),
        }
    }
}

/// Parses a `GpuRxqConfigurationList` in protobuf text format.
pub fn parse_textproto(text: &str, source_name: &str) -> Result<proto::GpuRxqConfigurationList, ConfigError> {
    let parse = || -> Result<proto::GpuRxqConfigurationList, TextprotoError> {
        let pool = DescriptorPool::decode(DESCRIPTORS)?;
        let desc = pool.get_message_by_name(MESSAGE).ok_or(TextprotoError::MissingMessage)?;
        Ok(DynamicMessage::parse_text_format(desc, text)?.transcode_to()?)
    };
    parse().map_err(|source| ConfigError::Parse { source_name: source_name.to_string(), source })
}

/// Builds a validated topology from a textproto.
pub fn topology_from_text(text: &str, source_name: &str) -> Result<Topology, ConfigError> {
    let msg = parse_textproto(text, source_name)?;
    let invalid = |err| ConfigError::Invalid { source_name: source_name.to_string(), err };
    let topo = super::topology::from_proto(&msg).map_err(invalid)?;
    topo.validate().map_err(invalid)?;
    Ok(topo)
}

/// The raw text and source of the configured topology, before parsing.
pub fn select_source(flags: &Flags) -> Result<(Source, Option<String>), ConfigError> {
    let manual_flags = flags.gpu_nic_topology.is_some() || flags.gpu_nic_topology_proto.is_some();
    if flags.gpu_nic_topology.is_some() && flags.gpu_nic_topology_proto.is_some() {
        return Err(ConfigError::BothTopologies);
    }
    let read =
        |p: &Path| std::fs::read_to_string(p).map_err(|err| ConfigError::Read { path: p.to_path_buf(), err });
    let preset = flags.gpu_nic_preset.as_str();
    if manual_flags && preset != "manual" {
        return Err(ConfigError::TopologyWithoutManual(preset.to_string()));
    }
    Ok(match preset {
        "auto" => (Source::Discovery, None),
        "a3vm" => (Source::Preset("a3vm"), Some(A3VM.to_string())),
        "a3vm4gpu4nic" => (Source::Preset("a3vm4gpu4nic"), Some(A3VM_4GPU_4NIC.to_string())),
        "a6" => (Source::Preset("a6"), Some(A6.to_string())),
        "sim" => (Source::Preset("sim"), Some(SIM.to_string())),
        "manual" => match (&flags.gpu_nic_topology, &flags.gpu_nic_topology_proto) {
            (Some(p), None) => (Source::File(p.clone()), Some(read(p)?)),
            (None, Some(t)) => (Source::Inline, Some(t.clone())),
            _ => return Err(ConfigError::ManualWithoutTopology),
        },
        path => (Source::File(PathBuf::from(path)), Some(read(Path::new(path))?)),
    })
}

/// Resolves the effective topology from the flags: source, parse, discovery
/// where the source needs it, overrides, validation.
pub fn resolve_topology(flags: &Flags) -> Result<(Topology, Source), ConfigError> {
    let (source, text) = select_source(flags)?;
    let name = source.describe();
    let invalid = |err| ConfigError::Invalid { source_name: name.clone(), err };
    let views = super::views::SysfsViews::new(flags);
    let discover = |rss: u32, q: u32| {
        discovery::discover_in(&views, flags.num_hops, rss, q, &interface_has_address)
            .map_err(ConfigError::Discovery)
    };
    let mut topo = match text {
        None => {
            let mut topo = super::topology::from_proto(&Default::default()).map_err(invalid)?;
            topo.nics = discover(topo.rss_set_size, topo.tcpd_queue_size)?;
            if topo.nics.is_empty() {
                return Err(ConfigError::NothingDiscovered { sysfs: flags.sysfs_root() });
            }
            topo
        }
        Some(text) => {
            let mut msg = parse_textproto(&text, &name)?;
            if source == Source::Preset("a6") {
                let found = discover(
                    msg.rss_set_size.unwrap_or(8).max(0) as u32,
                    msg.tcpd_queue_size.unwrap_or(8).max(0) as u32,
                )?;
                fill_from_discovery(&mut msg, &found)?;
            }
            super::topology::from_proto(&msg).map_err(invalid)?
        }
    };
    apply_overrides(&mut topo, &source, flags);
    topo.validate().map_err(invalid)?;
    Ok((topo, source))
}

/// a6: one GPU per NIC, PCI addresses taken from discovery by ifname.
fn fill_from_discovery(
    msg: &mut proto::GpuRxqConfigurationList,
    found: &[NicSpec],
) -> Result<(), ConfigError> {
    for cfg in &mut msg.gpu_rxq_configs {
        let ifname = cfg.ifname.clone().unwrap_or_default();
        let nic = found
            .iter()
            .find(|n| n.ifname == ifname)
            .ok_or_else(|| ConfigError::A6NicMissing { ifname: ifname.clone() })?;
        if nic.gpus.len() != 1 || cfg.gpu_infos.len() != 1 {
            return Err(ConfigError::A6GpuCount { ifname, found: nic.gpus.len() });
        }
        cfg.nic_pci_addr = nic.pci.map(|p| p.to_string());
        cfg.gpu_infos[0].gpu_pci_addr = Some(nic.gpus[0].pci.to_string());
    }
    Ok(())
}

/// Whether an interface has an IPv4 or IPv6 address (discovery skips those without).
pub fn interface_has_address(ifname: &str) -> bool {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return false;
    };
    addrs.into_iter().any(|a| {
        a.interface_name == ifname
            && a.address.is_some_and(|s| s.as_sockaddr_in().is_some() || s.as_sockaddr_in6().is_some())
    })
}

/// Applies `--rx_pool_size` and `--max_rx_rules`. The reference ignores
/// `--max_rx_rules` for a3vm; so do we, with a warning.
pub fn apply_overrides(topo: &mut Topology, source: &Source, flags: &Flags) {
    if flags.rx_pool_size > 0 {
        topo.rx_pool_size = flags.rx_pool_size;
    }
    if flags.max_rx_rules > 0 {
        if *source == Source::Preset("a3vm") {
            tracing::warn!(
                max_rx_rules = flags.max_rx_rules,
                "--max_rx_rules is ignored with --gpu_nic_preset=a3vm (as in the reference)"
            );
        } else {
            topo.max_rx_rules = flags.max_rx_rules;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_presets_parse_and_validate() {
        let a3 = topology_from_text(A3VM, "a3vm").unwrap();
        assert_eq!(a3.nics.len(), 4);
        assert_eq!(a3.nics[3].ifname, "eth4");
        assert_eq!(a3.nics[3].pci.unwrap().to_string(), "0000:8c:00.0");
        assert_eq!(a3.nics[3].gpus[1].pci.to_string(), "0000:8b:00.0");
        assert_eq!(a3.nics[0].gpus[1].queues, vec![12, 13, 14, 15]);
        assert_eq!((a3.max_rx_rules, a3.rss_set_size, a3.rx_pool_size), (100_000, 8, 4 << 30));
        let four = topology_from_text(A3VM_4GPU_4NIC, "a3vm4gpu4nic").unwrap();
        assert!(four
            .nics
            .iter()
            .all(|n| n.gpus.len() == 1 && n.gpus[0].queues == (8..16).collect::<Vec<_>>()));
        assert_eq!(four.nics[2].gpus[0].pci, a3.nics[2].gpus[0].pci);
        let sim = topology_from_text(SIM, "sim").unwrap();
        assert_eq!(sim.gpus().count(), 8);
        assert_eq!(sim.rx_pool_size, 64 << 20);
        let a6 = parse_textproto(A6, "a6").unwrap();
        assert_eq!(a6.gpu_rxq_configs.len(), 8);
    }

    #[test]
    fn uppercase_pci_is_normalised() {
        let t = topology_from_text(
            r#"gpu_rxq_configs { gpu_infos { gpu_pci_addr: "0000:8A:00.0" queue_ids: 9 } ifname: "eth9" nic_pci_addr: "0000:8C:00.0" } rss_set_size: 8"#,
            "inline",
        )
        .unwrap();
        assert_eq!(t.nics[0].gpus[0].pci.to_string(), "0000:8a:00.0");
    }

    #[test]
    fn inconsistencies_are_refused() {
        let cases = [
            ("", "empty"),
            ("gpu_rxq_configs { ifname: \"eth1\" gpu_infos { gpu_pci_addr: \"0000:04:00.0\" queue_ids: 8 } } gpu_rxq_configs { ifname: \"eth2\" gpu_infos { gpu_pci_addr: \"0000:04:00.0\" queue_ids: 9 } }", "two NICs"),
            ("gpu_rxq_configs { ifname: \"eth1\" gpu_infos { gpu_pci_addr: \"0000:04:00.0\" queue_ids: 8 } gpu_infos { gpu_pci_addr: \"0000:05:00.0\" queue_ids: 8 } }", "shared by"),
            ("gpu_rxq_configs { ifname: \"eth1\" gpu_infos { gpu_pci_addr: \"0000:04:00.0\" queue_ids: 3 } } rss_set_size: 8", "overlaps the RSS set"),
            ("gpu_rxq_configs { ifname: \"eth1\" gpu_infos { gpu_pci_addr: \"nope\" queue_ids: 9 } }", "invalid PCI"),
            ("gpu_rxq_configs { ifname: \"eth1\" gpu_infos { gpu_pci_addr: \"0000:04:00.0\" queue_ids: 9 } } max_rx_rules: -1", "max_rx_rules"),
            ("gpu_rxq_configs { bogus: 1 }", "invalid topology textproto"),
        ];
        for (text, want) in cases {
            let err = topology_from_text(text, "t").unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn channel_bound_is_checked() {
        let t = topology_from_text(SIM, "sim").unwrap();
        t.validate_channels("eth1", 16).unwrap();
        let e = t.validate_channels("eth1", 12).unwrap_err().to_string();
        assert!(e.contains("queue 12") && e.contains("channel count 12"), "{e}");
    }
}
