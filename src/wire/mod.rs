//! The client protocol: message types, framing, fd passing, and a
//! small blocking client used by tests and tools.

pub mod client;
pub mod frame;

/// Messages of package `gpudirect_tcpxd`, generated from `proto/`.
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/gpudirect_tcpxd.rs"));
}

/// `google.rpc.Status` (code and message only; other fields are skipped on decode).
pub mod google {
    pub mod rpc {
        include!(concat!(env!("OUT_DIR"), "/google.rpc.rs"));
    }
}

/// Encoded `FileDescriptorSet` of every message, for the textproto loader.
pub const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));
