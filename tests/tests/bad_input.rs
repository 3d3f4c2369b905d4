//! Bad input, beyond the invalid creates of each kind's own test file: unknown fields under
//! strict validation, more malformed values, invalid UPDATES of a stored object (which
//! must leave it exactly as it was: same resourceVersion, same spec), and the valid edge
//! cases (zero, the boundaries) accepted and converging.

use anyhow::{Context, Result, bail, ensure};
use e2e::kinds::{
    self, Kind, KindApi, LOLCOW, MEMCACHED, PODSET, PULSAR_CONSUMER, assert_all_creates_rejected,
    free_node_port, node_ports_in_use,
};
use e2e::operator::{OperatorProcess, install};
use e2e::{TestNamespace, wait_for};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use lolcow_operator::api::Lolcow;
use memcached_operator::api::Memcached;
use podset_operator::api::PodSet;
use pulsar_consumer_operator::api::PulsarConsumer;
use serde_json::{Value, json};

/// An unknown field under strict validation (server-side apply asking for it, as
/// `kubectl apply --validate=strict` does) is rejected naming the field.
async fn unknown_field_rejected(ns: &TestNamespace, kind: &Kind, spec: Value) -> Result<()> {
    let mut manifest = kind.manifest("unknown-field", spec);
    manifest["spec"]["replicaCount"] = json!(3);
    let message = kind
        .api(ns)
        .patch(
            "unknown-field",
            &PatchParams::apply("e2e").validation_strict(),
            &Patch::Apply(&manifest),
        )
        .await
        .err()
        .with_context(|| format!("{} with spec.replicaCount must be rejected", kind.kind))?
        .to_string();
    ensure!(message.contains("spec.replicaCount"), "{message}");
    Ok(())
}

/// Every patch of the stored object `name` must be rejected naming `field`, and leave the
/// object as it was (same resourceVersion, same spec). No operator runs meanwhile, so
/// nothing else writes it.
async fn updates_rejected(
    ns: &TestNamespace,
    kind: &Kind,
    name: &str,
    patches: Vec<(Patch<Value>, PatchParams, &str)>,
    scale_to_minus_one: bool,
) -> Result<()> {
    let api = kind.api(ns);
    let before = api.get(name).await?;
    let rv = before.metadata.resource_version.clone();
    for (patch, params, field) in patches {
        let described = format!("{patch:?}");
        let Err(err) = api.patch(name, &params, &patch).await else {
            bail!("{} update {described} must be rejected", kind.kind);
        };
        let message = err.to_string();
        ensure!(
            message.contains(field),
            "the error for {described} must name {field}: {message}"
        );
        let now = api.get(name).await?;
        ensure!(
            now.metadata.resource_version == rv && now.data["spec"] == before.data["spec"],
            "{described} changed the stored object: {:?} -> {:?}",
            before.data["spec"],
            now.data["spec"]
        );
    }
    if scale_to_minus_one {
        // Through the scale subresource (what `kubectl scale` and an HPA use).
        let Err(err) = api
            .patch_scale(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": -1}})),
            )
            .await
        else {
            bail!("scaling {} {name} to -1 must be rejected", kind.kind);
        };
        ensure!(err.to_string().contains("spec."), "{err}");
        let now = api.get(name).await?;
        ensure!(now.metadata.resource_version == rv, "scale -1 changed it");
    }
    Ok(())
}

fn merge(spec: Value) -> (Patch<Value>, PatchParams, &'static str) {
    (
        Patch::Merge(json!({ "spec": spec })),
        PatchParams::default(),
        "",
    )
}

/// A merge patch of `spec` that must be rejected naming `field`.
fn bad_merge(spec: Value, field: &'static str) -> (Patch<Value>, PatchParams, &'static str) {
    let (p, pp, _) = merge(spec);
    (p, pp, field)
}

/// A merge patch removing a required field (`null` deletes a key).
fn remove(field: &'static str, path_in_spec: &str) -> (Patch<Value>, PatchParams, &'static str) {
    bad_merge(json!({ path_in_spec: null }), field)
}

