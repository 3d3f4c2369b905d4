//! What the phases of one run share: its target, the bench's watches, the
//! operator process and where the current phase began; the start (up to
//! idle) and the steps several phases take.

use super::options::{Operator, OperatorArgs, run_name};
use super::process::{Launcher, OperatorProcess};
use super::procfs::{self, Sample};
use super::record::{Requests, Startup};
use super::timing::{seconds, wait_until};
use super::watch::{Children, Objects, Pods, StatusShape, Watches, spawn_watches};
use crate::commands::bench::common::{out_dir, round3};
use anyhow::{Context, Result, anyhow};
use futures::{StreamExt, TryStreamExt};
use kube::Client;
use kube::api::Api;
use kube::core::DynamicObject;
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xtask::say;

/// What one run is of: the options, the binary and where it runs.
pub(super) struct Target<'a> {
    pub(super) args: &'a OperatorArgs,
    /// What runs: the Rust operator or the Go original.
    pub(super) launcher: &'a Launcher,
    /// How its status says Ready.
    pub(super) shape: StatusShape,
    pub(super) client: &'a Client,
    /// The bench namespaces (one unless `--namespaces`); object `i` is in `i % len`.
    pub(super) namespaces: &'a [String],
}

impl Target<'_> {
    /// What the operator is told to watch: the namespaces, comma-separated.
    fn watched(&self) -> String {
        self.namespaces.join(",")
    }
}

/// Where a phase began: the process's figures and where its request record stood then.
#[derive(Default)]
struct Mark {
    sample: Sample,
    requests: usize,
    cluster_cpu: BTreeMap<String, f64>,
}

/// What a phase ends with: the figures then, and the CPU time and requests
/// since it began.
pub(super) struct PhaseEnd {
    pub(super) sample: Sample,
    pub(super) cpu_seconds: f64,
    pub(super) requests: Requests,
    /// CPU seconds of each process of the local cluster meanwhile.
    pub(super) cluster_cpu: BTreeMap<String, f64>,
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
    /// The custom resource in each namespace (in the order of `target.namespaces`).
    cr_apis: Vec<Api<DynamicObject>>,
    /// Which of `cr_apis` each object is in.
    homes: HashMap<String, usize>,
    pub(super) objects: Arc<Mutex<Objects>>,
    pub(super) pods: Arc<Mutex<Pods>>,
    pub(super) children: Arc<Mutex<Children>>,
    /// How long convergence, a restart or the delete may take.
    pub(super) timeout: Duration,
    pub(super) env: Vec<(String, String)>,
    /// The folder of the operator's logs.
    pub(super) logs: PathBuf,
    pub(super) process: OperatorProcess,
    /// Where the current phase began.
    mark: Mark,
    /// The first process's requests and last figures, once it has stopped.
    pub(super) first_process: Option<(BTreeMap<String, u64>, Sample)>,
}

