//! What the phases of one run share: its target, the bench's watches, the
//! operator process and where the current phase began; the start (up to
//! idle) and the steps several phases take.

use super::options::{Operator, OperatorArgs, run_name};
use super::process::OperatorProcess;
use super::procfs::{self, Sample};
use super::record::{Requests, Startup};
use super::timing::{seconds, wait_until};
use super::watch::{Objects, Pods, spawn_watches};
use crate::bench::common::{out_dir, round3};
use anyhow::{Context, Result, anyhow};
use futures::{StreamExt, TryStreamExt};
use kube::Client;
use kube::api::Api;
use kube::core::DynamicObject;
use std::collections::HashMap;
use std::fs;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What one run is of: the options, the binary and where it runs.
pub(super) struct Target<'a> {
    pub(super) args: &'a OperatorArgs,
    pub(super) binary: &'a Path,
    pub(super) sa_kubeconfig: &'a Path,
    pub(super) client: &'a Client,
    pub(super) namespace: &'a str,
}

/// Where a phase began: the process's figures and its log's length then.
#[derive(Default)]
struct Mark {
    sample: Sample,
    log: usize,
}

/// What a phase ends with: the figures then, and the CPU time and requests
/// since it began.
pub(super) struct PhaseEnd {
    pub(super) sample: Sample,
    pub(super) cpu_seconds: f64,
    pub(super) requests: Requests,
}

/// What the phases share: the run's target, the bench's watches and the
/// operator process.
pub(super) struct Session<'a> {
    pub(super) target: &'a Target<'a>,
    pub(super) op: Operator,
    /// Objects (N).
    pub(super) n: u32,
    /// The objects' names.
    pub(super) names: Vec<String>,
    pub(super) cr_api: Api<DynamicObject>,
    pub(super) objects: Arc<Mutex<Objects>>,
    pub(super) pods: Arc<Mutex<Pods>>,
    /// How long convergence, a restart or the delete may take.
    pub(super) timeout: Duration,
    pub(super) env: Vec<(String, String)>,
    /// The folder of the operator's logs.
    pub(super) logs: PathBuf,
    pub(super) process: OperatorProcess,
    /// Where the current phase began.
    mark: Mark,
    /// The first process's whole log and last figures, once it has stopped.
    pub(super) first_process: Option<(String, Sample)>,
}