/// Valid at the boundary but too big to converge on a shared test machine: accepted by a
/// server-side dry run.
async fn accepted_by_dry_run(
    ns: &TestNamespace,
    kind: &Kind,
    name: &str,
    spec: Value,
) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(kind.manifest(name, spec.clone()))?;
    kind.api(ns)
        .create(
            &PostParams {
                dry_run: true,
                ..PostParams::default()
            },
            &obj,
        )
        .await
        .with_context(|| format!("{} {spec} must be accepted", kind.kind))?;
    Ok(())
}

#[tokio::test]
async fn podset_bad_updates_leave_it_untouched_and_edges_converge() -> Result<()> {
    let ns = TestNamespace::restricted("bad-podset").await?;
    install(PODSET.operator)?;
    unknown_field_rejected(&ns, &PODSET, json!({"replicas": 1})).await?;
    assert_all_creates_rejected(
        &ns,
        &PODSET,
        vec![
            ("Bad_Name".into(), json!({"replicas": 1}), "metadata.name"),
            // The pods carry the name as a label value: at most 63 characters.
            ("p".repeat(64), json!({"replicas": 1}), "metadata.name"),
        ],
    )
    .await?;
    let api = PODSET.api(&ns);
    let obj: DynamicObject = serde_json::from_value(kinds::podset("stored", 2))?;
    api.create(&PostParams::default(), &obj).await?;
    updates_rejected(
        &ns,
        &PODSET,
        "stored",
        vec![
            bad_merge(json!({"replicas": -1}), "spec.replicas"),
            bad_merge(json!({"replicas": 1001}), "spec.replicas"),
            bad_merge(json!({"replicas": "two"}), "spec.replicas"),
            bad_merge(json!({"image": ""}), "spec.image"),
            bad_merge(json!({"image": "i".repeat(513)}), "spec.image"),
            remove("spec.replicas", "replicas"),
        ],
        true,
    )
    .await?;

    // Edges: 0 replicas and the longest image name converge; the maximum is accepted.
    let _op = OperatorProcess::start(PODSET.operator, &[&ns.name]).await?;
    let typed: Api<PodSet> = ns.api();
    let mut long = kinds::podset("long-image", 1);
    long["spec"]["image"] = json!(format!("registry.example/{}", "i".repeat(512 - 17)));
    for manifest in [kinds::podset("zero", 0), long] {
        let obj: PodSet = serde_json::from_value(manifest)?;
        typed.create(&PostParams::default(), &obj).await?;
    }
    for name in ["zero", "long-image"] {
        wait_for(&typed, name, |o: Option<&PodSet>| {
            o.is_some_and(kinds::podset_ready)
        })
        .await?;
    }
    accepted_by_dry_run(&ns, &PODSET, "max", json!({"replicas": 1000})).await?;
    Ok(())
}

