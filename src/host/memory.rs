//! The process's heap: glibc keeps freed memory in its arenas unless asked
//! to give it back. Layers that free large blocks note it here; the server's
//! trimmer task (which also watches connection counts) does the trimming.

use std::sync::atomic::{AtomicBool, Ordering};

static TRIM_WANTED: AtomicBool = AtomicBool::new(false);

/// Notes that a large block was freed (a table shrank); the next check trims.
pub fn note_large_free() {
    TRIM_WANTED.store(true, Ordering::Relaxed);
}

/// Returns freed heap memory to the system (glibc only; elsewhere a no-op).
/// Returns whether anything was released.
pub fn trim() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim only walks the allocator's own free lists.
        unsafe { libc::malloc_trim(0) != 0 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}

/// Fixes glibc's mmap threshold at 128 KiB (its initial value). glibc
/// otherwise raises the threshold each time a large mmapped block is freed
/// (up to 32 MiB), after which large tables and buffers come from the heap,
/// where freed memory stays; fixed, every block of 128 KiB or more is mapped
/// on its own and unmapped when freed.
pub fn fix_mmap_threshold() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; called before threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// Whether a large free was noted since the last call; clears the note.
pub fn take_trim_request() -> bool {
    TRIM_WANTED.swap(false, Ordering::Relaxed)
}
