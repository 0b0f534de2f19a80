//! tcpx-rxdm: receive-datapath manager for GPUDirect-TCPX NICs.
//!
//! # Layout
//! Layers, lowest first; a module uses only the layers below it (checked by
//! `tests/layers.rs`, explained in `docs/ARCHITECTURE.md`):
//! - [`types`]: the shared vocabulary (PCI address, flows, status codes,
//!   interface names, topology); imports nothing else of the crate.
//! - [`caps`]: the Linux capabilities the daemon uses, whether this thread
//!   holds them, and the words that name a missing one in an error.
//! - [`pidfd`] (beside it): a process held by a pidfd, and every pidfd
//!   system call of the crate.
//! - [`netlink`]: netlink sockets, generic netlink, rtnetlink messages.
//! - [`wire`]: the client protocol: framing, messages, fd passing, a test client.
//! - [`nic`], [`host`], [`gpu`] (side by side, not using each other): NIC
//!   control (traits, ethtool and simulated backends, prime/restore, link
//!   monitor); host tuning, the heap and shared folders; pool allocators
//!   and queue binders.
//! - [`rules`]: rule bookkeeping (slots, queue loads, flow keys) and the
//!   per-NIC rule engine.
//! - [`config`]: flags (and their absl forms), presets, discovery.
//! - [`metrics`], [`nccl`] (side by side): the Prometheus registry; the NCCL
//!   plugin's settings for this node (`tcpx-rxdm nccl-env`, `nccl.env`).
//! - [`identity`], [`endpoint`] (side by side): who a client is (peer
//!   credentials, pidfds, leases); what every client endpoint shares (socket
//!   names, the connection budget, accept back-off, memory give-back).
//! - [`steering`]: the rule path: the rule sockets' I/O threads, the per-NIC
//!   rule threads, and what a rule request means.
//! - [`server`]: the async endpoints (queue, registry, pools), the socket
//!   folder, HTTP and the status socket.
//! - [`daemon`]: the lifecycle; `main.rs` assembles it.
//! - [`doctor`]: `tcpx-rxdm doctor`, read-only checks of a node.
//! - [`inject`] (beside it): `tcpx-rxdm inject`, TCPX added to Kubernetes pod templates.
//! - [`upgrade`] (beside them): `tcpx-rxdm upgrade`, a running daemon handed
//!   over to the binary now installed (SIGUSR2), waited for.
//! - [`cli`]: the command tree (the daemon's flags and every subcommand),
//!   its completions and man page; `main.rs` runs what it parses.
//! - `fuzz_targets`: the byte decoders as fuzz targets (`fuzz/`, replayed by `cargo test`).

pub mod caps;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod doctor;
pub mod endpoint;
#[doc(hidden)]
pub mod fuzz_targets;
pub mod gpu;
pub mod handover;
pub mod host;
pub mod identity;
pub mod inject;
pub mod metrics;
pub mod nccl;
pub mod netlink;
pub mod nic;
pub mod pidfd;
pub mod rules;
pub mod server;
pub mod steering;
pub mod types;
pub mod upgrade;
pub mod wire;
