//! tcpx-rxdm: receive-datapath manager for GPUDirect-TCPX NICs.
//!
//! # Layout
//! - [`config`]: flags, topology model, presets (textproto), sysfs discovery.
//! - [`wire`]: framing (u16 BE length + protobuf), messages, fd passing, test client.
//! - [`rules`]: pure rule bookkeeping: slots, queue loads, flow keys.
//! - [`nic`]: the `NicControl` trait, its backends (ethtool, sim), prime/restore.
//! - [`gpu`]: the `PoolAllocator` and `QueueBinder` traits and their backends.
//! - [`server`]: Unix-socket endpoints, connection loop, dispatch.
//! - [`metrics`]: Prometheus registry and the HTTP endpoints.
//! - [`daemon`]: lifecycle: prime → allocate → bind → serve → restore.
//! - [`doctor`]: `tcpx-rxdm doctor`, read-only checks of a node.
//! - `fuzz_targets`: the byte decoders as fuzz targets (`fuzz/`, replayed by `cargo test`).

pub mod config;
pub mod daemon;
pub mod doctor;
#[doc(hidden)]
pub mod fuzz_targets;
pub mod gpu;
pub mod host;
pub mod metrics;
pub mod netlink;
pub mod nic;
pub mod rules;
pub mod server;
pub mod types;
pub mod wire;
