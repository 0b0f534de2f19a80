use super::*;
use std::io::{Read, Write};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

use crate::types::planted::Victim;

fn fifo(path: &Path) {
    nix::unistd::mkfifo(path, Mode::from_bits_truncate(0o600)).unwrap();
}

#[test]
fn a_planted_entry_is_never_opened_and_is_named_in_the_refusal() {
    let (tmp, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let v = Victim::new(out.path());
    let d = SharedDir::open(tmp.path()).unwrap();
    symlink(&v.0, tmp.path().join("link")).unwrap();
    std::fs::hard_link(&v.0, tmp.path().join("hard")).unwrap();
    fifo(&tmp.path().join("fifo"));
    std::fs::create_dir(tmp.path().join("dir")).unwrap();
    for (name, kind) in
        [("link", Kind::Link), ("hard", Kind::File { links: 2 }), ("fifo", Kind::Fifo), ("dir", Kind::Folder)]
    {
        // A FIFO with no writer would block an open for reading: this returns at once.
        match d.open_plain(name, OFlag::O_RDWR) {
            Err(OpenError::NotPlain(k)) => assert_eq!(k, kind, "{name}"),
            other => panic!("{name}: {:?}", other.map(|_| ())),
        }
        let e =
            io::Error::from(d.open_or_create(name, 0o600, OFlag::O_WRONLY | OFlag::O_APPEND).unwrap_err());
        assert!(e.to_string().contains(&kind.to_string()), "{name}: {e}");
        // Creating anew refuses whatever is there, a dangling link included.
        assert_eq!(
            d.create_new(name, 0o600, OFlag::O_WRONLY).unwrap_err().raw_os_error(),
            Some(libc::EEXIST)
        );
    }
    symlink(out.path().join("absent"), tmp.path().join("dangling")).unwrap();
    assert!(d.create_new("dangling", 0o600, OFlag::O_WRONLY).is_err());
    assert!(!out.path().join("absent").exists(), "created through a dangling link");
    v.assert_untouched();
}

#[test]
fn plain_files_are_opened_or_created_and_only_names_are_removed() {
    let (tmp, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let v = Victim::new(out.path());
    let d = SharedDir::open(tmp.path()).unwrap();
    let mut f = d.open_or_create("log", 0o600, OFlag::O_WRONLY | OFlag::O_APPEND).unwrap();
    f.write_all(b"one\n").unwrap();
    let mut f = d.open_or_create("log", 0o600, OFlag::O_WRONLY | OFlag::O_APPEND).unwrap();
    f.write_all(b"two\n").unwrap();
    let mut text = String::new();
    d.open_plain("log", OFlag::O_RDONLY).unwrap().read_to_string(&mut text).unwrap();
    assert_eq!(text, "one\ntwo\n");
    // Removing a link removes the link.
    symlink(&v.0, tmp.path().join("link")).unwrap();
    assert!(d.unlink("link").unwrap());
    assert!(!d.unlink("link").unwrap(), "gone");
    // A folder is never removed as a file.
    std::fs::create_dir(tmp.path().join("dir")).unwrap();
    assert!(d.unlink("dir").is_err());
    assert!(tmp.path().join("dir").is_dir());
    // Only the file described: something else at the name stays.
    let e = d.entry("log").unwrap().unwrap();
    std::fs::remove_file(tmp.path().join("log")).unwrap();
    std::fs::write(tmp.path().join("log"), b"theirs").unwrap();
    assert!(!d.unlink_if("log", |now| *now == e).unwrap());
    assert_eq!(std::fs::read(tmp.path().join("log")).unwrap(), b"theirs");
    let e = d.entry("log").unwrap().unwrap();
    assert!(d.unlink_if("log", |now| *now == e).unwrap());
    // Renaming over a link replaces the link.
    symlink(&v.0, tmp.path().join("target")).unwrap();
    d.create_new("tmp", 0o600, OFlag::O_WRONLY).unwrap();
    d.rename("tmp", "target").unwrap();
    assert_eq!(d.entry("target").unwrap().unwrap().kind, Kind::File { links: 1 });
    assert!(d.entry("x/y").is_err(), "a path is not a name");
    v.assert_untouched();
}

#[test]
fn a_link_in_a_folder_others_may_write_is_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).unwrap();
    // The test's own folder (this user's, 0700): a link there is the admin's.
    symlink(&real, tmp.path().join("ok")).unwrap();
    let d = SharedDir::open(&tmp.path().join("ok")).unwrap();
    d.create_new("f", 0o600, OFlag::O_WRONLY).unwrap();
    assert!(real.join("f").exists());
    // The same link in a folder anyone may write (as /tmp is) is refused, by name.
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    symlink(&real, open.join("tcpx")).unwrap();
    let e = SharedDir::open(&open.join("tcpx")).err().unwrap();
    assert!(e.to_string().contains("symbolic link in a folder others may write"), "{e}");
    assert!(e.to_string().contains(&open.join("tcpx").display().to_string()), "{e}");
    let e = SharedDir::create(&open.join("tcpx/sub"), 0o750, None).err().unwrap();
    assert!(e.to_string().contains("not followed"), "{e}");
    assert!(!real.join("sub").exists(), "created through the link");
    // A file where a folder should be.
    std::fs::write(tmp.path().join("file"), b"").unwrap();
    let e = SharedDir::create(&tmp.path().join("file/sub"), 0o750, None).err().unwrap();
    assert!(e.to_string().contains("is a plain file, not a folder"), "{e}");
}

#[test]
fn created_folders_get_their_mode_and_go_only_when_empty_and_still_theirs() {
    let tmp = tempfile::tempdir().unwrap();
    let old = nix::sys::stat::umask(Mode::from_bits_truncate(0o077));
    let made = SharedDir::create(&tmp.path().join("a/b"), 0o750, None);
    nix::sys::stat::umask(old);
    let (d, created) = made.unwrap();
    let paths: Vec<_> = created.iter().map(|c| c.path().to_path_buf()).collect();
    assert_eq!(paths, [tmp.path().join("a"), tmp.path().join("a/b")]);
    for p in &paths {
        assert_eq!(std::fs::metadata(p).unwrap().mode() & 0o7777, 0o750, "{}", p.display());
    }
    // Existing folders are not made again.
    let (_, again) = SharedDir::create(&tmp.path().join("a/b"), 0o700, None).unwrap();
    assert!(again.is_empty());
    d.create_new("f", 0o600, OFlag::O_WRONLY).unwrap();
    assert!(!created[1].remove_if_empty().unwrap(), "not empty");
    d.unlink("f").unwrap();
    assert!(created[1].remove_if_empty().unwrap());
    assert!(created[0].remove_if_empty().unwrap());
    assert!(!tmp.path().join("a").exists());
    // A folder put in its place is someone else's: it stays.
    let (_, created) = SharedDir::create(&tmp.path().join("c"), 0o750, None).unwrap();
    std::fs::remove_dir(tmp.path().join("c")).unwrap();
    std::fs::create_dir(tmp.path().join("c")).unwrap();
    assert!(!created[0].remove_if_empty().unwrap());
    assert!(tmp.path().join("c").is_dir());
}
