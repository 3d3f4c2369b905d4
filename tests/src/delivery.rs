//! Checks of what message consumers received against what was produced.

use anyhow::{Result, ensure};
use std::collections::BTreeMap;

/// Checks that the payloads in `counts` are exactly those produced (each at
/// least once) and returns how many deliveries were duplicates.
pub fn check_all_received(counts: &BTreeMap<String, usize>, expected: &[String]) -> Result<usize> {
    let missing: Vec<&String> = expected
        .iter()
        .filter(|p| !counts.contains_key(*p))
        .collect();
    ensure!(
        missing.is_empty(),
        "{} of {} payloads were never received, e.g. {:?}",
        missing.len(),
        expected.len(),
        missing.iter().take(5).collect::<Vec<_>>()
    );
    ensure!(
        counts.len() == expected.len(),
        "received {} distinct payloads, {} were sent",
        counts.len(),
        expected.len()
    );
    Ok(counts.values().map(|n| n - 1).sum())
}
