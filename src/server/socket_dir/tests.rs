use super::*;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

use crate::types::planted::Victim;

fn kind_at(p: &Path) -> Option<Kind> {
    let st = nix::sys::stat::lstat(p).ok()?;
    Some(Kind::of(&st))
}

#[tokio::test]
async fn an_adopted_folder_keeps_the_lock_and_serves_the_same_listeners() {
    let tmp = tempfile::tempdir().unwrap();
    let mut first = SocketDir::lock(tmp.path(), 0o660, None).unwrap();
    let l = first.bind("a").unwrap();
    let (lock, listeners, _) = first.handover();
    let lock = lock.unwrap().try_clone_to_owned().unwrap();
    let handed: HashMap<String, OwnedFd> =
        listeners.map(|(n, fd)| (n.to_string(), fd.try_clone_to_owned().unwrap())).collect();
    let mut second = SocketDir::adopt(tmp.path(), 0o660, None, lock, handed, Vec::new()).unwrap();
    let l2 = second.bind("a").unwrap();
    let ino = |fd: BorrowedFd<'_>| nix::sys::stat::fstat(fd).unwrap().st_ino;
    assert_eq!(ino(l.as_fd()), ino(l2.as_fd()), "the same socket");
    // A third daemon still finds the folder locked, naming the new holder.
    std::mem::forget(first); // as a daemon that handed over: exits without cleanup
    drop(l);
    let err = SocketDir::lock(tmp.path(), 0o660, None).err().unwrap().to_string();
    assert!(err.contains(&format!("pid {}", std::process::id())), "{err}");
    let c = tokio::net::UnixStream::connect(tmp.path().join("a")).await;
    assert!(c.is_ok(), "the socket file stayed and the listener serves");
    drop(second);
    assert!(!tmp.path().join("a").exists(), "the last holder removes it");
    assert!(tmp.path().exists(), "a folder it did not create stays");
}

#[test]
fn only_the_open_file_that_holds_the_folders_lock_is_adopted() {
    let tmp = tempfile::tempdir().unwrap();
    let first = SocketDir::lock(tmp.path(), 0o660, None).unwrap();
    // Another file altogether.
    let other = tempfile::tempfile().unwrap();
    let err =
        SocketDir::adopt(tmp.path(), 0o660, None, other.into(), HashMap::new(), Vec::new()).err().unwrap();
    assert!(err.to_string().contains("is another file, not the lock of"), "{err}");
    // The folder's lock file, opened anew: not the open file that holds the lock.
    let reopened =
        std::fs::OpenOptions::new().read(true).write(true).open(tmp.path().join(LOCK_FILE)).unwrap();
    let err =
        SocketDir::adopt(tmp.path(), 0o660, None, reopened.into(), HashMap::new(), Vec::new()).err().unwrap();
    assert!(err.to_string().contains("not the open file that holds it"), "{err}");
    // The holder's own open file: adopted.
    let held = first.handover().0.unwrap().try_clone_to_owned().unwrap();
    let mut second = SocketDir::adopt(tmp.path(), 0o660, None, held, HashMap::new(), Vec::new()).unwrap();
    second.disarm();
}

