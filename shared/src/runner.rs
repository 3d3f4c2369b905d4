//! The operator entry point: `crd` prints the CRD; `run` connects, checks the CRD, serves
//! metrics and probes, wins leader election and runs one controller per watched scope
//! until SIGTERM/SIGINT (graceful: in-flight reconciles finish, the lease is released).

use std::{future::Future, sync::Arc};

use futures::{FutureExt, StreamExt, future::Shared};
use kube::{
    Client, CustomResourceExt,
    api::ListParams,
    core::object::HasStatus,
    runtime::{
        Controller,
        controller::{self, Action},
    },
};

mod cli;
mod client;
mod fair;
mod guard;
mod health;
mod leader;
mod metrics;
#[cfg(feature = "secure-metrics")]
mod metrics_auth;
mod process_metrics;
mod rate_limit;
mod resync;
mod telemetry;
mod toolkit;

pub use metrics::{GaugeFamily, ObjectGauges};
pub use toolkit::{Operator, Pacing, Toolkit, awaiting_ready};

use guard::{Guard, on_controller_result};
use resync::{Admission, RESYNC_QUEUED, resyncs};

use crate::{
    backoff::{Debounce, ErrorBackoff},
    conditions::HasConditions,
    error::{Error, ReconcileError},
    namespaces::{self, Scope, ScopeStatus, WatchNamespaces, Watched},
    runner::cli::{Cli, Command, RunArgs},
    runner::health::Readiness,
    runner::leader::{Elector, LeaderConfig, Leadership},
    runner::metrics::Metrics,
    runner::rate_limit::ClientRateLimit,
};

/// The longest `--reconcile-debounce` postpones a settled object that keeps getting
/// triggers (one on its way to its spec: [`PROGRESS_INTERVAL`]).
pub(crate) const MAX_DEBOUNCE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How often the progress of an object on its way to its spec is written at most
/// ([`Pacing::progress`] says [`Progress::Converging`]): its status catches up with its
/// pods every 15 s while it converges (a HorizontalPodAutoscaler's sync period), and the
/// trigger that completes it runs at once. On a busy control plane an object's pods come,
/// start and turn Ready many seconds apart; writing each step cost more status writes
/// than the Go originals make.
pub(crate) const PROGRESS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(15);

type ShutdownSignal = Shared<futures::future::BoxFuture<'static, ()>>;

impl Operator {
    /// Prints the CRD of `K` as YAML on stdout.
    ///
    /// # Errors
    /// When the CRD cannot be serialized (a bug).
    pub fn print_crd<K: CustomResourceExt>(&self) -> Result<(), Error> {
        print!("{}", crd_yaml::<K>()?);
        Ok(())
    }

