//! The controller: [`Context`], [`controller`] (what is watched) and [`reconcile`]: the
//! finalizer ([`crate::finalizer`]), then the desired children ([`desired`]) written
//! through the kit (`shared::children`), then the status ([`status`]) published.
//!
//! The error policy is the common runner's (behind `shared::Operator::run`): a failed
//! reconcile ([`Error`]) is retried with per-object exponential backoff (1 s doubling to
//! 5 min), never in a hot loop.

use std::sync::Arc;

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Service, networking::v1::NetworkPolicy};
use kube::{
    Api, ResourceExt,
    runtime::{
        Controller,
        controller::Action,
        finalizer::{self, finalizer},
        reflector::ObjectRef,
        watcher,
    },
};
use shared::{
    Progress, Toolkit,
    children::Children,
    conditions,
    events::Announce,
    namespaces::Scope,
    namespaces::{ScopedIndex, ScopedStores},
    slim::{Slim, SlimPod},
};

use crate::{
    FINALIZER, OPERATOR,
    api::{DEFAULT_IMAGE, Memcached},
    desired::{self, INSTANCE_LABEL},
    error::Error,
    finalizer::{add_finalizer, cleanup},
    release,
    status::{self, NamedPod, PodState, Problem, ServiceState},
};

/// State shared by every reconcile.
#[derive(Debug)]
pub struct Context {
    /// Client, events, metrics.
    pub toolkit: Toolkit,
    /// The operator's Deployments, one cache per watched scope (compact: [`Slim`]).
    pub deployments: ScopedStores<Slim<Deployment>>,
    /// The operator's Services, one cache per watched scope (compact: [`Slim`]).
    pub services: ScopedStores<Slim<Service>>,
    /// The operator's NetworkPolicies (`spec.networkPolicy`), one cache per watched scope.
    pub network_policies: ScopedStores<Slim<NetworkPolicy>>,
    /// The memcached pods of each Memcached's Deployment, one index per watched scope:
    /// names and [`PodState`]s by Memcached, not the pods themselves.
    pub pods: Arc<ScopedIndex<SlimPod, PodState>>,
    /// The memcached image (`MEMCACHED_IMAGE`, else [`DEFAULT_IMAGE`]).
    pub image: String,
}

impl Context {
    /// A context; `image` comes from `MEMCACHED_IMAGE`.
    #[must_use]
    pub fn new(toolkit: Toolkit, image: Option<String>) -> Self {
        Self {
            toolkit,
            deployments: ScopedStores::default(),
            services: ScopedStores::default(),
            network_policies: ScopedStores::default(),
            // By the Memcached's name (`app.kubernetes.io/instance`): a reconcile reads its
            // own pods only.
            pods: Arc::new(ScopedIndex::new(status::cached_pod)),
            image: image
                .map(|i| i.trim().to_owned())
                .filter(|i| !i.is_empty())
                .unwrap_or_else(|| DEFAULT_IMAGE.to_owned()),
        }
    }

    /// The pods of the Memcached `name` in `ns` (its Deployment's), by name.
    fn pods_of(&self, ns: &str, name: &str) -> Vec<NamedPod> {
        self.pods.get(ns, name)
    }
}

impl shared::Pacing<Memcached> for Context {
    /// Completed by the last pod of a change ready: `spec.size` current pods ready in the
    /// cache, its own Service cached, then (parsed only when they are) the cached
    /// Deployment at its latest spec with as many available; converging until then, while
    /// the status does not say `Ready` for this generation.
    fn progress(&self, mc: &Memcached) -> Progress {
        let Some(ns) = shared::awaiting_ready(mc) else {
            return Progress::Settled;
        };
        let name = mc.name_any();
        let pods = self.pods_of(&ns, &name);
        let done = status::pods_ready(mc, &pods)
            && status::service_state(mc, self.services.find(&ns, &name).as_deref())
                == ServiceState::Owned
            && self
                .deployments
                .find(&ns, &name)
                .and_then(|d| d.full().ok())
                .is_some_and(|d| status::is_available(mc, &d, &pods));
        Progress::converging_until(done)
    }
}

