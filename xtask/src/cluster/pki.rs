//! Certificates and keys of the local cluster, made with the `openssl` CLI.
//!
//! One CA signs the API server's serving certificate and a client certificate
//! for each identity (admin, controller manager, scheduler, kwok). A separate
//! RSA key pair signs service-account tokens.

use crate::cmd;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A client identity: the certificate's CN is the user, O the group.
pub struct Identity {
    /// File stem of the key, certificate and kubeconfig.
    pub file: &'static str,
    /// The user name (certificate CN).
    pub user: &'static str,
    /// The group (certificate O), if any.
    pub group: Option<&'static str>,
}

/// Every client identity the cluster uses.
pub const IDENTITIES: [Identity; 7] = [
    Identity {
        file: "admin",
        user: "kubernetes-admin",
        group: Some("system:masters"),
    },
    Identity {
        file: "controller-manager",
        user: "system:kube-controller-manager",
        group: None,
    },
    Identity {
        file: "scheduler",
        user: "system:kube-scheduler",
        group: None,
    },
    Identity {
        file: "kwok",
        user: "kwok-controller",
        group: Some("system:masters"),
    },
    // The real node's kubelet: the Node authorizer and NodeRestriction limit
    // it to its own node and the pods bound to it.
    Identity {
        file: "kubelet",
        user: "system:node:real-node",
        group: Some("system:nodes"),
    },
    // Bound by the built-in `system:node-proxier` ClusterRoleBinding.
    Identity {
        file: "kube-proxy",
        user: "system:kube-proxy",
        group: None,
    },
    // Reads Services, EndpointSlices, Namespaces and Pods (its ClusterRole is
    // applied by `up`).
    Identity {
        file: "coredns",
        user: "system:coredns",
        group: None,
    },
];

fn openssl(dir: &Path) -> Command {
    let mut c = Command::new("openssl");
    c.current_dir(dir);
    c
}

/// Makes every key and certificate in `dir` unless they already exist.
pub fn ensure(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let have_ca = dir.join("ca.crt").exists() && dir.join("sa.pub").exists();
    if have_ca {
        // A cluster made by an older version may lack newer identities.
        return issue_identities(dir);
    }
    if !cmd::on_path("openssl") {
        anyhow::bail!("the local cluster needs the `openssl` command: apt-get install -y openssl");
    }
    cmd::output(openssl(dir).args([
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "3650",
        "-subj",
        "/CN=rust-operators-local-ca",
    ]))
    .context("making the cluster CA")?;
    issue(
        dir,
        "apiserver",
        "/CN=kube-apiserver",
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment",
    )?;
    issue_identities(dir)?;
    cmd::output(openssl(dir).args(["genrsa", "-out", "sa.key", "2048"]))?;
    cmd::output(openssl(dir).args(["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]))?;
    Ok(())
}

/// Issues the client certificate of every identity that has none yet.
fn issue_identities(dir: &Path) -> Result<()> {
    for id in &IDENTITIES {
        if dir.join(format!("{}.crt", id.file)).exists() {
            continue;
        }
        let subject = match id.group {
            Some(group) => format!("/O={group}/CN={}", id.user),
            None => format!("/CN={}", id.user),
        };
        issue(
            dir,
            id.file,
            &subject,
            "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment",
        )?;
    }
    Ok(())
}

fn issue(dir: &Path, stem: &str, subject: &str, extensions: &str) -> Result<()> {
    let ext = dir.join(format!("{stem}.ext"));
    std::fs::write(&ext, extensions)?;
    cmd::output(openssl(dir).args([
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        &format!("{stem}.key"),
        "-out",
        &format!("{stem}.csr"),
        "-subj",
        subject,
    ]))
    .with_context(|| format!("making the key of {stem}"))?;
    cmd::output(openssl(dir).args([
        "x509",
        "-req",
        "-in",
        &format!("{stem}.csr"),
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "3650",
        "-out",
        &format!("{stem}.crt"),
        "-extfile",
        &format!("{stem}.ext"),
    ]))
    .with_context(|| format!("signing the certificate of {stem}"))?;
    Ok(())
}

/// Writes a kubeconfig for `id` that reaches `server`; returns its path.
pub fn kubeconfig(pki: &Path, out_dir: &Path, id: &Identity, server: &str) -> Result<PathBuf> {
    let path = out_dir.join(format!("{}.kubeconfig", id.file));
    let ca = pki.join("ca.crt");
    let crt = pki.join(format!("{}.crt", id.file));
    let key = pki.join(format!("{}.key", id.file));
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user}
  user:
    client-certificate: {crt}
    client-key: {key}
contexts:
- name: local
  context:
    cluster: local
    user: {user}
    namespace: default
current-context: local
",
        ca = ca.display(),
        user = id.user,
        crt = crt.display(),
        key = key.display(),
    );
    std::fs::write(&path, text)?;
    Ok(path)
}
