//! Configuration: flags, presets, the topology message, and sysfs discovery.

pub mod discovery;
pub mod flags;
pub mod presets;
pub(crate) mod topology;
