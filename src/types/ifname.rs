//! Interface names as the kernel's fixed-size fields hold them, and in the
//! order people expect (`eth2` before `eth10`).

use std::cmp::Ordering;

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

/// Orders names with embedded numbers by value: `eth2 < eth10`.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let (na, ra) = split_digits(a);
                let (nb, rb) = split_digits(b);
                let (za, zb) = (trim_zeros(na), trim_zeros(nb));
                let ord = za.len().cmp(&zb.len()).then(za.cmp(zb)).then(na.len().cmp(&nb.len()));
                if ord != Ordering::Equal {
                    return ord;
                }
                (a, b) = (ra, rb);
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                (a, b) = (&a[1..], &b[1..]);
            }
        }
    }
}

fn split_digits(s: &[u8]) -> (&[u8], &[u8]) {
    s.split_at(s.iter().position(|c| !c.is_ascii_digit()).unwrap_or(s.len()))
}

fn trim_zeros(s: &[u8]) -> &[u8] {
    &s[s.iter().position(|&c| c != b'0').unwrap_or(s.len())..]
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

    #[test]
    fn natural_order() {
        let mut names = vec!["eth10", "eth2", "lo", "eth1", "enp6s0", "eth02", "eth"];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(names, ["enp6s0", "eth", "eth1", "eth2", "eth02", "eth10", "lo"]);
    }
}
