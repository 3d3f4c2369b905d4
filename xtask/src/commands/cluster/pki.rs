//! Certificates and keys of the local cluster, made in process with `rcgen`
//! (ECDSA P-256 keys, PEM files: PKCS#8 keys, X.509 v3 certificates).
//!
//! One CA signs the API server's serving certificate and a client certificate
//! for each identity (admin, controller manager, scheduler, kwok, the real
//! node's kubelet, kube-proxy, CoreDNS). A separate key pair signs
//! service-account tokens (ES256). Files that exist are kept: a state folder
//! made by an older version (with the `openssl` command) keeps its CA, and
//! only identities it lacks are issued, signed by that CA.

use anyhow::{Context, Result};
use kube::config::{
    AuthInfo, Cluster, Context as KubeContext, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType,
};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

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

/// The CA certificate's common name.
const CA_NAME: &str = "rust-operators-local-ca";
/// How long every certificate is valid.
const VALIDITY_DAYS: i64 = 3650;
/// The API server's DNS names (its certificate's SANs besides the addresses).
const API_SERVER_DNS: [&str; 5] = [
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];
/// The API server's addresses: this machine's loopback and the `kubernetes`
/// Service address pods reach it at.
const API_SERVER_IPS: [Ipv4Addr; 2] = [Ipv4Addr::LOCALHOST, Ipv4Addr::new(10, 96, 0, 1)];

/// Makes every key and certificate in `dir` unless they already exist.
///
/// # Errors
/// When a file cannot be read or written, or an existing CA cannot be parsed.
pub fn ensure(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let have_ca = dir.join("ca.crt").exists() && dir.join("sa.pub").exists();
    if have_ca {
        // A cluster made by an older version may lack newer identities.
        return issue_identities(dir);
    }
    let ca_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut ca = params(CA_NAME, None);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).context("making the cluster CA")?;
    write_private(&dir.join("ca.key"), &ca_key.serialize_pem())?;
    std::fs::write(dir.join("ca.crt"), ca_cert.pem())?;
    let issuer = Issuer::new(ca, ca_key);

    let mut api = params("kube-apiserver", None);
    api.subject_alt_names = API_SERVER_IPS
        .iter()
        .map(|ip| SanType::IpAddress(IpAddr::V4(*ip)))
        .chain(
            API_SERVER_DNS
                .iter()
                .map(|name| Ok(SanType::DnsName((*name).try_into()?)))
                .collect::<Result<Vec<_>, rcgen::Error>>()?,
        )
        .collect();
    api.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    issue(dir, "apiserver", api, &issuer)?;
    issue_identities_with(dir, &issuer)?;

    let sa = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    write_private(&dir.join("sa.key"), &sa.serialize_pem())?;
    std::fs::write(dir.join("sa.pub"), sa.public_key_pem())?;
    Ok(())
}

/// Issues the client certificate of every identity that has none yet, signed
/// by the CA in `dir` (whichever tool made it).
fn issue_identities(dir: &Path) -> Result<()> {
    if IDENTITIES
        .iter()
        .all(|id| dir.join(format!("{}.crt", id.file)).exists())
    {
        return Ok(());
    }
    let key = KeyPair::from_pem(&read(&dir.join("ca.key"))?).context("reading the CA key")?;
    let issuer =
        Issuer::from_ca_cert_pem(&read(&dir.join("ca.crt"))?, key).context("reading the CA")?;
    issue_identities_with(dir, &issuer)
}

fn issue_identities_with(dir: &Path, issuer: &Issuer<'_, KeyPair>) -> Result<()> {
    for id in &IDENTITIES {
        if dir.join(format!("{}.crt", id.file)).exists() {
            continue;
        }
        let mut params = params(id.user, id.group);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        issue(dir, id.file, params, issuer)?;
    }
    Ok(())
}

/// A certificate's parameters: the subject `O=<organization>, CN=<common_name>`
/// (in that order, as the `openssl` subjects were), valid from now for ten
/// years, with the key usages of a TLS key.
fn params(common_name: &str, organization: Option<&str>) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    if let Some(organization) = organization {
        name.push(DnType::OrganizationName, organization);
    }
    name.push(DnType::CommonName, common_name);
    params.distinguished_name = name;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + time::Duration::days(VALIDITY_DAYS);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.use_authority_key_identifier_extension = true;
    params
}

/// Makes `<stem>.key` and `<stem>.crt`, the certificate signed by `issuer`.
fn issue(
    dir: &Path,
    stem: &str,
    params: CertificateParams,
    issuer: &Issuer<'_, KeyPair>,
) -> Result<()> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let cert = params
        .signed_by(&key, issuer)
        .with_context(|| format!("signing the certificate of {stem}"))?;
    write_private(&dir.join(format!("{stem}.key")), &key.serialize_pem())?;
    std::fs::write(dir.join(format!("{stem}.crt")), cert.pem())
        .with_context(|| format!("writing the certificate of {stem}"))
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Writes a private key readable by its owner only.
fn write_private(path: &Path, pem: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(pem.as_bytes())?;
    Ok(())
}

