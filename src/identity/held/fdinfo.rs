//! What `/proc/<pid>/fdinfo/<fd>` says of one descriptor: its open flags
//! (`flags:`, octal), the mount (`mnt_id:`) and the inode (`ino:`, Linux
//! 5.14) of its file. The kernel shows it to a reader that may trace the
//! process. Its first lines come from the descriptor itself; what follows
//! them is the file's own (`show_fdinfo`), which for some kinds of file
//! takes locks the process can hold as long as it likes, so it is read
//! only for files already known to be of a kind without them (see the
//! module above).

use std::os::fd::BorrowedFd;

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;

/// `O_PATH`: a descriptor that names a file without opening it.
const O_PATH: u32 = 0o10000000;

/// The fields of one descriptor's fdinfo that the GPU check reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fdinfo {
    pub flags: u32,
    pub mnt_id: u64,
    pub ino: u64,
}

impl Fdinfo {
    /// The text of `name` (`fdinfo/<fd>`) under a process's `/proc/<pid>` folder.
    pub fn read(proc_dir: BorrowedFd<'_>, name: &str) -> Result<String, Errno> {
        let fd = openat(proc_dir, name, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut text)
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
        Ok(text)
    }

    /// The three fields, each on a line of its own (`name:` then blanks and
    /// the number); `None` where one is missing or not a number (`ino:`
    /// before Linux 5.14). Lines the file adds after them are not looked at.
    pub fn parse(text: &str) -> Option<Fdinfo> {
        let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
        let number = |name: &str| field(name)?.parse::<u64>().ok();
        Some(Fdinfo {
            flags: u32::from_str_radix(field("flags:")?, 8).ok()?,
            mnt_id: number("mnt_id:")?,
            ino: number("ino:")?,
        })
    }

    /// Whether it is open for reading and writing (`O_RDWR`, not `O_PATH`).
    pub fn read_write(&self) -> bool {
        self.flags & O_PATH == 0 && self.flags & (libc::O_ACCMODE as u32) == libc::O_RDWR as u32
    }

    /// Whether it is the file `stx` describes: the same mount and inode
    /// (the process may have put another file at that number since it was
    /// looked at; then nothing is proved).
    pub fn names(&self, stx: &libc::statx) -> bool {
        stx.stx_mask & libc::STATX_MNT_ID != 0 && self.mnt_id == stx.stx_mnt_id && self.ino == stx.stx_ino
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(flags: &str, mnt: &str, ino: &str) -> String {
        format!("pos:\t0\nflags:\t{flags}\nmnt_id:\t{mnt}\nino:\t{ino}\n")
    }

    #[test]
    fn the_three_fields_are_read_from_their_own_lines() {
        let f = Fdinfo::parse(&info("02100002", "24", "3")).unwrap();
        assert_eq!(f, Fdinfo { flags: 0o2100002, mnt_id: 24, ino: 3 });
        // Lines a file adds (an eventfd's count, a lock) change nothing.
        let more = format!(
            "{}eventfd-count:\t5\nlock:\t1: POSIX ADVISORY WRITE 7 00:2a:3 0 EOF\n",
            info("02", "9", "8")
        );
        assert_eq!(Fdinfo::parse(&more), Some(Fdinfo { flags: 2, mnt_id: 9, ino: 8 }));
        // Blanks around the number, as the kernel writes tabs.
        assert_eq!(Fdinfo::parse("flags: 0100002 \nmnt_id:  31\nino:\t  77\n").map(|f| f.ino), Some(77));
    }

    #[test]
    fn a_missing_or_garbled_field_gives_nothing() {
        assert_eq!(Fdinfo::parse("pos:\t0\nflags:\t0100002\nmnt_id:\t24\n"), None, "no ino: (before 5.14)");
        assert_eq!(Fdinfo::parse(&info("0100009", "24", "3")), None, "flags are octal");
        assert_eq!(Fdinfo::parse(&info("0100002", "-1", "3")), None);
        assert_eq!(Fdinfo::parse(&info("0100002", "24", "x")), None);
        assert_eq!(Fdinfo::parse(""), None);
        // A field name inside another line is not the field.
        assert_eq!(Fdinfo::parse("xflags:\t02\nmnt_id:\t1\nino:\t1\n"), None);
    }

    #[test]
    fn only_reading_and_writing_without_o_path_is_read_write() {
        let mode = |flags: u32| Fdinfo { flags, mnt_id: 0, ino: 0 }.read_write();
        assert!(mode(0o2100002), "O_RDWR|O_CLOEXEC|O_LARGEFILE");
        assert!(!mode(0o100000), "O_RDONLY");
        assert!(!mode(0o100001), "O_WRONLY");
        assert!(!mode(0o12000000), "O_PATH");
        assert!(!mode(0o10000002), "O_PATH with O_RDWR set");
    }

    #[test]
    fn it_names_a_file_only_by_the_same_mount_and_inode() {
        // SAFETY: statx is plain data: all zeroes is a valid value.
        let mut stx: libc::statx = unsafe { std::mem::zeroed() };
        (stx.stx_mask, stx.stx_mnt_id, stx.stx_ino) = (libc::STATX_MNT_ID, 24, 3);
        let f = |mnt_id, ino| Fdinfo { flags: 2, mnt_id, ino };
        assert!(f(24, 3).names(&stx));
        assert!(!f(24, 4).names(&stx), "another file at that number now");
        assert!(!f(25, 3).names(&stx), "another mount");
        stx.stx_mask = 0;
        assert!(!f(24, 3).names(&stx), "no mount id from statx");
    }
}
