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

    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

    use crate::types::flow::FlowSpec;

    /// The size of one packed rule record (see `proto/handover.proto`).
    pub const RECORD: usize = 68;

    /// One rule as a packed record carries it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Record {
        pub flow: FlowSpec,
        pub loc: u32,
        pub queue: u32,
        pub gpu: u32,
        pub owner_pid: u32,
        pub lease: u32,
        pub tenant: Option<u64>,
        pub pending_delete: bool,
        /// The rule steers a repaired IPv6 flow (flag bit 3; older daemons ignore it).
        pub repaired: bool,
    }

    fn ip16(ip: IpAddr) -> [u8; 16] {
        match ip {
            IpAddr::V4(a) => {
                let mut b = [0u8; 16];
                b[..4].copy_from_slice(&a.octets());
                b
            }
            IpAddr::V6(a) => a.octets(),
        }
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
    }

    impl Record {
        /// Appends the record to `out`.
        pub fn pack(&self, out: &mut Vec<u8>) {
            let v6 = self.flow.src.is_ipv6();
            let flags = u8::from(v6)
                | u8::from(self.pending_delete) << 1
                | u8::from(self.tenant.is_some()) << 2
                | u8::from(self.repaired) << 3;
            out.extend_from_slice(&[flags, 0, 0, 0]);
            for v in [self.loc, self.queue, self.gpu, self.owner_pid, self.lease] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&self.tenant.unwrap_or(0).to_le_bytes());
            out.extend_from_slice(&ip16(self.flow.src.ip()));
            out.extend_from_slice(&ip16(self.flow.dst.ip()));
            out.extend_from_slice(&self.flow.src.port().to_le_bytes());
            out.extend_from_slice(&self.flow.dst.port().to_le_bytes());
        }

        /// The records of `bytes`; an error if it is not whole records.
        pub fn unpack_all(bytes: &[u8]) -> Result<impl Iterator<Item = Record> + '_, String> {
            if bytes.len() % RECORD != 0 {
                return Err(format!(
                    "{} bytes of rule records is not a whole number of {RECORD}",
                    bytes.len()
                ));
            }
            Ok(bytes.chunks_exact(RECORD).map(Record::unpack))
        }

        fn unpack(b: &[u8]) -> Record {
            let v6 = b[0] & 1 != 0;
            let ip = |at: usize| -> IpAddr {
                let a: [u8; 16] = b[at..at + 16].try_into().expect("16 bytes");
                match v6 {
                    true => IpAddr::V6(Ipv6Addr::from(a)),
                    false => IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3])),
                }
            };
            let port = |at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
            Record {
                flow: FlowSpec {
                    src: SocketAddr::new(ip(32), port(64)),
                    dst: SocketAddr::new(ip(48), port(66)),
                },
                loc: u32_at(b, 4),
                queue: u32_at(b, 8),
                gpu: u32_at(b, 12),
                owner_pid: u32_at(b, 16),
                lease: u32_at(b, 20),
                tenant: (b[0] & 4 != 0).then(|| u64::from_le_bytes(b[24..32].try_into().expect("8 bytes"))),
                pending_delete: b[0] & 2 != 0,
                repaired: b[0] & 8 != 0,
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn records_survive_packing_and_bad_lengths_are_caught() {
            let flow = |s: &str, d: &str| FlowSpec { src: s.parse().unwrap(), dst: d.parse().unwrap() };
            let recs = [
                Record {
                    flow: flow("10.0.0.1:40000", "192.168.1.2:5000"),
                    loc: 7,
                    queue: 9,
                    gpu: 1,
                    owner_pid: 1234,
                    lease: 3,
                    tenant: Some(u64::MAX - 1),
                    pending_delete: true,
                    repaired: false,
                },
                Record {
                    flow: flow("[fd00::1]:1", "[fd00:0:0:1::2]:65535"),
                    loc: 99_999,
                    queue: 15,
                    gpu: 0,
                    owner_pid: 0,
                    lease: 0,
                    tenant: None,
                    pending_delete: false,
                    repaired: true,
                },
            ];
            let mut bytes = Vec::new();
            for r in &recs {
                r.pack(&mut bytes);
            }
            assert_eq!(bytes.len(), 2 * RECORD);
            assert_eq!(Record::unpack_all(&bytes).unwrap().collect::<Vec<_>>(), recs);
            assert!(Record::unpack_all(&bytes[..RECORD + 1]).err().unwrap().contains("not a whole number"));
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
