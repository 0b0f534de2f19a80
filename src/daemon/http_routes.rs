//! The daemon's HTTP routes: `/metrics`, `/healthz`, `/readyz`, `/debug/flows`,
//! `/debug/config`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use crate::metrics::http::{Handler, Response};
use crate::metrics::Metrics;
use crate::server::ServerState;

pub struct Routes {
    pub metrics: Arc<Metrics>,
    pub ready: AtomicBool,
    pub state: OnceLock<Arc<ServerState>>,
    pub config_json: OnceLock<String>,
}

impl Routes {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Routes {
            metrics,
            ready: AtomicBool::new(false),
            state: OnceLock::new(),
            config_json: OnceLock::new(),
        }
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
        self.metrics.ready.set(ready as i64);
    }
}

impl Handler for Routes {
    async fn get(&self, path: &str) -> Response {
        match path {
            "/metrics" => Response {
                status: 200,
                content_type: "text/plain; version=0.0.4; charset=utf-8",
                body: self.metrics.render(),
            },
            "/healthz" => Response::text(200, "ok\n"),
            "/readyz" => match self.ready.load(Ordering::SeqCst) {
                true => Response::text(200, "ready\n"),
                false => Response::text(503, "not ready\n"),
            },
            "/debug/flows" => match self.state.get() {
                Some(s) => Response::json(s.flows_json().await),
                None => Response::text(503, "rule endpoints not started\n"),
            },
            "/debug/config" => match self.config_json.get() {
                Some(c) => Response::json(c.clone()),
                None => Response::text(503, "starting\n"),
            },
            _ => Response::text(404, "not found\n"),
        }
    }
}
