//! Images the local cluster's real node needs that come from public
//! registries on a real cluster (the pod sandbox, busybox for PodSets,
//! memcached for Memcacheds), built here from Debian's packages with the same
//! deterministic builder, and pushed under the names the operators use by
//! default. So the default manifests work unchanged on the local cluster, and
//! the upstream images work on a real one.

use super::tar::Entry;
use super::{Image, Platform, Spec, assemble_spec, source_date_epoch, write_image};
use anyhow::{Context, Result, bail};
use std::process::Command;
use xtask::support::cmd;

/// Debian packages the system images are made from: `(file, package)`.
pub const PACKAGES: [(&str, &str); 2] = [
    ("/bin/busybox", "busybox-static"),
    ("/usr/bin/memcached", "memcached"),
];

/// One system image.
#[derive(Clone, Copy, Debug)]
pub struct SystemImage {
    /// Short name (the folder under `target/images/`).
    pub name: &'static str,
    /// The reference manifests and operators use.
    pub reference: &'static str,
}

/// The pod sandbox containerd starts for every pod.
pub const PAUSE: SystemImage = SystemImage {
    name: "system-pause",
    reference: "registry.k8s.io/pause:3.10",
};
/// PodSet's default image (`busybox`).
pub const BUSYBOX: SystemImage = SystemImage {
    name: "system-busybox",
    reference: "busybox:latest",
};
/// Memcached's default image.
pub const MEMCACHED: SystemImage = SystemImage {
    name: "system-memcached",
    reference: "memcached:1.6.38-alpine",
};

/// Every system image.
pub const ALL: [SystemImage; 3] = [PAUSE, BUSYBOX, MEMCACHED];

/// The repository path and tag a registry mirror is asked for when a pod
/// names `reference` (Docker Hub's single names get `library/`).
pub fn registry_path(reference: &str) -> String {
    let (first, rest) = reference.split_once('/').unwrap_or(("", reference));
    let is_host = first.contains('.') || first.contains(':') || first == "localhost";
    match (first, is_host) {
        ("", _) => format!("library/{rest}"),
        ("docker.io", true) if !rest.contains('/') => format!("library/{rest}"),
        (_, true) => rest.to_owned(),
        _ => reference.to_owned(),
    }
}

/// Builds one system image under `target/images/`.
pub fn build(image: SystemImage) -> Result<Image> {
    xtask::support::machine_packages::ensure_debian(&PACKAGES)?;
    let tag = image
        .reference
        .rsplit_once(':')
        .map(|(_, t)| t)
        .context("system image without tag")?;
    let spec = match image.name {
        "system-pause" => Spec {
            entrypoint: vec!["/bin/sleep".into(), "2147483647".into()],
            ..busybox_spec(image)?
        },
        "system-busybox" => Spec {
            cmd: vec!["sh".into()],
            ..busybox_spec(image)?
        },
        "system-memcached" => memcached_spec(image)?,
        other => bail!("unknown system image {other}"),
    };
    // The host's Debian packages: the host's platform alone.
    let layout = assemble_spec(spec, Platform::host()?, tag, source_date_epoch()?)?;
    write_image(image.name, tag, &layout)
}

fn base_entries() -> Vec<Entry> {
    let mut entries = super::tar::skeleton(
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        "root:x:0:\nnogroup:x:65534:\n",
        &["bin", "usr", "usr/bin", "usr/sbin", "sbin"],
    );
    entries.push(Entry::dir("root", 0o700));
    entries
}

fn spec(image: SystemImage, entries: Vec<Entry>, package: &str) -> Spec {
    Spec {
        title: image.reference.to_owned(),
        entries,
        entrypoint: Vec::new(),
        cmd: Vec::new(),
        user: None,
        env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
        source: format!("Debian package {package}"),
        version: debian_version(package),
        created_by: format!("cargo xtask (from Debian's {package})"),
    }
}

fn debian_version(package: &str) -> String {
    cmd::output(Command::new("dpkg-query").args(["-W", "-f=${Version}", package]))
        .unwrap_or_default()
}

/// busybox-static with a link for every applet.
fn busybox_spec(image: SystemImage) -> Result<Spec> {
    let binary = std::fs::read("/bin/busybox").context("reading /bin/busybox")?;
    let list = cmd::output(Command::new("/bin/busybox").arg("--list-full"))?;
    let mut entries = base_entries();
    entries.push(Entry::file("bin/busybox", 0o755, binary));
    for applet in list.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if applet == "bin/busybox" || !applet.contains('/') {
            continue;
        }
        if applet.starts_with("usr/")
            && !applet.starts_with("usr/bin/")
            && !applet.starts_with("usr/sbin/")
        {
            continue;
        }
        entries.push(Entry::symlink(applet, "/bin/busybox"));
    }
    Ok(spec(image, entries, "busybox-static"))
}

/// Debian's memcached with the shared libraries it links.
fn memcached_spec(image: SystemImage) -> Result<Spec> {
    let mut entries = base_entries();
    entries.push(Entry::file(
        "usr/bin/memcached",
        0o755,
        std::fs::read("/usr/bin/memcached").context("reading /usr/bin/memcached")?,
    ));
    let mut dirs = std::collections::BTreeSet::new();
    for lib in shared_libraries("/usr/bin/memcached")? {
        let rel = lib.trim_start_matches('/').to_owned();
        let mut dir = std::path::Path::new(&rel).parent();
        while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
            dirs.insert(d.display().to_string());
            dir = d.parent();
        }
        let data = std::fs::read(&lib).with_context(|| format!("reading {lib}"))?;
        entries.push(Entry::file(&rel, 0o755, data));
    }
    for d in dirs {
        if !entries.iter().any(|e| e.path == format!("{d}/")) {
            entries.push(Entry::dir(&d, 0o755));
        }
    }
    let mut spec = spec(image, entries, "memcached");
    spec.entrypoint = vec!["/usr/bin/memcached".into()];
    spec.user = Some("11211:11211".into());
    Ok(spec)
}

/// The shared libraries (and the loader) `ldd` lists for `binary`.
fn shared_libraries(binary: &str) -> Result<Vec<String>> {
    let out = cmd::output(Command::new("ldd").arg(binary))?;
    Ok(parse_ldd(&out))
}

fn parse_ldd(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| path.to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_paths() {
        assert_eq!(registry_path("busybox:latest"), "library/busybox:latest");
        assert_eq!(registry_path("docker.io/busybox:1"), "library/busybox:1");
        assert_eq!(registry_path("registry.k8s.io/pause:3.10"), "pause:3.10");
        assert_eq!(registry_path("ghcr.io/a/b:1"), "a/b:1");
        assert_eq!(registry_path("127.0.0.1:5000/x:1"), "x:1");
        assert_eq!(registry_path("someone/app:2"), "someone/app:2");
    }

    #[test]
    fn ldd_output() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibevent-2.1.so.7 => /lib/x86_64-linux-gnu/libevent-2.1.so.7 (0x1)\n\t/lib64/ld-linux-x86-64.so.2 (0x2)\n";
        assert_eq!(
            parse_ldd(out),
            [
                "/lib/x86_64-linux-gnu/libevent-2.1.so.7",
                "/lib64/ld-linux-x86-64.so.2"
            ]
        );
    }
}
