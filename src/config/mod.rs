//! Configuration: flags, the topology model, presets, and sysfs discovery.

pub mod discovery;
pub mod pci;
pub mod topology;
