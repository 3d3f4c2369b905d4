//! `/metrics` served as `deploy/` runs it (`--metrics-secure`): HTTPS, every request
//! authenticated with a TokenReview and authorized with a SubjectAccessReview against the
//! real API server. No token -> 401, a ServiceAccount without the metrics-reader role ->
//! 403, one bound to `<operator>-metrics-reader` -> 200 with controller-runtime's metrics.
//! The probes stay plain HTTP.
//!
//! The HTTPS client is `curl` (as `cargo xtask demo` uses it); the certificate for the
//! certificate-directory test is made with `openssl`, which the local cluster needs anyway.

use anyhow::{Context, Result, bail, ensure};
use e2e::operator::{OperatorOptions, OperatorProcess, http_get, install};
use e2e::rbac::ClusterRoleBinding;
use e2e::{TIMEOUT, TestNamespace, can_i, kubectl_ok, poll, target_dir, unique_suffix};
use std::path::{Path, PathBuf};
use std::process::Command;

const OPERATOR: &str = "podset-operator";

/// How curl checks the server's certificate.
#[derive(Clone, Copy)]
enum Trust<'a> {
    /// Not at all (the operator's self-signed certificate is made in memory at startup).
    Insecure,
    /// Against this CA file.
    CaFile(&'a Path),
}