impl<'a> Session<'a> {
    /// Starts the bench's watches and the operator, and reads its idle figures.
    pub(super) async fn start(target: &'a Target<'a>) -> Result<(Self, Startup)> {
        let (args, op, n) = (target.args, target.args.operator, target.args.objects);
        let (objects, pods) = spawn_watches(target.client, target.namespace, &op.api_resource());
        let env: Vec<(String, String)> = args
            .env
            .iter()
            .map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .with_context(|| format!("--env {kv}: expected KEY=VALUE"))
            })
            .collect::<Result<_>>()?;
        let logs = out_dir()?.join("logs");
        fs::create_dir_all(&logs)?;
        let log_path = logs.join(format!("{}-{n}.log", op.name()));
        let started = Instant::now();
        let mut process = OperatorProcess::start(
            target.binary,
            target.sa_kubeconfig,
            target.namespace,
            &log_path,
            &env,
        )?;
        process.wait_ready().await?;
        let ready_seconds = seconds(started, Instant::now());
        let mut run = Self {
            target,
            op,
            n,
            names: (0..n).map(|i| format!("{}-{i:04}", op.name())).collect(),
            cr_api: Api::namespaced_with(
                target.client.clone(),
                target.namespace,
                &op.api_resource(),
            ),
            objects,
            pods,
            timeout: Duration::from_secs(180 + u64::from(n) / 2),
            env,
            logs,
            process,
            mark: Mark::default(),
            first_process: None,
        };
        // Let startup allocations settle, then read the idle figures.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let idle = run.end_phase()?;
        println!(
            "    idle: RSS {} MiB (anonymous {} MiB, peak {} MiB), {} threads, ready after {ready_seconds}s",
            procfs::mib(idle.sample.rss_kib),
            procfs::mib(idle.sample.anon_kib),
            procfs::mib(idle.sample.hwm_kib),
            idle.sample.threads
        );
        let startup = Startup {
            ready_seconds,
            idle_rss_kib: idle.sample.rss_kib,
            idle_hwm_kib: idle.sample.hwm_kib,
            idle_anon_kib: idle.sample.anon_kib,
            threads: idle.sample.threads,
            cpu_seconds: idle.cpu_seconds,
            requests: idle.requests,
        };
        Ok((run, startup))
    }

    /// Ends the current phase (the next one begins): the process's figures
    /// now, its CPU time and the requests it logged since the phase began.
    pub(super) fn end_phase(&mut self) -> Result<PhaseEnd> {
        let sample = self.process.sample()?;
        let log = self.process.log_len();
        let text = self.process.log_between(self.mark.log, log);
        let end = PhaseEnd {
            sample,
            cpu_seconds: round3(sample.cpu_seconds - self.mark.sample.cpu_seconds),
            requests: Requests::in_log(&text, self.n),
        };
        self.mark = Mark { sample, log };
        Ok(end)
    }

    /// Stops the operator and starts it again (a new phase begins with it);
    /// the first process's log and last figures are kept. Returns when it
    /// had stopped.
    pub(super) fn restart_process(&mut self) -> Result<Instant> {
        let log = self.process.log_from(0);
        let last = self.process.sample()?;
        self.first_process = Some((log, last));
        self.process.stop();
        let stopped = Instant::now();
        let restart_log = self.logs.join(format!(
            "{}-restart.log",
            run_name(self.op, self.n, self.target.args.stranger_pods)
        ));
        self.process = OperatorProcess::start(
            self.target.binary,
            self.target.sa_kubeconfig,
            self.target.namespace,
            &restart_log,
            &self.env,
        )?;
        self.mark = Mark::default();
        Ok(stopped)
    }

    /// The log of the process up to where the current phase began.
    pub(super) fn log_until_mark(&self) -> String {
        self.process.log_between(0, self.mark.log)
    }

    /// Objects Ready at `generations`.
    fn ready(&self, generations: &HashMap<String, i64>) -> usize {
        self.objects
            .lock()
            .map_or(0, |o| o.ready(&self.names, generations))
    }

    /// Pods that exist and are not terminating.
    pub(super) fn active_pods(&self) -> usize {
        self.pods.lock().map_or(0, |p| p.active.len())
    }

    /// Per-object latencies from each request to Ready at the generation it
    /// answered with, sorted.
    pub(super) fn latencies(&self, sent: &Sent) -> Result<Vec<f64>> {
        let o = self
            .objects
            .lock()
            .map_err(|_| anyhow!("state lock poisoned"))?;
        Ok(o.latencies(&self.names, &sent.at, &sent.generations))
    }

    /// Waits until every object is Ready at `generations` with exactly
    /// `want_pods` pods.
    async fn converged(
        &self,
        what: &str,
        generations: &HashMap<String, i64>,
        want_pods: usize,
    ) -> Result<Instant> {
        let n = self.n;
        wait_until(
            what,
            self.timeout,
            || self.ready(generations) == n as usize && self.active_pods() == want_pods,
            || {
                format!(
                    "{} of {n} Ready, {} of {want_pods} pods",
                    self.ready(generations),
                    self.active_pods()
                )
            },
        )
        .await
    }

    /// Sends one request per object (32 at a time), then waits until every
    /// object is Ready at the generation it answered with, with exactly
    /// `want_pods` pods (`what`: the wait, for its timeout error).
    pub(super) async fn converge<F, Fut>(
        &self,
        what: &str,
        want_pods: usize,
        items: Vec<(String, F)>,
        send: impl Fn(Api<DynamicObject>, String, F) -> Fut,
    ) -> Result<Sent>
    where
        Fut: Future<Output = Result<DynamicObject>>,
    {
        let sent: Vec<(String, Instant, i64)> = futures::stream::iter(items)
            .map(|(name, item)| {
                let request = send(self.cr_api.clone(), name.clone(), item);
                async move {
                    let at = Instant::now();
                    let obj = request.await?;
                    Ok::<_, anyhow::Error>((name, at, obj.metadata.generation.unwrap_or(1)))
                }
            })
            .buffer_unordered(32)
            .try_collect()
            .await?;
        let answered = Instant::now();
        let generations = sent.iter().map(|(n, _, g)| (n.clone(), *g)).collect();
        let converged = self.converged(what, &generations, want_pods).await?;
        Ok(Sent {
            at: sent.iter().map(|(n, t, _)| (n.clone(), *t)).collect(),
            generations,
            answered,
            converged,
        })
    }
}

/// One request per object and the convergence after them.
pub(super) struct Sent {
    /// When each request was sent.
    pub(super) at: HashMap<String, Instant>,
    /// The generation each answered with.
    pub(super) generations: HashMap<String, i64>,
    /// When the last answer came.
    pub(super) answered: Instant,
    /// When every object was Ready with the pods wanted.
    pub(super) converged: Instant,
}
