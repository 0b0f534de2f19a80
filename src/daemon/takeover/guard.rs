//! A panic in a daemon that is taking over, until it has told the old daemon
//! that it serves, ends the process at once: nothing unwinds, so no destructor runs over what it holds
//! of the daemon that still serves (socket files, undo logs), and a panic in a
//! task or thread is not swallowed while the takeover goes on as if adopted.
//!
//! Why a hook rather than `panic = "abort"`: it holds in every profile,
//! including the one the tests run, and only for the takeover's window; a
//! panic anywhere else keeps unwinding as it always has (a client task's
//! panic ends that task, not the node's daemon).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

static ADOPTING: AtomicBool = AtomicBool::new(false);
static HOOK: Once = Once::new();

/// From now until [`disarm`], a panic anywhere in the process exits it with
/// status 1 after the panic's message.
pub(super) fn arm() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !ADOPTING.load(Ordering::Acquire) {
                return previous(info);
            }
            // The message only: the usual hook may resolve a backtrace
            // (RUST_BACKTRACE), which takes seconds on a busy machine while
            // the old daemon waits for an answer, and outlasts its patience.
            // Written so that a closed standard error cannot panic in here.
            let _ = writeln!(std::io::stderr(), "{info}");
            tracing::error!(
                "a panic while taking over: exiting at once, undoing nothing; the daemon taken over from serves on"
            );
            std::process::exit(super::super::EXIT_FAILURE.into());
        }));
    });
    ADOPTING.store(true, Ordering::Release);
}

/// The old daemon was told (or no takeover happens): panics unwind again.
pub(super) fn disarm() {
    ADOPTING.store(false, Ordering::Release);
}
