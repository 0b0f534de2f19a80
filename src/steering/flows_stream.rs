//! `/debug/flows` as a stream: one NIC at a time, the rule table copied
//! under its lock (no NIC call or formatting inside), then written out as
//! JSON in chunks of about [`CHUNK`] bytes through a bounded channel. A
//! reader that stops reading stalls the producer instead of growing memory.

use std::sync::Arc;

use serde::Serialize;
use tokio::sync::mpsc;

use super::RulePath;

/// Bytes gathered before a chunk is handed to the writer.
pub const CHUNK: usize = 64 * 1024;

/// Channel capacity: chunks waiting for a slow reader.
pub const QUEUED_CHUNKS: usize = 2;

/// Streams `{"nics":[...]}` for every NIC, or only `only` (an ifname), into
/// the returned receiver. The body has the shape of the earlier, one-piece
/// `/debug/flows`: per NIC `ifname`, `capacity`, `rules`, `nic_rules` (null
/// when the NIC could not be read) and `nic_error` (only then).
/// `hold` (a concurrency permit) is kept until the producer ends.
pub fn spawn<T: Send + 'static>(
    state: Arc<RulePath>,
    only: Option<String>,
    hold: T,
) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(QUEUED_CHUNKS);
    tokio::spawn(async move {
        // An error only means the reader went away.
        let _ = produce(&state, only.as_deref(), &tx).await;
        drop(hold);
    });
    rx
}

struct Out<'a> {
    buf: Vec<u8>,
    tx: &'a mpsc::Sender<Vec<u8>>,
}

impl Out<'_> {
    fn raw(&mut self, s: &str) {
        self.buf.extend_from_slice(s.as_bytes());
    }

    fn value<T: Serialize + ?Sized>(&mut self, v: &T) {
        serde_json::to_writer(&mut self.buf, v).expect("serialising to memory cannot fail");
    }

    /// Hands the buffer over once it is a chunk's worth.
    async fn maybe_flush(&mut self) -> Result<(), ()> {
        if self.buf.len() >= CHUNK {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), ()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK + 1024));
        self.tx.send(chunk).await.map_err(|_| ())
    }
}

async fn produce(state: &RulePath, only: Option<&str>, tx: &mpsc::Sender<Vec<u8>>) -> Result<(), ()> {
    let mut out = Out { buf: Vec::with_capacity(CHUNK + 1024), tx };
    out.raw("{\"nics\":[");
    let mut first_nic = true;
    for w in state.nics.iter().filter(|w| only.is_none_or(|n| n == w.ifname)) {
        let copy = w.booked_copy().await;
        let (capacity, booked) = (copy.capacity, copy.rules);
        if !first_nic {
            out.raw(",");
        }
        first_nic = false;
        out.raw("{\"ifname\":");
        out.value(&w.ifname);
        out.raw(&format!(",\"capacity\":{capacity},\"rules\":["));
        for (i, (flow, entry)) in booked.iter().enumerate() {
            if i > 0 {
                out.raw(",");
            }
            out.value(&w.booked_rule(flow, entry));
            out.maybe_flush().await?;
        }
        drop(booked);
        out.raw("],\"nic_rules\":");
        // Read outside the engine lock: installs go on meanwhile.
        match w.nic_rules().await {
            Ok(rules) => {
                out.raw("[");
                for (i, r) in rules.iter().enumerate() {
                    if i > 0 {
                        out.raw(",");
                    }
                    out.value(r);
                    out.maybe_flush().await?;
                }
                out.raw("]");
            }
            Err(e) => {
                out.raw("null,\"nic_error\":");
                out.value(&e.to_string());
            }
        }
        out.raw(",\"foreign_slots\":");
        out.value(&copy.foreign_slots);
        out.raw("}");
        out.maybe_flush().await?;
    }
    out.raw("]}");
    out.flush().await
}