#[tokio::test]
async fn memcached_bad_input_is_rejected_and_edges_converge() -> Result<()> {
    let ns = TestNamespace::restricted("bad-memcached").await?;
    install(MEMCACHED.operator)?;
    unknown_field_rejected(&ns, &MEMCACHED, json!({"size": 1})).await?;
    assert_all_creates_rejected(
        &ns,
        &MEMCACHED,
        vec![
            ("bad".into(), json!({"size": 2.5}), "spec.size"),
            (
                "bad".into(),
                json!({"size": 1, "containerPort": 80.5}),
                "spec.containerPort",
            ),
            ("bad".into(), json!("big"), "spec"),
            // Cross-field (CEL over metadata): a valid object name that cannot name a Service.
            ("m".repeat(64), json!({"size": 1}), "metadata.name"),
            // Every list and string of the spec is bounded: over-long, too many, not a
            // namespace name.
            (
                "bad".into(),
                json!({"size": 1, "networkPolicy": {"allowedNamespaces": ["n".repeat(64)]}}),
                "spec.networkPolicy.allowedNamespaces",
            ),
            (
                "bad".into(),
                json!({"size": 1, "networkPolicy": {
                    "allowedNamespaces": (0..65).map(|i| format!("ns-{i}")).collect::<Vec<_>>()
                }}),
                "spec.networkPolicy.allowedNamespaces",
            ),
            (
                "bad".into(),
                json!({"size": 1, "networkPolicy": {"allowedNamespaces": ["Web"]}}),
                "spec.networkPolicy.allowedNamespaces",
            ),
        ],
    )
    .await?;
    let api = MEMCACHED.api(&ns);
    let obj: DynamicObject = serde_json::from_value(kinds::memcached("stored", 1))?;
    api.create(&PostParams::default(), &obj).await?;
    updates_rejected(
        &ns,
        &MEMCACHED,
        "stored",
        vec![
            bad_merge(json!({"size": -1}), "spec.size"),
            bad_merge(json!({"size": 101}), "spec.size"),
            bad_merge(json!({"size": "one"}), "spec.size"),
            bad_merge(json!({"containerPort": 0}), "spec.containerPort"),
            bad_merge(json!({"containerPort": 70000}), "spec.containerPort"),
            bad_merge(
                json!({"networkPolicy": {"allowedNamespaces": ["web", "web"]}}),
                "spec.networkPolicy.allowedNamespaces",
            ),
            bad_merge(
                json!({"networkPolicy": {"enabled": "yes"}}),
                "spec.networkPolicy.enabled",
            ),
            remove("spec.size", "size"),
        ],
        true,
    )
    .await?;

    // Edges: size 0, and the lowest and highest ports, converge; size 100 is accepted.
    let op = OperatorProcess::start(MEMCACHED.operator, &[&ns.name]).await?;
    let typed: Api<Memcached> = ns.api();
    let edges = [
        kinds::memcached("zero", 0),
        json!({"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
               "metadata": {"name": "port-low"}, "spec": {"size": 1, "containerPort": 1}}),
        json!({"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
               "metadata": {"name": "port-high"}, "spec": {"size": 1, "containerPort": 65535}}),
    ];
    for manifest in edges {
        let obj: Memcached = serde_json::from_value(manifest)?;
        typed.create(&PostParams::default(), &obj).await?;
    }
    for name in ["zero", "port-low", "port-high"] {
        wait_for(&typed, name, |o: Option<&Memcached>| {
            o.is_some_and(kinds::memcached_ready)
        })
        .await
        .with_context(|| format!("operator log:\n{}", op.log()))?;
    }
    accepted_by_dry_run(&ns, &MEMCACHED, "max", json!({"size": 100})).await?;
    // The longest list of the longest namespace names.
    let longest: Vec<String> = (0..64).map(|i| format!("{i:0>63}")).collect();
    accepted_by_dry_run(
        &ns,
        &MEMCACHED,
        "max-policy",
        json!({"size": 1, "networkPolicy": {"allowedNamespaces": longest}}),
    )
    .await?;
    // The finalizer needs the operator: delete them while it runs.
    for name in ["stored", "zero", "port-low", "port-high"] {
        e2e::delete_and_wait(&typed, name).await?;
    }
    Ok(())
}

