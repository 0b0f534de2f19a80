//! Interface names as the kernel's fixed-size fields hold them.

/// Bytes of an interface name field, its terminating NUL included.
pub const IFNAMSIZ: usize = 16;

/// `ifname` NUL-padded into a kernel name field; `None` if it is empty, holds
/// a NUL, or does not fit with its terminating NUL.
pub fn ifname_field(ifname: &str) -> Option<[u8; IFNAMSIZ]> {
    let b = ifname.as_bytes();
    if b.is_empty() || b.len() >= IFNAMSIZ || b.contains(&0) {
        return None;
    }
    let mut name = [0u8; IFNAMSIZ];
    name[..b.len()].copy_from_slice(b);
    Some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_do_not_fit_are_refused() {
        assert_eq!(&ifname_field("eth1").unwrap()[..5], b"eth1\0");
        assert!(ifname_field("").is_none());
        assert!(ifname_field("a\0b").is_none());
        assert!(ifname_field(&"x".repeat(15)).is_some());
        assert!(ifname_field(&"x".repeat(16)).is_none());
    }
}
