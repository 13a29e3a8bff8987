//! A connection whose peer stops reading is closed after `server.write_timeout`.
//! hyper has no write timeout: an event-stream client that keeps its socket open
//! but never reads would hold its connection, its stream slot and its
//! subscription forever. [`StallGuard`] wraps the socket and fails a write that
//! has made no progress for that long, which ends the connection. It also tells
//! the connection's [`ConnectionNote`] what it saw, for the line logged when the
//! connection is dropped.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::incidents::ConnectionNote;

/// An I/O stream whose writes fail once they have been stuck for `limit`.
pub struct StallGuard<T> {
    inner: T,
    limit: Duration,
    /// Armed while a write is pending; reset by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
    note: Arc<ConnectionNote>,
}

impl<T> StallGuard<T> {
    /// Guards `inner`, reporting to `note`.
    pub fn new(inner: T, limit: Duration, note: Arc<ConnectionNote>) -> Self {
        Self { inner, limit, stalled: None, note }
    }

    /// A write (or flush) made progress.
    fn progressed(&mut self, written: bool) {
        self.stalled = None;
        if written {
            self.note.wrote();
        }
    }

    /// After a write (or flush) returned `Pending`: fails once the stall has
    /// lasted `limit`, else keeps waiting (the timer wakes the task).
    fn check_stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let limit = self.limit;
        let timer = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.note.stalled();
                Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the peer read nothing for {}s", limit.as_secs_f64()),
                ))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for StallGuard<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.note.read();
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for StallGuard<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(result) => {
                self.progressed(matches!(result, Ok(written) if written > 0));
                Poll::Ready(result)
            }
            Poll::Pending => self.check_stall(cx).map(Err),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Ready(result) => {
                self.progressed(false);
                Poll::Ready(result)
            }
            Poll::Pending => self.check_stall(cx).map(Err),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(result) => {
                self.progressed(matches!(result, Ok(written) if written > 0));
                Poll::Ready(result)
            }
            Poll::Pending => self.check_stall(cx).map(Err),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_write_nobody_reads_fails_after_the_limit_and_progress_resets_it() {
        let (near, mut far) = tokio::io::duplex(64);
        let note = Arc::new(ConnectionNote::new(std::net::SocketAddr::from(([127, 0, 0, 1], 1))));
        let mut guarded = StallGuard::new(near, Duration::from_secs(30), note);
        // Progress: what the peer reads keeps the connection alive, however slow.
        guarded.write_all(&[0; 64]).await.unwrap();
        let drained = async {
            tokio::time::sleep(Duration::from_secs(20)).await;
            let mut sink = [0; 64];
            tokio::io::AsyncReadExt::read_exact(&mut far, &mut sink).await.unwrap();
            far
        };
        let (written, _far) = tokio::join!(guarded.write_all(&[1; 64]), drained);
        written.unwrap();
        // The buffer is full again and the peer reads no more.
        let started = Instant::now();
        let error = guarded.write_all(&[2; 64]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
    }
}
