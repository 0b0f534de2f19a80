//! Fuzz targets: every input the daemon and its commands take from
//! outside. Each takes arbitrary bytes, must never panic, and checks what
//! its code promises. `fuzz/` drives them with libFuzzer (`fuzz/run.sh
//! TARGET SECONDS`); `tests/fuzz_corpus.rs` replays the committed corpora in
//! `fuzz/corpus/<name>/` on stable in every `cargo test`.
//!
//! - [`decoders`]: client frames and requests, topologies, netlink replies,
//!   a takeover's state.
//! - [`kube`]: the admission webhook's reviews and `inject`'s manifests,
//!   from text or built by [`grammar`].
//! - [`local`]: `nccl-env --check --env-file`, the status socket, the HTTP
//!   request line and query, the daemon's command line.

pub mod decoders;
pub mod grammar;
pub mod kube;
pub mod local;

pub use decoders::{frame, handover, handover_tables, netlink, request, topology};
pub use kube::{inject, webhook};
pub use local::{argv, envfile, http, status};

/// Byte 0 of a `netlink` input that picks the `sock_diag` answer parser.
pub const SOCK_DIAG: u8 = 200;
/// Byte 0 of a `netlink` input that picks the per-queue stats parser (its
/// replies as the genl parsers take them).
pub const QSTATS: u8 = 201;
/// Byte 0 of a `netlink` input that picks the `sock_diag` dump parser (the
/// IPv6 repair's lookup by ports).
pub const SOCK_DIAG_DUMP: u8 = 202;

/// A fuzz target: any bytes in, a panic when a promise is broken.
pub type Target = fn(&[u8]);

/// Target names, as `fuzz/` and the corpus folders call them, with their functions.
pub const TARGETS: [(&str, Target); 11] = [
    ("frame", frame),
    ("request", request),
    ("topology", topology),
    ("netlink", netlink),
    ("handover", handover),
    ("webhook", webhook),
    ("inject", inject),
    ("envfile", envfile),
    ("status", status),
    ("http", http),
    ("argv", argv),
];

/// Runs target `name` on `data`.
pub fn run(name: &str, data: &[u8]) {
    match TARGETS.iter().find(|(n, _)| *n == name) {
        Some((_, target)) => target(data),
        None => panic!("no fuzz target {name}"),
    }
}
