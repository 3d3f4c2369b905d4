//! `cargo xtask lint-manifests` (a static step of `cargo xtask test`): kube-score and
//! checkov over what a user installs, every `deploy/<operator>/install.yaml` and every
//! chart rendered with its default values (`helm template`).
//!
//! Every finding is either fixed in the kustomize tree (which the installers and charts
//! are generated from) or suppressed on the object itself, in the annotations each tool
//! reads, with its reason beside it:
//!
//! - kube-score: `kube-score/ignore: <check>,<check>` (its own annotation) and, for each
//!   check named there, `kube-score/ignore-reason.<check>: <why>` (kube-score's annotation
//!   has no room for one);
//! - checkov: `checkov.io/skip<N>: <CKV id>=<why>` (the reason may hold no `=`: checkov
//!   splits the value on it).
//!
//! The step fails on a finding that is neither fixed nor suppressed, on a suppression
//! without its reason, and on a suppression that suppresses nothing (kube-score run
//! again with its annotations disabled, checkov run again on copies without them), and
//! prints each. docs/deploy.md#linters lists the suppressions and their reasons.
//!
//! The tools are never downloaded as binaries: kube-score is built once from its Go
//! module (`xtask/tools/kube-score/go.mod` pins the version) into the cache, as Helm is;
//! checkov is installed once from PyPI, with every package it runs with pinned by
//! `xtask/tools/checkov/requirements.txt`, into a venv in the cache keyed by that file's
//! hash.

use crate::commands::cluster::build::Component;
use crate::commands::{charts, crds, tool};
use anyhow::{Context, Result, bail};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use xtask::say;
use xtask::support::{cmd, kustomize, machine_packages, paths};

/// kube-score, from `github.com/zegl/kube-score/cmd/kube-score`.
pub const KUBE_SCORE: Component = Component {
    folder: "tools",
    name: "kube-score",
    module: "github.com/zegl/kube-score",
    packages: &["github.com/zegl/kube-score/cmd/kube-score"],
    binaries: &["kube-score"],
    tags: &[],
};

/// kube-score's annotation naming the checks it skips on an object.
const KUBE_SCORE_IGNORE: &str = "kube-score/ignore";
/// The prefix of the annotation that gives the reason for skipping one check.
const KUBE_SCORE_REASON: &str = "kube-score/ignore-reason.";
/// What checkov's skip annotations contain (`checkov.io/skip1`, `checkov.io/skip2`, ...).
const CHECKOV_SKIP: &str = "checkov.io/skip";

/// One file the linters read.
struct Manifest {
    /// How it is shown: `deploy/<op>/install.yaml`, `deploy/<op>/chart (defaults)`.
    shown: String,
    /// The file name under the work folder (`<op>-install.yaml`, `<op>-chart.yaml`).
    file: String,
    /// Its objects.
    objects: Vec<Value>,
}

/// What an object's annotations suppress, each with its reason.
#[derive(Default)]
struct Suppressions {
    /// kube-score check id -> reason.
    kube_score: BTreeMap<String, String>,
    /// checkov check id -> reason.
    checkov: BTreeMap<String, String>,
}

/// `cargo xtask lint-manifests`.
///
/// # Errors
/// When a tool finds something unexplained, a suppression has no reason or suppresses
/// nothing (each is printed), or a tool cannot be built or installed.
pub fn run() -> Result<()> {
    let start = Instant::now();
    // The first run builds kube-score (Go) while pip installs checkov (network, mostly).
    let (kube_score, checkov) = std::thread::scope(|scope| {
        let checkov = scope.spawn(checkov);
        let kube_score = kube_score();
        let checkov = checkov
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("installing checkov panicked")));
        (kube_score, checkov)
    });
    let (kube_score, checkov) = (kube_score?, checkov?);
    let work = paths::target_dir().join("lint-manifests");
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    std::fs::create_dir_all(work.join("bare"))?;
    let manifests = manifests(&work)?;
    let mut problems = Vec::new();
    for manifest in &manifests {
        for object in &manifest.objects {
            if let Err(e) = suppressions(object) {
                problems.push(format!("{}: {}: {e:#}", manifest.shown, describe(object)));
            }
        }
    }
    let mut suppressed = 0;
    for manifest in &manifests {
        suppressed += kube_score_findings(&kube_score, &work, manifest, &mut problems)?;
    }
    suppressed += checkov_findings(&checkov, &work, &manifests, &mut problems)?;
    if !problems.is_empty() {
        bail!(
            "the linters found {} problem(s) in the installers and default charts:\n  {}\n\
             Fix each in the kustomize tree (deploy/<operator>/, then `cargo xtask installers` and \
             `cargo xtask charts`), or suppress it on the object with its reason (docs/deploy.md#linters).",
            problems.len(),
            problems.join("\n  ")
        );
    }
    say!(
        "lint-manifests: kube-score {} and checkov {} over {} manifests in {}: no finding \
         unexplained, {suppressed} suppressed with their reasons",
        KUBE_SCORE.version()?,
        checkov_version()?,
        manifests.len(),
        cmd::elapsed(start)
    );
    Ok(())
}