#[tokio::test]
async fn folders_it_creates_get_the_mode_whatever_the_umask_and_go_at_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let dir = tmp.path().join("a/b");
    let r = SocketDir::lock(&dir, 0o660, None);
    nix::sys::stat::umask(old);
    let mut d = r.unwrap();
    for p in [tmp.path().join("a"), dir.clone()] {
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o750, "{}", p.display());
    }
    d.bind("s").unwrap();
    drop(d);
    assert!(!tmp.path().join("a").exists(), "the folders it made are gone");

    // An existing folder keeps its mode, and stays, emptied of what the daemon made.
    std::fs::create_dir(tmp.path().join("kept")).unwrap();
    std::fs::set_permissions(tmp.path().join("kept"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut d = SocketDir::lock(&tmp.path().join("kept"), 0o666, None).unwrap();
    d.bind("s").unwrap();
    drop(d);
    assert_eq!(std::fs::metadata(tmp.path().join("kept")).unwrap().mode() & 0o7777, 0o700);
    assert_eq!(std::fs::read_dir(tmp.path().join("kept")).unwrap().count(), 0);

    // A folder it made that a client wrote in stays, with the client's file.
    let mut d = SocketDir::lock(&tmp.path().join("c"), 0o660, None).unwrap();
    d.bind("s").unwrap();
    std::fs::write(tmp.path().join("c/terminated"), b"").unwrap();
    drop(d);
    let left: Vec<_> =
        std::fs::read_dir(tmp.path().join("c")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["terminated"]);

    // A file in the way is an error.
    std::fs::write(tmp.path().join("f"), b"").unwrap();
    let e = SocketDir::lock(&tmp.path().join("f"), 0o660, None).err().unwrap().to_string();
    assert!(e.contains("not a folder"), "{e}");
}

#[test]
fn whatever_is_planted_at_the_lock_file_is_removed_unopened_and_never_written() {
    let (tmp, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let v = Victim::new(out.path());
    let lock = tmp.path().join(LOCK_FILE);
    let plant: [(&str, &dyn Fn()); 3] = [
        ("link", &|| symlink(&v.0, &lock).unwrap()),
        ("hard link", &|| std::fs::hard_link(&v.0, &lock).unwrap()),
        ("FIFO", &|| nix::unistd::mkfifo(&lock, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()),
    ];
    for (what, plant) in plant {
        plant();
        let d = SocketDir::lock(tmp.path(), 0o660, None).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(kind_at(&lock), Some(Kind::File { links: 1 }), "{what}");
        assert_eq!(std::fs::read_to_string(&lock).unwrap(), std::process::id().to_string(), "{what}");
        drop(d);
        assert!(kind_at(&lock).is_none(), "{what}: the lock file is removed at exit");
        v.assert_untouched();
    }
    // A folder at its name is refused, by name.
    std::fs::create_dir(&lock).unwrap();
    let e = SocketDir::lock(tmp.path(), 0o660, None).err().unwrap().to_string();
    assert!(e.contains(&lock.display().to_string()) && e.contains("it is a folder"), "{e}");
}

#[tokio::test]
async fn a_link_at_a_socket_name_is_replaced_other_files_are_refused() {
    let (tmp, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let v = Victim::new(out.path());
    let mut d = SocketDir::lock(tmp.path(), 0o660, None).unwrap();
    symlink(&v.0, tmp.path().join("a")).unwrap();
    let _a = d.bind("a").unwrap();
    assert_eq!(kind_at(&tmp.path().join("a")), Some(Kind::Socket));
    assert_eq!(std::fs::metadata(tmp.path().join("a")).unwrap().mode() & 0o777, 0o660);
    v.assert_untouched();
    // A stale socket is replaced.
    drop(StdUnixListener::bind(tmp.path().join("b")).unwrap());
    let _b = d.bind_with_mode("b", 0o600).unwrap();
    assert_eq!(std::fs::metadata(tmp.path().join("b")).unwrap().mode() & 0o777, 0o600);
    nix::unistd::mkfifo(&tmp.path().join("c"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let e = d.bind("c").err().unwrap().to_string();
    assert!(e.contains("is a FIFO, not a socket"), "{e}");
    std::fs::hard_link(&v.0, tmp.path().join("h")).unwrap();
    let e = d.bind("h").err().unwrap().to_string();
    assert!(e.contains("a file with 2 names"), "{e}");
    v.assert_untouched();
}

#[tokio::test]
async fn only_what_it_made_is_removed_at_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = SocketDir::lock(tmp.path(), 0o660, None).unwrap();
    let _a = d.bind("a").unwrap();
    let _b = d.bind("b").unwrap();
    // A client replaces socket `a` with its own, and the lock file with a file of its own.
    std::fs::remove_file(tmp.path().join("a")).unwrap();
    let theirs = StdUnixListener::bind(tmp.path().join("a")).unwrap();
    std::fs::remove_file(tmp.path().join(LOCK_FILE)).unwrap();
    std::fs::write(tmp.path().join(LOCK_FILE), b"theirs").unwrap();
    drop(d);
    assert_eq!(kind_at(&tmp.path().join("a")), Some(Kind::Socket), "their socket stays");
    assert!(kind_at(&tmp.path().join("b")).is_none(), "ours goes");
    assert_eq!(std::fs::read(tmp.path().join(LOCK_FILE)).unwrap(), b"theirs");
    drop(theirs);
}

#[test]
fn the_bound_socket_is_told_from_another_at_its_name() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = SharedDir::open(tmp.path()).unwrap();
    let a = StdUnixListener::bind(tmp.path().join("a")).unwrap();
    let b = StdUnixListener::bind(tmp.path().join("b")).unwrap();
    let (fa, _) = dir.open_path("a").unwrap();
    assert!(is_bound_to(&a, fa.as_fd()).unwrap());
    assert!(!is_bound_to(&b, fa.as_fd()).unwrap(), "a connection through a arrives at a, not b");
    // A socket file nobody listens on.
    drop(b);
    let (fb, _) = dir.open_path("b").unwrap();
    assert!(!is_bound_to(&a, fb.as_fd()).unwrap());
}

#[tokio::test]
async fn a_disarmed_folder_removes_nothing_and_the_holder_is_written_anew() {
    let tmp = tempfile::tempdir().unwrap();
    let mut first = SocketDir::lock(tmp.path(), 0o660, None).unwrap();
    let _l = first.bind("a").unwrap();
    let (lock, listeners, _) = first.handover();
    let lock = lock.unwrap().try_clone_to_owned().unwrap();
    let handed: HashMap<String, OwnedFd> =
        listeners.map(|(n, fd)| (n.to_string(), fd.try_clone_to_owned().unwrap())).collect();
    let mut second = SocketDir::adopt(tmp.path(), 0o660, None, lock, handed, Vec::new()).unwrap();
    second.disarm();
    let _l2 = second.bind("a").unwrap();
    // A successor that fails before the commit lets go of the folder as it found it.
    drop(second);
    assert!(tmp.path().join("a").exists() && tmp.path().join(LOCK_FILE).exists());
    // The lock named someone else (a successor that is gone): written anew.
    std::fs::write(tmp.path().join(LOCK_FILE), "4194304").unwrap();
    first.record_holder().unwrap();
    let named = std::fs::read_to_string(tmp.path().join(LOCK_FILE)).unwrap();
    assert_eq!(named, std::process::id().to_string());
    let c = tokio::net::UnixStream::connect(tmp.path().join("a")).await;
    assert!(c.is_ok(), "listened on again, still serving");
    first.disarm();
    first.arm();
    drop(first);
    assert!(!tmp.path().join("a").exists() && !tmp.path().join(LOCK_FILE).exists());
}

#[tokio::test]
async fn the_folders_the_first_daemon_made_go_with_the_last_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("made/tcpx");
    let mut first = SocketDir::lock(&dir, 0o660, None).unwrap();
    let _l = first.bind("a").unwrap();
    let (lock, listeners, made) = first.handover();
    assert_eq!(made.len(), 2, "the folder and its missing parent");
    let lock = lock.unwrap().try_clone_to_owned().unwrap();
    let handed: HashMap<String, OwnedFd> =
        listeners.map(|(n, fd)| (n.to_string(), fd.try_clone_to_owned().unwrap())).collect();
    // As the handover carries them: the descriptors duplicated, the names copied.
    let created = made
        .iter()
        .map(|c| {
            let (parent, name, path, own) = c.parts();
            let dup = |fd: BorrowedFd<'_>| fd.try_clone_to_owned().unwrap();
            Created::from_parts(dup(parent), name.to_os_string(), path.to_path_buf(), dup(own)).unwrap()
        })
        .collect();
    let mut second = SocketDir::adopt(&dir, 0o660, None, lock, handed, created).unwrap();
    let _l2 = second.bind("a").unwrap();
    std::mem::forget(first); // as a daemon that handed over: exits without cleanup
    drop(second);
    assert!(!tmp.path().join("made").exists(), "the successor left the folders the first one made");
    assert!(tmp.path().exists());
}
