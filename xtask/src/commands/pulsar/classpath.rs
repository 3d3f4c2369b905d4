//! Java, Maven and the classpath of the broker, and its rendered configuration.

use super::*;
use xtask::{say, say_err};

/// `$JAVA_HOME/bin/java` when `JAVA_HOME` is set, else `java` from `PATH`.
pub(super) fn java_command() -> String {
    match std::env::var_os("JAVA_HOME").filter(|v| !v.is_empty()) {
        Some(home) => PathBuf::from(home).join("bin/java").display().to_string(),
        None => "java".to_string(),
    }
}

/// Fails with an install hint unless `java` is Java 17 or newer.
pub(super) fn check_java(java: &str) -> Result<()> {
    let out = Command::new(java)
        .arg("-version")
        .output()
        .with_context(|| {
            format!("running `{java} -version`: Java 17+ is needed ({INSTALL_HINT})")
        })?;
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    let major = text
        .split('"')
        .nth(1)
        .and_then(|v| {
            let mut parts = v.split(['.', '-', '+']);
            match parts.next()? {
                "1" => parts.next()?.parse::<u32>().ok(),
                m => m.parse::<u32>().ok(),
            }
        })
        .with_context(|| format!("cannot read the Java version from `{java} -version`: {text}"))?;
    if major < 17 {
        bail!(
            "Pulsar {PULSAR_VERSION} needs Java 17 or newer, `{java}` is Java {major} ({INSTALL_HINT})"
        );
    }
    Ok(())
}

/// FNV-1a of the pom, so that a changed pom re-resolves the classpath even
/// when the version (the cache key) stayed the same.
pub(super) fn fingerprint(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{PULSAR_VERSION}-{h:016x}")
}

/// Returns the directory with the broker's jars, resolving them with Maven
/// into the cache first if needed.
pub(super) fn ensure_classpath(dirs: &Dirs) -> Result<PathBuf> {
    let lib = dirs.lib();
    let marker = lib.join(".complete");
    let want = fingerprint(POM);
    if fs::read_to_string(&marker).is_ok_and(|m| m.trim() == want) {
        return Ok(lib);
    }

    match Command::new("mvn")
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => {}
        _ => bail!(
            "Maven (`mvn`) is needed once to assemble the Pulsar broker from Maven Central \
             ({INSTALL_HINT})"
        ),
    }
    fs::create_dir_all(&dirs.cache)
        .with_context(|| format!("creating {}", dirs.cache.display()))?;
    let pom = dirs.cache.join("pom.xml");
    fs::write(&pom, POM).with_context(|| format!("writing {}", pom.display()))?;
    let tmp = dirs.cache.join("lib.partial");
    remove_dir_if_exists(&tmp)?;
    let mvn_log = dirs.cache.join("mvn.log");
    let log = File::create(&mvn_log).with_context(|| format!("creating {}", mvn_log.display()))?;
    let log_err = log.try_clone().context("duplicating the log file handle")?;

    say!(
        "pulsar: resolving pulsar-broker {PULSAR_VERSION} with Maven (first time only, a few minutes)..."
    );
    let started = Instant::now();
    let mut child = Command::new("mvn")
        .args(["-B", "-q", "-f"])
        .arg(&pom)
        .arg(format!("-Dpulsar.version={PULSAR_VERSION}"))
        .arg("dependency:copy-dependencies")
        .arg("-DincludeScope=runtime")
        .arg(format!("-DoutputDirectory={}", tmp.display()))
        .current_dir(&dirs.cache)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .with_context(|| format!("starting mvn ({INSTALL_HINT})"))?;
    let mut next_note = Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for mvn")? {
            break status;
        }
        if started.elapsed() >= next_note {
            say!(
                "pulsar: still resolving ({}s)...",
                started.elapsed().as_secs()
            );
            next_note += Duration::from_secs(30);
        }
        sleep(Duration::from_millis(250));
    };
    if !status.success() {
        say_err!("{}", tail(&mvn_log, 40));
        bail!(
            "mvn failed ({status}) after {}s; full output in {}",
            started.elapsed().as_secs(),
            mvn_log.display()
        );
    }
    let main_jar = tmp.join(format!("pulsar-broker-{PULSAR_VERSION}.jar"));
    if !main_jar.is_file() {
        bail!(
            "mvn succeeded but {} is missing; see {}",
            main_jar.display(),
            mvn_log.display()
        );
    }
    remove_dir_if_exists(&lib)?;
    fs::rename(&tmp, &lib)
        .with_context(|| format!("moving {} to {}", tmp.display(), lib.display()))?;
    fs::write(&marker, format!("{want}\n"))
        .with_context(|| format!("writing {}", marker.display()))?;
    let jars = fs::read_dir(&lib)
        .map(|d| d.count().saturating_sub(1))
        .unwrap_or(0);
    say!(
        "pulsar: resolved {jars} jars in {:.0}s into {}",
        started.elapsed().as_secs_f64(),
        lib.display()
    );
    Ok(lib)
}

/// Our configuration with the ports xtask manages put in: every `key=value`
/// line of a managed key is replaced, keys the template lacks are appended.
pub(super) fn render_conf(template: &str, ports: &Ports, advertised: &str) -> String {
    let managed = [
        ("brokerServicePort", ports.broker.to_string()),
        ("webServicePort", ports.web.to_string()),
        ("advertisedAddress", advertised.to_owned()),
    ];
    let mut seen = [false; 3];
    let mut out = String::with_capacity(template.len() + 128);
    for line in template.lines() {
        let key = line.split_once('=').map(|(k, _)| k.trim());
        match managed.iter().position(|(k, _)| Some(*k) == key) {
            Some(i) if !line.trim_start().starts_with('#') => {
                out.push_str(&format!("{}={}\n", managed[i].0, managed[i].1));
                seen[i] = true;
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    for (i, (k, v)) in managed.iter().enumerate() {
        if !seen[i] {
            out.push_str(&format!("{k}={v}\n"));
        }
    }
    out
}

/// The address the broker names in its lookup answers: clients connect to
/// it after the first request. Beside the local cluster's real node it is the
/// node's bridge address, which pods reach and the host too (the node's
/// nftables rules forward both to the broker on 127.0.0.1); else 127.0.0.1.
pub(super) fn advertised_address() -> &'static str {
    if std::path::Path::new("/sys/class/net")
        .join(crate::commands::cluster::node::BRIDGE)
        .exists()
    {
        crate::commands::cluster::node::NODE_IP
    } else {
        "127.0.0.1"
    }
}

pub(super) fn bookie_port() -> Result<u16> {
    match std::env::var("XTASK_PULSAR_BOOKIE_PORT") {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .with_context(|| format!("XTASK_PULSAR_BOOKIE_PORT={v} is not a port number")),
        _ => Ok(DEFAULT_BOOKIE_PORT),
    }
}
