//! Linux capabilities: the few the daemon uses, whether the calling thread
//! holds them, and the words that name a missing one in an error.
//!
//! The kernel answers an operation that needs a capability the caller lacks
//! with a bare `EPERM` (or `EACCES`). Where the daemon gets one from such an
//! operation it adds [`lacking`]: which capability the operation needs and,
//! read from `/proc/thread-self/status` at that moment, whether this thread
//! holds it. A thread that holds it was refused by something else (a
//! seccomp filter, a security module), and the words say that instead.
//! `SECURITY.md` (*Privileges*) lists each capability with the operations
//! that need it.

use std::fmt;

/// A capability the daemon's operations need (or, `SysAdmin`, one that it
/// does without on purpose).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cap {
    /// Giving the socket folder, its sockets and `nccl.env` the socket group.
    Chown,
    /// Listing the open files (`/proc/<pid>/fd`, its owner's) of a client
    /// process of another user.
    DacReadSearch,
    /// An HTTP port below 1024.
    NetBindService,
    /// NIC priming and rules, the dma-buf bind, route metrics.
    NetAdmin,
    /// Reading a client process of another user; a takeover's proof.
    SysPtrace,
    /// Entering another network namespace (`setns`): not granted.
    SysAdmin,
}

/// The kernel's capability names, by bit (`include/uapi/linux/capability.h`).
const NAMES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

impl Cap {
    pub const ALL: [Cap; 6] =
        [Cap::Chown, Cap::DacReadSearch, Cap::NetBindService, Cap::NetAdmin, Cap::SysPtrace, Cap::SysAdmin];

    /// Its bit in the kernel's masks.
    pub const fn bit(self) -> u32 {
        match self {
            Cap::Chown => 0,
            Cap::DacReadSearch => 2,
            Cap::NetBindService => 10,
            Cap::NetAdmin => 12,
            Cap::SysPtrace => 19,
            Cap::SysAdmin => 21,
        }
    }

    /// `CAP_NET_ADMIN`.
    pub fn name(self) -> &'static str {
        NAMES[self.bit() as usize]
    }

    /// The name without `CAP_`, as Kubernetes and Docker write it (`NET_ADMIN`).
    pub fn short_name(self) -> &'static str {
        &self.name()[4..]
    }

    /// From `CAP_NET_ADMIN` or `NET_ADMIN` (any case).
    pub fn from_name(s: &str) -> Option<Cap> {
        let s = s.to_ascii_uppercase();
        let s = s.strip_prefix("CAP_").unwrap_or(&s);
        Cap::ALL.into_iter().find(|c| c.short_name() == s)
    }
}

impl fmt::Display for Cap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A capability set, as the kernel's 64-bit mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CapSet(pub u64);

impl CapSet {
    pub fn has(self, cap: Cap) -> bool {
        self.0 & (1 << cap.bit()) != 0
    }

    /// The names of its members, lowest bit first (`CAP_<n>` for a bit
    /// this build has no name for).
    pub fn names(self) -> Vec<String> {
        (0..64u32)
            .filter(|b| self.0 & (1 << b) != 0)
            .map(|b| NAMES.get(b as usize).map_or_else(|| format!("CAP_{b}"), |n| n.to_string()))
            .collect()
    }

    /// Its members for a message: `CAP_CHOWN, CAP_NET_ADMIN`, or `none`.
    pub fn describe(self) -> String {
        match self.names() {
            n if n.is_empty() => "none".into(),
            n => n.join(", "),
        }
    }
}

/// What a thread holds: the capabilities it may use now, and those it or
/// any program it runs could ever have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub effective: CapSet,
    pub bounding: CapSet,
}

impl Held {
    /// From the text of a `/proc/<pid>/status` file (`CapEff:`, `CapBnd:`).
    pub fn parse(status: &str) -> Option<Held> {
        let mask = |key: &str| {
            let line = status.lines().find_map(|l| l.strip_prefix(key))?;
            u64::from_str_radix(line.trim(), 16).ok().map(CapSet)
        };
        Some(Held { effective: mask("CapEff:")?, bounding: mask("CapBnd:")? })
    }

    /// The calling thread's (capabilities are per thread).
    pub fn this_thread() -> Option<Held> {
        let status = std::fs::read_to_string("/proc/thread-self/status")
            .or_else(|_| std::fs::read_to_string("/proc/self/status"))
            .ok()?;
        Held::parse(&status)
    }
}

