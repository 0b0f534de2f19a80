//! Finding the NVIDIA driver's user-space libraries (`libcuda`,
//! `libnvidia-ml`) where the common installations put them, and saying which
//! file was loaded.
//!
//! The search, first match wins:
//! 1. the dynamic loader, by the library's name: `LD_LIBRARY_PATH`, the
//!    `ld.so.cache` and the default folders. This finds a driver installed on
//!    the host, and the libraries that the NVIDIA Container Toolkit (the GPU
//!    Operator's runtime class `nvidia`) puts into a container;
//! 2. the folders of [`search_dirs`], in order: GKE's mount point in
//!    containers, GKE's host folder, then the GPU Operator's driver container
//!    root (`/run/nvidia/driver`) in its Debian/Ubuntu and RHEL layouts.
//!
//! A library found in step 2 is loaded by its full path and stays loaded, so
//! that a later lookup by its name (cudarc asks for `libcuda.so.1`) is
//! answered by that same file: the loader matches an already loaded object by
//! its soname.

use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};

/// GKE: where the driver installer's libraries are mounted in containers.
pub const GKE_CONTAINER_DIR: &str = "/usr/local/nvidia/lib64";
/// GKE: the same libraries on the node itself.
pub const GKE_HOST_DIR: &str = "/home/kubernetes/bin/nvidia/lib64";
/// The GPU Operator's driver container puts its root here on the node.
pub const OPERATOR_DRIVER_ROOT: &str = "/run/nvidia/driver";

/// Debian's multiarch folder name for this build's architecture.
const MULTIARCH: &str = if cfg!(target_arch = "aarch64") { "aarch64-linux-gnu" } else { "x86_64-linux-gnu" };

/// The folders tried after the dynamic loader, in order.
pub fn search_dirs() -> Vec<PathBuf> {
    vec![
        PathBuf::from(GKE_CONTAINER_DIR),
        PathBuf::from(GKE_HOST_DIR),
        Path::new(OPERATOR_DRIVER_ROOT).join("usr/lib").join(MULTIARCH),
        Path::new(OPERATOR_DRIVER_ROOT).join("usr/lib64"),
    ]
}

/// How a library was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// By name, through the dynamic loader's own search.
    Loader,
    /// In this folder of [`search_dirs`].
    Folder(PathBuf),
}

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Found::Loader => f.write_str("found by the dynamic loader"),
            Found::Folder(d) => write!(f, "found in {}", d.display()),
        }
    }
}

/// Why no library could be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverLibError {
    #[error(
        "{name} not found: searched the dynamic loader's path (LD_LIBRARY_PATH, ld.so.cache) \
         and {searched}"
    )]
    NotFound { name: String, searched: String },
    #[error("{path}: present but does not load: {why}")]
    Unloadable { path: String, why: String },
}

/// A loaded driver library; it stays loaded as long as this value lives.
#[derive(Debug)]
pub struct DriverLibrary {
    pub lib: libloading::Library,
    /// The name it was asked for (the first of the candidates).
    pub name: String,
    pub found: Found,
}

impl DriverLibrary {
    /// The file the loader mapped for this library, from the address of one
    /// of its symbols (`None` when the loader cannot say).
    pub fn path_of_symbol(&self, symbol: &str) -> Option<PathBuf> {
        // SAFETY: only looks the symbol's address up; nothing is called.
        let sym = unsafe { self.lib.get::<*const c_void>(symbol.as_bytes()) }.ok()?;
        // SAFETY: reading the symbol's value as a pointer is what `get`
        // returns it for; it stays valid while `self.lib` is loaded.
        let addr = unsafe { sym.try_as_raw_ptr() }?;
        loaded_from(addr as usize)
    }
}

/// The file of the loaded object holding address `addr` (`dladdr`; the
/// address is only a key, never read through).
pub fn loaded_from(addr: usize) -> Option<PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `info` is a writable Dl_info; dladdr compares `addr` with the
    // loaded objects' ranges and does not read through it.
    if unsafe { libc::dladdr(addr as *const c_void, info.as_mut_ptr()) } == 0 {
        return None;
    }
    // SAFETY: dladdr returned non-zero, so it filled `info`.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: the loader owns this NUL-terminated string for the object's lifetime.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(name.to_string_lossy().into_owned()))
}

