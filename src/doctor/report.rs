//! The report: one line per check, the verdict, and its text and JSON forms.

use std::fmt::Write as _;

use serde::Serialize;

/// The mark of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// ✔ present and as needed.
    Pass,
    /// ! works, but worth knowing (does not fail the verdict).
    Warn,
    /// ✗ missing or wrong: GPUDirect-TCPX will not work until fixed.
    Fail,
    /// – not applicable to this preset or backend.
    Skip,
}

impl Status {
    pub fn mark(self) -> &'static str {
        match self {
            Status::Pass => "✔",
            Status::Warn => "!",
            Status::Fail => "✗",
            Status::Skip => "–",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub section: String,
    pub name: String,
    pub status: Status,
    pub found: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// Every check, in the order they ran.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub preset: String,
    pub nic_backend: String,
    pub gpu_backend: String,
    pub checks: Vec<Check>,
}

impl Report {
    pub(super) fn add(
        &mut self,
        section: &str,
        name: &str,
        status: Status,
        found: impl Into<String>,
        fix: Option<String>,
    ) {
        self.checks.push(Check {
            section: section.to_string(),
            name: name.to_string(),
            status,
            found: found.into(),
            fix,
        });
    }

    /// True when nothing the chosen preset needs is missing.
    pub fn ok(&self) -> bool {
        !self.checks.iter().any(|c| c.status == Status::Fail)
    }

    pub fn failures(&self) -> usize {
        self.checks.iter().filter(|c| c.status == Status::Fail).count()
    }

    /// The human-readable report.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "tcpx-rxdm doctor: preset {}, NIC backend {}, GPU backend {}",
            self.preset, self.nic_backend, self.gpu_backend
        );
        let mut section = "";
        for c in &self.checks {
            if c.section != section {
                section = &c.section;
                let _ = writeln!(out, "\n{section}");
            }
            let _ = writeln!(out, "  {} {}: {}", c.status.mark(), c.name, c.found);
            if let Some(fix) = &c.fix {
                let _ = writeln!(out, "      → {fix}");
            }
        }
        let warns = self.checks.iter().filter(|c| c.status == Status::Warn).count();
        let _ = writeln!(out);
        if self.ok() {
            let _ = writeln!(
                out,
                "verdict: ready: everything preset {} needs is here ({warns} warning{})",
                self.preset,
                if warns == 1 { "" } else { "s" }
            );
        } else {
            let n = self.failures();
            let _ = writeln!(
                out,
                "verdict: NOT ready: {n} problem{} (✗) for preset {}",
                if n == 1 { "" } else { "s" },
                self.preset
            );
        }
        out
    }

    /// The machine-readable report.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "ok": self.ok(),
            "preset": self.preset,
            "nic_backend": self.nic_backend,
            "gpu_backend": self.gpu_backend,
            "failures": self.failures(),
            "checks": self.checks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_failure_fails_the_verdict_and_warnings_do_not() {
        let mut r = Report { preset: "sim".into(), ..Default::default() };
        r.add("a", "x", Status::Pass, "fine", None);
        r.add("a", "y", Status::Warn, "meh", None);
        r.add("b", "z", Status::Skip, "n/a", None);
        assert!(r.ok());
        assert!(r.text().contains("verdict: ready"));
        r.add("b", "w", Status::Fail, "broken", Some("fix it".into()));
        assert!(!r.ok());
        let text = r.text();
        assert!(text.contains("✗ w: broken\n      → fix it"), "{text}");
        assert!(text.contains("NOT ready: 1 problem"), "{text}");
        assert_eq!(r.json()["checks"][3]["status"], "fail");
    }
}