    /// The whole of an operator binary's `main`: parses the command line, then prints the
    /// CRD of `K` (`crd`) or runs the operator (`run`, the default) until SIGTERM/SIGINT
    /// (returns `Ok`) or a fatal error (leadership lost, startup failure). Logging is
    /// initialised here.
    ///
    /// `make_context` builds the reconcile context once, from the [`Toolkit`] and the value
    /// of the environment variable `image_env` (the workload image, if set); `build` builds
    /// the `Controller` of one [`Scope`] (called once per watched namespace, or once for
    /// all); `reconcile` is wrapped with metrics, a log span naming the controller and
    /// object, the debounce (which asks the context's [`Pacing`]) and per-object
    /// exponential backoff on errors. `K`'s status carries conditions: `/metrics` counts
    /// the cached objects Ready for their generation or not (`operator_objects`).
    ///
    /// # Errors
    /// [`Error`] with a message saying what to do.
    pub async fn run<K, Ctx, E, Fut>(
        self,
        image_env: &str,
        make_context: impl FnOnce(Toolkit, Option<String>) -> Ctx,
        build: impl Fn(&Scope, &Ctx) -> Controller<K>,
        reconcile: fn(Arc<K>, Arc<Ctx>) -> Fut,
    ) -> Result<(), Error>
    where
        K: Watched + CustomResourceExt + HasStatus,
        K::Status: HasConditions,
        Ctx: Pacing<K> + Send + Sync + 'static,
        E: ReconcileError,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let cli = Cli::parse_for(self.name);
        let args = match cli.subcommand() {
            Command::Crd => return self.print_crd::<K>(),
            Command::Run => cli.run,
        };
        let telemetry =
            crate::runner::telemetry::init(&args, self.name).map_err(Error::InvalidFlag)?;
        let result = self
            .serve(args, image_env, make_context, build, reconcile)
            .await;
        // The last spans are sent (within a bound) however the run ended.
        telemetry.shutdown().await;
        result
    }

    /// [`Operator::run`]'s `run` subcommand, once logging (and tracing) is set up.
    async fn serve<K, Ctx, E, Fut>(
        self,
        args: RunArgs,
        image_env: &str,
        make_context: impl FnOnce(Toolkit, Option<String>) -> Ctx,
        build: impl Fn(&Scope, &Ctx) -> Controller<K>,
        reconcile: fn(Arc<K>, Arc<Ctx>) -> Fut,
    ) -> Result<(), Error>
    where
        K: Watched + CustomResourceExt + HasStatus,
        K::Status: HasConditions,
        Ctx: Pacing<K> + Send + Sync + 'static,
        E: ReconcileError,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let image = std::env::var(image_env).ok();
        tracing::info!(operator = self.name, watch_namespace = %args.watch_namespace, "starting");
        // Every child is applied under the operator's name: the caches keep its fields.
        crate::slim::projection::set_field_manager(self.name);
        let metrics = Metrics::new();
        let limit = args.client_rate_limit().map_err(Error::InvalidFlag)?;
        let kube_config = infer_config().await?;
        let client = connect(&metrics, kube_config.clone(), limit)?;
        check_crd_installed::<K>(&client, &args.watch_namespace, self.name).await?;

        let ready = Readiness::default();
        health::serve_from_args(&args, &client, metrics.clone(), ready.clone()).await?;
        let shutdown = shutdown_on_signal();

        let mut held = None;
        if args.leader_elect {
            let candidate = Candidate {
                metrics: &metrics,
                ready: &ready,
                kube_config,
                limit,
            };
            match self.win_leadership(&args, candidate, &shutdown).await? {
                Some(lease) => held = Some(lease),
                None => {
                    tracing::info!("shutting down before becoming leader");
                    return Ok(());
                }
            }
        }

        let mut toolkit = Toolkit::new(client.clone(), self);
        toolkit.metrics = metrics.clone();
        let status_writes = toolkit.status_writes.clone();
        let ctx = Arc::new(make_context(toolkit, image));
        let guard = Arc::new(Guard {
            controller: self.controller,
            metrics: metrics.clone(),
            backoff: ErrorBackoff::default(),
            debounce: Debounce::new(args.reconcile_debounce, MAX_DEBOUNCE_WAIT)
                .progress_every(PROGRESS_INTERVAL),
            resyncs: Arc::new(Admission::new(RESYNC_QUEUED)),
            status_writes,
            slots: crate::runner::fair::FairSlots::new(usize::from(args.max_concurrent_reconciles)),
            waiting: Arc::default(),
            reconcile,
        });
        metrics.controller_started(self.controller, args.max_concurrent_reconciles);
        let all = start_controllers(&args, &client, &ctx, build, &guard, &ready, &shutdown);
        tracing::info!(controller = self.controller, "controllers started");

        match held {
            None => all.await,
            Some(lease) => lead_until_done(all, lease, &metrics).await?,
        }
        tracing::info!("shut down cleanly");
        Ok(())
    }

    /// Waits for this replica to win leader election (`--leader-elect`), ready meanwhile
    /// (a standby replica serves its purpose by waiting). `None` when a shutdown signal
    /// came first.
    ///
    /// # Errors
    /// When the client of its own cannot be built.
    async fn win_leadership(
        self,
        args: &RunArgs,
        candidate: Candidate<'_>,
        shutdown: &ShutdownSignal,
    ) -> Result<Option<HeldLease>, Error> {
        let Candidate {
            metrics,
            ready,
            kube_config,
            limit,
        } = candidate;
        let config = LeaderConfig {
            lease_name: args.leader_election_id(self.name),
            namespace: args.leader_election_namespace(),
            identity: leader::default_identity(),
            lease_duration: args.lease_duration,
            renew_deadline: args.renew_deadline,
            retry_period: args.retry_period,
        };
        tracing::info!(lease = %config.lease_name, namespace = %config.namespace, identity = %config.identity, "waiting for leadership");
        metrics.set_leader(&config.lease_name, false);
        // A standby replica is ready: it serves its purpose by waiting.
        ready.set(true);
        let lease_name = config.lease_name.clone();
        // A client and token bucket of its own, as controller-runtime gives leader election
        // its own clientset, built on the election's own thread: renewals never queue
        // behind the reconciles' requests nor wait for the reconciles' runtime.
        let mode = args.leader_election_mode;
        let mut elector = Elector::start(mode, config, || connect(metrics, kube_config, limit))?;
        tokio::select! {
            () = elector.acquire() => {}
            () = shutdown.clone() => return Ok(None),
        }
        metrics.set_leader(&lease_name, true);
        ready.set(false);
        Ok(Some(HeldLease {
            leadership: elector.keep_leading(),
            lease_name,
        }))
    }
}

