//! The daemon's HTTP routes: `/metrics`, `/healthz`, `/readyz`, `/debug/flows`
//! (`?nic=<ifname>` for one NIC), `/debug/config`.
//!
//! `/debug/*` lists every peer address, so by default only loopback peers may
//! read it (`--debug_endpoints`). `/debug/flows` is streamed and at most
//! [`DEBUG_FLOWS_AT_ONCE`] are produced at once: each holds a copy of one
//! NIC's rule table while it is written out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::metrics::Metrics;
use crate::server::http::{DebugAccess, Handler, Request, Response, TurnedAway};
use crate::server::ServerState;
use crate::steering::flows_stream;

/// `/debug/flows` responses produced at the same time.
pub const DEBUG_FLOWS_AT_ONCE: usize = 2;
/// How long a `/debug/flows` request waits for its turn before a 503.
const DEBUG_FLOWS_WAIT: Duration = Duration::from_secs(5);

pub struct Routes {
    pub metrics: Arc<Metrics>,
    pub ready: AtomicBool,
    pub state: OnceLock<Arc<ServerState>>,
    pub config_json: OnceLock<String>,
    /// Per-queue counters, refreshed when `/metrics` is scraped (set once the NICs are up).
    pub datapath: OnceLock<Arc<super::datapath::Datapath>>,
    debug: DebugAccess,
    flows_turns: Arc<Semaphore>,
}

impl Routes {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Routes {
            metrics,
            ready: AtomicBool::new(false),
            state: OnceLock::new(),
            config_json: OnceLock::new(),
            datapath: OnceLock::new(),
            debug: DebugAccess::Local,
            flows_turns: Arc::new(Semaphore::new(DEBUG_FLOWS_AT_ONCE)),
        }
    }

    /// Who may read `/debug/*` (default: loopback peers).
    pub fn with_debug_access(mut self, debug: DebugAccess) -> Self {
        self.debug = debug;
        self
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
        self.metrics.ready.set(ready as i64);
    }

    async fn flows(&self, req: &Request) -> Response {
        let Some(state) = self.state.get() else {
            return Response::text(503, "rule endpoints not started\n");
        };
        let only = match flows_nic(req, state.rules.nics.iter().map(|w| w.ifname.as_str())) {
            Ok(only) => only,
            Err(text) => return Response::text(404, text),
        };
        let turn =
            match tokio::time::timeout(DEBUG_FLOWS_WAIT, self.flows_turns.clone().acquire_owned()).await {
                Ok(Ok(t)) => t,
                _ => return Response::text(503, "too many /debug/flows requests at once; retry\n"),
            };
        // The turn is held by the producer until the body is written or the reader is gone.
        let rx = flows_stream::spawn(state.rules.clone(), only, turn);
        Response::json_stream(rx)
    }
}

/// The NIC that `/debug/flows?nic=NAME` asks for, among the `managed` ones:
/// `Ok(None)` for all of them; `Err`: the text of the 404 reply.
pub(crate) fn flows_nic<'a>(
    req: &Request,
    managed: impl Iterator<Item = &'a str> + Clone,
) -> Result<Option<String>, String> {
    let Some(nic) = req.param("nic") else { return Ok(None) };
    if managed.clone().any(|m| m == nic) {
        return Ok(Some(nic));
    }
    let shown: String = nic.chars().take(64).collect();
    Err(format!("no managed NIC {shown:?} (managed: {})\n", managed.collect::<Vec<_>>().join(", ")))
}

impl Handler for Routes {
    async fn get(&self, req: &Request) -> Response {
        let path = req.path.as_str();
        if path.starts_with("/debug/") {
            if self.debug == DebugAccess::Off {
                return Response::text(
                    404,
                    "/debug/* is off: it lists every tenant's flows, and an HTTP peer cannot be told to be \
                     the node's operator; start the daemon with --debug_endpoints=local to serve it to \
                     loopback peers, or ask `tcpx-rxdm status flows` as the operator\n",
                );
            }
            if !self.debug.allows(req.peer) {
                return Response::text(
                    403,
                    "/debug/* is served to loopback peers only (--debug_endpoints=all opens it)\n",
                );
            }
        }
        match path {
            "/metrics" => {
                if let Some(dp) = self.datapath.get() {
                    dp.refresh_async().await;
                }
                Response {
                    status: 200,
                    content_type: "text/plain; version=0.0.4; charset=utf-8",
                    body: crate::server::http::Body::Full(self.metrics.render()),
                }
            }
            "/healthz" => Response::text(200, "ok\n"),
            "/readyz" => match self.ready.load(Ordering::SeqCst) {
                true => Response::text(200, "ready\n"),
                false => Response::text(503, "not ready\n"),
            },
            "/debug/flows" => self.flows(req).await,
            "/debug/config" => match self.config_json.get() {
                Some(c) => Response::json(c.clone()),
                None => Response::text(503, "starting\n"),
            },
            _ => Response::text(404, "not found\n"),
        }
    }

    fn turned_away(&self, why: TurnedAway) {
        self.metrics.http_turned_away.with_label_values(&[why.name()]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_take_one_managed_nic_or_all() {
        let managed = ["eth1", "eth-2"];
        let ask = |target: &str| {
            flows_nic(&Request::new(target, "127.0.0.1:1".parse().unwrap()), managed.into_iter())
        };
        assert_eq!(ask("/debug/flows"), Ok(None));
        assert_eq!(ask("/debug/flows?nic=eth1"), Ok(Some("eth1".into())));
        assert_eq!(ask("/debug/flows?nic=eth%2d2"), Ok(Some("eth-2".into())));
        assert_eq!(
            ask("/debug/flows?nic=eth9"),
            Err("no managed NIC \"eth9\" (managed: eth1, eth-2)\n".into())
        );
        let long = ask(&format!("/debug/flows?nic={}", "x".repeat(5000))).unwrap_err();
        assert!(long.len() < 200, "{long}");
    }
}