#[tokio::test]
async fn lolcow_bad_input_is_rejected_and_edges_converge() -> Result<()> {
    let ns = TestNamespace::restricted("bad-lolcow").await?;
    install(LOLCOW.operator)?;
    unknown_field_rejected(&ns, &LOLCOW, json!({"port": 30080})).await?;
    assert_all_creates_rejected(
        &ns,
        &LOLCOW,
        vec![
            // The Service is named after it: a DNS-1035 label.
            ("9lives".into(), json!({"port": 30080}), "metadata.name"),
            ("l".repeat(64), json!({"port": 30080}), "metadata.name"),
            ("bad".into(), json!({"port": -1}), "spec.port"),
            ("bad".into(), json!("moo"), "spec"),
            (
                "bad".into(),
                json!({"port": 30080, "greeting": ["moo"]}),
                "spec.greeting",
            ),
            ("Bad_Name".into(), json!({"port": 30080}), "metadata.name"),
        ],
    )
    .await?;
    let api = LOLCOW.api(&ns);
    let obj: DynamicObject = serde_json::from_value(kinds::lolcow("stored", 30080, "moo"))?;
    api.create(&PostParams::default(), &obj).await?;
    updates_rejected(
        &ns,
        &LOLCOW,
        "stored",
        vec![
            bad_merge(json!({"port": 29999}), "spec.port"),
            bad_merge(json!({"port": 32768}), "spec.port"),
            bad_merge(json!({"port": "30081"}), "spec.port"),
            bad_merge(json!({"greeting": "m".repeat(257)}), "spec.greeting"),
            remove("spec.port", "port"),
        ],
        false,
    )
    .await?;
    // No operator ran: the stored one may go now (it holds no NodePort).
    e2e::delete_and_wait(&api, "stored").await?;

    // Edges: the lowest and highest NodePorts, and the longest greeting. A boundary port
    // another Service holds is reported as PortConflict, which is the operator working.
    let op = OperatorProcess::start(LOLCOW.operator, &[&ns.name]).await?;
    let typed: Api<Lolcow> = ns.api();
    let held = node_ports_in_use(&ns).await?;
    let long_port = free_node_port(&ns, "long", &[30000, 32767]).await?;
    for (name, port, greeting) in [
        ("low", 30000, "moo".to_owned()),
        ("high", 32767, "moo".to_owned()),
        ("long", long_port, "m".repeat(256)),
    ] {
        let obj: Lolcow = serde_json::from_value(kinds::lolcow(name, port, &greeting))?;
        typed.create(&PostParams::default(), &obj).await?;
    }
    for (name, port) in [("low", 30000), ("high", 32767), ("long", long_port)] {
        if held.contains(&port) {
            wait_for(&typed, name, |o: Option<&Lolcow>| {
                o.and_then(|o| o.status.as_ref()).is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.reason == "PortConflict")
                })
            })
            .await?;
        } else {
            wait_for(&typed, name, |o: Option<&Lolcow>| {
                o.is_some_and(kinds::lolcow_ready)
            })
            .await
            .with_context(|| format!("operator log:\n{}", op.log()))?;
        }
    }
    Ok(())
}