/// What a candidate for leadership needs besides the flags: the metrics and `/readyz` it
/// reports to, and what it builds its own client from.
struct Candidate<'a> {
    metrics: &'a Metrics,
    ready: &'a Readiness,
    kube_config: kube::Config,
    limit: ClientRateLimit,
}

/// Leadership won, with the name of its lease (the `leader_election_master_status` label).
struct HeldLease {
    leadership: Leadership,
    lease_name: String,
}

/// Runs the controllers (`all`) while holding `lease`: on a clean shutdown the lease is
/// released so a successor takes over at once.
///
/// # Errors
/// [`Error::LeadershipLost`] when the lease is lost: the controllers are stopped at once.
async fn lead_until_done(
    all: impl Future<Output = ()>,
    lease: HeldLease,
    metrics: &Metrics,
) -> Result<(), Error> {
    let HeldLease {
        mut leadership,
        lease_name,
    } = lease;
    tokio::select! {
        () = all => {
            leadership.release().await;
            metrics.set_leader(&lease_name, false);
            Ok(())
        }
        reason = leadership.lost() => {
            // Stop reconciling at once: dropping `all` cancels the controllers.
            metrics.set_leader(&lease_name, false);
            tracing::error!(%reason, "leader election lost; stopping");
            Err(Error::LeadershipLost(reason))
        }
    }
}

/// Starts one controller per watched scope (`build` makes each), every one reconciling
/// through `guard`, and the task that keeps `/readyz` in step with their watches. The
/// returned future ends when every controller has shut down.
fn start_controllers<K, Ctx, E, Fut, B>(
    args: &RunArgs,
    client: &Client,
    ctx: &Arc<Ctx>,
    build: B,
    guard: &Arc<Guard<K, Ctx, Fut>>,
    ready: &Readiness,
    shutdown: &ShutdownSignal,
) -> impl Future<Output = ()> + use<K, Ctx, E, Fut, B>
where
    K: Watched + HasStatus,
    K::Status: HasConditions,
    Ctx: Pacing<K> + Send + Sync + 'static,
    E: ReconcileError,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    B: Fn(&Scope, &Ctx) -> Controller<K>,
{
    let mut runs = Vec::new();
    let mut statuses = Vec::new();
    let mut stores = Vec::new();
    for namespace in args.watch_namespace.scopes() {
        let scope = Scope::new(client.clone(), namespace)
            .with_streaming_lists(args.streaming_lists)
            .with_status_writes(guard.status_writes.clone())
            .with_owner::<K>();
        let controller = build(&scope, ctx);
        stores.push(controller.store());
        let status = scope.status();
        // The scope's watches pass no list on as triggers: every object is reconciled after
        // each full list from here, a bounded number queued at a time (see `resync`).
        let resync = resyncs(
            controller.store(),
            status.clone(),
            scope.lists(),
            guard.resyncs.clone(),
        );
        // The objects whose turn for a reconcile slot came (`Guard::reconcile`).
        let (turns, turn_triggers) = futures::channel::mpsc::unbounded();
        let controller = controller.reconcile_on(resync).reconcile_on(turn_triggers);
        let reconciler = {
            let (guard, status) = (guard.clone(), status.clone());
            move |obj, ctx| {
                guard
                    .clone()
                    .reconcile(status.clone(), turns.clone(), obj, ctx)
            }
        };
        let error_policy = {
            let guard = guard.clone();
            move |obj: Arc<K>, error: &E, _ctx: Arc<Ctx>| guard.error_policy(obj.as_ref(), error)
        };
        let results = {
            let guard = guard.clone();
            move |res| {
                on_controller_result(guard.controller, res, &guard);
                std::future::ready(())
            }
        };
        let run = controller
            .with_config(
                controller::Config::default()
                    // No limit in kube's queue, which serves first come, first served: every
                    // reconcile takes one of `--max-concurrent-reconciles` slots, handed out
                    // fairly across namespaces (`Guard::slots`).
                    .concurrency(0)
                    // See `Guard::debounce`.
                    .debounce(std::time::Duration::ZERO),
            )
            .graceful_shutdown_on(shutdown.clone())
            .run(reconciler, error_policy, ctx.clone())
            .for_each(results);
        statuses.push(status);
        runs.push(run);
    }
    // `operator_objects*`: the primary objects Ready or not, read from these caches at
    // each scrape (one source for all the scopes: each family is described once).
    guard
        .metrics
        .add_object_gauges(Arc::new(metrics::ReadyGauges {
            controller: guard.controller,
            stores,
        }));
    tokio::spawn(report_readiness(statuses, ready.clone()));
    futures::future::join_all(runs).map(|_| ())
}

