//! The broker's directories, its state file (pid and ports) and the lock that serialises `up`.

use super::*;
use xtask::say;

/// The cache (classpath) and state (pid, log, data) directories.
pub(super) struct Dirs {
    /// `<cache>/rust-operators/pulsar/<version>`.
    pub(super) cache: PathBuf,
    /// `<state>/rust-operators/pulsar`.
    pub(super) state: PathBuf,
}

impl Dirs {
    pub(super) fn new() -> Result<Self> {
        let home = || -> Result<PathBuf> {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(PathBuf::from)
                .context("HOME is not set; cannot choose the cache and state directories")
        };
        let xdg = |var: &str, fallback: &str| -> Result<PathBuf> {
            match std::env::var_os(var).filter(|v| !v.is_empty()) {
                Some(v) => Ok(PathBuf::from(v)),
                None => Ok(home()?.join(fallback)),
            }
        };
        Ok(Self {
            cache: xdg("XDG_CACHE_HOME", ".cache")?
                .join("rust-operators/pulsar")
                .join(PULSAR_VERSION),
            state: xdg("XDG_STATE_HOME", ".local/state")?.join("rust-operators/pulsar"),
        })
    }
    pub(super) fn lib(&self) -> PathBuf {
        self.cache.join("lib")
    }
    pub(super) fn data(&self) -> PathBuf {
        self.state.join("data")
    }
    pub(super) fn log(&self) -> PathBuf {
        self.state.join("pulsar.log")
    }
    pub(super) fn pid_file(&self) -> PathBuf {
        self.state.join("pulsar.pid")
    }
    pub(super) fn ports_file(&self) -> PathBuf {
        self.state.join("pulsar.ports")
    }
}

/// The three ports the broker listens on (all on 127.0.0.1).
#[derive(Debug, Clone, Copy)]
pub(super) struct Ports {
    pub(super) broker: u16,
    pub(super) web: u16,
    pub(super) bookie: u16,
}

/// What `up` recorded about the broker it started.
pub(super) struct State {
    pub(super) pid: u32,
    pub(super) ports: Ports,
}

impl State {
    pub(super) fn read(dirs: &Dirs) -> Result<Option<Self>> {
        if !dirs.pid_file().exists() {
            return Ok(None);
        }
        let Some(pid) = process_group::read_pid(&dirs.pid_file()) else {
            State::remove(dirs);
            return Ok(None);
        };
        let text = fs::read_to_string(dirs.ports_file()).unwrap_or_default();
        let mut ports = Ports {
            broker: PulsarOptions::default().broker_port,
            web: PulsarOptions::default().web_port,
            bookie: DEFAULT_BOOKIE_PORT,
        };
        for line in text.lines() {
            if let Some((k, v)) = line.split_once('=') {
                let Ok(v) = v.trim().parse::<u16>() else {
                    continue;
                };
                match k.trim() {
                    "broker" => ports.broker = v,
                    "web" => ports.web = v,
                    "bookie" => ports.bookie = v,
                    _ => {}
                }
            }
        }
        Ok(Some(Self { pid, ports }))
    }

    pub(super) fn write(&self, dirs: &Dirs) -> Result<()> {
        let p = &self.ports;
        fs::write(
            dirs.ports_file(),
            format!("broker={}\nweb={}\nbookie={}\n", p.broker, p.web, p.bookie),
        )
        .with_context(|| format!("writing {}", dirs.ports_file().display()))?;
        process_group::write_pid(&dirs.pid_file(), self.pid)
    }

    pub(super) fn remove(dirs: &Dirs) {
        let _ = fs::remove_file(dirs.pid_file());
        let _ = fs::remove_file(dirs.ports_file());
    }
}

/// Serialises concurrent `up` calls (two test binaries, two shells) with a
/// lock file holding the owner's pid; a lock left by a dead process is taken
/// over.
pub(super) struct Lock(pub(super) PathBuf);

impl Lock {
    pub(super) fn acquire(path: &Path) -> Result<Self> {
        let deadline = Instant::now() + Duration::from_secs(900);
        let mut told = false;
        loop {
            match OpenOptions::new().write(true).create_new(true).open(path) {
                Ok(mut f) => {
                    let _ = writeln!(f, "{}", std::process::id());
                    return Ok(Self(path.to_path_buf()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let owner = fs::read_to_string(path)
                        .ok()
                        .and_then(|s| s.trim().parse::<u32>().ok());
                    match owner {
                        Some(pid) if process_group::alive(pid) => {}
                        // Dead owner, or the owner has not written its pid
                        // yet: only take over a lock that is a few seconds old.
                        _ => {
                            let old = fs::metadata(path)
                                .and_then(|m| m.modified())
                                .ok()
                                .and_then(|t| t.elapsed().ok())
                                .is_none_or(|age| age > Duration::from_secs(5));
                            if owner.is_some() || old {
                                let _ = fs::remove_file(path);
                                continue;
                            }
                        }
                    }
                    if !told {
                        say!("pulsar: another `up` is in progress; waiting for it");
                        told = true;
                    }
                    if Instant::now() > deadline {
                        bail!("timed out waiting for the lock {}", path.display());
                    }
                    sleep(Duration::from_millis(500));
                }
                Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
            }
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}
