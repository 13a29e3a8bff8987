//! Retries, in this one layer only: 429, 5xx, connect errors and timeouts are
//! retried with capped exponential backoff and full jitter, never sooner than a
//! `Retry-After` the server asked for; attempts and total time are bounded.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use troupe_actors::llm::ModelError;

/// How a provider's requests are retried.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// The first backoff step.
    pub base: Duration,
    /// The largest backoff step.
    pub cap: Duration,
    /// No retry starts after this much time since the first attempt.
    pub max_total: Duration,
}

/// What one attempt came to.
pub enum Attempt<T> {
    /// It worked.
    Done(T),
    /// A transient failure: try again, not before `after` if the server said so.
    Retry {
        /// Returned if no attempt is left.
        error: ModelError,
        /// The server's `Retry-After`.
        after: Option<Duration>,
    },
    /// A failure retrying cannot fix (400, 401, 403, 404, quota).
    Fail(ModelError),
}

/// Runs `attempt` (given its number, from 1) until it is done, fails for good, or
/// the policy is exhausted. `on_retry` hears each failed attempt that is retried,
/// with its number and the delay before the next (for logs, metrics and tests).
pub async fn with_retries<T, F, Fut>(
    policy: &RetryPolicy,
    mut attempt: F,
    mut on_retry: impl FnMut(&ModelError, u32, Duration),
) -> Result<T, ModelError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Attempt<T>>,
{
    let started = tokio::time::Instant::now();
    let mut number = 1;
    loop {
        match attempt(number).await {
            Attempt::Done(value) => return Ok(value),
            Attempt::Fail(error) => return Err(error),
            Attempt::Retry { error, after } => {
                if number >= policy.max_attempts {
                    return Err(error);
                }
                let delay = backoff(policy, number).max(after.unwrap_or_default());
                if started.elapsed().saturating_add(delay) > policy.max_total {
                    return Err(error);
                }
                on_retry(&error, number, delay);
                tokio::time::sleep(delay).await;
                number += 1;
            }
        }
    }
}

/// Full jitter: a random delay in `0..=min(cap, base × 2^(n-1))`.
fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    let ceiling = policy.base.saturating_mul(1u32 << (attempt - 1).min(16)).min(policy.cap);
    ceiling.mul_f64(fastrand::f64())
}

/// A `Retry-After` value: seconds, or an HTTP date.
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).ok();
    }
    let date = DateTime::parse_from_rfc2822(value).ok()?;
    Some((date.with_timezone(&Utc) - now).to_std().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 4,
            base: Duration::from_millis(500),
            cap: Duration::from_secs(8),
            max_total: Duration::from_secs(60),
        }
    }

    fn status(code: u16) -> ModelError {
        ModelError::Status { status: code, message: String::new() }
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_waits_at_least_the_retry_after() {
        let started = tokio::time::Instant::now();
        let times = Arc::new(Mutex::new(Vec::new()));
        let seen = times.clone();
        let result = with_retries(
            &policy(),
            |number| {
                seen.lock().unwrap().push(started.elapsed());
                async move {
                    if number == 1 {
                        Attempt::Retry { error: status(429), after: Some(Duration::from_secs(7)) }
                    } else {
                        Attempt::Done("ok")
                    }
                }
            },
            |_, _, _| {},
        )
        .await;
        assert_eq!(result, Ok("ok"));
        let times = times.lock().unwrap();
        assert!(times[1] - times[0] >= Duration::from_secs(7), "{times:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_are_bounded_and_the_last_error_returned() {
        let mut calls = 0;
        let result: Result<(), _> = with_retries(
            &policy(),
            |_| {
                calls += 1;
                async { Attempt::Retry { error: status(503), after: None } }
            },
            |_, _, delay| assert!(delay <= Duration::from_secs(8)),
        )
        .await;
        assert_eq!(result, Err(status(503)));
        assert_eq!(calls, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn total_time_is_bounded_even_with_attempts_left() {
        let mut calls = 0;
        let result: Result<(), _> = with_retries(
            &policy(),
            |_| {
                calls += 1;
                async { Attempt::Retry { error: status(429), after: Some(Duration::from_secs(45)) } }
            },
            |_, _, _| {},
        )
        .await;
        assert_eq!(result, Err(status(429)));
        assert_eq!(calls, 2, "the third attempt would start after 90 s, past the 60 s bound");
    }

    #[test]
    fn retry_after_takes_seconds_or_an_http_date() {
        let now = DateTime::parse_from_rfc3339("2026-11-23T10:00:00Z").unwrap().with_timezone(&Utc);
        assert_eq!(parse_retry_after("3", now), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("Mon, 23 Nov 2026 10:00:05 GMT", now), Some(Duration::from_secs(5)));
        assert_eq!(parse_retry_after("soon", now), None);
    }
}
