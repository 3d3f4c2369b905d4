//! What the figures depend on: the machine.

use serde::{Deserialize, Serialize};
use std::fs;

// ---------------------------------------------------------------------------
// The machine
// ---------------------------------------------------------------------------

/// What the figures depend on: CPUs, memory, CPU model (as recorded in every
/// benchmark's JSON, under `machine`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Machine {
    /// CPUs available to this process.
    pub nproc: usize,
    /// `MemTotal`, KiB.
    pub memory_kib: u64,
    /// The first CPU's model name.
    pub cpu_model: String,
}

impl Machine {
    pub(crate) fn probe() -> Self {
        let nproc = std::thread::available_parallelism().map_or(1, |n| n.get());
        let memory_kib = fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.split_whitespace().next()?.parse().ok())
            })
            .unwrap_or(0);
        let cpu_model = fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| {
                c.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".into());
        Self {
            nproc,
            memory_kib,
            cpu_model,
        }
    }

    pub(crate) fn markdown(&self) -> String {
        format!(
            "Machine: {} CPUs (`nproc`), {:.1} GiB memory, {}.",
            self.nproc,
            self.memory_kib as f64 / 1024.0 / 1024.0,
            self.cpu_model
        )
    }
}