/// The controller of one scope: Memcacheds; the Deployments and Services this operator
/// manages (by label, mapped back through the controller owner reference); and the
/// memcached pods (by label, mapped back through `app.kubernetes.io/instance`) so that
/// `status.nodes` follows them as they come and go.
///
/// A scope of one namespace (a namespace-scoped run) also gets its
/// [`release::release_while_stranded`] task, which ends with the scope's watches.
pub fn controller(scope: &Scope, ctx: &Context) -> Controller<Memcached> {
    let ours = watcher::Config::default()
        .labels(&format!("app.kubernetes.io/managed-by={}", OPERATOR.name));
    let (deployments, deployment_events) = scope.reflect::<Slim<Deployment>>(ours.clone());
    ctx.deployments.insert(scope, deployments);
    let (services, service_events) = scope.reflect::<Slim<Service>>(ours.clone());
    ctx.services.insert(scope, services);
    let (policies, policy_events) = scope.reflect::<Slim<NetworkPolicy>>(ours);
    ctx.network_policies.insert(scope, policies);
    // Only the pods' names and states are read (`status.nodes`, readiness), and only those
    // are kept.
    let pod_events = scope.reflect_index(
        watcher::Config::default().labels(&desired::all_pods_selector()),
        &ctx.pods,
    );
    let controller = scope
        .controller::<Memcached>(watcher::Config::default())
        .owns_stream(deployment_events)
        .owns_stream(service_events)
        .owns_stream(policy_events)
        .watches_stream(pod_events, |pod: SlimPod| {
            let ns = pod.namespace()?;
            pod.labels()
                .get(INSTANCE_LABEL)
                .map(|name| ObjectRef::<Memcached>::new(name).within(&ns))
        });
    if let Some(namespace) = scope.namespace() {
        tokio::spawn(release::release_while_stranded(
            scope.client().clone(),
            namespace.to_owned(),
            scope.status(),
        ));
    }
    controller
}

/// Keeps the finalizer on every Memcached; brings its Deployment and Service in line with
/// the spec and records what it saw in the status; on deletion runs [`cleanup`].
///
/// # Errors
/// [`Error`] on API failures; the runner retries with per-object backoff.
pub async fn reconcile(mc: Arc<Memcached>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(ns) = mc.namespace() else {
        return Ok(Action::await_change());
    };
    let api: Api<Memcached> = Api::namespaced(ctx.toolkit.client.clone(), &ns);
    let mc = add_finalizer(&api, mc).await?;
    finalizer(&api, FINALIZER, mc, |event| async {
        match event {
            finalizer::Event::Apply(mc) => apply(&mc, &ctx).await,
            finalizer::Event::Cleanup(mc) => cleanup(&mc, &ctx).await,
        }
    })
    .await
    .or_else(|e| match e {
        // Removed by an earlier reconcile that this one's (stale) cache had not seen yet.
        finalizer::Error::RemoveFinalizer(kube::Error::Api(s)) if s.code == 404 => {
            Ok(Action::await_change())
        }
        e => Err(Error::Finalizer(Box::new(e))),
    })
}

