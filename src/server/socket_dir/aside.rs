//! A listener set aside to be bound again: the status socket a daemon
//! serves while it waits for its NICs is the one it serves from then on,
//! without a moment where `tcpx-rxdm status` finds no socket.

use std::os::fd::OwnedFd;

use super::SocketDir;

impl SocketDir {
    /// Takes back endpoint `name`'s listener (a duplicate of the one
    /// [`SocketDir::bind_with_mode`] returned): its file stays, and the next
    /// bind of `name` hands out this listener instead of binding anew.
    pub fn set_aside(&mut self, name: &str, listener: OwnedFd) {
        self.sockets.retain(|(n, _)| n != name);
        self.listeners.retain(|(n, _)| n != name);
        self.handed.insert(name.to_string(), listener);
    }
}
