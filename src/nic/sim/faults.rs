//! Faults and delays the simulated NIC can be armed with: what
//! `--sim_fault` and `--sim_delay` parse into, and the state that decides,
//! call by call, whether one fires.

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use nix::errno::Errno;

use super::errno::errno_from_name;
use super::rng::Rng;
use crate::nic::NicOp;

/// A fault to inject: operation `op` fails with `errno`, either with
/// probability `prob` on each call or exactly on the `nth` call (1-based).
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub op: NicOp,
    pub errno: Errno,
    pub trigger: Trigger,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Trigger {
    Probability(f64),
    Nth(u64),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid value \"{0}\": {1}")]
pub struct FaultParseError(pub String, pub &'static str);

impl FromStr for Fault {
    type Err = FaultParseError;

    /// `OP:ERRNO:PROB`, e.g. `add_rule:EBUSY:0.5`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| FaultParseError(s.to_string(), why);
        let mut parts = s.split(':');
        let (Some(op), Some(errno), Some(prob), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(err("expected OP:ERRNO:PROB"));
        };
        let op =
            match op {
                "add_rule" => NicOp::AddRule,
                "del_rule" => NicOp::DelRule,
                "set_feature" => NicOp::SetFeature,
                "set_priv_flag" => NicOp::SetPrivFlag,
                "set_rss" => NicOp::SetRss,
                "list_rules" => NicOp::ListRules,
                _ => return Err(err(
                    "OP must be one of add_rule, del_rule, set_feature, set_priv_flag, set_rss, list_rules",
                )),
            };
        let errno = errno_from_name(errno).ok_or_else(|| err("ERRNO must be an errno name such as EBUSY"))?;
        let prob: f64 = prob.parse().map_err(|_| err("PROB must be a number in [0,1]"))?;
        if !(0.0..=1.0).contains(&prob) {
            return Err(err("PROB must be a number in [0,1]"));
        }
        Ok(Fault { op, errno, trigger: Trigger::Probability(prob) })
    }
}

/// A delay for every call of one operation: `--sim_delay=OP:DELAY[:IFNAME]`,
/// on every simulated NIC or only on `IFNAME`. `DELAY` may also be
/// `until=FILE`: each call waits until FILE exists (a test releases a NIC
/// operation it holds, whatever the machine's speed), and `FILE.held`
/// appears once a call waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimDelay {
    pub op: NicOp,
    /// How long each call waits (zero with `until`).
    pub by: Duration,
    pub ifname: Option<String>,
    /// Each call waits until this file exists.
    pub until: Option<PathBuf>,
}

/// How a call of a delayed operation waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stall {
    For(Duration),
    /// Until the file exists (looked for every 5 ms).
    Until(PathBuf),
}

impl Stall {
    /// Waits, on the calling thread, as a slow NIC would keep it.
    pub(super) fn wait(&self) {
        match self {
            Stall::For(d) => std::thread::sleep(*d),
            Stall::Until(file) => {
                // Tells a test that a call is held now.
                let _ = std::fs::write(held_marker(file), b"");
                while !file.exists() {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
}

/// The file that exists once a call is held until `file` exists: `FILE.held`.
pub fn held_marker(file: &std::path::Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".held");
    PathBuf::from(name)
}

impl SimDelay {
    /// How each call waits.
    pub fn stall(&self) -> Stall {
        match &self.until {
            Some(file) => Stall::Until(file.clone()),
            None => Stall::For(self.by),
        }
    }
}

impl FromStr for SimDelay {
    type Err = FaultParseError;

    /// `OP:DELAY[:IFNAME]`, e.g. `del_rule:50` or `add_rule:200us:eth1`; OP is any
    /// NIC operation name. DELAY is a whole number of milliseconds, or a whole
    /// number with a unit: `50ms`, `200us`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| FaultParseError(s.to_string(), why);
        let mut parts = s.splitn(3, ':');
        let (Some(op), Some(delay)) = (parts.next(), parts.next()) else {
            return Err(err("expected OP:DELAY[:IFNAME]"));
        };
        let ifname = match parts.next() {
            Some("") => return Err(err("IFNAME after the second ':' is empty")),
            other => other.map(str::to_string),
        };
        let op = NicOp::from_name(op)
            .ok_or_else(|| err("OP must be a NIC operation such as add_rule or del_rule"))?;
        if let Some(file) = delay.strip_prefix("until=") {
            if file.is_empty() {
                return Err(err("until= names no file"));
            }
            return Ok(SimDelay { op, by: Duration::ZERO, ifname, until: Some(file.into()) });
        }
        let (digits, unit): (&str, fn(u64) -> Duration) = if let Some(d) = delay.strip_suffix("us") {
            (d, Duration::from_micros)
        } else if let Some(d) = delay.strip_suffix("ms") {
            (d, Duration::from_millis)
        } else {
            (delay, Duration::from_millis)
        };
        let bad = "DELAY must be a whole number of milliseconds, or a whole number ending in ms or us (e.g. 20, 20ms, 200us)";
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err(bad));
        }
        let n: u64 = digits.parse().map_err(|_| err(bad))?;
        Ok(SimDelay { op, by: unit(n), ifname, until: None })
    }
}

