//! Log lines a client can cause (a refused request, a dropped connection, a cut
//! event stream) go through a [`LogThrottle`]: at most one line of each kind per
//! interval, the next one carrying how many were left out in between. A client
//! that floods the server with bad requests cannot flood the log with them.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// How often a line of one kind may be written.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// At most one log line per kind per interval.
pub struct LogThrottle {
    interval: Duration,
    /// A `std` mutex: it is held for a map lookup, never across an `.await`.
    kinds: Mutex<HashMap<&'static str, Window>>,
}

/// One kind's last written line and what was left out since.
struct Window {
    written: Instant,
    suppressed: u64,
}

impl LogThrottle {
    /// A throttle letting one line of each kind through per `interval`.
    pub fn new(interval: Duration) -> Self {
        Self { interval, kinds: Mutex::new(HashMap::new()) }
    }

    /// Whether a line of `kind` may be written now: `Some(n)` with the number of
    /// lines of that kind left out since the last one written, `None` when this
    /// one is to be left out (and is counted). Time is Tokio's, so a paused clock
    /// drives it in tests.
    pub fn admit(&self, kind: &'static str) -> Option<u64> {
        let now = Instant::now();
        let mut kinds = self.kinds.lock().unwrap_or_else(PoisonError::into_inner);
        match kinds.get_mut(kind) {
            Some(window) if now.duration_since(window.written) < self.interval => {
                window.suppressed += 1;
                None
            }
            Some(window) => {
                window.written = now;
                Some(std::mem::take(&mut window.suppressed))
            }
            None => {
                kinds.insert(kind, Window { written: now, suppressed: 0 });
                Some(0)
            }
        }
    }
}

impl Default for LogThrottle {
    fn default() -> Self {
        Self::new(LOG_INTERVAL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_flood_leaves_one_line_per_interval_and_counts_the_rest() {
        let throttle = LogThrottle::new(Duration::from_secs(10));
        assert_eq!(throttle.admit("payload_too_large"), Some(0), "the first line of a kind is written");
        for _ in 0..1000 {
            assert_eq!(throttle.admit("payload_too_large"), None);
        }
        assert_eq!(throttle.admit("overloaded"), Some(0), "kinds are throttled apart");
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert_eq!(throttle.admit("payload_too_large"), None, "still within the interval");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(throttle.admit("payload_too_large"), Some(1001), "the next line counts what was left out");
        assert_eq!(throttle.admit("payload_too_large"), None);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(throttle.admit("payload_too_large"), Some(1));
        assert_eq!(throttle.admit("overloaded"), Some(0));
    }
}