/// Opens the first of `names` that the dynamic loader finds, else the first
/// that exists in one of `dirs` (in order: every name in the first folder,
/// then the next folder).
pub fn open(names: &[&str], dirs: &[PathBuf]) -> Result<DriverLibrary, DriverLibError> {
    let first = names.first().copied().unwrap_or_default().to_string();
    for name in names {
        // SAFETY: loading a driver library runs its initialisers, which is what
        // every CUDA program does; the name has no path, so only the loader's
        // own search is used.
        if let Ok(lib) = unsafe { libloading::Library::new(*name) } {
            return Ok(DriverLibrary { lib, name: first, found: Found::Loader });
        }
    }
    let mut unloadable = None;
    for (dir, path) in candidates(names, dirs).into_iter().filter(|(_, p)| p.exists()) {
        // SAFETY: as above, for a file of the driver's own library folder.
        match unsafe { libloading::Library::new(&path) } {
            Ok(lib) => return Ok(DriverLibrary { lib, name: first, found: Found::Folder(dir) }),
            Err(e) => {
                unloadable.get_or_insert(DriverLibError::Unloadable {
                    path: path.display().to_string(),
                    why: e.to_string(),
                });
            }
        }
    }
    Err(unloadable.unwrap_or_else(|| DriverLibError::NotFound { name: first, searched: describe(dirs) }))
}

/// Every `dir/name`, folder by folder.
fn candidates(names: &[&str], dirs: &[PathBuf]) -> Vec<(PathBuf, PathBuf)> {
    dirs.iter().flat_map(|d| names.iter().map(move |n| (d.clone(), d.join(n)))).collect()
}

/// `a, b and c`.
fn describe(dirs: &[PathBuf]) -> String {
    let v: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    match v.split_last() {
        None => "no folder".into(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_are_tried_in_order_every_name_in_each() {
        let dirs = [PathBuf::from("/a"), PathBuf::from("/b")];
        let c: Vec<PathBuf> = candidates(&["x.so.1", "x.so"], &dirs).into_iter().map(|(_, p)| p).collect();
        assert_eq!(c, ["/a/x.so.1", "/a/x.so", "/b/x.so.1", "/b/x.so"].map(PathBuf::from));
        let order: Vec<String> = search_dirs().iter().map(|d| d.display().to_string()).collect();
        assert_eq!(order[..2], [GKE_CONTAINER_DIR, GKE_HOST_DIR]);
        assert!(order[2..].iter().all(|d| d.starts_with("/run/nvidia/driver/usr/lib")), "{order:?}");
    }

    #[test]
    fn nothing_found_names_every_place_searched() {
        let empty = tempfile::tempdir().unwrap();
        let dirs = [empty.path().join("one"), empty.path().join("two")];
        let e = open(&["libtcpx-absent.so.1"], &dirs).unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with("libtcpx-absent.so.1 not found: searched the dynamic loader"), "{text}");
        assert!(text.contains(&format!("{} and {}", dirs[0].display(), dirs[1].display())), "{text}");
    }

    #[test]
    fn a_file_that_is_no_library_is_reported_not_skipped_silently() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("libtcpx-broken.so.1"), b"not an ELF file").unwrap();
        let e = open(&["libtcpx-broken.so.1"], &[dir.path().to_path_buf()]).unwrap_err();
        assert!(
            matches!(&e, DriverLibError::Unloadable { path, .. } if path.ends_with("libtcpx-broken.so.1")),
            "{e}"
        );
    }

    /// Builds `dir/libtcpxprobe.so.1` (soname `libtcpxprobe.so.1`) whose
    /// `tcpx_probe()` returns `value`.
    fn build_probe(dir: &Path, value: i32) -> PathBuf {
        let src = dir.join("probe.c");
        std::fs::write(&src, format!("int tcpx_probe(void) {{ return {value}; }}\n")).unwrap();
        let out = dir.join("libtcpxprobe.so.1");
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-Wl,-soname,libtcpxprobe.so.1", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .expect("a C compiler (cc) builds the probe library");
        assert!(status.success());
        out
    }

    #[test]
    fn a_library_found_in_a_folder_answers_later_lookups_by_name() {
        let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // The same library in two folders: the first folder wins.
        build_probe(first.path(), 7);
        build_probe(second.path(), 9);
        let dirs = [first.path().join("missing"), first.path().to_path_buf(), second.path().to_path_buf()];
        let lib = open(&["libtcpxprobe.so.1"], &dirs).unwrap();
        assert_eq!(lib.found, Found::Folder(first.path().to_path_buf()));
        let path = lib.path_of_symbol("tcpx_probe").expect("the loader names the file");
        assert_eq!(path, first.path().join("libtcpxprobe.so.1"));
        // By name now (what cudarc does): the loaded object, matched by soname.
        // SAFETY: the probe library has no initialisers; the symbol's type is its C type.
        let by_name = unsafe { libloading::Library::new("libtcpxprobe.so.1") }.expect("matched by soname");
        // SAFETY: as above.
        let probe = unsafe { by_name.get::<unsafe extern "C" fn() -> i32>(b"tcpx_probe") }.unwrap();
        // SAFETY: a C function without arguments.
        assert_eq!(unsafe { probe() }, 7);
        assert!(Found::Folder(first.path().into()).to_string().starts_with("found in /"));
    }
}
