//! Long-lived children in their own process group (the local cluster's processes,
//! the Pulsar broker, the demo's operators): spawning them so that Ctrl-C on
//! `cargo xtask` does not reach them and one signal reaches everything they
//! started, stopping a group or a child with SIGTERM and then SIGKILL (the one such
//! helper of xtask), and the pid files that find them again from a later command.

use crate::support::cmd;
use anyhow::{Context, Result, bail};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// Spawns `command` as the leader of a new process group (its pid is the group's id).
///
/// # Errors
/// When it cannot start.
pub fn spawn(command: &mut Command) -> std::io::Result<Child> {
    command.process_group(0).spawn()
}

/// Whether `pid` is a live process (zombies count as dead).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) if Path::new("/proc/self").exists() => false,
        // No procfs: ask kill(1).
        Err(_) => Command::new("kill")
            .args(["-0", &pid.to_string()])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
    }
}

/// Whether any process of process group `pgid` is still alive.
pub fn group_alive(pgid: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return alive(pgid);
    };
    entries.flatten().any(|e| {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            return false;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        // Fields after the command name: state, ppid, pgrp, ...
        let Some((_, rest)) = stat.rsplit_once(')') else {
            return false;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        fields.len() > 2
            && fields[0] != "Z"
            && fields[0] != "X"
            && fields[2].parse::<u32>().ok() == Some(pgid)
    })
}

/// `pid` and every process it started, children before their parents' turn ends: the
/// processes whose parent chain leads to `pid`, read from procfs (empty without it).
fn tree(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![pid];
    };
    let parents: Vec<(u32, u32)> = entries
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // Fields after the command name: state, ppid, ...
            let ppid = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = vec![pid];
    let mut next = 0;
    while next < found.len() {
        let parent = found[next];
        found.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(c, _)| *c),
        );
        next += 1;
    }
    found
}

/// SIGKILL to `child` and every process it started (a build's compilers), for a child
/// kept in this process's group so that Ctrl-C reaches it, then reaps it.
pub fn kill_tree(child: &mut Child) {
    for pid in tree(child.id()).into_iter().rev() {
        signal_process(pid, "KILL");
    }
    let _ = child.wait();
}

