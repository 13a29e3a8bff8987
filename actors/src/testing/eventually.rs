//! Waiting in tests: [`eventually`] polls a condition until it holds or a time
//! limit passes, instead of a hand-rolled deadline loop in every test.

use std::future::Future;
use std::time::Duration;

/// How often [`eventually`] asks again.
const POLL: Duration = Duration::from_millis(5);

/// What a condition of [`eventually`] answers: `bool` (holds or not) or
/// `Option<T>` (holds once it is `Some`, whose value `eventually` returns).
pub trait Holds {
    /// What `eventually` returns once the condition holds: `()` for `bool`, `T`
    /// for `Option<T>`.
    type Value;
    /// `Some` once the condition holds.
    fn holds(self) -> Option<Self::Value>;
}

impl Holds for bool {
    type Value = ();
    fn holds(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Holds for Option<T> {
    type Value = T;
    fn holds(self) -> Option<T> {
        self
    }
}

/// Polls `condition` (every 5 ms) until it holds and returns what it found
/// (`()` for a `bool`, the value of an `Option`); panics naming `what` once
/// `limit` has passed without it. The clock is tokio's, so a test with paused
/// time waits in virtual time.
///
/// ```ignore
/// eventually(Duration::from_secs(10), "the sub-run to start", || async {
///     sub_runs_of(&store, boss).await.pop()
/// })
/// .await;
/// ```
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut condition: F) -> <Fut::Output as Holds>::Value
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: Holds,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = condition().await.holds() {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(POLL).await;
    }
}
