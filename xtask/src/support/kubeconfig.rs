//! Kubeconfigs for a ServiceAccount's token, and clients from kubeconfig files.

use std::path::Path;

use anyhow::{Context, Result};
use kube::Client;
use kube::config::{
    AuthInfo, Context as KubeContext, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedContext,
};

/// A kubeconfig for the cluster of the kubeconfig at `admin` that authenticates as
/// ServiceAccount `namespace/name` with `token` (from `kubectl create token`), with
/// `default_namespace` as its context's namespace when given.
///
/// # Errors
/// When `admin` cannot be read or names no cluster.
pub fn for_service_account(
    admin: &Path,
    namespace: &str,
    name: &str,
    token: &str,
    default_namespace: Option<&str>,
) -> Result<Kubeconfig> {
    let admin_config =
        Kubeconfig::read_from(admin).with_context(|| format!("reading {}", admin.display()))?;
    let cluster = admin_config
        .clusters
        .first()
        .cloned()
        .with_context(|| format!("{} names no cluster", admin.display()))?;
    let user = format!("system:serviceaccount:{namespace}:{name}");
    Ok(Kubeconfig {
        clusters: vec![cluster.clone()],
        auth_infos: vec![NamedAuthInfo {
            name: user.clone(),
            auth_info: Some(AuthInfo {
                token: Some(token.trim().to_owned().into()),
                ..AuthInfo::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "sa".into(),
            context: Some(KubeContext {
                cluster: cluster.name.clone(),
                user: Some(user),
                namespace: default_namespace.map(str::to_owned),
                ..KubeContext::default()
            }),
            other: Default::default(),
        }],
        current_context: Some("sa".into()),
        ..Kubeconfig::default()
    })
}

/// Writes `config` to `path` as YAML.
///
/// # Errors
/// When the file cannot be written.
pub fn write(config: &Kubeconfig, path: &Path) -> Result<()> {
    let text = serde_saphyr::to_string(config).context("serializing a kubeconfig")?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// A client from the kubeconfig file at `path` (its current context).
///
/// # Errors
/// When the file cannot be read or names no usable context.
pub async fn client_from(path: &Path) -> Result<Client> {
    Ok(Client::try_from(config_from(path).await?)?)
}

/// The client configuration of the kubeconfig at `path` (its current context).
///
/// # Errors
/// When the file cannot be read or names no usable cluster.
pub async fn config_from(path: &Path) -> Result<kube::Config> {
    let kc = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_account_kubeconfig_keeps_the_cluster_and_uses_the_token() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("xtask-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let admin = dir.join("admin.kubeconfig");
        std::fs::write(
            &admin,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: https://127.0.0.1:16443\nusers:\n- name: admin\n  user:\n    token: admin-token\ncontexts:\n- name: admin\n  context: {cluster: local, user: admin}\ncurrent-context: admin\n",
        )?;
        let kc = for_service_account(&admin, "ns", "op", "tok\n", Some("demo"))?;
        let path = dir.join("sa.kubeconfig");
        write(&kc, &path)?;
        let read = Kubeconfig::read_from(&path)?;
        std::fs::remove_dir_all(&dir)?;
        assert_eq!(read.clusters[0].name, "local");
        assert_eq!(read.auth_infos.len(), 1);
        assert_eq!(read.auth_infos[0].name, "system:serviceaccount:ns:op");
        let context = read.contexts[0].context.clone().unwrap_or_default();
        assert_eq!(context.namespace.as_deref(), Some("demo"));
        assert_eq!(read.current_context.as_deref(), Some("sa"));
        Ok(())
    }
}
