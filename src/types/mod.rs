//! The shared vocabulary of every layer: PCI addresses, TCP flows, reply
//! status codes and the GPU ↔ NIC ↔ queue topology. Plain data and pure
//! functions; this module imports no other module of the crate.

pub mod flow;
pub mod ifname;
pub mod mode;
pub mod pci;
pub mod status;
pub mod topology;
