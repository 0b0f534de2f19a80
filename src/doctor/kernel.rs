//! The kernel checks: version, the two queue-binding paths (devmem TCP and
//! the COS TCPX dma-buf ioctls), and peer pidfds for leases.

use nix::errno::Errno;

use super::{Ctx, Report, Status};
use crate::gpu::BinderKind;

/// `CTRL_ATTR_OPS` and `CTRL_ATTR_OP_ID` of the generic netlink controller.
const CTRL_ATTR_OPS: u16 = 6;
const CTRL_ATTR_OP_ID: u16 = 1;

/// The op ids of generic netlink family `name`; `None` when the kernel lacks the family.
fn genl_family_ops(name: &str) -> Result<Option<Vec<u32>>, String> {
    use crate::netlink::genl;
    use crate::netlink::{AttrSet, NlConn, NlError};
    let mut conn = NlConn::open(neli::consts::socket::NlFamily::Generic).map_err(|e| e.to_string())?;
    let replies = match conn.transact(&genl::get_family(name)) {
        Ok(r) => r,
        Err(NlError::Kernel { errno: Errno::ENOENT, .. }) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let attrs = genl::single_reply(&replies).map_err(|e| e.to_string())?;
    let mut ops = Vec::new();
    if let Some(list) = attrs.nested(CTRL_ATTR_OPS).map_err(|e| e.to_string())? {
        for (_, op) in list.iter() {
            if let Some(id) = AttrSet::parse(op).ok().and_then(|a| a.u32(CTRL_ATTR_OP_ID)) {
                ops.push(id);
            }
        }
    }
    Ok(Some(ops))
}

pub(super) fn check_kernel(r: &mut Report, ctx: &Ctx) {
    let s = "kernel";
    match nix::sys::utsname::uname() {
        Ok(u) => r.add(
            s,
            "version",
            Status::Pass,
            format!("{} {}", u.sysname().to_string_lossy(), u.release().to_string_lossy()),
            None,
        ),
        Err(e) => r.add(s, "version", Status::Warn, format!("uname: {e}"), None),
    }
    // A pool must be bound to the GPU queues by one of two kernel paths,
    // unless binding is off or the NICs are simulated.
    let bind = ctx.flags.bind_backend;
    let binding_needed = ctx.binding_needed;
    let devmem = genl_family_ops(crate::gpu::NETDEV_FAMILY_NAME);
    let devmem_ok =
        matches!(&devmem, Ok(Some(ops)) if ops.contains(&(crate::gpu::NETDEV_CMD_BIND_RX as u32)));
    let tcpx = tcpx_symbols();
    let tcpx_seen = tcpx.is_some();
    let not_needed = |wanted: bool| if wanted { Status::Warn } else { Status::Skip };
    let devmem_line = match &devmem {
        Ok(Some(_)) if devmem_ok => {
            (Status::Pass, "netdev family with BIND_RX (upstream devmem TCP)".to_string())
        }
        Ok(Some(_)) => {
            (not_needed(bind == BinderKind::Devmem), "netdev family without BIND_RX (kernel < 6.12)".into())
        }
        Ok(None) => (
            not_needed(bind == BinderKind::Devmem),
            "no netdev generic netlink family (kernel < 6.12)".into(),
        ),
        Err(e) => (Status::Warn, format!("cannot ask generic netlink: {e}")),
    };
    let devmem_status = if bind == BinderKind::Devmem && !devmem_ok { Status::Fail } else { devmem_line.0 };
    r.add(s, "devmem TCP", devmem_status, devmem_line.1, None);
    let tcpx_line = match &tcpx {
        Some(sym) => (Status::Pass, format!("likely present: kernel symbol {sym} (the ioctls themselves are only tried by the daemon: probing them creates a page pool on a GPU dma-buf)")),
        None => (
            if bind == BinderKind::Tcpx { Status::Fail } else { not_needed(binding_needed && !devmem_ok) },
            "unknown: no dma-buf page-pool symbols in /proc/kallsyms (not a COS TCPX kernel?); the ioctls cannot be probed without creating a page pool on a GPU dma-buf".into(),
        ),
    };
    r.add(s, "TCPX dma-buf ioctls", tcpx_line.0, tcpx_line.1, None);
    if !binding_needed {
        let why = if ctx.sim_nic { "simulated NICs" } else { "--bind_backend=none" };
        r.add(s, "queue binding", Status::Skip, format!("not needed ({why})"), None);
    } else if devmem_ok || tcpx_seen {
        let how = if devmem_ok { "devmem BIND_RX" } else { "TCPX dma-buf ioctls" };
        r.add(s, "queue binding", Status::Pass, format!("available through {how}"), None);
    } else {
        r.add(
            s,
            "queue binding",
            Status::Fail,
            "neither devmem TCP (netdev BIND_RX) nor the COS TCPX dma-buf ioctls were found",
            Some("use a COS image with GPUDirect-TCPX support (A3 node pools), or Linux ≥ 6.12 with devmem TCP".into()),
        );
    }

    let (status, found) = match crate::identity::probe_peer_pidfd() {
        Ok(()) => (Status::Pass, "SO_PEERPIDFD works (leases follow clients across pid namespaces)".to_string()),
        Err(Errno::ENOPROTOOPT) => (
            if ctx.flags.leases { Status::Warn } else { Status::Skip },
            "SO_PEERPIDFD not supported (Linux < 6.5): leases rely on peer pids, which break across pid namespaces".into(),
        ),
        Err(e) => (Status::Warn, format!("SO_PEERPIDFD: {e}")),
    };
    r.add(s, "peer pidfd", status, found, None);
}

/// A kernel symbol of the COS dma-buf page pool, if `/proc/kallsyms` lists one.
fn tcpx_symbols() -> Option<String> {
    let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .find(|sym| sym.starts_with("dma_buf_create_pages") || sym.starts_with("dma_buf_pages_"))
        .map(str::to_string)
}
