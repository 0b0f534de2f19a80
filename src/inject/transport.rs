//! What bounds a client of `inject serve` beyond HTTP's own limits: the
//! bytes of request bodies and replies held at once ([`budget`]), the time
//! a body may take to arrive ([`body`]), and the time a reply may take to
//! be written (a client that stops reading is cut off rather than holding
//! its reply).

pub mod body;
pub mod budget;

pub use body::{held_bytes, read_body, BodyError, BodyRules, BODY_GRACE, BODY_RATE};
pub use budget::{Budget, Holding};

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// A stream whose writes must be done within `limit`: from the first write
/// of a reply until it is flushed. A reply not taken by then fails the
/// connection with `TimedOut` and sets `expired`.
pub struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    deadline: Option<Pin<Box<Sleep>>>,
    expired: Arc<AtomicBool>,
}

impl<S> WriteDeadline<S> {
    pub fn new(inner: S, limit: Duration, expired: Arc<AtomicBool>) -> WriteDeadline<S> {
        WriteDeadline { inner, limit, deadline: None, expired }
    }

    /// Pending while the deadline holds; the error once it passed.
    fn wait<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let sleep = self.deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.expired.store(true, Ordering::Relaxed);
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("reply not taken within {:.1} s", limit.as_secs_f64()),
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// Starts the clock at a reply's first write.
    fn start(&mut self) {
        if self.deadline.is_none() {
            self.deadline = Some(Box::pin(tokio::time::sleep(self.limit)));
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.start();
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending => self.wait(cx),
            ready => ready,
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.start();
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.wait(cx),
            ready => ready,
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Ready(Ok(())) => {
                // Written out: the next reply gets its own time.
                self.deadline = None;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.wait(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_shutdown(cx) {
            Poll::Pending => self.wait(cx),
            ready => ready,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::time::Instant;

    #[tokio::test(start_paused = true)]
    async fn a_reply_nobody_reads_fails_after_the_limit_and_one_read_in_time_does_not() {
        let expired = Arc::new(AtomicBool::new(false));
        let (a, mut b) = tokio::io::duplex(1024);
        let mut w = WriteDeadline::new(a, Duration::from_secs(2), expired.clone());
        // Fits the pipe: written and flushed at once, no deadline left armed.
        w.write_all(&[1; 1000]).await.unwrap();
        w.flush().await.unwrap();
        assert!(w.deadline.is_none());
        let mut sink = vec![0; 1000];
        tokio::io::AsyncReadExt::read_exact(&mut b, &mut sink).await.unwrap();
        // Read slowly but within the limit: fine.
        let reader = tokio::spawn(async move {
            let mut buf = vec![0; 4096];
            let mut got = 0;
            while got < 4096 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                got += tokio::io::AsyncReadExt::read(&mut b, &mut buf).await.unwrap();
            }
            b
        });
        let t = Instant::now();
        w.write_all(&[2; 4096]).await.unwrap();
        w.flush().await.unwrap();
        assert!(t.elapsed() < Duration::from_secs(2));
        let _b = reader.await.unwrap();
        // Nobody reads: the write fails at the limit.
        let t = Instant::now();
        let e = w.write_all(&[3; 8192]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(t.elapsed(), Duration::from_secs(2));
        assert!(expired.load(Ordering::Relaxed));
    }
}