/// The reconcile proper, with the finalizer in place: the desired children written
/// (`shared::children`), the NetworkPolicy made earlier deleted once `spec.networkPolicy`
/// no longer asks for one, then the status.
async fn apply(mc: &Memcached, ctx: &Context) -> Result<Action, Error> {
    let (Some(ns), Some(_)) = (mc.namespace(), mc.uid()) else {
        return Ok(Action::await_change());
    };
    let name = mc.name_any();
    let mut children = Children::new(&ctx.toolkit.client, ctx.toolkit.operator.name, mc)?;
    let owner = children.owner();
    let deployment = desired::desired_deployment(mc, owner.clone(), &ctx.image);
    let deployment = children
        .apply_scalable(&deployment, ctx.deployments.find(&ns, &name))
        .await?;
    let service = desired::desired_service(mc, owner.clone());
    let service = children
        .apply(&service, ctx.services.find(&ns, &name))
        .await?;
    let policies = ctx.network_policies.find(&ns, &name);
    if let Some(policy) = desired::desired_network_policy(mc, owner) {
        children.apply(&policy, policies.clone()).await?;
    }
    children.prune(policies).await?;
    if children.namespace_terminating() {
        return Ok(Action::await_change());
    }

    let problem = children.problems().first().map(Problem::from);
    // Only its own Service makes the Memcached Ready; a refused Deployment is not shown.
    let service = match (service.is_held_by_another(), service.exists()) {
        (true, _) => ServiceState::NotOwned,
        (false, true) => ServiceState::Owned,
        (false, false) => ServiceState::Missing,
    };
    let deployment = if deployment.is_problem() {
        None
    } else {
        deployment.into_object()?
    };
    update_status(
        mc,
        ctx,
        deployment.as_ref(),
        service,
        problem.as_ref(),
        &ns,
        &status::ANNOUNCED,
    )
    .await?;
    match problem {
        Some(Problem::ApplyFailed(msg) | Problem::NameConflict(msg)) => Err(Error::Children(msg)),
        _ => Ok(children
            .leftover_recheck()
            .map_or_else(Action::await_change, Action::requeue)),
    }
}

