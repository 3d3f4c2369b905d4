//! `cargo xtask new <name> --group <g> --version <v> --kind <K> [--plural <p>]`: scaffolds
//! one more operator the way this workspace builds them.
//!
//! It writes the crate `operators/<name>-operator/` (Cargo.toml, Dockerfile, and `main`,
//! `lib`, `api`, `desired`, `status`, `reconcile` with their unit tests, the reconcile's
//! against a scripted API server) and the kustomize tree `deploy/<name>-operator/` (the
//! same parts as the other operators': base, cluster RBAC, user RBAC, the namespaced
//! overlay, the leader-for-life component, Prometheus, network policy, samples) from the
//! templates under `xtask/templates/`; adds the crate to the workspace and its entry to
//! the one list of operators (`xtask/src/support/operators.rs`); formats what it wrote; then runs
//! the generators of a freshly built xtask, which finds the operator in that list:
//! `crds` (the CRD, from the operator's own `crd` subcommand), `installers` and
//! `charts`. Nothing else names the operators: deploy, run, demo, image and the tests
//! read the list.
//!
//! The scaffolded operator is small but real: each object of its kind keeps a ConfigMap
//! of the same name with the object's entries, written through the kit
//! (`shared::children`: server-side applied under the operator's field manager, with a
//! controller owner reference, only when it drifted, never taking over someone else's
//! ConfigMap); what the kit met becomes the `Ready` condition, and the status (with
//! `observedGeneration`) is published through the runner's `Toolkit`.

use anyhow::{Context, Result, bail};
use std::path::Path;
use xtask::say;
use xtask::support::operators::{KINDS, Kind};
use xtask::support::{cmd, paths, workspace_version};

/// Options of `cargo xtask new`.
#[derive(clap::Args, Debug)]
pub struct NewArgs {
    /// The operator's short name: lowercase letters, digits and `-` (`cache` makes
    /// `cache-operator`).
    pub name: String,
    /// The API group of its kind, a DNS subdomain with a dot (`cache.example.com`).
    #[arg(long)]
    pub group: String,
    /// The API version (`v1`, `v1alpha1`, `v2beta1`).
    #[arg(long)]
    pub version: String,
    /// The kind, UpperCamelCase (`CacheSet`).
    #[arg(long)]
    pub kind: String,
    /// The plural (the resource name); default: the kind in lowercase, pluralised.
    #[arg(long)]
    pub plural: Option<String>,
}

/// What is scaffolded, checked.
#[derive(Debug, PartialEq, Eq)]
pub struct Scaffold {
    /// The short name (`cache`).
    pub name: String,
    /// The API group.
    pub group: String,
    /// The API version.
    pub version: String,
    /// The kind.
    pub kind: String,
    /// The plural.
    pub plural: String,
}

/// The longest short name: the operator's namespace `<name>-operator-system` is a DNS
/// label (at most 63 characters).
const MAX_NAME: usize = 63 - "-operator-system".len();

/// Type names the scaffolded code imports or defines besides the kind's own: a kind of
/// one of these names would not compile.
const RESERVED_KINDS: [&str; 28] = [
    "Action",
    "Announce",
    "Arc",
    "BTreeMap",
    "Children",
    "Condition",
    "ConfigMap",
    "Conditions",
    "Context",
    "Controller",
    "CustomResource",
    "Deserialize",
    "Error",
    "HasConditions",
    "JsonSchema",
    "KubeSchema",
    "ObjectMeta",
    "OwnerReference",
    "Problem",
    "Reply",
    "Resource",
    "ResourceExt",
    "Scope",
    "Scripted",
    "Serialize",
    "Slim",
    "Time",
    "Toolkit",
];

