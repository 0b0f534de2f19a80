//! Unit tests of reading a process's open files.
use super::*;
use std::os::fd::AsFd;
use std::os::unix::fs::{symlink, OpenOptionsExt};

fn devices(simulated: bool) -> GpuDevices {
    GpuDevices { minors: vec![0, 1, 5], simulated }
}

/// This process's open files, through `/proc/<pid>`.
fn own_open_files(simulated: bool) -> Vec<OpenFile> {
    let dir = std::fs::File::open(format!("/proc/{}", std::process::id())).unwrap();
    open_files_in(dir.as_fd(), SCAN_LIMIT, &devices(simulated)).unwrap().files
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
    let in_proc = own_open_files(true);
    assert_eq!(held_gpus(&in_proc, &d, &stand_ins), 0b001);
    let id = stand_ins[0].unwrap();
    assert_eq!(in_proc.iter().filter(|f| **f == OpenFile::Regular { id, read_write: true }).count(), 1);
    // A `dev` that is itself a link is not followed.
    let other = tempfile::tempdir().unwrap();
    symlink(&dev, other.path().join("dev")).unwrap();
    let otherfd = std::fs::File::open(other.path()).unwrap();
    assert_eq!(stand_ins_under(otherfd.as_fd(), &d), vec![None; 3]);
    // Real GPUs: regular files are not even listed.
    assert!(!own_open_files(false).iter().any(|f| matches!(f, OpenFile::Regular { .. })));
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
    let high = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(high) };
    drop(file);
    assert!(high.as_raw_fd() >= 900);
    let dir = std::fs::File::open(format!("/proc/{}", std::process::id())).unwrap();
    let low = 800;
    let below = open_files_in(dir.as_fd(), low, &d).unwrap();
    assert_eq!(held_gpus(&below.files, &d, &stand_ins), 0, "past the limit: not seen");
    assert!(below.beyond_limit, "the process holds descriptors past the limit");
    // Under the limit it is seen.
    let all = open_files_in(dir.as_fd(), SCAN_LIMIT, &d).unwrap();
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
    assert_eq!(held_gpus(&own_open_files(true), &d, &stand_ins), 0, "O_PATH, O_RDONLY, O_WRONLY");
    // Opened for reading and writing, nvidia5 is held.
    let read_write = std::fs::OpenOptions::new().read(true).write(true).open(dev.join("nvidia5")).unwrap();
    assert_eq!(held_gpus(&own_open_files(true), &d, &stand_ins), 0b100);
    drop((path_only, read_only, write_only, read_write));
}
