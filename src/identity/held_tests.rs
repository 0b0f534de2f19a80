//! Unit tests of reading a process's open files.
use super::*;
use std::os::unix::fs::{symlink, OpenOptionsExt};

fn devices(simulated: bool) -> GpuDevices {
    GpuDevices { minors: vec![0, 1, 5], simulated }
}

/// This process's open files, through `/proc/<pid>` and through a pidfd.
fn own_open_files(simulated: bool) -> (Vec<OpenFile>, Vec<OpenFile>) {
    let dir = std::fs::File::open(format!("/proc/{}", std::process::id())).unwrap();
    let own = crate::identity::pidfd_open(std::process::id()).unwrap();
    let d = devices(simulated);
    let in_proc = open_files_in(dir.as_fd(), SCAN_LIMIT, &d).unwrap();
    let through_pidfd = open_files_of_pidfd(own.as_fd(), SCAN_LIMIT, &d).unwrap();
    (in_proc.files, through_pidfd.files)
}

#[test]
fn a_gpu_is_held_by_its_device_or_for_simulated_gpus_its_stand_in_open_for_reading_and_writing() {
    let stand_in = FileId { dev: (0, 40), ino: 7 };
    let other = FileId { dev: (0, 40), ino: 8 };
    let stand_ins = [None, Some(stand_in), None];
    let open = [
        OpenFile::Nvidia { minor: 5, read_write: true },
        OpenFile::Nvidia { minor: 0, read_write: false },
        OpenFile::Regular { id: other, read_write: true },
    ];
    assert_eq!(held_gpus(&open, &devices(false), &stand_ins), 0b100, "195:5 is the third GPU");
    assert_eq!(held_gpus(&open, &devices(true), &stand_ins), 0b100, "another file stands in for nothing");
    let open = [OpenFile::Regular { id: stand_in, read_write: true }];
    assert_eq!(held_gpus(&open, &devices(true), &stand_ins), 0b010);
    assert_eq!(held_gpus(&open, &devices(false), &stand_ins), 0, "real GPUs: only the device counts");
    let open = [OpenFile::Regular { id: stand_in, read_write: false }];
    assert_eq!(held_gpus(&open, &devices(true), &stand_ins), 0, "held, not for reading and writing");
    assert_eq!(held_gpus(&[], &devices(true), &stand_ins), 0, "present, not held");
}

#[test]
fn the_open_mode_counts_only_for_the_same_file_read_and_written() {
    // SAFETY: statx is plain data: all zeroes is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    (stx.stx_mask, stx.stx_mnt_id, stx.stx_ino) = (libc::STATX_MNT_ID, 24, 3);
    let info =
        |flags: &str, mnt: u64, ino: u64| format!("pos:\t0\nflags:\t{flags}\nmnt_id:\t{mnt}\nino:\t{ino}\n");
    assert!(fdinfo_read_write(&info("02100002", 24, 3), &stx), "O_RDWR|O_CLOEXEC|O_LARGEFILE");
    assert!(!fdinfo_read_write(&info("0100000", 24, 3), &stx), "O_RDONLY");
    assert!(!fdinfo_read_write(&info("0100001", 24, 3), &stx), "O_WRONLY");
    assert!(!fdinfo_read_write(&info("012000000", 24, 3), &stx), "O_PATH");
    assert!(!fdinfo_read_write(&info("010000002", 24, 3), &stx), "O_PATH with O_RDWR set");
    assert!(!fdinfo_read_write(&info("0100002", 24, 4), &stx), "another file at that number now");
    assert!(!fdinfo_read_write(&info("0100002", 25, 3), &stx), "another mount");
    assert!(!fdinfo_read_write("pos:\t0\nflags:\t0100002\nmnt_id:\t24\n", &stx), "no inode to compare");
    stx.stx_mask = 0;
    assert!(!fdinfo_read_write(&info("0100002", 24, 3), &stx), "no mount id from statx");
}

