//! How a command ended: what each subcommand returns, and what `main` alone
//! turns into the process's exit status (one mapping, for every command).

/// The end of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It did what was asked, and the answer is yes (exit 0).
    Done,
    /// It ran, and the answer is no, or what it needed was not there: a
    /// check found a problem, no daemon answered, a daemon is not ready, a
    /// takeover failed (exit 1).
    Failed,
    /// What it was given cannot work: a bad value, a file that is not
    /// there, flags that do not go together (exit 2).
    Usage,
}

impl Exit {
    /// The exit status: 0, 1 or 2, as the man pages and `--help` say.
    pub fn exit_code(self) -> u8 {
        match self {
            Exit::Done => 0,
            Exit::Failed => 1,
            Exit::Usage => 2,
        }
    }

    /// `Done` when `ok`, else `Failed`.
    pub fn of(ok: bool) -> Exit {
        if ok {
            Exit::Done
        } else {
            Exit::Failed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_end_has_its_own_exit_status() {
        let codes = [Exit::Done, Exit::Failed, Exit::Usage].map(Exit::exit_code);
        assert_eq!(codes, [0, 1, 2]);
        assert_eq!(Exit::of(true), Exit::Done);
        assert_eq!(Exit::of(false), Exit::Failed);
    }
}
