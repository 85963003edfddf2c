//! When a sandbox connection last moved a byte and last began or ended
//! a request, and how many of its requests are in flight or wait for
//! their host's answer: what decides that it is idle.
//!
//! Owns nothing but the count and the time; trusts nothing, since the
//! bytes it counts come from the sandbox.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// A connection's activity.
#[derive(Debug)]
pub(crate) struct Activity {
    start: Instant,
    /// Milliseconds from `start` to the last byte moved.
    last: AtomicU64,
    /// Milliseconds from `start` to the last request's start or end.
    last_request: AtomicU64,
    /// Requests whose response has not ended.
    in_flight: AtomicUsize,
    /// Requests sent upstream whose response's head has not come.
    waiting: AtomicUsize,
}

impl Activity {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            last: AtomicU64::new(0),
            last_request: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
        })
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn touch(&self) {
        self.last.store(self.now(), Ordering::Relaxed);
    }

    fn at(&self, time: &AtomicU64) -> Instant {
        self.start + Duration::from_millis(time.load(Ordering::Relaxed))
    }

    /// Whether the connection is idle for `idle`: no byte moved while no
    /// request waits for its host (a stalled client or response), or no
    /// request began or ended while none is in flight (a client that
    /// sends nothing, or a request's head that never ends).
    pub(crate) fn is_idle(&self, idle: Duration) -> bool {
        let quiet =
            self.waiting.load(Ordering::Relaxed) == 0 && self.at(&self.last).elapsed() >= idle;
        let unused = self.in_flight.load(Ordering::Relaxed) == 0
            && self.at(&self.last_request).elapsed() >= idle;
        quiet || unused
    }

    /// When to look again whether the connection is idle for `idle`: as
    /// soon as it could be, but not before `recheck` from now.
    pub(crate) fn next_check(&self, idle: Duration, recheck: Duration) -> Instant {
        let could_be = self.at(&self.last).min(self.at(&self.last_request)) + idle;
        could_be.max(Instant::now() + recheck)
    }

    /// Counts a request as in flight until the guard drops.
    pub(crate) fn request(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.last_request.store(self.now(), Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// Counts a request as waiting for its host until the guard drops.
    pub(crate) fn waiting(self: &Arc<Self>) -> Waiting {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(self.clone())
    }
}

/// A request waiting for its host's answer.
#[derive(Debug)]
pub(crate) struct Waiting(Arc<Activity>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.touch();
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request whose response has not ended.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.last_request.store(self.0.now(), Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream that records its activity.
#[derive(Debug)]
pub(crate) struct Watched<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T> Watched<T> {
    pub(crate) fn new(inner: T, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
