//! The NCCL plugin's settings in doctor's own environment, checked like
//! `tcpx-rxdm nccl-env --check` does, when any of the plugin's variables is
//! set (doctor run in the workload's shell or container).

use super::report::{Report, Status};
use super::Ctx;
use crate::nccl::{self, Sysfs};

const SECTION: &str = "NCCL settings";

pub(super) fn check_nccl(r: &mut Report, ctx: &Ctx) {
    let (vars, any) = nccl::process_env();
    if !any {
        r.add(
            SECTION,
            "environment",
            Status::Skip,
            "no NCCL_GPUDIRECTTCPX_* variable set here",
            Some("`tcpx-rxdm nccl-env` prints the settings for this node".into()),
        );
        return;
    }
    let Some(topo) = &ctx.topo else {
        r.add(SECTION, "environment", Status::Skip, "no topology to check against", None);
        return;
    };
    let report = nccl::check_env(&Sysfs::for_flags(ctx.flags), topo, &ctx.flags.uds_path, &vars);
    for p in &report.problems {
        let fix = match &p.fix {
            Some(v) => format!("{}={}", p.variable, nccl::env::shell_quote(v)),
            None if p.unset => format!("unset {} (the settings for this node leave it out)", p.variable),
            None => "`tcpx-rxdm nccl-env` prints the right value".into(),
        };
        r.add(SECTION, &p.variable, Status::Fail, p.message.clone(), Some(fix));
    }
    for n in &report.notes {
        r.add(SECTION, "not checked", Status::Warn, n.clone(), None);
    }
    if report.ok {
        r.add(
            SECTION,
            "environment",
            Status::Pass,
            format!("the plugin's settings match this daemon ({}, {})", report.nics.join(","), report.prefix),
            None,
        );
    }
}
