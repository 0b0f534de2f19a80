//! Configuration: flags (and their absl forms), presets, the topology
//! message, the sysfs views and sysfs discovery.

pub mod absl;
pub mod discovery;
mod flag_values;
pub mod flags;
pub mod presets;
pub mod retired;
pub(crate) mod topology;
pub mod views;