/// Every installer, and every chart rendered with its defaults, copied into `work`.
fn manifests(work: &Path) -> Result<Vec<Manifest>> {
    let helm = tool::helm()?;
    let mut out = Vec::new();
    for op in crds::deployed_operators() {
        let installer = paths::repo_root()
            .join("deploy")
            .join(op)
            .join("install.yaml");
        let text = std::fs::read_to_string(&installer)
            .with_context(|| format!("reading {}", installer.display()))?;
        out.push(manifest(
            work,
            format!("deploy/{op}/install.yaml"),
            format!("{op}-install.yaml"),
            &text,
        )?);
        let rendered = cmd::output(
            Command::new(&helm)
                .args(["template", op])
                .arg(charts::chart_dir(op))
                .args(["--namespace", &format!("{op}-system")]),
        )
        .with_context(|| format!("rendering deploy/{op}/chart with its defaults"))?;
        out.push(manifest(
            work,
            format!("deploy/{op}/chart (defaults)"),
            format!("{op}-chart.yaml"),
            &rendered,
        )?);
    }
    Ok(out)
}

/// A manifest written into `work` as it is, and into `work/bare` without the
/// suppressions (to find those that suppress nothing).
fn manifest(work: &Path, shown: String, file: String, text: &str) -> Result<Manifest> {
    let objects: Vec<Value> = kustomize::documents(text)
        .with_context(|| format!("parsing {shown}"))?
        .into_iter()
        .filter(|d| !d.is_null())
        .collect();
    std::fs::write(work.join(&file), text)?;
    let mut bare = String::new();
    for object in &objects {
        let mut object = object.clone();
        strip_suppressions(&mut object);
        bare.push_str("---\n");
        bare.push_str(&serde_saphyr::to_string(&object)?);
    }
    std::fs::write(work.join("bare").join(&file), bare)?;
    Ok(Manifest {
        shown,
        file,
        objects,
    })
}

fn annotations(object: &Value) -> Option<&Map<String, Value>> {
    object["metadata"]["annotations"].as_object()
}

fn is_suppression(key: &str) -> bool {
    key == KUBE_SCORE_IGNORE || key.starts_with(KUBE_SCORE_REASON) || key.contains(CHECKOV_SKIP)
}

fn strip_suppressions(object: &mut Value) {
    if let Some(annotations) = object["metadata"]["annotations"].as_object_mut() {
        annotations.retain(|key, _| !is_suppression(key));
        if annotations.is_empty()
            && let Some(metadata) = object["metadata"].as_object_mut()
        {
            metadata.remove("annotations");
        }
    }
}

/// The suppressions an object declares, each checked for its reason.
fn suppressions(object: &Value) -> Result<Suppressions> {
    let mut out = Suppressions::default();
    let Some(annotations) = annotations(object) else {
        return Ok(out);
    };
    let text = |key: &str| annotations.get(key).and_then(Value::as_str).map(str::trim);
    let mut problems = Vec::new();
    for check in text(KUBE_SCORE_IGNORE)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
    {
        match text(&format!("{KUBE_SCORE_REASON}{check}")) {
            Some(reason) if !reason.is_empty() => {
                out.kube_score.insert(check.to_owned(), reason.to_owned());
            }
            _ => problems.push(format!(
                "{KUBE_SCORE_IGNORE} names {check} without a {KUBE_SCORE_REASON}{check} annotation saying why"
            )),
        }
    }
    for (key, value) in annotations {
        if let Some(check) = key.strip_prefix(KUBE_SCORE_REASON)
            && !out.kube_score.contains_key(check)
            && !problems.iter().any(|p| p.contains(&format!(" {check} ")))
        {
            problems.push(format!(
                "{key} gives a reason, but {KUBE_SCORE_IGNORE} does not name {check}"
            ));
        }
        if key.contains(CHECKOV_SKIP) {
            let value = value.as_str().unwrap_or_default().trim();
            match value.split_once('=') {
                Some((check, reason)) if !reason.trim().is_empty() && !reason.contains('=') => {
                    out.checkov
                        .insert(check.trim().to_owned(), reason.trim().to_owned());
                }
                Some((_, reason)) if reason.contains('=') => problems.push(format!(
                    "{key}: the reason holds a `=`, which checkov cannot read (it splits on it)"
                )),
                _ => problems.push(format!(
                    "{key}: {value:?} gives no reason: write `<CKV id>=<why>`"
                )),
            }
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        bail!("{}", problems.join("; "))
    }
}

/// `Kind namespace/name` (or `Kind name`), for messages.
fn describe(object: &Value) -> String {
    key(
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["namespace"].as_str().unwrap_or_default(),
        object["metadata"]["name"].as_str().unwrap_or("?"),
    )
}

fn key(kind: &str, namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {namespace}/{name}")
    }
}

