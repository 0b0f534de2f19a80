//! A request body read into memory: drawn on the [`Budget`] as its bytes
//! arrive (a declared length holds nothing past the connection's share
//! until its bytes come), within its own time (a body that stops coming is
//! cut off rather than holding its room), and refused when another request
//! needs the room it holds while it still trickles in.

use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Body, Bytes};
use tokio::time::Instant;

use super::budget::{BodyRoom, Budget, Holding};

/// Time every body has, whatever its length.
pub const BODY_GRACE: Duration = Duration::from_secs(1);
/// Bytes per second a body must arrive at, past [`BODY_GRACE`]: 4 MiB/s,
/// a thousandth of what an API server on the cluster network sends.
pub const BODY_RATE: usize = 4 << 20;

/// Why a request body was not taken.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("request body over {0} bytes")]
    TooLarge(usize),
    #[error(
        "request body not received in time: {got} bytes in the {:.1} s it had (a body has 1 s plus 1 s per 4 MiB it declares, within the request timeout)",
        allowed.as_secs_f64()
    )]
    Slow { got: usize, allowed: Duration },
    /// The common pool stayed full until the request's deadline.
    #[error(
        "the webhook is busy: other clients' request bodies and replies fill its buffers, and this request needs {need} bytes beyond the {share} kept for each request; try again"
    )]
    Busy { need: usize, share: usize },
    /// Another request needed the room it held while it still arrived.
    #[error(
        "request body still arriving after {:.2} s ({got} bytes) while another request needed its room; send the body at once",
        after.as_secs_f64()
    )]
    GaveBack { got: usize, after: Duration },
    #[error("reading the body: {0}")]
    Read(String),
}

impl BodyError {
    fn busy(budget: &Budget, total: usize) -> BodyError {
        BodyError::Busy { need: total.saturating_sub(budget.share()), share: budget.share() }
    }
}

/// How a body must arrive.
#[derive(Debug, Clone, Copy)]
pub struct BodyRules {
    /// Largest body taken.
    pub max: usize,
    /// The request's end: no body, and no wait for room, goes past it.
    pub deadline: Instant,
}

/// Reads a request body under `rules`, drawing on `budget` as its bytes
/// arrive. Its time is [`BODY_GRACE`] plus its declared length (or the
/// limit) at [`BODY_RATE`], not counting time spent waiting for room;
/// `room_wait(true)` is called when such a wait starts, `room_wait(false)`
/// when it ends. While it arrives, the budget may tell it to give its room
/// to another request ([`BodyError::GaveBack`]). Returns the body and its
/// holding.
pub async fn read_body<B>(
    mut body: B,
    declared: Option<u64>,
    rules: BodyRules,
    budget: &Budget,
    room_wait: &(dyn Fn(bool) + Send + Sync),
) -> Result<(Vec<u8>, Holding), BodyError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let max = rules.max;
    if declared.is_some_and(|n| n > max as u64) {
        return Err(BodyError::TooLarge(max));
    }
    let expected = declared.map_or(max, |n| n as usize);
    let start = Instant::now();
    let allowed = BODY_GRACE + Duration::from_secs_f64(expected as f64 / BODY_RATE as f64);
    let client_deadline = (start + allowed).min(rules.deadline);
    let mut held = budget.none();
    let mut data = Vec::new();
    let room = budget.body();
    let mut clock = Clock { client: client_deadline, end: rules.deadline };
    // The connection's own share is there for it: taken at once, up to the
    // length declared. Past it, nothing is held before it arrives.
    let first = expected.min(budget.share());
    grow(budget, &room, &mut held, first, &mut clock, room_wait).await?;
    data.reserve_exact(first);
    loop {
        let next = tokio::select! {
            biased;
            () = room.told_to_give_back() => {
                return Err(BodyError::GaveBack { got: data.len(), after: start.elapsed() })
            }
            next = tokio::time::timeout_at(clock.client, body.frame()) => next,
        };
        let frame = match next {
            Err(_) => return Err(BodyError::Slow { got: data.len(), allowed: clock.client - start }),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(BodyError::Read(e.to_string())),
            Ok(Some(Ok(f))) => f,
        };
        let Ok(chunk) = frame.into_data() else { continue };
        let need = data.len() + chunk.len();
        if need > max {
            return Err(BodyError::TooLarge(max));
        }
        if need > data.capacity() {
            // In steps of a quarter of what came, never past what may come:
            // what is held is what arrived, and a little.
            let step = (data.len() + data.len() / 4).min(expected.max(need)).min(max);
            let cap = need.max(step);
            grow(budget, &room, &mut held, cap, &mut clock, room_wait).await?;
            data.reserve_exact(cap - data.len());
        }
        data.extend_from_slice(&chunk);
    }
    data.shrink_to_fit();
    Budget::shrink_to(&mut held, data.capacity());
    Ok((data, held))
}