/// Describes the Memcached's Deployment, Service and pods in its status, and announces the
/// transitions listed in `announced` ([`status::ANNOUNCED`], or while finalizing
/// [`status::ANNOUNCED_FINALIZING`]).
pub(crate) async fn update_status(
    mc: &Memcached,
    ctx: &Context,
    deployment: Option<&Deployment>,
    service: ServiceState,
    problem: Option<&Problem>,
    ns: &str,
    announced: &[Announce],
) -> Result<(), Error> {
    let pods = ctx.pods_of(ns, &mc.name_any());
    let new_status = status::status(mc, deployment, service, &pods, problem, conditions::now());
    ctx.toolkit
        .publish_status(mc, &new_status, announced)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Reconcile against a scripted API server: the answers a real cluster rarely gives.
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fixtures::{
        APPLY_DEPLOYMENT, APPLY_SERVICE, EVENT, GET_SERVICE, MEMCACHED, children_created, run,
        with_finalizer,
    };
    use shared_testing::{Reply, Scripted, assert_events, cache, reconcile_scripted, toolkit};

    #[tokio::test]
    async fn a_refused_deployment_is_degraded_and_retried() {
        for (code, message) in [
            (403, "admission webhook denied the request"),
            (422, "Deployment.apps \"cache\" is invalid"),
        ] {
            let mc = with_finalizer();
            let replies = vec![
                Reply::error(code, message),
                Reply::Echo,
                Reply::Object(serde_json::to_value(&mc).unwrap()),
                Reply::Echo,
                Reply::Echo,
            ];
            let (result, api) = run(mc, replies).await;
            let Err(Error::Finalizer(e)) = &result else {
                panic!("{result:?}")
            };
            assert!(
                matches!(e.as_ref(), finalizer::Error::ApplyFailed(Error::Children(m)) if m == message),
                "{e:?}"
            );
            // The Service is still written, then the status, then the events.
            let status = format!("PATCH {MEMCACHED}/status");
            assert_eq!(
                api.lines(),
                [APPLY_DEPLOYMENT, APPLY_SERVICE, &status, EVENT, EVENT]
            );
            assert_events(
                &api,
                &[("Normal", "Reconciling"), ("Warning", "ApplyFailed")],
            );
        }
    }

    /// The Service of `mc` as the API server would show it, with `cluster_ip`.
    fn our_service(mc: &Memcached, cluster_ip: &str) -> Service {
        let mut svc = desired::desired_service(mc, shared::apply::owner_reference(mc).unwrap());
        svc.spec.as_mut().unwrap().cluster_ip = Some(cluster_ip.into());
        svc
    }

    #[tokio::test]
    async fn a_headless_service_is_not_recreated() {
        let mc = with_finalizer();
        let current = our_service(&mc, desired::HEADLESS);
        // Not cached yet: the create is refused, the read finds it ours and in sync.
        let replies = vec![
            Reply::Echo,
            Reply::error(409, "the object has been modified"),
            Reply::Object(serde_json::to_value(&current).unwrap()),
            Reply::Object(serde_json::to_value(&mc).unwrap()),
            Reply::Echo,
        ];
        let (result, api) = run(mc, replies).await;
        assert_eq!(result.unwrap(), Action::await_change());
        assert!(
            !api.lines().iter().any(|l| l.starts_with("DELETE")),
            "{:?}",
            api.lines()
        );
        assert_eq!(
            api.lines()[..3],
            [APPLY_DEPLOYMENT, APPLY_SERVICE, GET_SERVICE],
            "no second apply of the Service"
        );
    }

    #[tokio::test]
    async fn status_write_404_is_no_error() {
        let mut replies = children_created();
        replies.push(Reply::error(404, "not found"));
        let (result, api) = run(with_finalizer(), replies).await;
        assert_eq!(result.unwrap(), Action::await_change());
        assert_eq!(api.lines().len(), 3, "no event: {:?}", api.lines());
        assert_eq!(api.lines()[2], format!("PATCH {MEMCACHED}/status"));
    }

    #[tokio::test]
    async fn status_write_409_is_retried() {
        let mut replies = children_created();
        replies.push(Reply::error(409, "the object has been modified"));
        let (result, api) = run(with_finalizer(), replies).await;
        let Err(Error::Finalizer(e)) = &result else {
            panic!("{result:?}")
        };
        assert!(
            matches!(
                e.as_ref(),
                finalizer::Error::ApplyFailed(Error::Shared(shared::Error::Kube(kube::Error::Api(s))))
                    if s.code == 409
            ),
            "{e:?}"
        );
        assert_eq!(api.lines().len(), 3, "no event: {:?}", api.lines());
    }

    /// Reconciles `mc` with `deployments`, `services` and `policies` in the caches.
    async fn run_cached(
        mc: Memcached,
        deployments: Vec<Deployment>,
        services: Vec<Service>,
        policies: Vec<NetworkPolicy>,
        replies: Vec<Reply>,
    ) -> (Result<Action, Error>, Scripted) {
        let context = |client: kube::Client| {
            let ctx = Context::new(toolkit(client.clone(), OPERATOR), None);
            cache(&ctx.deployments, &client, deployments);
            cache(&ctx.services, &client, services);
            cache(&ctx.network_policies, &client, policies);
            ctx
        };
        reconcile_scripted(mc, replies, context, reconcile).await
    }

    /// The children `mc` wants, as the cache shows them once written.
    fn in_sync(mc: &Memcached) -> (Vec<Deployment>, Vec<Service>) {
        let owner = shared::apply::owner_reference(mc).unwrap();
        (
            vec![desired::desired_deployment(
                mc,
                owner.clone(),
                DEFAULT_IMAGE,
            )],
            vec![desired::desired_service(mc, owner)],
        )
    }

    /// Whether a request of `api` wrote a child (anything but the status and events).
    fn child_writes(api: &Scripted) -> Vec<String> {
        api.lines()
            .into_iter()
            .filter(|l| !l.starts_with("GET") && !l.contains("/status") && !l.contains("/events"))
            .collect()
    }

    #[tokio::test]
    async fn children_in_sync_cost_no_request() {
        let mc = with_finalizer();
        let (deployments, services) = in_sync(&mc);
        let replies = vec![
            Reply::Object(serde_json::to_value(&mc).unwrap()),
            Reply::Echo,
        ];
        let (result, api) = run_cached(mc, deployments, services, vec![], replies).await;
        assert_eq!(result.unwrap(), Action::await_change());
        assert_eq!(
            api.lines()[0],
            format!("PATCH {MEMCACHED}/status"),
            "{:?}",
            api.lines()
        );
        assert!(child_writes(&api).is_empty(), "{:?}", api.lines());
    }

    #[tokio::test]
    async fn a_leftover_service_is_waited_for_and_looked_at_again() {
        let mc = with_finalizer();
        let (deployments, mut services) = in_sync(&mc);
        // The Service of an earlier Memcached `cache`.
        services[0].metadata.owner_references.as_mut().unwrap()[0].uid = "uid-0".into();
        let replies = vec![
            Reply::Object(serde_json::to_value(&mc).unwrap()),
            Reply::Echo,
        ];
        let (result, api) = run_cached(mc, deployments, services, vec![], replies).await;
        assert_eq!(
            result.unwrap(),
            Action::requeue(shared::ownership::LEFTOVER_RECHECK)
        );
        assert!(child_writes(&api).is_empty(), "{:?}", api.lines());
        let status = &api.seen()[0].body["status"];
        let available = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Available")
            .unwrap();
        assert_eq!(available["reason"], status::REASON_SERVICE_NOT_OWNED);
        // The next reconcile that finds none starts the schedule over.
        let mc = with_finalizer();
        let (deployments, services) = in_sync(&mc);
        let replies = vec![
            Reply::Object(serde_json::to_value(&mc).unwrap()),
            Reply::Echo,
        ];
        let (result, _) = run_cached(mc, deployments, services, vec![], replies).await;
        assert_eq!(result.unwrap(), Action::await_change());
    }

    #[tokio::test]
    async fn a_service_name_held_by_a_stranger_is_degraded_and_never_written() {
        let mc = with_finalizer();
        let (deployments, mut services) = in_sync(&mc);
        services[0].metadata.owner_references = None;
        let replies = vec![
            Reply::Object(serde_json::to_value(&mc).unwrap()),
            Reply::Echo,
            Reply::Echo,
        ];
        let (result, api) = run_cached(mc, deployments, services, vec![], replies).await;
        let Err(Error::Finalizer(e)) = &result else {
            panic!("{result:?}")
        };
        assert!(
            matches!(e.as_ref(), finalizer::Error::ApplyFailed(Error::Children(m)) if m.starts_with("Service cache exists")),
            "{e:?}"
        );
        assert!(child_writes(&api).is_empty(), "{:?}", api.lines());
        assert_events(
            &api,
            &[("Normal", "ServiceNotOwned"), ("Warning", "NameConflict")],
        );
    }

    #[tokio::test]
    async fn a_namespace_being_deleted_stops_quietly() {
        let message = "deployments.apps \"cache\" is forbidden: unable to create new content in namespace ns because it is being terminated";
        let replies = vec![Reply::error(403, message)];
        let (result, api) = run(with_finalizer(), replies).await;
        assert_eq!(result.unwrap(), Action::await_change());
        // Neither the Service nor the status is written.
        assert_eq!(api.lines(), [APPLY_DEPLOYMENT]);
    }

    #[tokio::test]
    async fn a_network_policy_no_longer_asked_for_is_deleted_exactly() {
        let mut with_policy = with_finalizer();
        with_policy.spec.network_policy = Some(crate::api::MemcachedNetworkPolicy {
            enabled: true,
            allowed_namespaces: vec![],
        });
        let owner = shared::apply::owner_reference(&with_policy).unwrap();
        let mut policy = desired::desired_network_policy(&with_policy, owner).unwrap();
        policy.metadata.uid = Some("policy-uid".into());
        policy.metadata.resource_version = Some("12".into());
        let mc = with_finalizer();
        let (deployments, services) = in_sync(&mc);
        let replies = vec![
            Reply::Object(serde_json::json!({"kind": "Status", "status": "Success"})),
            Reply::Object(serde_json::to_value(&mc).unwrap()),
            Reply::Echo,
        ];
        let (result, api) = run_cached(mc, deployments, services, vec![policy], replies).await;
        assert_eq!(result.unwrap(), Action::await_change());
        assert_eq!(
            child_writes(&api),
            ["DELETE /apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/cache"]
        );
        assert_eq!(
            api.seen()[0].body["preconditions"],
            serde_json::json!({"uid": "policy-uid", "resourceVersion": "12"})
        );
    }
}
