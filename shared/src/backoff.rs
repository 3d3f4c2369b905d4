//! Per-object exponential backoff for failed reconciles (controller-runtime's rate-limited
//! queue, simplified): the n-th consecutive failure of one object waits `base * 2^(n-1)`,
//! capped; a success resets the object.

use std::{collections::HashMap, sync::Mutex, time::Duration};

/// Failure counts per object key (`namespace/name`).
#[derive(Debug)]
pub struct ErrorBackoff {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl Default for ErrorBackoff {
    /// 1 s doubling up to 5 min.
    fn default() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(300))
    }
}

impl ErrorBackoff {
    /// A backoff starting at `base`, doubling up to `max`.
    #[must_use]
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::default(),
        }
    }

    /// Records a failure of `key`; returns how long to wait before retrying it.
    pub fn failed(&self, key: &str) -> Duration {
        let n = match self.failures.lock() {
            Ok(mut f) => {
                let n = f.entry(key.to_owned()).or_insert(0);
                *n = n.saturating_add(1);
                *n
            }
            Err(_) => 1,
        };
        let factor = 2u32.saturating_pow(n.saturating_sub(1).min(20));
        self.base.saturating_mul(factor).min(self.max)
    }

    /// Forgets the failures of `key` (after a successful reconcile).
    pub fn succeeded(&self, key: &str) {
        if let Ok(mut f) = self.failures.lock() {
            f.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_caps_and_resets() {
        let b = ErrorBackoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let waits: Vec<_> = (0..6).map(|_| b.failed("ns/a").as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 10, 10]);
        assert_eq!(b.failed("ns/b").as_secs(), 1);
        b.succeeded("ns/a");
        assert_eq!(b.failed("ns/a").as_secs(), 1);
    }
}
