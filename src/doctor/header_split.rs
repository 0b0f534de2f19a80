//! The header-split lines of one NIC: which control its driver offers, and
//! whether header split is on now.

use super::{Ctx, Report, Status};
use crate::nic::{DataSplit, HeaderSplit, PRIV_HEADER_SPLIT};

pub(super) fn header_split_lines(r: &mut Report, ctx: &Ctx, s: &str, ifname: &str, f: &HeaderSplit) {
    let running = ctx.daemon_on_these_nics().is_some();
    let (family_status, family, on) = match f {
        HeaderSplit::PrivFlags { flags, strict, max_rx_buffer } => {
            let mut extra = Vec::new();
            if *strict {
                extra.push("strict");
            }
            if *max_rx_buffer {
                extra.push("max-rx-buffer-size");
            }
            let on = flags.iter().any(|(n, v)| n == PRIV_HEADER_SPLIT && *v);
            let also = if extra.is_empty() { String::new() } else { format!("; also {}", extra.join(", ")) };
            (Status::Pass, format!("private flags ({PRIV_HEADER_SPLIT}{also})"), Some(on))
        }
        HeaderSplit::DataSplit { start } => {
            (Status::Pass, "rings tcp-data-split (upstream)".to_string(), Some(*start == DataSplit::Enabled))
        }
        HeaderSplit::RingSizeFallback { start } => (
            Status::Warn,
            format!(
                "no header-split control; rx ring {} of {} is resized after binding instead (works only where the driver rebuilds its page pools)",
                start.current, start.max
            ),
            None,
        ),
        HeaderSplit::Unsupported => (Status::Fail, "none: no private flags, no tcp-data-split, no ring control".into(), None),
    };
    let fix = (family_status == Status::Fail).then(|| {
        "GPUDirect-TCPX needs header split: gVNIC (gve) on a COS image with the TCPX driver, or a driver with rings tcp-data-split".to_string()
    });
    r.add(s, "header split", family_status, family, fix);
    match on {
        Some(true) if running => {
            r.add(s, "header split state", Status::Pass, "on (the running daemon enabled it)", None)
        }
        Some(true) if ctx.daemon_unknown() => r.add(
            s,
            "header split state",
            Status::Pass,
            "on: a running daemon enabled it, or a previous one left the NIC primed (whether a daemon \
             runs cannot be told here: see the host section)",
            None,
        ),
        Some(true) => r.add(
            s,
            "header split state",
            Status::Warn,
            "already on with no daemon running: a previous daemon left the NIC primed",
            Some(format!(
                "harmless for the next start (it turns it off, binds, then on); by hand: `{}`",
                undo_header_split(ifname, f)
            )),
        ),
        Some(false) if running => r.add(
            s,
            "header split state",
            Status::Warn,
            "off although a daemon runs: it may still be starting, or the driver was reset",
            None,
        ),
        Some(false) => {
            r.add(s, "header split state", Status::Pass, "off (the daemon turns it on after binding)", None)
        }
        None => {}
    }
}

/// The `ethtool` command that turns header split off by hand.
fn undo_header_split(ifname: &str, f: &HeaderSplit) -> String {
    match f {
        HeaderSplit::DataSplit { .. } => format!("ethtool -G {ifname} tcp-data-split off"),
        _ => format!("ethtool --set-priv-flags {ifname} {PRIV_HEADER_SPLIT} off"),
    }
}
