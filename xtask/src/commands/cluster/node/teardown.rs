//! Undoing the node (`cluster down`): its containers, mounts, network
//! namespaces, bridge, rules and cgroups.

use super::{BRIDGE, NFT_TABLE, NodeLayout};
use crate::commands::cluster::Layout;
use std::path::Path;
use std::process::{Command, Stdio};
use xtask::support::cmd;

/// Stops every container of the node and undoes its mounts, bridge and
/// rules, so the node's folder can be removed (`down`).
pub fn tear_down(layout: &Layout) {
    // Containers outlive containerd and its shims: kill what runs in the
    // kubelet's cgroups.
    kill_cgroup_tree("/sys/fs/cgroup/pids/kubepods");
    kill_cgroup_tree("/sys/fs/cgroup/memory/kubepods");
    let node = NodeLayout::new(layout);
    unmount_under(node.root());
    // containerd keeps pod network namespaces under /run/netns (cni-*).
    if let Ok(entries) = std::fs::read_dir("/run/netns") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("cni-") {
                let _ = Command::new("umount")
                    .arg("-l")
                    .arg(e.path())
                    .stderr(Stdio::null())
                    .status();
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let _ = Command::new("ip")
        .args(["link", "delete", BRIDGE])
        .stderr(Stdio::null())
        .status();
    let _ = Command::new("nft")
        .args(["delete", "table", "ip", NFT_TABLE])
        .stderr(Stdio::null())
        .status();
    // kube-proxy's own chains: it removes them with --cleanup.
    if let Ok(proxy) = layout.kubernetes().map(|k| k.binary("kube-proxy"))
        && cmd::is_executable(&proxy)
    {
        let _ = Command::new(proxy)
            .arg("--cleanup")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    for controller in [
        "pids", "memory", "cpu", "cpuacct", "cpuset", "blkio", "devices", "freezer", "systemd",
    ] {
        remove_cgroup_dirs(Path::new(&format!("/sys/fs/cgroup/{controller}/kubepods")));
    }
}

fn kill_cgroup_tree(dir: &str) {
    let mut pids = Vec::new();
    collect_cgroup_pids(Path::new(dir), &mut pids);
    for pid in pids {
        xtask::support::process_group::signal_process(pid, "KILL");
    }
}

fn collect_cgroup_pids(dir: &Path, pids: &mut Vec<u32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_cgroup_pids(&e.path(), pids);
            }
        }
    }
}

fn remove_cgroup_dirs(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_dirs(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Lazily unmounts every mount point under `root`, deepest first.
fn unmount_under(root: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<&str> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| Path::new(p).starts_with(root))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = Command::new("umount")
            .args(["-l", p])
            .stderr(Stdio::null())
            .status();
    }
}
