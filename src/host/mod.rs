//! The host around the NICs: TCP tuning through sysctls and routes, and the
//! process's heap.

pub mod memory;
pub mod tuning;