/// A body's deadlines: its client's, and the request's end.
struct Clock {
    client: Instant,
    end: Instant,
}

/// Grows `held` to `total` for a body; the client's clock stops while the
/// body waits for room.
async fn grow(
    budget: &Budget,
    room: &BodyRoom,
    held: &mut Holding,
    total: usize,
    clock: &mut Clock,
    room_wait: &(dyn Fn(bool) + Send + Sync),
) -> Result<(), BodyError> {
    if total <= held.bytes() {
        return Ok(());
    }
    let t = Instant::now();
    let mut waited = false;
    let r = budget.grow_to(held, total, clock.end, Some(room), || {
        waited = true;
        room_wait(true);
    });
    let r = r.await;
    if waited {
        room_wait(false);
        clock.client = (clock.client + t.elapsed()).min(clock.end);
    }
    r.map_err(|_| BodyError::busy(budget, total))
}

/// A reply's bytes with their holding of the budget, given back when the
/// last reference to them goes (hyper drops them once written).
pub fn held_bytes(data: Vec<u8>, held: Holding) -> Bytes {
    struct Held(Vec<u8>, #[allow(dead_code)] Holding);
    impl AsRef<[u8]> for Held {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }
    Bytes::from_owner(Held(data, held))
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};

    use hyper::body::Frame;
    use tokio::sync::mpsc;

    use super::*;
    use crate::inject::transport::budget::GIVE_BACK_AFTER;

    /// A body whose frames the test sends.
    struct Chan(mpsc::Receiver<Bytes>);

    impl Body for Chan {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
        }
    }

    type Read = tokio::task::JoinHandle<Result<(Vec<u8>, Holding), BodyError>>;

    /// Reads a body declaring `declared` bytes in a task: its sender, the
    /// read, and the room waits it reported (true: started, false: ended).
    fn reading(
        budget: &Budget,
        declared: usize,
        within: Duration,
    ) -> (mpsc::Sender<Bytes>, Read, Arc<Mutex<Vec<bool>>>) {
        let (tx, rx) = mpsc::channel(64);
        let budget = budget.clone();
        let waits = Arc::new(Mutex::new(Vec::new()));
        let log = waits.clone();
        let rules = BodyRules { max: 8 << 20, deadline: Instant::now() + within };
        let read = tokio::spawn(async move {
            let note = move |w: bool| log.lock().unwrap().push(w);
            read_body(Chan(rx), Some(declared as u64), rules, &budget, &note).await
        });
        (tx, read, waits)
    }

    async fn send(tx: &mpsc::Sender<Bytes>, n: usize) {
        tx.send(Bytes::from(vec![b'x'; n])).await.unwrap();
        // Let the reader take it.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_declared_length_holds_nothing_past_the_share_until_its_bytes_come() {
        let budget = Budget::new(1000, 4, 3000);
        let (tx, read, _) = reading(&budget, 2900, Duration::from_secs(10));
        send(&tx, 100).await;
        // Its share only, though it declared nearly the whole pool.
        assert_eq!(budget.common_free(), 3000);
        send(&tx, 1900).await;
        // 2,000 arrived: 1,000 past the share, rounded up by at most a quarter.
        let held = 3000 - budget.common_free();
        assert!((1000..=1500).contains(&held), "{held}");
        send(&tx, 900).await;
        drop(tx);
        let (data, holding) = read.await.unwrap().unwrap();
        assert_eq!((data.len(), holding.bytes()), (2900, 2900));
        assert_eq!(budget.common_free(), 1100);
        drop(holding);
        assert_eq!(budget.common_free(), 3000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_coming_is_cut_off_at_its_own_deadline() {
        let budget = Budget::new(1000, 4, 8 << 20);
        // 4 MiB declared: 1 s, plus 1 s for its length.
        let (tx, read, _) = reading(&budget, 4 << 20, Duration::from_secs(10));
        let t = Instant::now();
        send(&tx, 3 << 20).await;
        let e = read.await.unwrap().map(|_| ()).unwrap_err();
        assert_eq!(t.elapsed(), Duration::from_secs(2));
        assert!(matches!(e, BodyError::Slow { got, .. } if got == 3 << 20), "{e:?}");
        assert_eq!(
            e.to_string(),
            "request body not received in time: 3145728 bytes in the 2.0 s it had (a body has 1 s plus 1 s per 4 MiB it declares, within the request timeout)"
        );
        // Its bytes went back with it.
        assert_eq!(budget.common_free(), 8 << 20);
        // Never past the request's own end.
        let (_tx, read, _) = reading(&budget, 100, Duration::from_millis(300));
        let t = Instant::now();
        assert!(matches!(read.await.unwrap(), Err(BodyError::Slow { got: 0, .. })));
        assert_eq!(t.elapsed(), Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_share_a_body_takes_the_room_of_one_that_trickles_and_within_it_never_waits() {
        let budget = Budget::new(1000, 4, 3000);
        // A hostile body takes the whole common pool and holds it.
        let (hostile, held, _) = reading(&budget, 4001, Duration::from_secs(30));
        send(&hostile, 4000).await;
        assert_eq!(budget.common_free(), 0);
        // A typical review: in at once, no wait for room.
        let (tx, read, waits) = reading(&budget, 900, Duration::from_secs(30));
        send(&tx, 900).await;
        drop(tx);
        let (data, _typical) = read.await.unwrap().unwrap();
        assert_eq!(data.len(), 900);
        assert!(waits.lock().unwrap().is_empty());
        // A larger one waits for room (its client's clock stopped) until
        // the hostile body has been arriving for a quarter second, which
        // is then refused and gives its room back.
        let t = Instant::now();
        let (tx, read, waits) = reading(&budget, 1500, Duration::from_secs(30));
        send(&tx, 1500).await;
        assert_eq!(*waits.lock().unwrap(), [true]);
        drop(tx);
        let (data, holding) = read.await.unwrap().unwrap();
        assert_eq!((data.len(), holding.bytes()), (1500, 1500));
        assert_eq!(*waits.lock().unwrap(), [true, false]);
        assert!(t.elapsed() <= GIVE_BACK_AFTER, "{:?}", t.elapsed());
        let e = held.await.unwrap().map(|_| ()).unwrap_err();
        assert!(matches!(e, BodyError::GaveBack { got: 4000, .. }), "{e:?}");
        assert!(
            e.to_string().starts_with(
                "request body still arriving after 0.25 s (4000 bytes) while another request needed its room"
            ),
            "{e}"
        );
        drop((hostile, holding));

        // Room held by work in progress (a review, a reply) is not taken
        // back: no room by the request's end is 503's reason.
        let mut reviewing = budget.none();
        let far = Instant::now() + Duration::from_secs(60);
        budget.grow_to(&mut reviewing, 4000, far, None, || {}).await.unwrap();
        let (tx, read, _) = reading(&budget, 1500, Duration::from_millis(600));
        send(&tx, 1500).await;
        let e = read.await.unwrap().map(|_| ()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the webhook is busy: other clients' request bodies and replies fill its buffers, and this request needs 500 bytes beyond the 1000 kept for each request; try again"
        );
    }
}