/// `GET https://127.0.0.1:<port>/metrics` with an optional bearer token: status and body.
fn https_get(port: u16, token: Option<&str>, trust: Trust<'_>) -> Result<(u16, String)> {
    let body = target_dir()
        .join("e2e")
        .join(format!("secure-metrics-{}.body", unique_suffix()));
    std::fs::create_dir_all(body.parent().context("no parent")?)?;
    let mut curl = Command::new("curl");
    curl.args(["--silent", "--show-error", "--max-time", "10"])
        .arg("--output")
        .arg(&body)
        .args(["--write-out", "%{http_code}"]);
    match trust {
        Trust::Insecure => {
            curl.arg("--insecure");
        }
        Trust::CaFile(ca) => {
            curl.arg("--cacert").arg(ca);
        }
    }
    if let Some(token) = token {
        curl.args(["--header", &format!("Authorization: Bearer {token}")]);
    }
    curl.arg(format!("https://127.0.0.1:{port}/metrics"));
    let out = curl
        .output()
        .context("running curl (apt-get install -y curl)")?;
    let text = std::fs::read_to_string(&body).unwrap_or_default();
    let _ = std::fs::remove_file(&body);
    if !out.status.success() {
        bail!(
            "curl failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let code = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("curl printed no status code")?;
    Ok((code, text))
}

/// Two ServiceAccounts in the test namespace: `scraper` (bound to the operator's
/// metrics-reader ClusterRole) and `stranger` (bound to nothing); their tokens.
struct Scrapers {
    reader_token: String,
    stranger_token: String,
    _binding: ClusterRoleBinding,
}

async fn scrapers(ns: &TestNamespace) -> Result<Scrapers> {
    // The ClusterRole comes with the operator's tree; an earlier test binary may
    // have undeployed it, so install before binding to it.
    install(OPERATOR)?;
    for sa in ["scraper", "stranger"] {
        kubectl_ok(["create", "serviceaccount", sa, "-n", &ns.name])?;
    }
    let binding =
        ClusterRoleBinding::create(&format!("{OPERATOR}-metrics-reader"), &ns.name, "scraper")?;
    // RBAC is served from the API server's cache: wait until it allows the reader.
    let reader = format!("system:serviceaccount:{}:scraper", ns.name);
    poll(
        "the metrics-reader binding to take effect",
        TIMEOUT,
        || async { Ok(can_i(&reader, &["get", "/metrics"])?.then_some(())) },
    )
    .await?;
    ensure!(
        !can_i(
            &format!("system:serviceaccount:{}:stranger", ns.name),
            &["get", "/metrics"]
        )?,
        "the stranger may get /metrics without a binding"
    );
    let token = |sa: &str| -> Result<String> {
        Ok(
            kubectl_ok(["create", "token", sa, "-n", &ns.name, "--duration=1h"])?
                .trim()
                .to_owned(),
        )
    };
    Ok(Scrapers {
        reader_token: token("scraper")?,
        stranger_token: token("stranger")?,
        _binding: binding,
    })
}

/// The operator with `--metrics-secure` and `extra` arguments, watching `ns`.
async fn secure_operator(ns: &TestNamespace, extra: &[String]) -> Result<OperatorProcess> {
    let mut args = vec!["--metrics-secure".to_owned()];
    args.extend_from_slice(extra);
    OperatorProcess::start_with(
        OPERATOR,
        &[&ns.name],
        OperatorOptions {
            args,
            ..OperatorOptions::default()
        },
    )
    .await
}

#[tokio::test]
async fn secure_metrics_401_without_token_403_without_role_200_with_metrics_reader() -> Result<()> {
    let ns = TestNamespace::new("secmet").await?;
    let scrapers = scrapers(&ns).await?;
    // Ready means /readyz answered over plain HTTP on the probe port.
    let op = secure_operator(&ns, &[]).await?;
    let port = op.metrics_port;
    let log = || op.log();

    let (code, body) = https_get(port, None, Trust::Insecure)?;
    assert_eq!(code, 401, "no token: {body}\n{}", log());
    let (code, body) = https_get(port, Some("not-a-token"), Trust::Insecure)?;
    assert_eq!(code, 401, "a token the API server does not know: {body}");
    let (code, body) = https_get(port, Some(&scrapers.stranger_token), Trust::Insecure)?;
    assert_eq!(code, 403, "a ServiceAccount without the role: {body}");
    assert!(body.contains("stranger"), "403 names the user: {body}");
    let (code, body) = https_get(port, Some(&scrapers.reader_token), Trust::Insecure)?;
    assert_eq!(code, 200, "bound to metrics-reader: {body}\n{}", log());
    for name in [
        "controller_runtime_reconcile_total",
        "controller_runtime_reconcile_time_seconds",
        "controller_runtime_max_concurrent_reconciles",
    ] {
        assert!(body.contains(name), "{name} missing in\n{body}");
    }
    // A second scrape comes from the cache and still answers.
    let (code, _) = https_get(port, Some(&scrapers.reader_token), Trust::Insecure)?;
    assert_eq!(code, 200);

    // Plain HTTP on the HTTPS port gets no metrics.
    let plain = http_get(port, "/metrics");
    assert!(
        !matches!(&plain, Ok((200, _))),
        "plain HTTP served metrics: {plain:?}"
    );
    // The probes stay plain HTTP.
    let (code, _) = http_get(op.health_port, "/healthz")?;
    assert_eq!(code, 200);
    Ok(())
}

/// A self-signed certificate for 127.0.0.1 in `dir` (`tls.crt`, `tls.key`), as a
/// cert-manager Secret mounted into the pod would hold it.
fn certificate_dir() -> Result<PathBuf> {
    let dir = target_dir()
        .join("e2e")
        .join(format!("metrics-cert-{}", unique_suffix()));
    std::fs::create_dir_all(&dir)?;
    xtask::support::openssl::self_signed_ec(
        &dir,
        "tls.key",
        "tls.crt",
        "/CN=127.0.0.1",
        1,
        &["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
    )?;
    Ok(dir)
}

#[tokio::test]
async fn secure_metrics_serve_the_certificate_of_metrics_cert_path() -> Result<()> {
    let ns = TestNamespace::new("secmet-cert").await?;
    let scrapers = scrapers(&ns).await?;
    let dir = certificate_dir()?;
    let op = secure_operator(&ns, &[format!("--metrics-cert-path={}", dir.display())]).await?;
    // curl verifies the server against exactly that certificate.
    let ca = dir.join("tls.crt");
    let (code, body) = https_get(
        op.metrics_port,
        Some(&scrapers.reader_token),
        Trust::CaFile(&ca),
    )?;
    assert_eq!(code, 200, "{body}\n{}", op.log());
    assert!(
        body.contains("controller_runtime_reconcile_total"),
        "{body}"
    );
    let (code, _) = https_get(op.metrics_port, None, Trust::CaFile(&ca))?;
    assert_eq!(code, 401);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[tokio::test]
async fn secure_metrics_with_an_unreadable_certificate_fail_at_startup() -> Result<()> {
    let ns = TestNamespace::new("secmet-bad").await?;
    let dir = target_dir()
        .join("e2e")
        .join(format!("no-cert-{}", unique_suffix()));
    let started = OperatorProcess::start_with(
        OPERATOR,
        &[&ns.name],
        OperatorOptions {
            args: vec![
                "--metrics-secure".to_owned(),
                format!("--metrics-cert-path={}", dir.display()),
            ],
            ..OperatorOptions::default()
        },
    )
    .await;
    let Err(error) = started else {
        bail!("the operator started without its certificate");
    };
    let message = format!("{error:#}");
    assert!(
        message.contains("tls.crt"),
        "the error names the file: {message}"
    );
    Ok(())
}