/// Why an operation that needs `cap` was refused, for its error message:
/// `needs CAP_NET_ADMIN, which this process lacks: its bounding set holds
/// only ...; add NET_ADMIN to ...`, or, when the thread holds it, that
/// something else refused it.
pub fn lacking(cap: Cap) -> String {
    match Held::this_thread() {
        Some(held) => lacking_in(&held, cap),
        None => format!("needs {cap} (this process's capabilities could not be read)"),
    }
}

/// [`lacking`] for the capabilities `held`.
pub fn lacking_in(held: &Held, cap: Cap) -> String {
    if held.effective.has(cap) {
        return format!(
            "needs {cap}, which this process holds: a seccomp filter or a security module (AppArmor, \
             SELinux) refused it"
        );
    }
    if held.bounding.has(cap) {
        return format!(
            "needs {cap}, which this process lacks: it is in its bounding set but not effective; run the \
             daemon as root (uid 0)"
        );
    }
    let set = match held.bounding {
        CapSet(0) => "its bounding set is empty".to_string(),
        set => format!("its bounding set holds only {}", set.describe()),
    };
    format!(
        "needs {cap}, which this process lacks: {set}; add {} to the container's \
         securityContext.capabilities.add, or {cap} to the unit's CapabilityBoundingSet",
        cap.short_name()
    )
}

/// [`lacking`] for a refusal with `errno`: the words for `EPERM` and
/// `EACCES`, nothing for any other error.
pub fn refusal(errno: i32, cap: Cap) -> Option<String> {
    (errno == libc::EPERM || errno == libc::EACCES).then(|| lacking(cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_bits_agree_with_the_kernels() {
        assert_eq!(Cap::NetAdmin.name(), "CAP_NET_ADMIN");
        assert_eq!(Cap::SysPtrace.short_name(), "SYS_PTRACE");
        assert_eq!(Cap::NetBindService.name(), "CAP_NET_BIND_SERVICE");
        assert_eq!(Cap::SysAdmin.name(), "CAP_SYS_ADMIN");
        assert_eq!(Cap::from_name("net_admin"), Some(Cap::NetAdmin));
        assert_eq!(Cap::from_name("CAP_CHOWN"), Some(Cap::Chown));
        assert_eq!(Cap::from_name("NET_RAW"), None);
        assert_eq!(CapSet(1 << 12 | 1).describe(), "CAP_CHOWN, CAP_NET_ADMIN");
        assert_eq!(CapSet(1 << 45).names(), ["CAP_45"]);
        assert_eq!(CapSet(0).describe(), "none");
    }

    #[test]
    fn status_masks_parse_and_the_message_says_what_is_missing() {
        let status = "Name:\ttcpx-rxdm\nCapInh:\t0000000000000000\nCapPrm:\t0000000000001000\n\
                      CapEff:\t0000000000001000\nCapBnd:\t0000000000081001\nCapAmb:\t0000000000000000\n";
        let held = Held::parse(status).unwrap();
        assert!(held.effective.has(Cap::NetAdmin) && !held.effective.has(Cap::Chown));
        assert!(held.bounding.has(Cap::SysPtrace) && !held.bounding.has(Cap::SysAdmin));
        let chown = lacking_in(&held, Cap::Chown);
        assert_eq!(
            chown,
            "needs CAP_CHOWN, which this process lacks: it is in its bounding set but not effective; run \
             the daemon as root (uid 0)"
        );
        let admin = lacking_in(&held, Cap::SysAdmin);
        assert_eq!(
            admin,
            "needs CAP_SYS_ADMIN, which this process lacks: its bounding set holds only CAP_CHOWN, \
             CAP_NET_ADMIN, CAP_SYS_PTRACE; add SYS_ADMIN to the container's \
             securityContext.capabilities.add, or CAP_SYS_ADMIN to the unit's CapabilityBoundingSet"
        );
        let none = Held { effective: CapSet(0), bounding: CapSet(0) };
        assert!(lacking_in(&none, Cap::NetAdmin).contains("lacks: its bounding set is empty; add NET_ADMIN"));
        assert!(lacking_in(&held, Cap::NetAdmin).contains("which this process holds: a seccomp filter"));
        assert!(Held::parse("CapEff:\tzz\nCapBnd:\t0\n").is_none());
        assert!(Held::parse("CapEff:\t0\n").is_none());
        assert!(refusal(libc::ENOENT, Cap::NetAdmin).is_none());
        assert!(refusal(libc::EPERM, Cap::NetAdmin).unwrap().starts_with("needs CAP_NET_ADMIN"));
    }
}