/// The kubeconfig of `id` reaching `server`, naming the files in `pki`.
pub fn kubeconfig_for(pki: &Path, id: &Identity, server: &str) -> Kubeconfig {
    let path = |f: String| Some(pki.join(f).display().to_string());
    Kubeconfig {
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        clusters: vec![NamedCluster {
            name: "local".into(),
            cluster: Some(Cluster {
                server: Some(server.into()),
                certificate_authority: path("ca.crt".into()),
                ..Cluster::default()
            }),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: id.user.into(),
            auth_info: Some(AuthInfo {
                client_certificate: path(format!("{}.crt", id.file)),
                client_key: path(format!("{}.key", id.file)),
                ..AuthInfo::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "local".into(),
            context: Some(KubeContext {
                cluster: "local".into(),
                user: Some(id.user.into()),
                namespace: Some("default".into()),
                ..KubeContext::default()
            }),
            other: Default::default(),
        }],
        current_context: Some("local".into()),
        ..Kubeconfig::default()
    }
}

/// Writes a kubeconfig for `id` that reaches `server`; returns its path.
///
/// # Errors
/// When the file cannot be written.
pub fn kubeconfig(pki: &Path, out_dir: &Path, id: &Identity, server: &str) -> Result<PathBuf> {
    let path = out_dir.join(format!("{}.kubeconfig", id.file));
    xtask::support::kubeconfig::write(&kubeconfig_for(pki, id, server), &path)?;
    Ok(path)
}

#[cfg(test)]
// The test harness captures `eprintln!` (not `say_err!`), showing it with a failure.
#[allow(clippy::disallowed_macros)]
mod tests {
    use super::*;
    use x509_parser::extensions::GeneralName;
    use x509_parser::pem::parse_x509_pem;

    /// A fresh folder under the temporary directory.
    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-pki-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn pem(dir: &Path, file: &str) -> x509_parser::pem::Pem {
        let bytes = std::fs::read(dir.join(file)).unwrap();
        parse_x509_pem(&bytes).unwrap().1
    }

    /// The subject's attributes as `(O, CN)`.
    fn subject(cert: &x509_parser::certificate::X509Certificate<'_>) -> (Vec<String>, String) {
        let o = cert
            .subject()
            .iter_organization()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        let cn = cert
            .subject()
            .iter_common_name()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
            .join(",");
        (o, cn)
    }

    /// Checks the whole folder: the CA, the API server's and every client's
    /// certificate, and the service-account key pair.
    fn check(dir: &Path) {
        let ca_pem = pem(dir, "ca.crt");
        let ca = ca_pem.parse_x509().unwrap();
        assert!(ca.is_ca());
        assert_eq!(subject(&ca).1, CA_NAME);
        ca.verify_signature(None).unwrap();

        let api_pem = pem(dir, "apiserver.crt");
        let api = api_pem.parse_x509().unwrap();
        api.verify_signature(Some(ca.public_key())).unwrap();
        assert_eq!(api.issuer(), ca.subject());
        assert_eq!(subject(&api), (vec![], "kube-apiserver".to_owned()));
        let sans = &api.subject_alternative_name().unwrap().unwrap().value;
        let mut names: Vec<String> = sans
            .general_names
            .iter()
            .map(|n| match n {
                GeneralName::DNSName(d) => (*d).to_owned(),
                GeneralName::IPAddress(ip) => format!("{ip:?}"),
                other => panic!("unexpected SAN {other:?}"),
            })
            .collect();
        names.sort();
        let mut want: Vec<String> = API_SERVER_DNS.iter().map(|d| (*d).to_owned()).collect();
        want.push(format!("{:?}", [127u8, 0, 0, 1].as_slice()));
        want.push(format!("{:?}", [10u8, 96, 0, 1].as_slice()));
        want.sort();
        assert_eq!(names, want);
        let eku = api.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && !eku.client_auth);
        let ku = api.key_usage().unwrap().unwrap().value;
        assert!(ku.digital_signature() && ku.key_encipherment() && !ku.key_cert_sign());
        assert!(!api.is_ca());
        assert!(api.validity().is_valid());

        for id in &IDENTITIES {
            let cert_pem = pem(dir, &format!("{}.crt", id.file));
            let cert = cert_pem.parse_x509().unwrap();
            cert.verify_signature(Some(ca.public_key()))
                .unwrap_or_else(|e| panic!("{} does not chain to the CA: {e}", id.file));
            assert_eq!(cert.issuer(), ca.subject());
            let groups: Vec<String> = id.group.iter().map(|g| (*g).to_owned()).collect();
            assert_eq!(subject(&cert), (groups, id.user.to_owned()), "{}", id.file);
            let eku = cert.extended_key_usage().unwrap().unwrap().value;
            assert!(eku.client_auth && !eku.server_auth, "{}", id.file);
            assert!(!cert.is_ca());
            // The key on disk is the certificate's.
            let key = KeyPair::from_pem(
                &std::fs::read_to_string(dir.join(format!("{}.key", id.file))).unwrap(),
            )
            .unwrap();
            assert_eq!(
                rcgen::PublicKeyData::subject_public_key_info(&key),
                cert.public_key().raw,
                "{}: key and certificate differ",
                id.file
            );
        }

        let sa = KeyPair::from_pem(&std::fs::read_to_string(dir.join("sa.key")).unwrap()).unwrap();
        assert_eq!(
            sa.public_key_pem(),
            std::fs::read_to_string(dir.join("sa.pub")).unwrap()
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "the CA key is readable by others");
    }

    #[test]
    fn a_fresh_folder_gets_a_ca_and_certificates_that_chain_to_it() {
        let dir = temp_dir("fresh");
        ensure(&dir).unwrap();
        check(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn existing_files_are_kept_and_a_missing_identity_is_signed_by_the_same_ca() {
        let dir = temp_dir("keep");
        ensure(&dir).unwrap();
        let ca = std::fs::read(dir.join("ca.crt")).unwrap();
        let admin = std::fs::read(dir.join("admin.crt")).unwrap();
        std::fs::remove_file(dir.join("coredns.crt")).unwrap();
        ensure(&dir).unwrap();
        assert_eq!(std::fs::read(dir.join("ca.crt")).unwrap(), ca);
        assert_eq!(std::fs::read(dir.join("admin.crt")).unwrap(), admin);
        check(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A state folder whose CA the `openssl` command made (before this module
    /// used rcgen) gets its missing identities signed by that CA, and
    /// `openssl verify` accepts them. Skipped without `openssl`.
    #[test]
    fn a_ca_made_by_openssl_signs_new_identities() {
        if !xtask::support::cmd::on_path("openssl") {
            eprintln!("skipped: no openssl");
            return;
        }
        let dir = temp_dir("openssl");
        std::fs::create_dir_all(&dir).unwrap();
        let openssl = |args: &[&str]| xtask::support::openssl::run(&dir, args).unwrap();
        xtask::support::openssl::self_signed_ec(
            &dir,
            "ca.key",
            "ca.crt",
            "/CN=rust-operators-local-ca",
            30,
            &[],
        )
        .unwrap();
        openssl(&["genrsa", "-out", "sa.key", "2048"]);
        openssl(&["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
        let sa_before = std::fs::read(dir.join("sa.key")).unwrap();
        ensure(&dir).unwrap();
        assert_eq!(std::fs::read(dir.join("sa.key")).unwrap(), sa_before);
        for id in &IDENTITIES {
            let crt = format!("{}.crt", id.file);
            openssl(&["verify", "-purpose", "sslclient", "-CAfile", "ca.crt", &crt]);
            let subject = openssl(&["x509", "-in", &crt, "-noout", "-subject"]);
            assert!(subject.contains(id.user), "{subject}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `openssl verify` accepts what rcgen made, for the purposes the cluster
    /// uses. Skipped without `openssl`.
    #[test]
    fn openssl_verifies_the_fresh_certificates() {
        if !xtask::support::cmd::on_path("openssl") {
            eprintln!("skipped: no openssl");
            return;
        }
        let dir = temp_dir("verify");
        ensure(&dir).unwrap();
        let verify = |purpose: &str, file: &str| {
            let verified = xtask::support::openssl::run(
                &dir,
                &["verify", "-purpose", purpose, "-CAfile", "ca.crt", file],
            );
            assert!(verified.is_ok(), "{file}: {verified:?}");
        };
        verify("sslserver", "apiserver.crt");
        for id in &IDENTITIES {
            verify("sslclient", &format!("{}.crt", id.file));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The kubeconfig kube reads back names the identity's files, and kube
    /// builds a TLS client from them (it parses the certificate and the key).
    #[tokio::test]
    async fn kubeconfig_round_trips_through_kube() {
        let dir = temp_dir("kubeconfig");
        ensure(&dir).unwrap();
        let admin = &IDENTITIES[0];
        let path = kubeconfig(&dir, &dir, admin, "https://127.0.0.1:16443").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("kind: Config"), "{text}");
        let read = Kubeconfig::read_from(&path).unwrap();
        assert_eq!(read.current_context.as_deref(), Some("local"));
        let user = read.auth_infos[0].auth_info.clone().unwrap();
        assert_eq!(
            user.client_key.as_deref(),
            Some(dir.join("admin.key").to_str().unwrap())
        );
        let config = kube::Config::from_custom_kubeconfig(read, &Default::default())
            .await
            .unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:16443/");
        kube::Client::try_from(config).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