/// Sends `signal` (a name: `TERM`, `KILL`) to one process; whether it was delivered.
pub fn signal_process(pid: u32, signal: &str) -> bool {
    Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Sends `signal` (a name: `TERM`, `KILL`) to every process of group `pgid`.
///
/// # Errors
/// When kill(1) cannot run, or fails while the group is still alive (a group that
/// vanished in the meantime is no error).
pub fn signal(pgid: u32, signal: &str) -> Result<()> {
    if pgid <= 1 {
        bail!("refusing to signal process group {pgid}");
    }
    let status = Command::new("kill")
        .args(["-s", signal, "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status()
        .context("running kill(1)")?;
    if !status.success() && group_alive(pgid) {
        bail!("`kill -s {signal} -- -{pgid}` failed ({status})");
    }
    Ok(())
}

/// How long [`stop`] waits.
#[derive(Debug, Clone, Copy)]
pub struct Grace {
    /// After SIGTERM, before SIGKILL.
    pub term: Duration,
    /// After SIGKILL, before giving up.
    pub kill: Duration,
}

/// Stops process group `pgid`: SIGTERM, up to `grace.term` for `running()` to turn
/// false, then `before_kill()` and SIGKILL, up to `grace.kill`. Nothing is signalled
/// when it does not run (or `pgid` is 0 or 1).
///
/// # Errors
/// When a signal cannot be sent, or it still runs after SIGKILL.
pub fn stop(
    pgid: u32,
    grace: Grace,
    running: impl FnMut() -> bool,
    before_kill: impl FnOnce(),
) -> Result<()> {
    if pgid <= 1 {
        return Ok(());
    }
    term_then_kill(
        &format!("process group {pgid}"),
        |name| signal(pgid, name),
        grace,
        running,
        before_kill,
    )
}

/// Stops one child process (not its group): SIGTERM, up to `term` to exit, then SIGKILL;
/// reaps it and returns how it exited (`None`: it had exited before, and was reaped here).
///
/// # Errors
/// When it still runs after SIGKILL, or waiting for it fails.
pub fn stop_child(child: &mut Child, term: Duration) -> Result<Option<ExitStatus>> {
    if child.try_wait()?.is_some() {
        let _ = child.wait();
        return Ok(None);
    }
    let pid = child.id();
    let grace = Grace {
        term,
        kill: Duration::from_secs(10),
    };
    term_then_kill(
        &format!("process {pid}"),
        |name| {
            // Failing to deliver means it has exited meanwhile; `running` sees that.
            signal_process(pid, name);
            Ok(())
        },
        grace,
        || matches!(child.try_wait(), Ok(None)),
        || {},
    )?;
    Ok(Some(child.wait()?))
}

/// The one SIGTERM-then-SIGKILL of xtask: `send("TERM")`, up to `grace.term` for
/// `running()` to turn false, then `before_kill()`, `send("KILL")` and up to `grace.kill`.
fn term_then_kill(
    what: &str,
    mut send: impl FnMut(&str) -> Result<()>,
    grace: Grace,
    mut running: impl FnMut() -> bool,
    before_kill: impl FnOnce(),
) -> Result<()> {
    if !running() {
        return Ok(());
    }
    send("TERM")?;
    if cmd::wait_until(grace.term, || !running()) {
        return Ok(());
    }
    before_kill();
    send("KILL")?;
    if cmd::wait_until(grace.kill, || !running()) {
        return Ok(());
    }
    bail!("{what} is still alive after SIGKILL")
}

/// The pid recorded in `path`, if it holds one.
pub fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Records `pid` in `path`.
///
/// # Errors
/// When the file cannot be written.
pub fn write_pid(path: &Path, pid: u32) -> Result<()> {
    std::fs::write(path, format!("{pid}\n")).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_files_round_trip() -> Result<()> {
        let path = std::env::temp_dir().join(format!("xtask-pid-{}", std::process::id()));
        write_pid(&path, 4242)?;
        assert_eq!(read_pid(&path), Some(4242));
        std::fs::write(&path, "junk")?;
        assert_eq!(read_pid(&path), None);
        std::fs::remove_file(&path)?;
        assert_eq!(read_pid(&path), None);
        Ok(())
    }

    #[test]
    fn stop_child_terms_then_kills() -> Result<()> {
        // Exits on SIGTERM: stopped by the TERM, well within its grace.
        let mut polite = Command::new("sleep").arg("30").spawn()?;
        let started = std::time::Instant::now();
        let status = stop_child(&mut polite, Duration::from_secs(20))?;
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(
            status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s)),
            Some(15)
        );
        // Ignores SIGTERM: killed once its grace is over.
        let mut stubborn = Command::new("sh")
            .args(["-c", "trap '' TERM; exec sleep 30"])
            .spawn()?;
        // The signal must come once SIGTERM is ignored (bit 15 of SigIgn).
        let ignores_term = || {
            std::fs::read_to_string(format!("/proc/{}/status", stubborn.id()))
                .ok()
                .and_then(|s| {
                    let mask = s.lines().find_map(|l| l.strip_prefix("SigIgn:"))?;
                    u64::from_str_radix(mask.trim(), 16).ok()
                })
                .is_some_and(|mask| mask & (1 << 14) != 0)
        };
        assert!(cmd::wait_until(Duration::from_secs(10), ignores_term));
        let status = stop_child(&mut stubborn, Duration::from_secs(1))?;
        assert_eq!(
            status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s)),
            Some(9)
        );
        // Already gone: nothing to signal.
        assert_eq!(stop_child(&mut stubborn, Duration::from_secs(1))?, None);
        Ok(())
    }

    #[test]
    fn this_process_is_alive_and_never_signalled_as_group_1() {
        assert!(alive(std::process::id()));
        assert!(signal(1, "TERM").is_err());
    }

    #[test]
    fn kill_tree_stops_a_child_and_what_it_started() {
        // A shell that starts a grandchild and waits for it: the grandchild's pid on stdout.
        let mut child = Command::new("sh")
            .args(["-c", "sleep 300 & echo $!; wait"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh starts");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("the grandchild's pid");
        let grandchild: u32 = line.trim().parse().expect("a pid");
        assert!(alive(grandchild));
        kill_tree(&mut child);
        assert!(!alive(child.id()));
        // Reaped by init or the reaper of this test process, it is dead either way.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while alive(grandchild) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(grandchild), "the grandchild survived");
    }
}
