//! Time and waiting: polling until a condition holds, seconds between two
//! instants, quantiles.

use crate::commands::bench::common::round3;
use anyhow::{Result, ensure};
use std::time::{Duration, Instant};

/// Polls `done` every 50 ms; fails after `timeout` with `progress()`.
pub(super) async fn wait_until(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
    progress: impl Fn() -> String,
) -> Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return Ok(Instant::now());
        }
        ensure!(
            Instant::now() < deadline,
            "timed out after {}s waiting for {what} ({})",
            timeout.as_secs(),
            progress()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Seconds from `from` to `to`, to the millisecond.
pub(super) fn seconds(from: Instant, to: Instant) -> f64 {
    round3(to.saturating_duration_since(from).as_secs_f64())
}

/// The q-quantile (nearest rank) of sorted values.
pub(super) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
    }
}