/// The built kube-score.
fn kube_score() -> Result<PathBuf> {
    tool::binary(&KUBE_SCORE)
}

/// kube-score's failed checks (WARNING or CRITICAL, not skipped) of each object in
/// `file`, with what it said; `annotations` false: as if no object had any
/// `kube-score/ignore`.
fn kube_score_run(
    binary: &Path,
    file: &Path,
    annotations: bool,
) -> Result<BTreeMap<(String, String), String>> {
    let mut score = Command::new(binary);
    score.args(["score", "--output-format", "json"]);
    if !annotations {
        score.arg("--disable-ignore-checks-annotations");
    }
    score.arg(file);
    // kube-score exits 1 when it finds something: the JSON says what.
    let shown = cmd::show(&score);
    let out = score
        .output()
        .with_context(|| format!("could not start `{shown}`"))?;
    let report: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "`{shown}` printed no JSON ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })?;
    let mut failed = BTreeMap::new();
    for object in report.as_array().into_iter().flatten() {
        let who = key(
            object["type_meta"]["kind"].as_str().unwrap_or("?"),
            object["object_meta"]["namespace"]
                .as_str()
                .unwrap_or_default(),
            object["object_meta"]["name"].as_str().unwrap_or("?"),
        );
        for check in object["checks"].as_array().into_iter().flatten() {
            let grade = check["grade"].as_i64().unwrap_or(10);
            // 1 CRITICAL, 5 WARNING; 7 and 10 are OK.
            if check["skipped"] == true || grade > 5 {
                continue;
            }
            let said: Vec<String> = check["comments"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    let path = c["path"].as_str().unwrap_or_default();
                    let summary = c["summary"].as_str().unwrap_or_default();
                    if path.is_empty() {
                        summary.to_owned()
                    } else {
                        format!("{path}: {summary}")
                    }
                })
                .collect();
            failed.insert(
                (
                    who.clone(),
                    check["check"]["id"].as_str().unwrap_or("?").to_owned(),
                ),
                format!(
                    "{} ({}): {}",
                    check["check"]["name"].as_str().unwrap_or("?"),
                    if grade <= 1 { "CRITICAL" } else { "WARNING" },
                    said.join("; ")
                ),
            );
        }
    }
    Ok(failed)
}

/// kube-score over one manifest: its findings that no annotation explains, and its
/// suppressions that suppress nothing, go into `problems`; returns how many findings
/// were suppressed.
fn kube_score_findings(
    binary: &Path,
    work: &Path,
    manifest: &Manifest,
    problems: &mut Vec<String>,
) -> Result<usize> {
    let file = work.join(&manifest.file);
    for ((who, check), said) in kube_score_run(binary, &file, true)? {
        problems.push(format!(
            "{}: {who}: kube-score {check}: {said}",
            manifest.shown
        ));
    }
    let raw = kube_score_run(binary, &file, false)?;
    let mut suppressed = 0;
    for object in &manifest.objects {
        let Ok(declared) = suppressions(object) else {
            continue;
        };
        let who = describe(object);
        for check in declared.kube_score.keys() {
            if raw.contains_key(&(who.clone(), check.clone())) {
                suppressed += 1;
            } else {
                problems.push(format!(
                    "{}: {who}: {KUBE_SCORE_IGNORE} names {check}, which finds nothing there: remove it",
                    manifest.shown
                ));
            }
        }
    }
    Ok(suppressed)
}

