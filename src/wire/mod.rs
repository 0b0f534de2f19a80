//! The client protocol: message types, framing, fd passing, and a
//! small blocking client used by tests and tools.

pub mod client;
pub mod frame;

/// Messages of package `gpudirect_tcpxd`, generated from `proto/`.
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/gpudirect_tcpxd.rs"));
}

/// The takeover's messages (package `tcpx_rxdm.handover`), between two
/// daemons: see `handover`.
pub mod handover {
    include!(concat!(env!("OUT_DIR"), "/tcpx_rxdm.handover.rs"));

    use std::net::{IpAddr, SocketAddr};

    use crate::types::flow::FlowSpec;

    fn ip_bytes(ip: IpAddr) -> Vec<u8> {
        match ip {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        }
    }

    fn ip_from(bytes: &[u8]) -> Option<IpAddr> {
        match bytes.len() {
            4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
            16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
            _ => None,
        }
    }

    impl From<&FlowSpec> for Flow {
        fn from(f: &FlowSpec) -> Flow {
            Flow {
                src_ip: ip_bytes(f.src.ip()),
                src_port: f.src.port().into(),
                dst_ip: ip_bytes(f.dst.ip()),
                dst_port: f.dst.port().into(),
            }
        }
    }

    impl Flow {
        /// The flow, if its addresses and ports are well formed.
        pub fn spec(&self) -> Option<FlowSpec> {
            let port = |p: u32| u16::try_from(p).ok();
            Some(FlowSpec {
                src: SocketAddr::new(ip_from(&self.src_ip)?, port(self.src_port)?),
                dst: SocketAddr::new(ip_from(&self.dst_ip)?, port(self.dst_port)?),
            })
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn flows_survive_the_message_and_bad_ones_are_caught() {
            for (src, dst) in
                [("10.0.0.1:40000", "192.168.1.2:5000"), ("[fd00::1]:1", "[fd00:0:0:1::2]:65535")]
            {
                let f = FlowSpec { src: src.parse().unwrap(), dst: dst.parse().unwrap() };
                assert_eq!(Flow::from(&f).spec(), Some(f));
            }
            let f = FlowSpec { src: "10.0.0.1:1".parse().unwrap(), dst: "10.0.0.2:2".parse().unwrap() };
            assert_eq!(Flow { src_ip: vec![1, 2, 3], ..Flow::from(&f) }.spec(), None);
            assert_eq!(Flow { dst_port: 70_000, ..Flow::from(&f) }.spec(), None);
        }
    }
}

/// `google.rpc.Status` (code and message only; other fields are skipped on decode).
pub mod google {
    pub mod rpc {
        include!(concat!(env!("OUT_DIR"), "/google.rpc.rs"));
    }
}

/// Encoded `FileDescriptorSet` of every message, for the textproto loader.
pub const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));
