//! File modes derived from the socket files' mode (`--socket_mode`): what
//! the folder and the files beside the sockets grant to the classes (group,
//! others) that may use the sockets.

/// `owner` for the owner, plus `per_class` (an `rwx` triple, e.g. `0o5`)
/// for each class to which `socket_mode` gives any right: `0o660` with
/// `(0o700, 0o5)` → `0o750`.
pub fn granted_to_socket_users(socket_mode: u32, owner: u32, per_class: u32) -> u32 {
    let mut mode = owner;
    if socket_mode & 0o060 != 0 {
        mode |= per_class << 3;
    }
    if socket_mode & 0o006 != 0 {
        mode |= per_class;
    }
    mode
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_class_with_a_right_gets_the_class_bits() {
        assert_eq!(granted_to_socket_users(0o660, 0o700, 0o5), 0o750);
        assert_eq!(granted_to_socket_users(0o666, 0o700, 0o5), 0o755);
        assert_eq!(granted_to_socket_users(0o600, 0o700, 0o5), 0o700);
        assert_eq!(granted_to_socket_users(0o620, 0o600, 0o4), 0o640, "write alone counts");
        assert_eq!(granted_to_socket_users(0o602, 0o600, 0o4), 0o604);
    }
}