#[tokio::test]
async fn pulsar_consumer_bad_input_is_rejected_and_edges_converge() -> Result<()> {
    let ns = TestNamespace::restricted("bad-pulsar").await?;
    install(PULSAR_CONSUMER.operator)?;
    let good = kinds::pulsar_consumer("x", 1)["spec"].clone();
    let with = |field: &str, value: Value| {
        let mut s = good.clone();
        s[field] = value;
        s
    };
    assert_all_creates_rejected(
        &ns,
        &PULSAR_CONSUMER,
        vec![
            (
                "bad".into(),
                with("serverAddress", json!("pulsar://host:0")),
                "spec.serverAddress",
            ),
            // Ports above 65535 were stored before; now refused, naming the field.
            (
                "bad".into(),
                with("serverAddress", json!("pulsar://host:65536")),
                "spec.serverAddress",
            ),
            (
                "bad".into(),
                with("serverAddress", json!("pulsar+ssl://[::1]:99999")),
                "spec.serverAddress",
            ),
            (
                "bad".into(),
                with(
                    "autoscaling",
                    json!({"maxReplicas": 2, "targetBacklogPerReplica": 10, "adminUrl": "http://broker:65536"}),
                ),
                "spec.autoscaling.adminUrl",
            ),
            (
                "bad".into(),
                with(
                    "autoscaling",
                    json!({"maxReplicas": 2, "targetBacklogPerReplica": 10, "adminUrl": "https://broker:99999/"}),
                ),
                "spec.autoscaling.adminUrl",
            ),
            (
                "bad".into(),
                with("serverAddress", json!("pulsar://-host:6650")),
                "spec.serverAddress",
            ),
            (
                "bad".into(),
                with("serverAddress", json!(6650)),
                "spec.serverAddress",
            ),
            ("bad".into(), with("topic", json!("my topic")), "spec.topic"),
            (
                "bad".into(),
                with("topic", json!("persistent://t/n/")),
                "spec.topic",
            ),
            (
                "bad".into(),
                with("subscriptionName", json!("a b")),
                "spec.subscriptionName",
            ),
            (
                "bad".into(),
                with("subscriptionName", json!("a/b")),
                "spec.subscriptionName",
            ),
            ("bad".into(), with("replicas", json!(1.5)), "spec.replicas"),
        ],
    )
    .await?;
    let api = PULSAR_CONSUMER.api(&ns);
    let obj: DynamicObject = serde_json::from_value(kinds::pulsar_consumer("stored", 1))?;
    api.create(&PostParams::default(), &obj).await?;
    updates_rejected(
        &ns,
        &PULSAR_CONSUMER,
        "stored",
        vec![
            bad_merge(json!({"replicas": -1}), "spec.replicas"),
            bad_merge(json!({"replicas": 1001}), "spec.replicas"),
            bad_merge(
                json!({"serverAddress": "http://broker:6650"}),
                "spec.serverAddress",
            ),
            bad_merge(
                json!({"serverAddress": "pulsar://broker:99999"}),
                "spec.serverAddress",
            ),
            bad_merge(
                json!({"autoscaling": {"maxReplicas": 2, "targetBacklogPerReplica": 10, "adminUrl": "http://broker:70000"}}),
                "spec.autoscaling.adminUrl",
            ),
            bad_merge(
                json!({"autoscaling": {"maxReplicas": 2, "targetBacklogPerReplica": 10, "adminUrl": "http://169.254.169.254:80"}}),
                "spec.autoscaling.adminUrl",
            ),
            bad_merge(json!({"topic": "t".repeat(513)}), "spec.topic"),
            bad_merge(json!({"subscriptionName": ""}), "spec.subscriptionName"),
            remove("spec.topic", "topic"),
            (
                Patch::Apply(json!({
                    "apiVersion": "pulsar.pulsarconsumer.krvarma.com/v1",
                    "kind": "PulsarConsumer",
                    "metadata": {"name": "stored"},
                    "spec": {"replicaCount": 2},
                })),
                PatchParams::apply("e2e").validation_strict(),
                "spec.replicaCount",
            ),
        ],
        true,
    )
    .await?;

    // Edges: 0 replicas, the longest topic and subscription, an IPv6 broker, converge; the
    // maximum of replicas is accepted.
    let op = OperatorProcess::start(PULSAR_CONSUMER.operator, &[&ns.name]).await?;
    let typed: Api<PulsarConsumer> = ns.api();
    let mut long = kinds::pulsar_consumer("long", 1);
    long["spec"]["topic"] = json!(format!("persistent://tenant/ns/{}", "t".repeat(512 - 23)));
    long["spec"]["subscriptionName"] = json!("s".repeat(256));
    long["spec"]["serverAddress"] = json!("pulsar+ssl://[::1]:65535");
    for manifest in [kinds::pulsar_consumer("zero", 0), long] {
        let obj: PulsarConsumer = serde_json::from_value(manifest)?;
        typed.create(&PostParams::default(), &obj).await?;
    }
    for name in ["zero", "long"] {
        wait_for(&typed, name, |o: Option<&PulsarConsumer>| {
            o.is_some_and(kinds::pulsar_consumer_ready)
        })
        .await
        .with_context(|| format!("operator log:\n{}", op.log()))?;
    }
    accepted_by_dry_run(&ns, &PULSAR_CONSUMER, "max", with("replicas", json!(1000))).await?;
    stored_before_the_port_limit_stays_usable(&ns, &op).await
}

