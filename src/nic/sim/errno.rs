//! Errno names as `--sim_fault` spells them.

use nix::errno::Errno;

/// The errno values Linux uses on every architecture we build for.
const NAMES: &[(&str, Errno)] = &[
    ("EPERM", Errno::EPERM),
    ("ENOENT", Errno::ENOENT),
    ("EIO", Errno::EIO),
    ("E2BIG", Errno::E2BIG),
    ("EAGAIN", Errno::EAGAIN),
    ("ENOMEM", Errno::ENOMEM),
    ("EACCES", Errno::EACCES),
    ("EBUSY", Errno::EBUSY),
    ("EEXIST", Errno::EEXIST),
    ("ENODEV", Errno::ENODEV),
    ("EINVAL", Errno::EINVAL),
    ("ENOSPC", Errno::ENOSPC),
    ("ERANGE", Errno::ERANGE),
    ("ENOTSUP", Errno::EOPNOTSUPP),
    ("EOPNOTSUPP", Errno::EOPNOTSUPP),
    ("ETIMEDOUT", Errno::ETIMEDOUT),
    ("ENETDOWN", Errno::ENETDOWN),
    ("ENXIO", Errno::ENXIO),
    ("EFAULT", Errno::EFAULT),
];

/// Parses an errno name (`EBUSY`, any case) into its value.
pub fn errno_from_name(name: &str) -> Option<Errno> {
    NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, e)| *e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_in_any_case_and_unknown_names_do_not() {
        assert_eq!(errno_from_name("EBUSY"), Some(Errno::EBUSY));
        assert_eq!(errno_from_name("ebusy"), Some(Errno::EBUSY));
        assert_eq!(errno_from_name("ENOTSUP"), Some(Errno::EOPNOTSUPP));
        assert_eq!(errno_from_name("ENOPE"), None);
        assert_eq!(errno_from_name(""), None);
    }
}
