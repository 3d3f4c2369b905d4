//! The one way this project runs kubectl: `cargo xtask` (cluster, deploy, demo,
//! bench, test) and the end-to-end tests build a [`Kubectl`] (which program, which
//! kubeconfig) and run it through the same few methods.

use crate::support::cmd;
use anyhow::{Context, Result, bail};
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A kubectl program and the kubeconfig it runs with.
#[derive(Debug, Clone)]
pub struct Kubectl {
    program: OsString,
    kubeconfig: Option<PathBuf>,
}

/// What one kubectl run printed, whatever its exit status.
#[derive(Debug, Clone)]
pub struct KubectlOutput {
    /// Whether it exited 0.
    pub success: bool,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl KubectlOutput {
    /// The `Warning: ...` lines kubectl printed (the API server's warnings, among them
    /// Pod Security's `would violate PodSecurity`).
    pub fn warnings(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.trim_start().starts_with("Warning:"))
            .collect()
    }

    /// Fails unless it exited 0 without a single warning.
    ///
    /// # Errors
    /// When it failed (with its stderr) or printed warnings (with them).
    pub fn clean(&self, what: &str) -> Result<&Self> {
        if !self.success {
            bail!("{what} failed:\n{}", self.stderr.trim());
        }
        let warnings = self.warnings();
        if !warnings.is_empty() {
            bail!("{what} printed warnings:\n{}", warnings.join("\n"));
        }
        Ok(self)
    }
}

impl Kubectl {
    /// `program` (a path, or a name looked up on PATH) with the environment's
    /// kubeconfig (`KUBECONFIG`, else `~/.kube/config`).
    pub fn new(program: impl Into<OsString>) -> Self {
        Self {
            program: program.into(),
            kubeconfig: None,
        }
    }

    /// The same program with `KUBECONFIG` set to `path`.
    #[must_use]
    pub fn with_kubeconfig(mut self, path: impl Into<PathBuf>) -> Self {
        self.kubeconfig = Some(path.into());
        self
    }

    /// The kubeconfig it sets, if any.
    pub fn kubeconfig(&self) -> Option<&Path> {
        self.kubeconfig.as_deref()
    }

    /// A fresh command (no arguments yet) for callers that need more than the
    /// methods below (stdin, a child to follow, ...).
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        if let Some(path) = &self.kubeconfig {
            c.env("KUBECONFIG", path);
        }
        c
    }

    /// A command with `args`.
    pub fn with_args<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = self.command();
        c.args(args);
        c
    }

    /// Runs it with `args` and returns stdout.
    ///
    /// # Errors
    /// When it cannot start or exits non-zero (with its stderr).
    pub fn output<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        cmd::output(&mut self.with_args(args))
    }

    /// Runs it with `args`, stdout and stderr shown, and fails when it fails.
    ///
    /// # Errors
    /// When it cannot start or exits non-zero.
    pub fn run<I, S>(&self, args: I) -> Result<()>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        cmd::run(&mut self.with_args(args))
    }

    /// Runs it quietly with `args` and tells whether it succeeded.
    pub fn succeeds<I, S>(&self, args: I) -> bool
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        cmd::succeeds(&mut self.with_args(args))
    }

    /// Runs it with `args`, capturing stdout and stderr whatever the exit status.
    ///
    /// # Errors
    /// When it cannot start.
    pub fn capture<I, S>(&self, args: I) -> Result<KubectlOutput>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let out = self.with_args(args).output().context("running kubectl")?;
        Ok(KubectlOutput {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// `kubectl <args> -f -` with `document` on stdin (stdout dropped).
    ///
    /// # Errors
    /// When it cannot start or exits non-zero.
    pub fn with_stdin<I, S>(&self, args: I, document: &str) -> Result<()>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = self.with_args(args);
        let shown = cmd::show(&c);
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("could not start `{shown}`"))?;
        child
            .stdin
            .take()
            .context("kubectl's stdin")?
            .write_all(document.as_bytes())?;
        let status = child.wait()?;
        if !status.success() {
            bail!("`{shown}` failed ({status})");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_the_kubeconfig_only_when_given() {
        let plain = Kubectl::new("kubectl").command();
        assert!(plain.get_envs().next().is_none());
        let with = Kubectl::new("kubectl")
            .with_kubeconfig("/k")
            .with_args(["get", "pods"]);
        let envs: Vec<_> = with.get_envs().collect();
        assert_eq!(envs, [(OsStr::new("KUBECONFIG"), Some(OsStr::new("/k")))]);
        assert_eq!(cmd::show(&with), "kubectl get pods");
    }

    #[test]
    fn warnings_are_the_warning_lines() {
        let out = KubectlOutput {
            success: true,
            stdout: String::new(),
            stderr: "Warning: a\nother\n  Warning: b\n".into(),
        };
        assert_eq!(out.warnings(), ["Warning: a", "  Warning: b"]);
        assert!(out.clean("x").is_err());
    }
}
