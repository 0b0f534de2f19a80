//! Failures the takeover tests place at each step, on either side. Test
//! only: read in debug builds alone (the profile the tests run), so a
//! release binary never looks at the variable.
//!
//! `TCPX_RXDM_TEST_TAKEOVER_FAULT=[old:|new:]STEP:ACTION` (no side: the new
//! daemon). The new daemon's steps: `hello` (hello sent, offer not read),
//! `state` (the state is here, nothing decoded), `adopted` (adopted sent,
//! commit not read), `commit` (commit read, nothing armed, not serving yet),
//! `serving` (serving: its gate is open, the answer not sent). The old
//! daemon's: `hello` (hello read, nothing paused or sent), `adopted`
//! (adopted read, commit not sent), `commit` (commit sent, serving not
//! read). Actions: `exit` (status 3), `kill` (SIGKILL to itself), `panic`,
//! `stall` (sleeps an hour), `stop` (SIGSTOP to itself: a test then kills the
//! other daemon at exactly this step, and SIGCONT lets this one go on). A bare `exit` or `stall` is
//! `new:state:` that action.

/// Where in the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    Hello,
    State,
    Adopted,
    Commit,
    Serving,
}

/// Which daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Old,
    New,
}

const VAR: &str = "TCPX_RXDM_TEST_TAKEOVER_FAULT";

/// Fails here if the tests asked for it.
pub(super) fn at(side: Side, step: Step) {
    if !cfg!(debug_assertions) {
        return;
    }
    let Ok(spec) = std::env::var(VAR) else { return };
    let Some(action) = parse(&spec).filter(|(s, st, _)| (*s, *st) == (side, step)).map(|(_, _, a)| a) else {
        return;
    };
    eprintln!("{VAR}={spec}: failing here on purpose");
    match action {
        "exit" => std::process::exit(3),
        "kill" => {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            std::process::exit(3);
        }
        "panic" => panic!("{VAR}={spec}: a panic on purpose"),
        "stop" => {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
        }
        _ => std::thread::sleep(std::time::Duration::from_secs(3600)),
    }
}

fn parse(spec: &str) -> Option<(Side, Step, &str)> {
    let (side, rest) = match spec.split_once(':') {
        Some(("old", r)) => (Side::Old, r),
        Some(("new", r)) => (Side::New, r),
        _ => (Side::New, spec),
    };
    let (step, action) = match rest.split_once(':') {
        Some((s, a)) => (s, a),
        None => ("state", rest),
    };
    let step = match step {
        "hello" => Step::Hello,
        "state" => Step::State,
        "adopted" => Step::Adopted,
        "commit" => Step::Commit,
        "serving" => Step::Serving,
        _ => return None,
    };
    matches!(action, "exit" | "kill" | "panic" | "stall" | "stop").then_some((side, step, action))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_name_a_side_a_step_and_an_action() {
        assert_eq!(parse("exit"), Some((Side::New, Step::State, "exit")));
        assert_eq!(parse("stall"), Some((Side::New, Step::State, "stall")));
        assert_eq!(parse("adopted:kill"), Some((Side::New, Step::Adopted, "kill")));
        assert_eq!(parse("new:hello:panic"), Some((Side::New, Step::Hello, "panic")));
        assert_eq!(parse("old:commit:kill"), Some((Side::Old, Step::Commit, "kill")));
        assert_eq!(parse("old:hello:kill"), Some((Side::Old, Step::Hello, "kill")));
        assert_eq!(parse("new:serving:kill"), Some((Side::New, Step::Serving, "kill")));
        assert_eq!(parse("old:adopted:stop"), Some((Side::Old, Step::Adopted, "stop")));
        assert_eq!(parse("old:later:kill"), None);
        assert_eq!(parse("new:commit:explode"), None);
    }
}