/// The CRD of `K` as YAML.
///
/// # Errors
/// When serialization fails (a bug).
pub(crate) fn crd_yaml<K: CustomResourceExt>() -> Result<String, Error> {
    serde_saphyr::to_string(&K::crd()).map_err(|e| Error::Serialize {
        what: "CRD".to_owned(),
        source: serde::ser::Error::custom(e),
    })
}

/// Keeps `/readyz` up to date with the scopes' watches (see [`namespaces::readiness`]) until
/// the watches end.
async fn report_readiness(
    mut statuses: Vec<tokio::sync::watch::Receiver<ScopeStatus>>,
    ready: Readiness,
) {
    if statuses.is_empty() {
        return;
    }
    let mut was = (false, String::new());
    loop {
        let now: Vec<ScopeStatus> = statuses
            .iter_mut()
            .map(|s| s.borrow_and_update().clone())
            .collect();
        let (is_ready, detail) = namespaces::readiness(&now);
        if (is_ready, &detail) != (was.0, &was.1) {
            if is_ready && !was.0 {
                tracing::info!("watches synced; ready");
            }
            if !detail.is_empty() {
                tracing::info!(%detail, ready = is_ready, "watch status");
            }
            ready.set(is_ready);
            was = (is_ready, detail);
        }
        let changes = statuses.iter_mut().map(|s| Box::pin(s.changed()));
        if futures::future::select_all(changes).await.0.is_err() {
            // A scope's watches ended: shutting down.
            return;
        }
    }
}

/// `Config::infer`: `$KUBECONFIG`, `~/.kube/config` or the in-cluster service account.
async fn infer_config() -> Result<kube::Config, Error> {
    kube::Config::infer()
        .await
        .map_err(|e| no_credentials(kube::Error::InferConfig(e)))
}

/// A client for `config` with its own token bucket (`--kube-api-qps`, `--kube-api-burst`),
/// retrying 429s, every request counted in `rest_client_requests_total`
/// ([`Metrics::client`]).
fn connect(
    metrics: &Metrics,
    config: kube::Config,
    limit: ClientRateLimit,
) -> Result<Client, Error> {
    crate::runner::client::client(config, metrics, limit).map_err(no_credentials)
}

fn no_credentials(source: kube::Error) -> Error {
    Error::NoCredentials {
        source,
        kubeconfig: std::env::var("KUBECONFIG").unwrap_or_else(|_| "unset".to_owned()),
    }
}

async fn check_crd_installed<K>(
    client: &Client,
    watch: &WatchNamespaces,
    operator: &str,
) -> Result<(), Error>
where
    K: Watched + CustomResourceExt,
{
    // Asked in each watched namespace until one answers: a namespace this operator may
    // not read (its RoleBinding gone) must not stop it from serving the others.
    let mut forbidden = None;
    for namespace in watch.scopes() {
        let scope = Scope::new(client.clone(), namespace.clone());
        match scope
            .api::<K>()
            .list_metadata(&ListParams::default().limit(1))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return Err(Error::CrdNotInstalled {
                    crd: format!("{}.{}", K::plural(&()), K::group(&())),
                    operator: operator.to_owned(),
                });
            }
            Err(kube::Error::Api(s)) if s.code == 403 => {
                tracing::warn!(namespace = namespace.as_deref().unwrap_or("<all namespaces>"), error = %s, "cannot list in a watched namespace");
                forbidden = Some(kube::Error::Api(s));
            }
            Err(e) => return Err(Error::Kube(e)),
        }
    }
    forbidden.map_or(Ok(()), |e| Err(Error::Kube(e)))
}