/// The schema got stricter (ports up to 65535, unsafe adminUrl hosts): an object stored
/// under the old schema stays readable, its status writable (what the operator does) and
/// its other fields updatable (validation ratcheting), while a change of the field itself
/// must pass the new rules; the operator (`op`, running) reconciles it and refuses its
/// adminUrl. The old schema is put back for the time it takes to store such an object, then
/// the current one again (also when the store fails).
async fn stored_before_the_port_limit_stays_usable(
    ns: &TestNamespace,
    op: &OperatorProcess,
) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(e2e::admin_client().await?);
    let name = "pulsarconsumers.pulsar.pulsarconsumer.krvarma.com";
    let mut current = serde_json::to_value(crds.get(name).await?)?;
    for field in [
        "managedFields",
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "generation",
    ] {
        if let Some(m) = current["metadata"].as_object_mut() {
            m.remove(field);
        }
    }
    if let Some(o) = current.as_object_mut() {
        o.remove("status");
    }
    let new_port = pulsar_consumer_operator::api::PORT_PATTERN;
    let mut old: Value = serde_json::from_str(
        &serde_json::to_string(&current)?.replace(new_port, "[1-9][0-9]{0,4}"),
    )?;
    let admin_url = &mut old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"]["autoscaling"]["properties"]["adminUrl"];
    ensure!(admin_url.is_object(), "adminUrl in the schema");
    if let Some(o) = admin_url.as_object_mut() {
        o.remove("x-kubernetes-validations");
    }
    let apply = PatchParams::apply("e2e").force();
    let api = PULSAR_CONSUMER.api(ns);
    let mut stored = kinds::pulsar_consumer("stored-before", 1);
    stored["spec"]["serverAddress"] = json!("pulsar://broker:99999");
    stored["spec"]["autoscaling"] = json!({
        "maxReplicas": 2, "targetBacklogPerReplica": 10, "adminUrl": "http://169.254.169.254:80"
    });
    let stored_obj: DynamicObject = serde_json::from_value(stored.clone())?;

    crds.patch(name, &apply, &Patch::Apply(&old)).await?;
    let created = e2e::poll("created under the old schema", e2e::TIMEOUT, || async {
        Ok(api.create(&PostParams::default(), &stored_obj).await.ok())
    })
    .await;
    crds.patch(name, &apply, &Patch::Apply(&current)).await?;
    created?;
    // The current schema serves again once such a create (dry run: nothing stored) is
    // refused as invalid.
    let probe: DynamicObject = serde_json::from_value({
        let mut p = stored.clone();
        p["metadata"]["name"] = json!("probe");
        p
    })?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    e2e::poll("the current schema back", e2e::TIMEOUT, || async {
        Ok(match api.create(&dry_run, &probe).await {
            Err(kube::Error::Api(s)) if s.code == 422 => Some(()),
            _ => None,
        })
    })
    .await?;

    let before = api.get("stored-before").await?;
    ensure!(
        before.data["spec"]["serverAddress"] == "pulsar://broker:99999",
        "read back as stored"
    );
    // The operator's status write, a label, another field of the spec: accepted.
    api.patch_status(
        "stored-before",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"observedGeneration": 1}})),
    )
    .await
    .context("a status write to an object stored under the old schema")?;
    api.patch(
        "stored-before",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"e2e": "ratchet"}}, "spec": {"replicas": 2}})),
    )
    .await
    .context("an update leaving serverAddress and adminUrl as they are")?;
    // The fields themselves: only to what the current schema takes.
    for (patch, field) in [
        (
            json!({"serverAddress": "pulsar://broker:99998"}),
            "spec.serverAddress",
        ),
        (
            json!({"autoscaling": {"adminUrl": "http://169.254.169.253:80"}}),
            "spec.autoscaling.adminUrl",
        ),
    ] {
        let err = api
            .patch(
                "stored-before",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": patch })),
            )
            .await
            .err()
            .with_context(|| format!("{patch} must be refused"))?;
        ensure!(err.to_string().contains(field), "{err}");
    }
    let after = api.get("stored-before").await?;
    ensure!(
        after.data["spec"]["replicas"] == 2
            && after.data["spec"]["serverAddress"] == "pulsar://broker:99999",
        "{:?}",
        after.data["spec"]
    );
    // The operator writes its status and refuses the unsafe adminUrl it was stored with.
    e2e::poll(
        "ScalingActive=False AdminTargetNotAllowed",
        e2e::TIMEOUT,
        || async {
            let pc = api.get("stored-before").await?;
            let refused = pc.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "ScalingActive" && c["reason"] == "AdminTargetNotAllowed");
            Ok(refused.then_some(()))
        },
    )
    .await
    .with_context(|| format!("operator log:\n{}", op.log()))?;
    Ok(())
}
