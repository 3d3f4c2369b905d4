//! The operator process as `/proc` shows it: resident memory (now and peak),
//! threads and CPU time.

use std::collections::BTreeMap;
use std::fs;
use std::process::Command;
use std::sync::OnceLock;
use xtask::support::cmd;

/// One reading of `/proc/<pid>/status` and `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// `VmRSS`: resident memory now, KiB.
    pub rss_kib: u64,
    /// `VmHWM`: the peak of `VmRSS` since the process started, KiB.
    pub hwm_kib: u64,
    /// `RssAnon`: the anonymous part of `VmRSS` (heap, stacks), KiB; the rest
    /// is mostly the executable's own pages (`RssFile`).
    pub anon_kib: u64,
    /// Threads of the process (tokio workers, blocking pool, ...).
    pub threads: u64,
    /// User plus system CPU time, seconds.
    pub cpu_seconds: f64,
}

/// Reads the figures of `pid`; `None` once the process is gone.
pub fn sample(pid: u32) -> Option<Sample> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(Sample {
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
        anon_kib: field("RssAnon:"),
        threads: field("Threads:"),
        cpu_seconds: cpu_ticks(&stat)? as f64 / clock_ticks_per_second(),
    })
}

/// CPU seconds so far of each process of the local cluster (`kube-apiserver`, `etcd`,
/// `kube-controller-manager`, `kube-proxy`...), by name, from the cluster's pid files.
/// What the cluster spends on an operator's objects is part of its cost (Services make
/// kube-proxy and the EndpointSlice controller work), and on two shared cores it is
/// time the operator waits for.
pub fn cluster_cpu() -> BTreeMap<String, f64> {
    let dir = xtask::support::paths::state_dir("cluster").join("pids");
    let Ok(entries) = fs::read_dir(&dir) else {
        return BTreeMap::new();
    };
    entries
        .filter_map(|e| {
            let path = e.ok()?.path();
            let name = path.file_name()?.to_str()?.strip_suffix(".pid")?.to_owned();
            let pid: u32 = fs::read_to_string(&path).ok()?.trim().parse().ok()?;
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            Some((name, cpu_ticks(&stat)? as f64 / clock_ticks_per_second()))
        })
        .collect()
}

/// CPU seconds between two readings of [`cluster_cpu`], by process, to the hundredth.
pub fn cpu_since(
    before: &BTreeMap<String, f64>,
    now: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    now.iter()
        .map(|(name, t)| {
            let spent = t - before.get(name).copied().unwrap_or(*t);
            (name.clone(), (spent.max(0.0) * 100.0).round() / 100.0)
        })
        .collect()
}

/// `utime + stime` (clock ticks) from a `/proc/<pid>/stat` line. The command
/// name is parenthesised and may hold spaces, so fields are counted from the
/// last `)`: state is field 3, utime 14 and stime 15.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// `getconf CLK_TCK` (100 on every Linux this runs on; asked once anyway).
fn clock_ticks_per_second() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        cmd::output(Command::new("getconf").arg("CLK_TCK"))
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// KiB as MiB, one decimal.
pub fn mib(kib: u64) -> f64 {
    (kib as f64 / 1024.0 * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_fields() {
        let stat = "4242 (my op (x)) S 1 4242 4242 0 -1 4194304 900 0 0 0 250 31 0 0 20 0 6 0";
        assert_eq!(cpu_ticks(stat), Some(281));
        assert_eq!(cpu_ticks("garbage"), None);
    }

    #[test]
    fn own_process() {
        let me = sample(std::process::id()).unwrap_or_default();
        assert!(me.rss_kib > 0 && me.hwm_kib >= me.rss_kib && me.threads >= 1);
    }
}