/// A future that resolves on the first SIGTERM or SIGINT (cloneable, `Sync`).
fn shutdown_on_signal() -> ShutdownSignal {
    let (tx, rx) = futures::channel::oneshot::channel::<()>();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = ctrl_c => tracing::info!("SIGINT received; shutting down"),
                        _ = term.recv() => tracing::info!("SIGTERM received; shutting down"),
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot listen for SIGTERM");
                    let _ = ctrl_c.await;
                }
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        let _ = tx.send(());
    });
    rx.map(|_| ()).boxed().shared()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;
    use crate::backoff::Gate;

    /// Runs kube's applier (its scheduler, with `kube_debounce`) on one object triggered
    /// every 200 ms for 10 s; the reconciler asks `gate` first, as the runner's wrapper
    /// does. Returns when (since the start) reconciles ran, over 12 virtual seconds.
    async fn reconciles_under_constant_events(
        kube_debounce: Duration,
        gate: Debounce,
    ) -> Vec<Duration> {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::runtime::{
            applier,
            reflector::{self, ObjectRef},
            watcher,
        };
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("o".into());
        cm.metadata.namespace = Some("ns".into());
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(cm.clone()));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let start = tokio::time::Instant::now();
        let obj_ref = ObjectRef::from_obj(&cm);
        let triggers = futures::stream::unfold(0u32, move |i| {
            let obj_ref = obj_ref.clone();
            async move {
                if i > 50 {
                    return None;
                }
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Some((Ok::<_, std::convert::Infallible>(obj_ref), i + 1))
            }
        })
        .chain(futures::stream::pending());
        let gate = Arc::new(gate);
        let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
        let reconciler = {
            let runs = runs.clone();
            move |_obj: Arc<ConfigMap>, _ctx: Arc<()>| {
                let (gate, runs) = (gate.clone(), runs.clone());
                async move {
                    let now = tokio::time::Instant::now();
                    if let Gate::Wait(wait) =
                        gate.check("ns/o", None, now.into_std(), || crate::Progress::Settled)
                    {
                        return Ok(Action::requeue(wait));
                    }
                    runs.lock().unwrap().push(now - start);
                    Ok::<_, std::convert::Infallible>(Action::await_change())
                }
                .boxed()
            }
        };
        let run = applier(
            reconciler,
            |_, _, _| Action::await_change(),
            Arc::new(()),
            store,
            triggers,
            controller::Config::default().debounce(kube_debounce),
        )
        .for_each(|_| std::future::ready(()));
        let _ = tokio::time::timeout(Duration::from_secs(12), run).await;
        runs.lock().unwrap().clone()
    }

    #[tokio::test(start_paused = true)]
    async fn constant_events_still_reconcile_every_5_s_with_kubes_scheduler() {
        let quiet = Duration::from_millis(500);
        // As the runner sets it up: no debounce in kube, the bounded one in front.
        let runs = reconciles_under_constant_events(
            Duration::ZERO,
            Debounce::new(quiet, MAX_DEBOUNCE_WAIT),
        )
        .await;
        assert!(runs.len() >= 2, "{runs:?}");
        assert!(runs[0] <= Duration::from_millis(5_100), "{runs:?}");
        for pair in runs.windows(2) {
            assert!(
                pair[1] - pair[0] <= Duration::from_millis(5_300),
                "{runs:?}"
            );
        }
        // The events stop at 10 s; the last reconcile has seen them all.
        assert!(*runs.last().unwrap() >= Duration::from_secs(10), "{runs:?}");

        // kube's own trailing debounce: nothing until the events stop.
        let unbounded =
            reconciles_under_constant_events(quiet, Debounce::new(Duration::ZERO, Duration::ZERO))
                .await;
        assert_eq!(unbounded.len(), 1, "{unbounded:?}");
        assert!(unbounded[0] >= Duration::from_secs(10), "{unbounded:?}");
    }
}
