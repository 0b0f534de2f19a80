//! Why a takeover failed, as the successor tells it: its exit message, and
//! the verdict the running daemon gets where it is there to hear it (it then
//! serves on).

use std::io;
use std::path::PathBuf;

use nix::errno::Errno;

use crate::gpu::GpuError;
use crate::handover::HandoverError;
use crate::types::pci::PciAddr;

#[derive(Debug, thiserror::Error)]
pub enum TakeoverError {
    /// `--takeover` (not `auto`) and no daemon serves the folder.
    #[error("no daemon serves {} to take over from ({source})", dir.display())]
    NoDaemon {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("connecting to {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The process listening on the handover socket could not be held.
    #[error("holding the process that serves {}: {source}", path.display())]
    HoldPeer {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("preparing the GPUs: {0}")]
    PrepareGpus(#[source] GpuError),
    /// The channel to the running daemon failed.
    #[error("{0}")]
    Channel(#[from] HandoverError),
    /// The running daemon refused this one; `cannot`: why this one could
    /// not prove it may take the daemon's descriptors, where that is known.
    #[error("{}{refusal}", cannot.as_ref().map(|c| format!("{c}; ")).unwrap_or_default())]
    Refused {
        cannot: Option<String>,
        #[source]
        refusal: HandoverError,
    },
    /// The running daemon speaks another version of the takeover
    /// protocol: this upgrade cannot be a takeover.
    #[error(
        "{0}: the two versions cannot hand over to each other, so this upgrade needs a restart \
         (stop the running daemon on a drained node, then start this one); the running daemon serves on"
    )]
    OtherProtocol(#[source] HandoverError),
    /// What was handed over does not fit this daemon (it told the running
    /// daemon so).
    #[error("{0}")]
    Unfit(String),
    /// The running daemon closed the channel before handing anything over
    /// and still runs.
    #[error("{who} did not hand over ({error}); it serves on")]
    NotHandedOver { who: String, error: String },
    /// It closed the channel and ended, with `--takeover` (not `auto`).
    #[error("{who} ended before it handed over ({error}); nothing to take over")]
    EndedBefore { who: String, error: String },
    #[error("NICs {handed} were handed over, this daemon manages {ours}")]
    OtherNics { handed: String, ours: String },
    #[error("no pool was handed over for GPU {0}")]
    NoPool(PciAddr),
    /// A rule table, the simulated NICs' state or the clients' leases
    /// could not be taken on.
    #[error("{0}")]
    Adopt(String),
    /// A step run off the runtime did not return.
    #[error("a takeover step stopped: {0}")]
    Step(String),
}
