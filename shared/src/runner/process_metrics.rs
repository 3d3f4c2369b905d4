//! The `process_*` metrics of client_golang's process collector (which controller-runtime
//! registers), read from `/proc` at each scrape: `process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
//! `process_max_fds`, `process_start_time_seconds`. Where `/proc` is missing (not Linux),
//! nothing is exported.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

/// Clock ticks per second of `/proc/<pid>/stat` (`USER_HZ`: 100 on every Linux the
/// kernel exports to user space).
const USER_HZ: f64 = 100.0;

/// One reading of the process's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct ProcessStats {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Resident memory, bytes.
    pub resident_bytes: f64,
    /// Virtual memory, bytes.
    pub virtual_bytes: f64,
    /// Open file descriptors.
    pub open_fds: f64,
    /// The soft limit of open file descriptors.
    pub max_fds: f64,
    /// Start time, seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

/// Reads the figures of this process from `/proc`; `None` where they cannot be read.
#[must_use]
pub(super) fn read() -> Option<ProcessStats> {
    let stat = parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    let resident_kib = parse_status_kib(
        &std::fs::read_to_string("/proc/self/status").ok()?,
        "VmRSS:",
    )?;
    let boot_time = parse_boot_time(&std::fs::read_to_string("/proc/stat").ok()?)?;
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| parse_max_open_files(&l))
        .unwrap_or(0.0);
    let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count) as f64;
    Some(ProcessStats {
        cpu_seconds: (stat.utime + stat.stime) / USER_HZ,
        resident_bytes: resident_kib * 1024.0,
        virtual_bytes: stat.vsize,
        open_fds,
        max_fds,
        start_time_seconds: boot_time + stat.start_ticks / USER_HZ,
    })
}

/// The fields of `/proc/<pid>/stat` used here.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stat {
    utime: f64,
    stime: f64,
    start_ticks: f64,
    vsize: f64,
}

/// Parses `/proc/<pid>/stat`: the command name (field 2) is in parentheses and may hold
/// spaces, so fields are counted after its closing parenthesis.
fn parse_stat(text: &str) -> Option<Stat> {
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `fields[0]` is field 3 (state): field n is `fields[n - 3]`.
    let field = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
    Some(Stat {
        utime: field(14)?,
        stime: field(15)?,
        start_ticks: field(22)?,
        vsize: field(23)?,
    })
}

/// A `Key:   123 kB` line of `/proc/<pid>/status`, in KiB.
fn parse_status_kib(text: &str, key: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// `btime` of `/proc/stat`: boot time, seconds since the Unix epoch.
fn parse_boot_time(text: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit of `Max open files` in `/proc/<pid>/limits`.
fn parse_max_open_files(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()?;
    match soft {
        "unlimited" => Some(f64::INFINITY),
        n => n.parse().ok(),
    }
}

/// Exports [`read`] at each scrape.
#[derive(Debug, Default)]
pub(super) struct ProcessCollector;

impl ProcessCollector {
    /// The collector.
    #[must_use]
    pub(super) fn new() -> Self {
        Self
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = read() else {
            return Ok(());
        };
        // The family name without `_total`: the encoder appends it to a counter's sample.
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            MetricType::Counter,
        )?)?;
        for (name, help, value) in [
            (
                "process_open_fds",
                "Number of open file descriptors.",
                s.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                s.max_fds,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                s.virtual_bytes,
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                s.resident_bytes,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                s.start_time_seconds,
            ),
        ] {
            ConstGauge::new(value).encode(encoder.encode_descriptor(
                name,
                help,
                None,
                MetricType::Gauge,
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn parses_proc_files() {
        // A command name with spaces and parentheses.
        let stat = "4242 (my (odd) op) S 1 4242 4242 0 -1 4194560 1500 0 0 0 250 75 0 0 20 0 3 0 \
                    123456 7340032 1800 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let s = parse_stat(stat).unwrap();
        assert_eq!(s.utime, 250.0);
        assert_eq!(s.stime, 75.0);
        assert_eq!(s.start_ticks, 123_456.0);
        assert_eq!(s.vsize, 7_340_032.0);
        assert!(parse_stat("garbage").is_none());

        let status = "Name:\top\nVmSize:\t  7168 kB\nVmRSS:\t    6912 kB\n";
        assert_eq!(parse_status_kib(status, "VmRSS:"), Some(6912.0));
        assert_eq!(parse_status_kib(status, "VmSwap:"), None);
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1763856000\nprocesses 9\n"),
            Some(1_763_856_000.0)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max processes             95000                95000                processes\n\
                      Max open files            1048576              1048576              files\n";
        assert_eq!(parse_max_open_files(limits), Some(1_048_576.0));
        assert_eq!(
            parse_max_open_files(
                "Max open files            unlimited            unlimited            files\n"
            ),
            Some(f64::INFINITY)
        );
    }

    #[test]
    fn reads_this_process() {
        let s = read().expect("/proc is readable on Linux");
        assert!(s.resident_bytes > 1_000_000.0, "{s:?}");
        assert!(s.virtual_bytes >= s.resident_bytes, "{s:?}");
        assert!(s.open_fds >= 3.0 && s.max_fds >= s.open_fds, "{s:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // Started within the last day, not in the future (boot time and ticks agree).
        assert!(
            s.start_time_seconds <= now + 1.0 && s.start_time_seconds > now - 86_400.0,
            "{s:?}"
        );
        assert!(s.cpu_seconds >= 0.0);
    }
}
