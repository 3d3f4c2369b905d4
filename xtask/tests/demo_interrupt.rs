//! `cargo xtask demo 2>&1 | tee demo.log`, then Ctrl-C: the terminal's SIGINT ends
//! `tee` as well, and the demo must still clean up although every line it (or a child
//! of its cleanup) writes from then on goes to a pipe without a reader.
//!
//! The demo's stop and cleanup are rehearsed without a cluster (`demo
//! --rehearse-cleanup <dir>`: a stand-in process for what the demo runs, progress lines,
//! a child printing what it deletes; see `commands/demo.rs`): its stdout and stderr go
//! to one pipe, read until the demo waits for Ctrl-C; then the reader goes and SIGINT
//! comes, as with `tee`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether process `pid` exists and is no zombie.
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// `kill -s <signal> <pid>`: whether it succeeded.
fn kill(signal: &str, pid: &str) -> bool {
    Command::new("kill")
        .args(["-s", signal, pid])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn the_demo_cleans_up_on_sigint_after_the_reader_of_its_piped_output_went_away() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("demo-interrupt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (reader, writer) = std::io::pipe().unwrap();
    let mut demo = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["demo", "--rehearse-cleanup"])
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(writer.try_clone().unwrap())
        .stderr(writer)
        .spawn()
        .unwrap();
    // This process keeps no write end: the `Command` and its `Stdio`s are gone.

    let mut lines = BufReader::new(reader).lines();
    let mut seen = Vec::new();
    loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("the demo's output ended early: {seen:#?}"))
            .unwrap();
        let waiting = line.contains("press Ctrl-C to stop");
        seen.push(line);
        if waiting {
            break;
        }
    }
    let pid = std::fs::read_to_string(dir.join("stand-in.pid")).unwrap();
    assert!(alive(&pid), "the stand-in {pid} does not run");

    // `tee` goes first (or at the same time), then the demo gets its SIGINT.
    drop(lines);
    assert!(kill("INT", &demo.id().to_string()), "kill -s INT failed");

    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = demo.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = demo.kill();
            kill("KILL", &pid);
            panic!("the demo did not finish its cleanup within 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = std::fs::read_to_string(dir.join("cleanup.log")).unwrap_or_default();
    let stand_in_left = alive(&pid) && kill("KILL", &pid);
    assert!(
        status.success(),
        "the demo failed ({status}); cleanup log: {log:?}"
    );
    assert_eq!(
        log.lines().collect::<Vec<_>>(),
        [
            "progress lines written",
            "child that printed what it deleted succeeded",
            "stand-in stopped",
        ],
        "every cleanup step, in order"
    );
    assert!(!stand_in_left, "the stand-in {pid} still ran (killed now)");
    let _ = std::fs::remove_dir_all(&dir);
}
