//! The load generator: `clients` threads, a new connection per request (the
//! NCCL plugin's pattern), every reply checked byte for byte.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use tcpx_rxdm::wire::client::{raw_bytes, rule_request, status_code};
use tcpx_rxdm::wire::frame;

/// Where a run's rules go: the GPU to name (or none: routed by `dst`) and the
/// destination address (an address of the NIC that serves that GPU).
#[derive(Debug, Clone)]
pub struct Target {
    pub gpu: Option<String>,
    pub dst: String,
}

/// Framed `flow_steer_rule_request`s for flows `first..first + n`, spread
/// round-robin over `targets`. Flow numbers give distinct source addresses and
/// ports, so every request is a new install for a daemon that has not seen the
/// numbers before.
pub fn rule_frames(first: usize, n: usize, targets: &[Target]) -> Vec<Vec<u8>> {
    (first..first + n)
        .map(|i| {
            let t = &targets[i % targets.len()];
            let src = format!("10.{}.{}.{}", 1 + (i >> 16) % 250, (i >> 8) & 0xff, i & 0xff);
            let req =
                rule_request(1, (&src, 40000 + (i % 20000) as i32), (&t.dst, 5000), t.gpu.as_deref(), None);
            frame::encode(&req).expect("a rule request fits a frame")
        })
        .collect()
}

/// What one run saw.
#[derive(Debug, Default)]
pub struct Run {
    /// Connect-to-reply time of each correct reply (unsorted).
    pub lat: Vec<Duration>,
    pub errors: usize,
    /// Error descriptions and how often each happened.
    pub error_kinds: BTreeMap<String, usize>,
    /// From the moment all clients are released to the last reply.
    pub wall: Duration,
}

/// Sends every request of `reqs` once, from `clients` threads, each on a new
/// connection; a reply counts only if it is exactly `expect`.
pub fn drive(sock: &Path, clients: usize, reqs: &Arc<Vec<Vec<u8>>>, expect: &Arc<Vec<u8>>) -> Run {
    let next = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(Barrier::new(clients + 1));
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let (sock, next, go, reqs, expect) =
                (sock.to_path_buf(), next.clone(), go.clone(), reqs.clone(), expect.clone());
            std::thread::spawn(move || {
                go.wait();
                let mut run = Run::default();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(req) = reqs.get(i) else { break };
                    let t = Instant::now();
                    match one(&sock, req, &expect) {
                        Ok(()) => run.lat.push(t.elapsed()),
                        Err(e) => {
                            run.errors += 1;
                            *run.error_kinds.entry(e).or_default() += 1;
                        }
                    }
                }
                (run, Instant::now())
            })
        })
        .collect();
    go.wait();
    let start = Instant::now();
    let mut total = Run::default();
    let mut end = start;
    for h in handles {
        let (run, done) = h.join().expect("client thread");
        total.lat.extend(run.lat);
        total.errors += run.errors;
        for (k, v) in run.error_kinds {
            *total.error_kinds.entry(k).or_default() += v;
        }
        end = end.max(done);
    }
    total.wall = end - start;
    total
}

/// One request on a fresh connection: connect, send, read one whole reply
/// frame, check it, close. A bare blocking stream, like the plugin's.
pub fn one(sock: &Path, req: &[u8], expect: &[u8]) -> Result<(), String> {
    let mut s = UnixStream::connect(sock).map_err(|e| format!("connect: {e}"))?;
    s.write_all(req).map_err(|e| format!("write: {e}"))?;
    let mut buf = [0u8; 512];
    let mut have = 0;
    loop {
        let k = s.read(&mut buf[have..]).map_err(|e| format!("read: {e}"))?;
        if k == 0 {
            return Err(match have {
                0 => "closed without a reply".to_string(),
                n => format!("closed after {n} bytes of a reply"),
            });
        }
        have += k;
        if let Some(body) = frame::body_len(&buf[..have]) {
            if have >= frame::HEADER_LEN + body {
                break;
            }
        }
        if have == buf.len() {
            return Err(format!("reply longer than {} bytes", buf.len()));
        }
    }
    check(&buf[..have], expect)
}

/// Whether `reply` (everything read for one request) is exactly `expect`; if
/// not, a short description of what came instead.
pub fn check(reply: &[u8], expect: &[u8]) -> Result<(), String> {
    if reply == expect {
        return Ok(());
    }
    match frame::parse(reply) {
        Ok(Some((_, used))) if used < reply.len() => {
            Err(format!("{} bytes after the reply frame", reply.len() - used))
        }
        Ok(Some((msg, _))) => {
            let text = raw_bytes(&msg).map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
            Err(format!("reply status {} raw_bytes {text:?}", status_code(&msg)))
        }
        Ok(None) => Err(format!("incomplete reply of {} bytes", reply.len())),
        Err(e) => Err(format!("malformed reply: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcpx_rxdm::types::status::StatusCode;

    fn ok_frame() -> Vec<u8> {
        frame::encode(&frame::ok()).unwrap()
    }

    #[test]
    fn the_ok_frame_is_seven_bytes() {
        assert_eq!(ok_frame(), b"\x00\x05\x0a\x03Ok.");
    }

    #[test]
    fn check_accepts_only_the_exact_ok_frame() {
        let ok = ok_frame();
        assert_eq!(check(&ok, &ok), Ok(()));
        let err = frame::encode(&frame::error(StatusCode::ResourceExhausted, "no free slot")).unwrap();
        let e = check(&err, &ok).unwrap_err();
        assert!(e.contains("status 8") && e.contains("no free slot"), "{e}");
        let mut extra = ok.clone();
        extra.push(0);
        assert!(check(&extra, &ok).unwrap_err().contains("1 bytes after"));
        assert!(check(&ok[..4], &ok).unwrap_err().contains("incomplete"));
        let other = frame::encode(&frame::raw("Ok!")).unwrap();
        assert!(check(&other, &ok).unwrap_err().contains("\"Ok!\""));
    }

    #[test]
    fn rule_frames_are_distinct_flows_over_the_targets() {
        let targets = [
            Target { gpu: Some("0000:04:00.0".into()), dst: "192.168.1.2".into() },
            Target { gpu: None, dst: "192.168.2.2".into() },
        ];
        let frames = rule_frames(70_000, 600, &targets);
        assert_eq!(frames.len(), 600);
        let distinct: std::collections::HashSet<_> = frames.iter().collect();
        assert_eq!(distinct.len(), 600);
        use tcpx_rxdm::wire::proto::unix_socket_proto::Payload;
        for (j, f) in frames.iter().enumerate() {
            let (msg, used) = frame::parse(f).unwrap().unwrap();
            assert_eq!(used, f.len());
            let Some(Payload::FlowSteerRuleRequest(r)) = msg.payload else { panic!("not a rule request") };
            let t = &targets[(70_000 + j) % 2];
            assert_eq!(r.gpu_pci_addr, t.gpu);
            let n = r.flow_steer_ntuple.unwrap();
            assert_eq!(n.dst.unwrap().ip_address.as_deref(), Some(t.dst.as_str()));
        }
    }
}