/// The faults and delays a simulated NIC is armed with.
#[derive(Debug)]
pub(super) struct FaultState {
    pub(super) faults: Vec<Fault>,
    /// Per operation, and per NIC (`None`: every NIC).
    pub(super) delays: HashMap<(NicOp, Option<String>), Stall>,
    rng: Rng,
}

impl FaultState {
    pub(super) fn new() -> Self {
        FaultState { faults: Vec::new(), delays: HashMap::new(), rng: Rng::from_clock() }
    }

    /// For the `n`th call of `op` (1-based, counted over every NIC) on
    /// `ifname`: the delay to apply and the errno to fail with, if any. A
    /// fault for the `n`th call fires once and is then forgotten.
    pub(super) fn on_call(&mut self, ifname: &str, op: NicOp, n: u64) -> (Option<Stall>, Option<Errno>) {
        let delay = self
            .delays
            .get(&(op, Some(ifname.to_string())))
            .or_else(|| self.delays.get(&(op, None)))
            .cloned();
        let mut fail = None;
        for i in 0..self.faults.len() {
            if self.faults[i].op != op {
                continue;
            }
            let fires = match self.faults[i].trigger {
                Trigger::Nth(k) => k == n,
                Trigger::Probability(p) => p >= 1.0 || (p > 0.0 && self.rng.next_f64() < p),
            };
            if fires {
                fail = Some(self.faults[i].errno);
                if matches!(self.faults[i].trigger, Trigger::Nth(_)) {
                    self.faults.remove(i);
                }
                break;
            }
        }
        (delay, fail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_flag_parsing() {
        let d: SimDelay = "del_rule:50".parse().unwrap();
        assert_eq!(
            d,
            SimDelay { op: NicOp::DelRule, by: Duration::from_millis(50), ifname: None, until: None }
        );
        let d: SimDelay = "add_rule:1000:eth2".parse().unwrap();
        assert_eq!(
            d,
            SimDelay {
                op: NicOp::AddRule,
                by: Duration::from_secs(1),
                ifname: Some("eth2".into()),
                until: None
            }
        );
        let d: SimDelay = "add_rule:200us:eth2".parse().unwrap();
        assert_eq!((d.by, d.ifname.as_deref()), (Duration::from_micros(200), Some("eth2")));
        let cases = [
            ("add_rule:20", Duration::from_millis(20)),
            ("add_rule:20ms", Duration::from_millis(20)),
            ("add_rule:200us", Duration::from_micros(200)),
            ("add_rule:0us", Duration::ZERO),
            ("add_rule:1500us", Duration::from_micros(1500)),
        ];
        for (s, want) in cases {
            assert_eq!(
                s.parse::<SimDelay>().unwrap(),
                SimDelay { op: NicOp::AddRule, by: want, ifname: None, until: None },
                "{s}"
            );
        }
        for bad in [
            "del_rule",
            "frob:5",
            "del_rule:-1",
            "del_rule:1.5",
            "del_rule:+5",
            "del_rule:",
            "del_rule:ms",
            "del_rule:us",
            "del_rule:20ns",
            "del_rule:20s",
            "del_rule:20 us",
            "del_rule:20usms",
            "del_rule:99999999999999999999us",
            "del_rule:5:",
        ] {
            let e = bad.parse::<SimDelay>().unwrap_err();
            assert_eq!(e.0, bad, "the error names the value");
        }
        let d: SimDelay = "add_rule:until=/tmp/go:eth1".parse().unwrap();
        assert_eq!(d.stall(), Stall::Until("/tmp/go".into()));
        assert_eq!(d.ifname.as_deref(), Some("eth1"));
        assert!("add_rule:until=".parse::<SimDelay>().is_err());
        let e = "add_rule:5ns".parse::<SimDelay>().unwrap_err();
        assert!(e.to_string().contains("200us"), "{e}");
    }

    #[test]
    fn fault_flag_parsing() {
        let f: Fault = "set_rss:EAGAIN:0.25".parse().unwrap();
        assert_eq!(f, Fault { op: NicOp::SetRss, errno: Errno::EAGAIN, trigger: Trigger::Probability(0.25) });
        for bad in [
            "add_rule:EBUSY",
            "frob:EBUSY:1",
            "add_rule:ENOPE:1",
            "add_rule:EBUSY:2",
            "add_rule:EBUSY:x",
            "a:b:c:d",
        ] {
            assert!(bad.parse::<Fault>().is_err(), "{bad}");
        }
    }
}
