//! Users as messages name them: who owns a file, and who to run as.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// `root`, or `walker (uid 1001)`, or `uid 1001` when no name is known.
pub fn describe(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) if uid == 0 => u.name,
        Ok(Some(u)) => format!("{} (uid {uid})", u.name),
        _ => format!("uid {uid}"),
    }
}

/// The owner of `path` (not followed if a link), when this user can see it.
pub fn owner(path: &Path) -> Option<u32> {
    std::fs::symlink_metadata(path).ok().map(|m| m.uid())
}

/// Who this process runs as.
pub fn me() -> String {
    describe(nix::unistd::geteuid().as_raw())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_are_named_with_their_uid_and_root_plainly() {
        assert_eq!(describe(0), "root");
        assert!(describe(4_000_000_000).starts_with("uid 4000000000"));
        let here = tempfile::tempdir().unwrap();
        assert_eq!(owner(here.path()), Some(nix::unistd::geteuid().as_raw()));
        assert_eq!(owner(&here.path().join("none")), None);
    }
}