#[test]
fn only_a_held_regular_file_reached_without_a_link_stands_in() {
    let root = tempfile::tempdir().unwrap();
    let dev = root.path().join("dev");
    std::fs::create_dir(&dev).unwrap();
    std::fs::write(dev.join("nvidia0"), b"").unwrap();
    symlink("nvidia0", dev.join("nvidia1")).unwrap();
    std::fs::write(dev.join("nvidia5"), b"").unwrap();
    // Through the link, this process holds nvidia0 twice; nvidia5 not at all.
    let rw = || std::fs::OpenOptions::new().read(true).write(true).clone();
    let _a = rw().open(dev.join("nvidia0")).unwrap();
    let _b = rw().open(dev.join("nvidia1")).unwrap();
    let rootfd = std::fs::File::open(root.path()).unwrap();
    let d = devices(true);
    let stand_ins = stand_ins_under(rootfd.as_fd(), &d);
    assert!(stand_ins[0].is_some() && stand_ins[1].is_none() && stand_ins[2].is_some(), "{stand_ins:?}");
    let (in_proc, mut through_pidfd) = own_open_files(true);
    assert_eq!(held_gpus(&in_proc, &d, &stand_ins), 0b001);
    // The same files through the pidfd.
    assert_eq!(held_gpus(&through_pidfd, &d, &stand_ins), 0b001);
    let id = stand_ins[0].unwrap();
    through_pidfd.retain(|f| *f == OpenFile::Regular { id, read_write: true });
    assert!(through_pidfd.len() >= 2, "both descriptors of nvidia0 are seen");
    // A `dev` that is itself a link is not followed.
    let other = tempfile::tempdir().unwrap();
    symlink(&dev, other.path().join("dev")).unwrap();
    let otherfd = std::fs::File::open(other.path()).unwrap();
    assert_eq!(stand_ins_under(otherfd.as_fd(), &d), vec![None; 3]);
    // Real GPUs: regular files are not even listed.
    let (in_proc, through_pidfd) = own_open_files(false);
    assert!(!in_proc.iter().chain(&through_pidfd).any(|f| matches!(f, OpenFile::Regular { .. })));
}

#[test]
fn only_descriptors_below_the_limit_are_read_and_a_process_holding_more_says_so() {
    let root = tempfile::tempdir().unwrap();
    let dev = root.path().join("dev");
    std::fs::create_dir(&dev).unwrap();
    std::fs::write(dev.join("nvidia0"), b"").unwrap();
    let rootfd = std::fs::File::open(root.path()).unwrap();
    let d = devices(true);
    let stand_ins = stand_ins_under(rootfd.as_fd(), &d);
    // The stand-in held at a high descriptor number, and only there.
    let file = std::fs::OpenOptions::new().read(true).write(true).open(dev.join("nvidia0")).unwrap();
    let high = nix::fcntl::fcntl(file.as_fd(), nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(900)).unwrap();
    // SAFETY: F_DUPFD_CLOEXEC just returned this descriptor; nothing else owns it.
    let high = unsafe { OwnedFd::from_raw_fd(high) };
    drop(file);
    assert!(high.as_raw_fd() >= 900);
    let dir = std::fs::File::open(format!("/proc/{}", std::process::id())).unwrap();
    let own = crate::identity::pidfd_open(std::process::id()).unwrap();
    let low = 800;
    let below = open_files_in(dir.as_fd(), low, &d).unwrap();
    assert_eq!(held_gpus(&below.files, &d, &stand_ins), 0, "past the limit: not seen");
    assert_eq!(below.beyond_limit, Some(true), "the process holds descriptors past the limit");
    let through_pidfd = open_files_of_pidfd(own.as_fd(), low, &d).unwrap();
    assert_eq!(held_gpus(&through_pidfd.files, &d, &stand_ins), 0, "the same limit through the pidfd");
    assert_eq!(through_pidfd.beyond_limit, None, "the pidfd cannot tell");
    // Under the limit it is seen on both paths.
    let all = open_files_in(dir.as_fd(), SCAN_LIMIT, &d).unwrap();
    assert_eq!(held_gpus(&all.files, &d, &stand_ins), 0b001);
    let all = open_files_of_pidfd(own.as_fd(), SCAN_LIMIT, &d).unwrap();
    assert_eq!(held_gpus(&all.files, &d, &stand_ins), 0b001);
    drop(high);
}

#[test]
fn a_stand_in_held_only_by_path_or_for_reading_or_for_writing_gives_no_gpu() {
    let root = tempfile::tempdir().unwrap();
    let dev = root.path().join("dev");
    std::fs::create_dir(&dev).unwrap();
    for n in [0, 1, 5] {
        std::fs::write(dev.join(format!("nvidia{n}")), b"").unwrap();
    }
    let path_only =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH).open(dev.join("nvidia0")).unwrap();
    let read_only = std::fs::File::open(dev.join("nvidia1")).unwrap();
    let write_only = std::fs::OpenOptions::new().write(true).open(dev.join("nvidia5")).unwrap();
    let rootfd = std::fs::File::open(root.path()).unwrap();
    let d = devices(true);
    let stand_ins = stand_ins_under(rootfd.as_fd(), &d);
    let (in_proc, through_pidfd) = own_open_files(true);
    assert_eq!(held_gpus(&in_proc, &d, &stand_ins), 0, "O_PATH, O_RDONLY, O_WRONLY");
    assert_eq!(held_gpus(&through_pidfd, &d, &stand_ins), 0, "O_PATH, O_RDONLY, O_WRONLY (pidfd)");
    // Opened for reading and writing, nvidia5 is held.
    let read_write = std::fs::OpenOptions::new().read(true).write(true).open(dev.join("nvidia5")).unwrap();
    let (in_proc, through_pidfd) = own_open_files(true);
    assert_eq!(held_gpus(&in_proc, &d, &stand_ins), 0b100);
    assert_eq!(held_gpus(&through_pidfd, &d, &stand_ins), 0b100);
    drop((path_only, read_only, write_only, read_write));
}
