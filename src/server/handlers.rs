//! Request handling on the runtime: queue ids, the application registry and
//! the pool endpoints (parse, act, pick the exact reply bytes); rule requests
//! go to the rule path ([`steering::request`]). Malformed input gets
//! INVALID_ARGUMENT and the connection closes.

use std::sync::Arc;

use super::ServerState;
use crate::endpoint::Endpoint;
pub use crate::endpoint::Reply;
use crate::gpu::RxPool;
use crate::identity::Client;
use crate::types::pci::PciAddr;
use crate::types::status::StatusCode;
use crate::wire::frame;
use crate::wire::proto::{unix_socket_proto::Payload, QueueIdResponse, UnixSocketProto};

/// Per-connection facts the handlers need.
pub struct ConnContext {
    pub pid: Option<u32>,
    pub registered: bool,
    /// The client process, found at the first request that needs it.
    pub client: Option<Client>,
}

fn invalid(msg: impl Into<String>) -> Reply {
    Reply::Close(frame::error(StatusCode::InvalidArgument, msg))
}

pub fn handle(endpoint: Endpoint, msg: UnixSocketProto, state: &ServerState, ctx: &mut ConnContext) -> Reply {
    match endpoint {
        // Served by the rule path's own threads (`steering::intake`); never accepted here.
        Endpoint::RuleManager | Endpoint::RuleUninstall => Reply::Close(frame::error(
            StatusCode::Internal,
            "rule requests are served on the rule endpoints only",
        )),
        Endpoint::QueueIdsByGpu => queue_ids(state, msg),
        Endpoint::Registry => registry(state, msg, ctx),
        Endpoint::GpuFd(gpu) => pool_fd(state, msg, gpu, ctx),
        Endpoint::GpuMetadata(gpu) => pool_metadata(state, msg, gpu, ctx),
        Endpoint::GpuIpcHandle => ipc_handle(state, msg, ctx),
    }
}

fn queue_ids(state: &ServerState, msg: UnixSocketProto) -> Reply {
    let Some(Payload::QueueIdQuery(q)) = msg.payload else {
        return invalid("expected a queue_id_query");
    };
    let gpu: PciAddr = match q.gpu_pci_addr.parse() {
        Ok(g) => g,
        Err(e) => return invalid(e.to_string()),
    };
    match state.gpus.get(&gpu) {
        Some(g) => Reply::Message(UnixSocketProto {
            payload: Some(Payload::QueueIdResponse(QueueIdResponse {
                queue_ids: g.queues.iter().map(|&q| q as i32).collect(),
            })),
            status: None,
        }),
        None => Reply::Message(frame::error(
            StatusCode::NotFound,
            format!("GPU {gpu} is not managed by this daemon"),
        )),
    }
}

fn registry(state: &ServerState, msg: UnixSocketProto, ctx: &mut ConnContext) -> Reply {
    let Some(Payload::ApplicationRegisterRequest(r)) = msg.payload else {
        return invalid("expected an application_register_request");
    };
    let want = r.register_client.unwrap_or(false);
    if want && !ctx.registered {
        ctx.registered = true;
        state.registry.register(&state.shared.metrics);
        tracing::info!(pid = ctx.pid, apps = state.registry.count(), "application registered");
    } else if !want && ctx.registered {
        ctx.registered = false;
        state.registry.unregister(&state.shared.metrics);
    }
    Reply::Message(frame::ok())
}

/// The PCI address a pool request names in `raw_bytes` (NULs and spaces trimmed).
fn requested_gpu(msg: &UnixSocketProto) -> Result<Option<PciAddr>, Box<Reply>> {
    let Some(Payload::RawBytes(b)) = &msg.payload else {
        return Err(Box::new(invalid("expected raw_bytes with a GPU PCI address")));
    };
    let text = String::from_utf8_lossy(b);
    Ok(text.trim_matches(|c: char| c == '\0' || c.is_whitespace()).parse().ok())
}