/// Every template: where it is written (with placeholders) and its text.
const TEMPLATES: [(&str, &str); 31] = [
    (
        "operators/@OPERATOR@/Cargo.toml",
        include_str!("../../templates/operator/Cargo.toml.tmpl"),
    ),
    (
        "operators/@OPERATOR@/Dockerfile",
        include_str!("../../templates/operator/Dockerfile.tmpl"),
    ),
    (
        "operators/@OPERATOR@/src/lib.rs",
        include_str!("../../templates/operator/src/lib.rs.tmpl"),
    ),
    (
        "operators/@OPERATOR@/src/main.rs",
        include_str!("../../templates/operator/src/main.rs.tmpl"),
    ),
    (
        "operators/@OPERATOR@/src/api.rs",
        include_str!("../../templates/operator/src/api.rs.tmpl"),
    ),
    (
        "operators/@OPERATOR@/src/desired.rs",
        include_str!("../../templates/operator/src/desired.rs.tmpl"),
    ),
    (
        "operators/@OPERATOR@/src/status.rs",
        include_str!("../../templates/operator/src/status.rs.tmpl"),
    ),
    (
        "operators/@OPERATOR@/src/reconcile.rs",
        include_str!("../../templates/operator/src/reconcile.rs.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/kustomization.yaml",
        include_str!("../../templates/deploy/kustomization.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/base/kustomization.yaml",
        include_str!("../../templates/deploy/base/kustomization.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/base/namespace.yaml",
        include_str!("../../templates/deploy/base/namespace.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/base/service-account.yaml",
        include_str!("../../templates/deploy/base/service-account.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/base/leader-election-rbac.yaml",
        include_str!("../../templates/deploy/base/leader-election-rbac.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/base/deployment.yaml",
        include_str!("../../templates/deploy/base/deployment.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/base/metrics-service.yaml",
        include_str!("../../templates/deploy/base/metrics-service.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/base/metrics-auth-rbac.yaml",
        include_str!("../../templates/deploy/base/metrics-auth-rbac.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/cluster-rbac/kustomization.yaml",
        include_str!("../../templates/deploy/cluster-rbac/kustomization.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/cluster-rbac/cluster-role.yaml",
        include_str!("../../templates/deploy/cluster-rbac/cluster-role.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/user-rbac/kustomization.yaml",
        include_str!("../../templates/deploy/user-rbac/kustomization.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/user-rbac/roles.yaml",
        include_str!("../../templates/deploy/user-rbac/roles.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/namespaced/kustomization.yaml",
        include_str!("../../templates/deploy/namespaced/kustomization.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/namespaced/deployment-patch.yaml",
        include_str!("../../templates/deploy/namespaced/deployment-patch.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/namespaced/watched-namespaces.yaml",
        include_str!("../../templates/deploy/namespaced/watched-namespaces.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/leader-for-life/kustomization.yaml",
        include_str!("../../templates/deploy/leader-for-life/kustomization.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/leader-for-life/leader-for-life-rbac.yaml",
        include_str!("../../templates/deploy/leader-for-life/leader-for-life-rbac.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/prometheus/kustomization.yaml",
        include_str!("../../templates/deploy/prometheus/kustomization.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/prometheus/monitor.yaml",
        include_str!("../../templates/deploy/prometheus/monitor.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/network-policy/kustomization.yaml",
        include_str!("../../templates/deploy/network-policy/kustomization.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/network-policy/allow-metrics-traffic.yaml",
        include_str!("../../templates/deploy/network-policy/allow-metrics-traffic.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/samples/kustomization.yaml",
        include_str!("../../templates/deploy/samples/kustomization.yaml.tmpl"),
    ),
    (
        "deploy/@OPERATOR@/samples/@KIND_LOWER@.yaml",
        include_str!("../../templates/deploy/samples/@KIND_LOWER@.yaml.tmpl"),
    ),
];

/// The template of the operator's entry in `xtask/src/support/operators.rs`.
const LIST_ENTRY: &str = include_str!("../../templates/list-entry.rs.tmpl");

impl Scaffold {
    /// Checks `args` against the rules of Kubernetes and this workspace: `existing` are the
    /// operators there are, `root` the repository. The error names the flag at fault.
    ///
    /// # Errors
    /// When a value is malformed or taken.
    pub fn check(args: &NewArgs, existing: &[&Kind], root: &Path) -> Result<Scaffold> {
        let name = args.name.trim();
        check_name(name)?;
        let operator = format!("{name}-operator");
        if let Some(taken) = existing.iter().find(|k| k.operator == operator) {
            bail!(
                "<name> {name:?}: the operator {} exists already",
                taken.operator
            );
        }
        for dir in ["operators", "deploy"] {
            let path = Path::new(dir).join(&operator);
            if root.join(&path).exists() {
                bail!("<name> {name:?}: {} exists already", path.display());
            }
        }
        let group = args.group.trim();
        check_group(group)?;
        let version = args.version.trim();
        check_version(version)?;
        let kind = args.kind.trim();
        check_kind(kind)?;
        let plural = match &args.plural {
            Some(plural) => plural.trim().to_owned(),
            None => pluralise(&kind.to_lowercase()),
        };
        check_plural(&plural, kind)?;
        if plural.len() + 1 + group.len() > 253 {
            bail!(
                "--group {group:?} is too long for --plural {plural:?}: the CRD's name \
                 `<plural>.<group>` is at most 253 characters"
            );
        }
        if let Some(taken) = existing
            .iter()
            .find(|k| k.group == group && (k.kind == kind || k.plural == plural))
        {
            bail!(
                "--kind {kind:?} (plural {plural:?}) of --group {group:?} exists already: \
                 {} serves {}/{}",
                taken.operator,
                taken.kind,
                taken.plural
            );
        }
        Ok(Scaffold {
            name: name.to_owned(),
            group: group.to_owned(),
            version: version.to_owned(),
            kind: kind.to_owned(),
            plural,
        })
    }

    /// The crate, binary, image and `deploy/` folder: `<name>-operator`.
    #[must_use]
    pub fn operator(&self) -> String {
        format!("{}-operator", self.name)
    }

    /// The name of its constant in `xtask/src/support/operators.rs`: `CACHE_SET`.
    #[must_use]
    pub fn const_name(&self) -> String {
        self.name.to_uppercase().replace('-', "_")
    }

    /// `text` with every placeholder filled in.
    #[must_use]
    pub fn render(&self, text: &str, release: &str) -> String {
        let operator = self.operator();
        [
            ("@OPERATOR@", operator.as_str()),
            ("@CRATE@", &operator.replace('-', "_")),
            ("@CONST@", &self.const_name()),
            ("@NAME@", &self.name),
            ("@GROUP@", &self.group),
            ("@VERSION@", &self.version),
            ("@KIND_LOWER@", &self.kind.to_lowercase()),
            ("@KIND@", &self.kind),
            ("@PLURAL@", &self.plural),
            ("@RELEASE@", release),
        ]
        .iter()
        .fold(text.to_owned(), |text, (placeholder, value)| {
            text.replace(placeholder, value)
        })
    }
}

/// `<name>`: a DNS label that becomes `<name>-operator`.
fn check_name(name: &str) -> Result<()> {
    if name.ends_with("-operator") || name == "operator" {
        bail!(
            "<name> {name:?}: give the short name, `-operator` is added (`cache` makes \
             `cache-operator`)"
        );
    }
    if !is_dns_label(name) {
        bail!(
            "<name> {name:?} must be lowercase letters, digits and '-', starting with a letter \
             and not ending with '-' (e.g. `cache`)"
        );
    }
    if name.len() > MAX_NAME {
        bail!(
            "<name> {name:?} is too long: at most {MAX_NAME} characters (its namespace \
             `<name>-operator-system` is at most 63)"
        );
    }
    Ok(())
}

/// `--group`: a lowercase DNS subdomain with a dot, outside the groups Kubernetes keeps.
fn check_group(group: &str) -> Result<()> {
    let labels_ok = group.split('.').all(|l| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    });
    if !labels_ok || !group.contains('.') || group.len() > 253 {
        bail!(
            "--group {group:?} must be a lowercase DNS subdomain with at least one dot \
             (e.g. `cache.example.com`)"
        );
    }
    for reserved in ["k8s.io", "kubernetes.io"] {
        if group == reserved || group.ends_with(&format!(".{reserved}")) {
            bail!(
                "--group {group:?} is under {reserved}, which Kubernetes keeps for its own \
                 APIs: use a domain of yours"
            );
        }
    }
    Ok(())
}

/// `--version`: `v<n>`, `v<n>alpha<m>` or `v<n>beta<m>`.
fn check_version(version: &str) -> Result<()> {
    let number =
        |s: &str| !s.is_empty() && !s.starts_with('0') && s.chars().all(|c| c.is_ascii_digit());
    let ok = version.strip_prefix('v').is_some_and(|rest| {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (major, tail) = rest.split_at(digits);
        number(major)
            && (tail.is_empty()
                || ["alpha", "beta"]
                    .iter()
                    .any(|stage| tail.strip_prefix(stage).is_some_and(number)))
    });
    if !ok {
        bail!("--version {version:?} must be a Kubernetes API version: v1, v1alpha1, v2beta3...");
    }
    Ok(())
}

/// `--kind`: UpperCamelCase, and not a type name the scaffolded code uses.
fn check_kind(kind: &str) -> Result<()> {
    let ok = kind.starts_with(|c: char| c.is_ascii_uppercase())
        && kind.chars().all(|c| c.is_ascii_alphanumeric())
        && kind.len() <= 63;
    if !ok {
        bail!(
            "--kind {kind:?} must be UpperCamelCase: ASCII letters and digits, starting with \
             an uppercase letter, at most 63 (e.g. `CacheSet`)"
        );
    }
    if RESERVED_KINDS.contains(&kind) {
        bail!("--kind {kind:?} would clash with a type the scaffolded code uses: choose another");
    }
    Ok(())
}

/// `--plural` (given or derived): a lowercase DNS label other than the singular.
fn check_plural(plural: &str, kind: &str) -> Result<()> {
    if !is_dns_label(plural) || plural.contains('-') {
        bail!("--plural {plural:?} must be lowercase letters and digits, starting with a letter");
    }
    if plural == kind.to_lowercase() {
        bail!("--plural {plural:?} must differ from the singular (the kind in lowercase)");
    }
    Ok(())
}

/// Whether `s` is a DNS-1035 label: at most 63 lowercase letters, digits and '-',
/// starting with a letter, not ending with '-'.
fn is_dns_label(s: &str) -> bool {
    s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && !s.ends_with('-')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The English plural of a lowercase singular, as Kubernetes tools derive it: `-s`,
/// `-es` after s, x, z, ch and sh, `-ies` after a consonant and y.
fn pluralise(singular: &str) -> String {
    if ["s", "x", "z", "ch", "sh"]
        .iter()
        .any(|end| singular.ends_with(end))
    {
        return format!("{singular}es");
    }
    if let Some(stem) = singular.strip_suffix('y')
        && !stem.ends_with(['a', 'e', 'i', 'o', 'u'])
    {
        return format!("{stem}ies");
    }
    format!("{singular}s")
}

/// The workspace's `Cargo.toml` with `operators/<operator>` added to `members` and
/// `default-members`, after their last `operators/` entry.
///
/// # Errors
/// When either list has no `operators/` entry to follow.
fn add_member(toml: &str, operator: &str) -> Result<String> {
    let lines: Vec<&str> = toml.lines().collect();
    let mut insert_after = Vec::new();
    for list in ["members = [", "default-members = ["] {
        let start = lines
            .iter()
            .position(|l| l.trim() == list)
            .with_context(|| format!("Cargo.toml has no `{list}` line"))?;
        let end = lines[start..]
            .iter()
            .position(|l| l.trim() == "]")
            .map(|i| start + i)
            .with_context(|| format!("Cargo.toml: `{list}` is not closed"))?;
        let last = (start..end)
            .rev()
            .find(|&i| lines[i].trim().starts_with("\"operators/"))
            .with_context(|| format!("Cargo.toml: `{list}` has no operators/ entry"))?;
        insert_after.push(last);
    }
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        out.push_str(line);
        out.push('\n');
        if insert_after.contains(&i) {
            out.push_str(&format!("    \"operators/{operator}\",\n"));
        }
    }
    Ok(out)
}

/// `xtask/src/support/operators.rs` with `entry` (a `pub const <CONST>: Kind`) before the list
/// and `&<CONST>` appended to `KINDS` (its length one more). Unformatted: `cargo fmt`
/// formats it.
///
/// # Errors
/// When the list is not where it is expected, or `const_name` is taken.
fn add_to_list(source: &str, entry: &str, const_name: &str) -> Result<String> {
    if source.contains(&format!("const {const_name}:")) {
        bail!("<name>: the constant {const_name} exists already in xtask/src/support/operators.rs");
    }
    let head = "pub const KINDS: [&Kind; ";
    let start = source
        .find(head)
        .context("xtask/src/support/operators.rs has no `pub const KINDS: [&Kind; N] = [...]`")?;
    let rest = &source[start + head.len()..];
    let (count, rest) = rest
        .split_once("] = [")
        .context("xtask/src/support/operators.rs: KINDS is not `[&Kind; N] = [...]`")?;
    let count: usize = count.trim().parse().context("KINDS' length")?;
    let (items, after) = rest
        .split_once("];")
        .context("xtask/src/support/operators.rs: KINDS is not closed")?;
    let mut items: Vec<&str> = items
        .split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .collect();
    if items.len() != count {
        bail!(
            "xtask/src/support/operators.rs: KINDS lists {} of {count}",
            items.len()
        );
    }
    let new_item = format!("&{const_name}");
    items.push(&new_item);
    // The entry goes before the doc comment of KINDS.
    let doc_start = source[..start].rfind("\n\n").map_or(start, |i| i + 2);
    Ok(format!(
        "{}{entry}\n{}{head}{}] = [{}];{after}",
        &source[..doc_start],
        &source[doc_start..start],
        items.len(),
        items.join(", ")
    ))
}

/// `cargo xtask new ...`.
pub fn run(args: &NewArgs) -> Result<()> {
    let root = paths::repo_root();
    let scaffold = Scaffold::check(args, &KINDS, &root)?;
    let operator = scaffold.operator();
    let release = workspace_version::workspace_version()?.to_string();
    for (path, text) in TEMPLATES {
        let file = root.join(scaffold.render(path, &release));
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&file, scaffold.render(text, &release))
            .with_context(|| format!("writing {}", file.display()))?;
    }
    say!("new: wrote operators/{operator}/ and deploy/{operator}/");

    let manifest = root.join("Cargo.toml");
    let toml = std::fs::read_to_string(&manifest)?;
    std::fs::write(&manifest, add_member(&toml, &operator)?)?;
    let list = root.join("xtask/src/support/operators.rs");
    let entry = scaffold.render(LIST_ENTRY, &release);
    let source = std::fs::read_to_string(&list)?;
    std::fs::write(&list, add_to_list(&source, &entry, &scaffold.const_name())?)?;
    say!("new: added {operator} to the workspace and to xtask/src/support/operators.rs");

    let cargo = |args: &[&str]| {
        let mut command = cmd::cargo();
        command.current_dir(&root).args(args);
        cmd::run(&mut command)
    };
    cargo(&["fmt", "-p", &operator, "-p", "xtask"])?;
    // A fresh xtask, built with the new entry in its list, generates the CRD (from the
    // operator's `crd` subcommand), the installer and the chart.
    for generator in ["crds", "installers", "charts"] {
        cargo(&["run", "--quiet", "-p", "xtask", "--", generator, &operator])?;
    }
    say!(
        "new: {operator} is ready:\n  cargo test -p {operator}\n  cargo xtask run {operator}\n  \
         kubectl apply -k deploy/{operator}/samples\n\
         Then replace its ConfigMap with the children your kind needs (built in \
         src/desired.rs, handed to the kit in src/reconcile.rs, described in src/status.rs; \
         see docs/adding-an-operator.md) and the RBAC of deploy/{operator}/ to match."
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use xtask::support::operators::{MEMCACHED, PODSET};

    fn args(name: &str, group: &str, version: &str, kind: &str) -> NewArgs {
        NewArgs {
            name: name.into(),
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: None,
        }
    }

    /// The `@WORD@` placeholders of `text`.
    fn placeholders(text: &str) -> Vec<&str> {
        let mut found = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find('@') {
            let after = &rest[start + 1..];
            let word_end = after
                .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
                .unwrap_or(after.len());
            if word_end > 0 && after[word_end..].starts_with('@') {
                found.push(&after[..word_end]);
                rest = &after[word_end + 1..];
            } else {
                rest = after;
            }
        }
        found
    }

    /// The error of checking `args` against the four operators, in an empty repository.
    fn error(args: &NewArgs) -> String {
        let root = std::env::temp_dir().join("xtask-new-no-such-repo");
        match Scaffold::check(args, &KINDS, &root) {
            Ok(s) => panic!("{args:?} passed: {s:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn good_input_is_taken_and_the_plural_derived() -> Result<()> {
        let root = std::env::temp_dir().join("xtask-new-no-such-repo");
        let s = Scaffold::check(
            &args("cache", "cache.example.org", "v1beta2", "CacheSet"),
            &KINDS,
            &root,
        )?;
        assert_eq!(s.operator(), "cache-operator");
        assert_eq!(s.const_name(), "CACHE");
        assert_eq!(s.plural, "cachesets");
        for (singular, plural) in [
            ("policy", "policies"),
            ("gateway", "gateways"),
            ("box", "boxes"),
            ("switch", "switches"),
            ("widget", "widgets"),
        ] {
            assert_eq!(pluralise(singular), plural);
        }
        let mut with_plural = args("my-cache", "example.org", "v1", "Cache");
        with_plural.plural = Some("caches2".into());
        let s = Scaffold::check(&with_plural, &KINDS, &root)?;
        assert_eq!(
            (s.plural.as_str(), s.const_name()),
            ("caches2", "MY_CACHE".into())
        );
        Ok(())
    }

    #[test]
    fn bad_input_is_named_by_its_flag() {
        let cases = [
            (
                args("Cache", "example.org", "v1", "Cache"),
                "<name> \"Cache\" must be lowercase",
            ),
            (
                args("cache-", "example.org", "v1", "Cache"),
                "<name> \"cache-\" must be lowercase",
            ),
            (
                args("cache-operator", "example.org", "v1", "Cache"),
                "give the short name",
            ),
            (
                args(&"c".repeat(48), "example.org", "v1", "Cache"),
                "is too long",
            ),
            (
                args("memcached", "example.org", "v1", "Cache"),
                "the operator memcached-operator exists already",
            ),
            (
                args("cache", "example", "v1", "Cache"),
                "--group \"example\" must be a lowercase DNS subdomain",
            ),
            (
                args("cache", "Example.org", "v1", "Cache"),
                "--group \"Example.org\" must be",
            ),
            (
                args("cache", "example..org", "v1", "Cache"),
                "--group \"example..org\" must be",
            ),
            (
                args("cache", "apps.k8s.io", "v1", "Cache"),
                "--group \"apps.k8s.io\" is under k8s.io",
            ),
            (
                args("cache", "example.org", "1", "Cache"),
                "--version \"1\" must be a Kubernetes API version",
            ),
            (
                args("cache", "example.org", "v0", "Cache"),
                "--version \"v0\" must be",
            ),
            (
                args("cache", "example.org", "v1gamma1", "Cache"),
                "--version \"v1gamma1\" must be",
            ),
            (
                args("cache", "example.org", "v1alpha", "Cache"),
                "--version \"v1alpha\" must be",
            ),
            (
                args("cache", "example.org", "v1", "cache"),
                "--kind \"cache\" must be UpperCamelCase",
            ),
            (
                args("cache", "example.org", "v1", "Cache_Set"),
                "--kind \"Cache_Set\" must be UpperCamelCase",
            ),
            (
                args("cache", "example.org", "v1", "ConfigMap"),
                "--kind \"ConfigMap\" would clash",
            ),
            (
                args("cache", MEMCACHED.group, "v1", MEMCACHED.kind),
                "--kind \"Memcached\" (plural \"memcacheds\") of --group \"cache.example.com\" exists already: memcached-operator",
            ),
        ];
        for (args, expected) in cases {
            let message = error(&args);
            assert!(message.contains(expected), "{args:?}: {message}");
        }
        let mut bad_plural = args("cache", "example.org", "v1", "Cache");
        bad_plural.plural = Some("Caches".into());
        assert!(error(&bad_plural).starts_with("--plural \"Caches\" must be lowercase"));
        bad_plural.plural = Some("cache".into());
        assert!(error(&bad_plural).contains("must differ from the singular"));
    }

    #[test]
    fn an_existing_folder_is_refused() -> Result<()> {
        let root = std::env::temp_dir().join(format!("xtask-new-{}", std::process::id()));
        std::fs::create_dir_all(root.join("deploy/cache-operator"))?;
        let result = Scaffold::check(&args("cache", "example.org", "v1", "Cache"), &KINDS, &root);
        std::fs::remove_dir_all(&root)?;
        let message = result.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            message.contains("deploy/cache-operator exists already"),
            "{message}"
        );
        Ok(())
    }

    #[test]
    fn every_placeholder_is_filled_in() -> Result<()> {
        let root = std::env::temp_dir().join("xtask-new-no-such-repo");
        let s = Scaffold::check(
            &args("cache", "example.org", "v1", "CacheSet"),
            &KINDS,
            &root,
        )?;
        let mut templates = TEMPLATES.to_vec();
        templates.push(("xtask/src/support/operators.rs", LIST_ENTRY));
        for (path, text) in templates {
            assert!(
                !placeholders(text).is_empty() || !text.contains('@'),
                "{path}"
            );
            for rendered in [s.render(path, "1.2.3"), s.render(text, "1.2.3")] {
                assert_eq!(placeholders(&rendered), Vec::<&str>::new(), "{path}");
            }
        }
        let sample = s.render("deploy/@OPERATOR@/samples/@KIND_LOWER@.yaml", "1.2.3");
        assert_eq!(sample, "deploy/cache-operator/samples/cacheset.yaml");
        Ok(())
    }

    #[test]
    fn the_workspace_and_the_list_get_their_entries() -> Result<()> {
        let toml = std::fs::read_to_string(paths::repo_root().join("Cargo.toml"))?;
        let added = add_member(&toml, "cache-operator")?;
        assert_eq!(added.matches("\"operators/cache-operator\",").count(), 2);
        assert_eq!(added.lines().count(), toml.lines().count() + 2);

        let source =
            std::fs::read_to_string(paths::repo_root().join("xtask/src/support/operators.rs"))?;
        let root = std::env::temp_dir().join("xtask-new-no-such-repo");
        let s = Scaffold::check(
            &args("cache", "example.org", "v1", "CacheSet"),
            &KINDS,
            &root,
        )?;
        let entry = s.render(LIST_ENTRY, "1.2.3");
        let listed = add_to_list(&source, &entry, &s.const_name())?;
        let n = KINDS.len();
        assert!(listed.contains(&format!("pub const KINDS: [&Kind; {}] = [", n + 1)));
        assert!(listed.contains(", &CACHE];"));
        assert!(listed.contains("pub const CACHE: Kind = Kind {"));
        assert!(
            listed.find("pub const CACHE: Kind").unwrap_or(usize::MAX)
                < listed.find("pub const KINDS").unwrap_or(0)
        );
        // A second time, the constant is taken.
        assert!(add_to_list(&listed, &entry, "CACHE").is_err());
        assert!(add_to_list(&source, &entry, "PODSET").is_err());
        assert_eq!(PODSET.operator, KINDS[0].operator);
        Ok(())
    }
}
