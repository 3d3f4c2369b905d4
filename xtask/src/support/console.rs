//! Progress output that never stops a command: [`say!`](crate::say) and
//! [`say_err!`](crate::say_err) in place of `println!` and `eprintln!`.
//!
//! `cargo xtask demo 2>&1 | tee demo.log`, then Ctrl-C: the terminal sends SIGINT to
//! the whole foreground group, so `tee` ends as the demo starts cleaning up. From then
//! on every write to the pipe fails with EPIPE (Rust ignores SIGPIPE), `println!` would
//! panic on the first one and the cleanup would stop half-way, and a child writing to
//! the inherited pipe (`kubectl delete` printing what it deleted) would die of SIGPIPE.
//! Here a write that fails is dropped and remembered; once the output may be gone (a
//! write failed, or [`interrupted`] was called on SIGINT or SIGTERM), [`status`] copies
//! a child's output through this process instead of letting the child inherit it.

use std::fmt;
use std::io::{self, IsTerminal, Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// Set once a write to stdout or stderr failed, or a signal said the reader may be gone.
static OUTPUT_MAY_BE_GONE: AtomicBool = AtomicBool::new(false);

/// How long [`status`] waits, after the child exited, for the copies of its output to
/// end: a grandchild that inherited the pipe may hold it open for good.
const COPY_GRACE: Duration = Duration::from_secs(2);

/// Like `println!`, but a failed write (a closed pipe) is dropped, never a panic.
#[macro_export]
macro_rules! say {
    () => {
        $crate::support::console::stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::support::console::stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Like `eprintln!`, but a failed write (a closed pipe) is dropped, never a panic.
#[macro_export]
macro_rules! say_err {
    () => {
        $crate::support::console::stderr(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::support::console::stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Writes `args` to stdout as they are (no newline added) and flushes; a failure is
/// remembered, not returned.
pub fn stdout(args: fmt::Arguments<'_>) {
    write(&mut io::stdout().lock(), args);
}

/// Writes `args` to stderr as they are (no newline added); a failure is remembered,
/// not returned.
pub fn stderr(args: fmt::Arguments<'_>) {
    write(&mut io::stderr().lock(), args);
}

fn write(out: &mut impl Write, args: fmt::Arguments<'_>) {
    if out.write_fmt(args).and_then(|()| out.flush()).is_err() {
        OUTPUT_MAY_BE_GONE.store(true, Ordering::SeqCst);
    }
}

/// Says that SIGINT or SIGTERM arrived: with Ctrl-C the reader of a pipe this process
/// writes to got the same SIGINT and may be gone, so the children [`status`] runs
/// from now on write through this process.
pub fn interrupted() {
    OUTPUT_MAY_BE_GONE.store(true, Ordering::SeqCst);
}

/// Whether a write failed or [`interrupted`] was called.
#[must_use]
fn output_may_be_gone() -> bool {
    OUTPUT_MAY_BE_GONE.load(Ordering::SeqCst)
}

/// Runs `cmd` to its end, its stdout and stderr going where this process's go: inherited
/// while all is well (a terminal stays a terminal for the child); once the output may
/// be gone (see the module), each stream that is not a terminal is copied through this
/// process with [`stdout`] and [`stderr`], so the child never writes to a pipe without a
/// reader.
///
/// # Errors
/// When the command cannot start or be waited for.
pub fn status(cmd: &mut Command) -> io::Result<ExitStatus> {
    let copy_out = output_may_be_gone() && !io::stdout().is_terminal();
    let copy_err = output_may_be_gone() && !io::stderr().is_terminal();
    if copy_out {
        cmd.stdout(Stdio::piped());
    }
    if copy_err {
        cmd.stderr(Stdio::piped());
    }
    let mut child = cmd.spawn()?;
    let copies = copy_output(&mut child);
    let status = child.wait();
    for done in copies {
        let _ = done.recv_timeout(COPY_GRACE);
    }
    status
}

/// Starts a thread per piped stream of `child` copying it to this process's own; each
/// returned receiver hears when its copy ended.
fn copy_output(child: &mut Child) -> Vec<mpsc::Receiver<()>> {
    let mut copies = Vec::new();
    if let Some(out) = child.stdout.take() {
        copies.push(copy_in_thread(out, || Box::new(io::stdout())));
    }
    if let Some(err) = child.stderr.take() {
        copies.push(copy_in_thread(err, || Box::new(io::stderr())));
    }
    copies
}

fn copy_in_thread(
    mut from: impl Read + Send + 'static,
    to: fn() -> Box<dyn Write>,
) -> mpsc::Receiver<()> {
    let (done, ended) = mpsc::channel();
    // Detached: a grandchild holding the pipe open keeps it copying after `status`.
    let _ = std::thread::Builder::new()
        .name("xtask-output-copy".to_owned())
        .spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = from.read(&mut buf) {
                let mut out = to();
                if out.write_all(&buf[..n]).and_then(|()| out.flush()).is_err() {
                    OUTPUT_MAY_BE_GONE.store(true, Ordering::SeqCst);
                }
            }
            let _ = done.send(());
        });
    ended
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_runs_with_its_output_copied_once_the_output_may_be_gone() {
        // Whatever the test runner's output is, the child runs and its status is read;
        // after `interrupted` its output is copied (not inherited) unless a terminal.
        assert!(status(&mut Command::new("true")).unwrap().success());
        interrupted();
        assert!(output_may_be_gone());
        let failed = status(Command::new("sh").args(["-c", "echo copied; exit 3"])).unwrap();
        assert_eq!(failed.code(), Some(3));
    }
}