impl<'a> Session<'a> {
    /// Starts the bench's watches and the operator, and reads its idle figures.
    pub(super) async fn start(target: &'a Target<'a>) -> Result<(Self, Startup)> {
        let (args, op, n) = (target.args, target.args.operator, target.args.objects);
        let Watches {
            objects,
            pods,
            children,
        } = spawn_watches(
            target.client,
            target.namespaces,
            &op.api_resource(),
            target.shape,
        );
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
        let log_path = logs.join(format!("{}.log", log_name(target)));
        let started = Instant::now();
        let mut process =
            OperatorProcess::start(target.launcher, &target.watched(), &log_path, &env)?;
        process.wait_ready().await?;
        let ready_seconds = seconds(started, Instant::now());
        let names: Vec<String> = (0..n).map(|i| format!("{}-{i:04}", op.name())).collect();
        let homes = names
            .iter()
            .enumerate()
            .map(|(i, name)| (name.clone(), i % target.namespaces.len()))
            .collect();
        let mut run = Self {
            target,
            op,
            n,
            names,
            cr_apis: target
                .namespaces
                .iter()
                .map(|ns| Api::namespaced_with(target.client.clone(), ns, &op.api_resource()))
                .collect(),
            homes,
            objects,
            pods,
            children,
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
        say!(
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
        let position = self.process.request_position();
        let counts = self.process.requests_between(self.mark.requests, position);
        let cluster_cpu = procfs::cluster_cpu();
        let end = PhaseEnd {
            sample,
            cpu_seconds: round3(sample.cpu_seconds - self.mark.sample.cpu_seconds),
            requests: Requests::from_counts(counts, self.n),
            cluster_cpu: procfs::cpu_since(&self.mark.cluster_cpu, &cluster_cpu),
        };
        self.mark = Mark {
            sample,
            requests: position,
            cluster_cpu,
        };
        Ok(end)
    }

    /// Stops the operator and starts it again (a new phase begins with it);
    /// the first process's log and last figures are kept. Returns when it
    /// had stopped.
    pub(super) fn restart_process(&mut self) -> Result<Instant> {
        let last = self.process.sample()?;
        self.process.stop();
        let stopped = Instant::now();
        let requests = self.process.requests_between(
            self.process.first_request(),
            self.process.request_position(),
        );
        self.first_process = Some((requests, last));
        let restart_log = self
            .logs
            .join(format!("{}-restart.log", log_name(self.target)));
        self.process = OperatorProcess::start(
            self.target.launcher,
            &self.target.watched(),
            &restart_log,
            &self.env,
        )?;
        self.mark = Mark {
            sample: Sample::default(),
            requests: self.process.first_request(),
            cluster_cpu: procfs::cluster_cpu(),
        };
        Ok(stopped)
    }

    /// The custom resource API of the namespace object `name` is in.
    pub(super) fn cr_api(&self, name: &str) -> &Api<DynamicObject> {
        let home = self.homes.get(name).copied().unwrap_or(0);
        &self.cr_apis[home]
    }

    /// The custom resource API of every bench namespace.
    pub(super) fn cr_apis(&self) -> &[Api<DynamicObject>] {
        &self.cr_apis
    }

    /// The requests of the current process up to where the current phase began.
    pub(super) fn requests_until_mark(&self) -> BTreeMap<String, u64> {
        self.process
            .requests_between(self.process.first_request(), self.mark.requests)
    }

    /// Objects Ready at `generations`.
    fn ready(&self, generations: &HashMap<String, i64>) -> usize {
        self.objects
            .lock()
            .map_or(0, |o| o.ready(&self.names, generations))
    }

    /// Waits until the operator has made no request (logged nothing) for a second, at
    /// most 10 s.
    pub(super) async fn settle_requests(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = (self.process.request_position(), Instant::now());
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = self.process.request_position();
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() >= Duration::from_secs(1) {
                return;
            }
        }
    }

    /// Pods that exist and are not terminating.
    pub(super) fn active_pods(&self) -> usize {
        self.pods.lock().map_or(0, |p| p.active.len())
    }

    /// Pods that exist, are not terminating and are Ready.
    pub(super) fn ready_pods(&self) -> usize {
        self.pods.lock().map_or(0, |p| p.ready.len())
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

    /// Waits until every object is Ready at `generations` (as its own status says) with
    /// exactly `want_pods` pods, every one Ready (the same finish line for every
    /// implementation, whatever its status waits for). Returns when that held, and when
    /// each half first held.
    async fn converged(
        &self,
        what: &str,
        generations: &HashMap<String, i64>,
        want_pods: usize,
    ) -> Result<Convergence> {
        let n = self.n as usize;
        let (objects_ready, pods_ready) = (Cell::new(None), Cell::new(None));
        let all = wait_until(
            what,
            self.timeout,
            || {
                let now = Instant::now();
                let objects = self.ready(generations) == n;
                let pods = self.pods.lock().is_ok_and(|p| p.exactly_ready(want_pods));
                if objects && objects_ready.get().is_none() {
                    objects_ready.set(Some(now));
                }
                if pods && pods_ready.get().is_none() {
                    pods_ready.set(Some(now));
                }
                objects && pods
            },
            || {
                format!(
                    "{} of {n} Ready, {} of {want_pods} pods, {} Ready",
                    self.ready(generations),
                    self.active_pods(),
                    self.ready_pods()
                )
            },
        )
        .await?;
        Ok(Convergence {
            all,
            objects_ready: objects_ready.get().unwrap_or(all),
            pods_ready: pods_ready.get().unwrap_or(all),
        })
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
                let request = send(self.cr_api(&name).clone(), name.clone(), item);
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
            converged: converged.all,
            objects_ready: converged.objects_ready,
            pods_ready: converged.pods_ready,
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
    /// When every object was Ready with the pods wanted, every one Ready.
    pub(super) converged: Instant,
    /// When every object's status first said Ready.
    pub(super) objects_ready: Instant,
    /// When exactly the pods wanted first existed, every one Ready.
    pub(super) pods_ready: Instant,
}

/// When a convergence was reached, and each of its halves.
struct Convergence {
    all: Instant,
    objects_ready: Instant,
    pods_ready: Instant,
}

/// The name of the run's logs: `<operator>-<N>[-strangers-<M>]`, `-go` for the Go
/// original.
fn log_name(target: &Target<'_>) -> String {
    let args = target.args;
    let base = run_name(args);
    match target.launcher {
        Launcher::Rust { .. } => base,
        Launcher::Go { .. } => format!("{base}-go"),
    }
}
