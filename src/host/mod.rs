//! The host around the NICs: TCP tuning through sysctls and routes, and the
//! process's heap.

pub(crate) mod memory;
pub mod tuning;
