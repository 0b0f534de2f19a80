//! The host around the NICs: TCP tuning through sysctls and routes, which
//! network namespace the daemon is in, the process's heap, and the folders
//! it shares with clients.

pub(crate) mod memory;
pub mod netns;
pub mod shared_dir;
pub mod tuning;
pub mod users;