/// The venv checkov is installed in: `<cache>/tools/checkov-<version>-<requirements hash>`.
fn checkov_venv() -> Result<PathBuf> {
    let requirements = checkov_requirements();
    let text = std::fs::read(&requirements)
        .with_context(|| format!("reading {}", requirements.display()))?;
    let digest = ring::digest::digest(&ring::digest::SHA256, &text);
    let hash: String = digest.as_ref()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(paths::cache_dir("tools").join(format!("checkov-{}-{hash}", checkov_version()?)))
}

fn checkov_requirements() -> PathBuf {
    paths::repo_root()
        .join("xtask")
        .join("tools")
        .join("checkov")
        .join("requirements.txt")
}

/// The checkov version `requirements.txt` pins.
fn checkov_version() -> Result<String> {
    let path = checkov_requirements();
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("checkov=="))
        .map(str::to_owned)
        .with_context(|| format!("{} pins no checkov==<version>", path.display()))
}

/// checkov, installed into its venv first when the cache lacks it.
fn checkov() -> Result<PathBuf> {
    let venv = checkov_venv()?;
    let binary = venv.join("bin").join("checkov");
    let done = venv.join(".installed");
    if done.is_file() && cmd::is_executable(&binary) {
        return Ok(binary);
    }
    // A venv's scripts name its folder: it is made where it stays, and marked complete last.
    if venv.exists() {
        std::fs::remove_dir_all(&venv)?;
    }
    // Debian's python3 makes venvs only with python3-venv (ensurepip).
    let has_venv = || cmd::succeeds(Command::new("python3").args(["-c", "import ensurepip, venv"]));
    if !has_venv() {
        machine_packages::ensure_debian(&[("python3", "python3")])?;
        if !has_venv() {
            machine_packages::ensure_debian(&[("/usr/share/doc/python3-venv", "python3-venv")])?;
        }
    }
    let start = Instant::now();
    say!(
        "tools: installing checkov {} from PyPI into {} (once; pinned by xtask/tools/checkov/requirements.txt)",
        checkov_version()?,
        venv.display()
    );
    cmd::run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    cmd::run(
        Command::new(venv.join("bin").join("python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(checkov_requirements()),
    )
    .context("installing checkov from PyPI")?;
    if !cmd::is_executable(&binary) {
        bail!(
            "pip installed checkov, but {} is not there",
            binary.display()
        );
    }
    std::fs::write(&done, checkov_version()?)?;
    say!("tools: installed checkov in {}", cmd::elapsed(start));
    Ok(binary)
}

/// One checkov result: (file, check id, resource) and what to show.
type CheckovResults = BTreeMap<(String, String, String), String>;

/// checkov over every file in `dir`: (failed, skipped with their reasons).
fn checkov_run(
    binary: &Path,
    dir: &Path,
    files: &[&str],
) -> Result<(CheckovResults, CheckovResults)> {
    let mut run = Command::new(binary);
    run.current_dir(dir)
        .args(["--framework", "kubernetes", "--output", "json"])
        // No call to Prisma Cloud for guidelines or policies (nor a wait for its timeout).
        .arg("--skip-download")
        // Failed checks are read from the JSON, not from the exit code.
        .arg("--soft-fail");
    for file in files {
        run.args(["--file", file]);
    }
    let text = cmd::output(&mut run)?;
    let report: Value = serde_json::from_str(&text)
        .with_context(|| format!("checkov printed no JSON: {}", text.trim()))?;
    let reports: Vec<&Value> = match &report {
        Value::Array(all) => all
            .iter()
            .filter(|r| r["check_type"] == "kubernetes")
            .collect(),
        one => vec![one],
    };
    let mut failed = BTreeMap::new();
    let mut skipped = BTreeMap::new();
    for report in reports {
        let results = &report["results"];
        if let Some(errors) = results["parsing_errors"].as_array()
            && !errors.is_empty()
        {
            bail!("checkov could not parse {errors:?}");
        }
        for (list, into) in [
            ("failed_checks", &mut failed),
            ("skipped_checks", &mut skipped),
        ] {
            for check in results[list].as_array().into_iter().flatten() {
                let str = |v: &Value| v.as_str().unwrap_or("?").to_owned();
                into.insert(
                    (
                        str(&check["file_path"]).trim_start_matches('/').to_owned(),
                        str(&check["check_id"]),
                        str(&check["resource"]),
                    ),
                    if list == "failed_checks" {
                        str(&check["check_name"])
                    } else {
                        str(&check["check_result"]["suppress_comment"])
                    },
                );
            }
        }
    }
    Ok((failed, skipped))
}

/// checkov over every manifest (one run as they are, one without the suppressions):
/// what fails, and the suppressions that suppress nothing, go into `problems`; returns
/// how many failures were suppressed.
fn checkov_findings(
    binary: &Path,
    work: &Path,
    manifests: &[Manifest],
    problems: &mut Vec<String>,
) -> Result<usize> {
    let files: Vec<&str> = manifests.iter().map(|m| m.file.as_str()).collect();
    let shown = |file: &str| {
        manifests
            .iter()
            .find(|m| m.file == file)
            .map_or_else(|| file.to_owned(), |m| m.shown.clone())
    };
    let (failed, skipped) = checkov_run(binary, work, &files)?;
    for ((file, check, resource), name) in &failed {
        problems.push(format!(
            "{}: {resource}: checkov {check}: {name}",
            shown(file)
        ));
    }
    let (raw_failed, _) = checkov_run(binary, &work.join("bare"), &files)?;
    let mut suppressed = 0;
    for ((file, check, resource), reason) in &skipped {
        if reason.is_empty() || reason == "No comment provided" {
            problems.push(format!(
                "{}: {resource}: checkov {check} is skipped without a reason",
                shown(file)
            ));
        }
        if raw_failed.contains_key(&(file.clone(), check.clone(), resource.clone())) {
            suppressed += 1;
        } else {
            problems.push(format!(
                "{}: {resource}: checkov {check} is skipped but passes there: remove the skip",
                shown(file)
            ));
        }
    }
    // A skip checkov never applied (a misspelt check id) is no suppression either.
    for manifest in manifests {
        let applied: BTreeSet<&str> = skipped
            .keys()
            .filter(|(file, _, _)| *file == manifest.file)
            .map(|(_, check, _)| check.as_str())
            .collect();
        for object in &manifest.objects {
            let Ok(declared) = suppressions(object) else {
                continue;
            };
            for check in declared.checkov.keys() {
                if !applied.contains(check.as_str()) {
                    problems.push(format!(
                        "{}: {}: checkov skips {check}, which checkov did not apply (no such check?)",
                        manifest.shown,
                        describe(object)
                    ));
                }
            }
        }
    }
    Ok(suppressed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(annotations: Value) -> Value {
        json!({"kind": "Deployment", "metadata": {"name": "d", "namespace": "n", "annotations": annotations}})
    }

    #[test]
    fn every_suppression_needs_its_reason() {
        let ok = suppressions(&object(json!({
            "kube-score/ignore": "a, b",
            "kube-score/ignore-reason.a": "because",
            "kube-score/ignore-reason.b": "also",
            "checkov.io/skip1": "CKV_K8S_1=why not",
        })))
        .unwrap();
        assert_eq!(ok.kube_score.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(ok.checkov["CKV_K8S_1"], "why not");
        for (annotations, wanted) in [
            (
                json!({"kube-score/ignore": "a"}),
                "without a kube-score/ignore-reason.a",
            ),
            (
                json!({"kube-score/ignore-reason.a": "why"}),
                "does not name a",
            ),
            (json!({"checkov.io/skip1": "CKV_K8S_1"}), "gives no reason"),
            (
                json!({"checkov.io/skip2": "CKV_K8S_1= "}),
                "gives no reason",
            ),
            (json!({"checkov.io/skip1": "CKV_K8S_1=a=b"}), "holds a `=`"),
        ] {
            let err = suppressions(&object(annotations.clone()))
                .map(drop)
                .unwrap_err()
                .to_string();
            assert!(err.contains(wanted), "{annotations}: {err}");
        }
    }

    #[test]
    fn bare_copies_lose_the_suppressions_only() {
        let mut o = object(json!({
            "kube-score/ignore": "a",
            "kube-score/ignore-reason.a": "because",
            "checkov.io/skip1": "CKV_K8S_1=why",
            "other": "kept",
        }));
        strip_suppressions(&mut o);
        assert_eq!(o["metadata"]["annotations"], json!({"other": "kept"}));
        let mut o = object(json!({"checkov.io/skip1": "CKV_K8S_1=why"}));
        strip_suppressions(&mut o);
        assert!(o["metadata"].get("annotations").is_none());
    }

    #[test]
    fn the_committed_manifests_explain_every_suppression() {
        for op in crds::deployed_operators() {
            let path = paths::repo_root()
                .join("deploy")
                .join(op)
                .join("install.yaml");
            let text = std::fs::read_to_string(&path).unwrap();
            for object in kustomize::documents(&text).unwrap() {
                if object.is_null() {
                    continue;
                }
                suppressions(&object)
                    .unwrap_or_else(|e| panic!("{op}: {}: {e:#}", describe(&object)));
            }
        }
    }
}
