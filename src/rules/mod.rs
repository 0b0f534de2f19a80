//! Rule bookkeeping: which flows are steered where, in which slot.
//!
//! [`flow`] validates requests into exact flow keys; `table` is the pure
//! per-NIC bookkeeping (slots, queue loads, flows); `engine` applies it to a
//! NIC through [`crate::nic::NicControl`], rolling back on failure.

pub(crate) mod engine;
pub mod flow;
pub(crate) mod table;

use nix::errno::Errno;

use crate::types::status::StatusCode;

/// A request that failed, with the status code the client gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RuleFailure {
    pub code: StatusCode,
    pub message: String,
    /// The NIC's refusal behind it, if any (counted by the caller).
    pub nic: Option<crate::nic::NicError>,
}

impl RuleFailure {
    pub fn new(code: StatusCode, message: impl Into<String>) -> Self {
        RuleFailure { code, message: message.into(), nic: None }
    }
}

/// Maps a NIC errno to the status code the plugin acts on: it treats
/// RESOURCE_EXHAUSTED as fatal and everything else as "retry later".
pub fn code_for_errno(errno: Errno) -> StatusCode {
    match errno {
        Errno::EINVAL => StatusCode::InvalidArgument,
        Errno::ENOSPC => StatusCode::ResourceExhausted,
        Errno::EBUSY | Errno::EAGAIN => StatusCode::Unavailable,
        _ => StatusCode::Internal,
    }
}
