//! Configuration: flags, the topology model, presets, and sysfs discovery.

pub mod discovery;
pub mod flags;
pub mod pci;
pub mod presets;
pub mod topology;
