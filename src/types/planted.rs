//! Test support for the folders the daemon prepares: a file outside the
//! folder that entries planted in it point at, and the check that nothing
//! the daemon did reached it.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A file outside the folder that planted entries point at.
pub struct Victim(pub PathBuf);

impl Victim {
    /// `dir/victim`, mode 0640, holding a known text.
    pub fn new(dir: &Path) -> Victim {
        let p = dir.join("victim");
        std::fs::write(&p, b"precious").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        Victim(p)
    }

    /// Its text and mode are as [`Victim::new`] left them.
    pub fn assert_untouched(&self) {
        assert_eq!(std::fs::read(&self.0).unwrap(), b"precious", "content changed");
        assert_eq!(std::fs::metadata(&self.0).unwrap().mode() & 0o7777, 0o640, "mode changed");
    }
}