fn pool_for(
    state: &ServerState,
    want: Option<PciAddr>,
    endpoint_gpu: Option<PciAddr>,
) -> Option<Arc<dyn RxPool>> {
    let gpu = want?;
    if endpoint_gpu.is_some_and(|e| e != gpu) {
        return None;
    }
    state.gpus.get(&gpu)?.pool.as_ref()?.upgrade()
}

/// The tenant check of a pool request for `want`: the refusal to send, if any.
fn refused(state: &ServerState, ctx: &ConnContext, kind: &str, want: Option<PciAddr>) -> Option<Reply> {
    if !state.shared.tenants.checks() {
        return None;
    }
    let pci = want?;
    let gpu = state.gpus.get(&pci)?;
    let who = ctx.client.clone().unwrap_or_default();
    let endpoint = format!("gpu_{kind}");
    let denied = state.shared.tenants.check_gpu(&endpoint, &who, gpu.slot.ordinal, &pci).err()?;
    count(state, kind, denied.code());
    Some(Reply::Message(frame::error(denied.code(), denied.message)))
}

fn count(state: &ServerState, kind: &str, code: StatusCode) {
    state.shared.metrics.pool_requests.with_label_values(&[kind, code.name()]).inc();
}

fn pool_fd(state: &ServerState, msg: UnixSocketProto, gpu: PciAddr, ctx: &ConnContext) -> Reply {
    let want = match requested_gpu(&msg) {
        Ok(w) => w,
        Err(r) => return *r,
    };
    if let Some(r) = refused(state, ctx, "fd", want) {
        return r;
    }
    // Pools shared only by IPC handle (`--gpu_shmem_type file`) have no fd.
    match pool_for(state, want, Some(gpu)).filter(|p| p.share_fd().is_some()) {
        Some(pool) => {
            count(state, "fd", StatusCode::Ok);
            Reply::Fd(pool)
        }
        None => {
            count(state, "fd", StatusCode::NotFound);
            Reply::Message(frame::error(StatusCode::NotFound, "Not found."))
        }
    }
}

/// 24 bytes: i32 LE fd number, 4 zero bytes, u64 LE size, u64 LE alignment.
pub fn metadata_bytes(fd: i32, size: u64, alignment: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    out.extend_from_slice(&fd.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&alignment.to_le_bytes());
    out
}

fn pool_metadata(state: &ServerState, msg: UnixSocketProto, gpu: PciAddr, ctx: &ConnContext) -> Reply {
    use std::os::fd::AsRawFd;
    let want = match requested_gpu(&msg) {
        Ok(w) => w,
        Err(r) => return *r,
    };
    if let Some(r) = refused(state, ctx, "metadata", want) {
        return r;
    }
    let pool = pool_for(state, want, Some(gpu));
    match pool.as_ref().and_then(|p| Some(metadata_bytes(p.share_fd()?.as_raw_fd(), p.size(), p.alignment())))
    {
        Some(bytes) => {
            count(state, "metadata", StatusCode::Ok);
            Reply::Message(frame::raw(bytes))
        }
        None => {
            count(state, "metadata", StatusCode::InvalidArgument);
            Reply::Message(frame::error(StatusCode::InvalidArgument, "Not found."))
        }
    }
}

fn ipc_handle(state: &ServerState, msg: UnixSocketProto, ctx: &ConnContext) -> Reply {
    let want = match requested_gpu(&msg) {
        Ok(w) => w,
        Err(r) => return *r,
    };
    if let Some(r) = refused(state, ctx, "ipc_handle", want) {
        return r;
    }
    match pool_for(state, want, None).and_then(|p| p.ipc_handle()) {
        Some(h) => {
            count(state, "ipc_handle", StatusCode::Ok);
            Reply::Message(frame::raw(h.to_vec()))
        }
        None => {
            count(state, "ipc_handle", StatusCode::NotFound);
            Reply::Message(frame::error(StatusCode::NotFound, "Not found."))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_layout() {
        let b = metadata_bytes(7, 64 << 20, 4096);
        assert_eq!(b.len(), 24);
        assert_eq!(&b[0..8], &[7, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), 64 << 20);
        assert_eq!(u64::from_le_bytes(b[16..24].try_into().unwrap()), 4096);
    }
}
