//! Loads the page from the running binary in headless Chromium: the greeting
//! must be in the rendered DOM (escaped, inside `id="greeting"`), and a
//! screenshot is kept under `<target>/test-artifacts/lolcow-page.png`.
//!
//! Needs Chromium (`apt-get install -y chromium` on Debian). Without it this
//! test fails, unless `LOLCOW_SKIP_BROWSER=1` is set. `LOLCOW_CHROMIUM` can
//! name the browser binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Server, temp_path};

/// How long one Chromium run may take.
const BROWSER_DEADLINE: Duration = Duration::from_secs(90);

const GREETING: &str = r#"Moo & <b>hello</b> from "headless" Chromium!"#;

/// Finds the browser, or explains how to get one.
fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("LOLCOW_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    [
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ]
    .iter()
    .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
    .find(|candidate| candidate.is_file())
}

/// Runs Chromium headless with `args` then `url`, in a fresh profile,
/// killing it if it takes longer than the deadline.
fn run_chromium(browser: &Path, args: &[String], url: &str) -> Output {
    let profile = temp_path("chromium-profile");
    std::fs::create_dir_all(&profile).unwrap();
    let stdout_path = profile.with_extension("stdout");
    let stderr_path = profile.with_extension("stderr");
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", browser.display()));
    let deadline = Instant::now() + BROWSER_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium took longer than {BROWSER_DEADLINE:?}; stderr:\n{}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = Output {
        status,
        stdout: std::fs::read(&stdout_path).unwrap_or_default(),
        stderr: std::fs::read(&stderr_path).unwrap_or_default(),
    };
    let _ = std::fs::remove_dir_all(&profile);
    let _ = std::fs::remove_file(&stdout_path);
    let _ = std::fs::remove_file(&stderr_path);
    output
}

/// `<target>/test-artifacts`, next to cargo's `tmp` directory.
fn artifacts_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dir = tmp.parent().unwrap_or(tmp).join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The text inside the first element with `id="greeting"`.
fn greeting_element_text(dom: &str) -> Option<&str> {
    let start = dom.find(r#"id="greeting""#)?;
    let after_tag = start + dom[start..].find('>')? + 1;
    let end = after_tag + dom[after_tag..].find("</")?;
    Some(&dom[after_tag..end])
}

#[test]
fn chromium_shows_the_greeting() {
    let Some(browser) = chromium() else {
        if std::env::var("LOLCOW_SKIP_BROWSER").is_ok_and(|v| v == "1") {
            eprintln!("LOLCOW_SKIP_BROWSER=1: skipping the browser test");
            return;
        }
        panic!(
            "Chromium is needed for this test but was not found on PATH.\n\
             Install it with: apt-get update && apt-get install -y chromium\n\
             (or point LOLCOW_CHROMIUM at a Chromium/Chrome binary, \
             or set LOLCOW_SKIP_BROWSER=1 to skip this test)"
        );
    };
    let server = Server::start(Some(GREETING));
    let url = server.url();

    // 1. The rendered DOM has the greeting, escaped, in #greeting.
    let out = run_chromium(&browser, &["--dump-dom".to_owned()], &url);
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !dom.is_empty(),
        "chromium --dump-dom failed ({}); stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = greeting_element_text(&dom)
        .unwrap_or_else(|| panic!("no element with id=\"greeting\" in DOM:\n{dom}"));
    // Serialized DOM text escapes &, < and > (not quotes); no <b> element.
    assert_eq!(
        text,
        "Moo &amp; &lt;b&gt;hello&lt;/b&gt; from \"headless\" Chromium!"
    );
    assert!(!dom.contains("<b>"), "greeting markup was not escaped");
    assert!(dom.contains("(oo)"), "the cow is missing from the DOM");

    // 2. A screenshot, kept as a test artifact.
    let png = artifacts_dir().join("lolcow-page.png");
    let _ = std::fs::remove_file(&png);
    let out = run_chromium(
        &browser,
        &[
            format!("--screenshot={}", png.display()),
            "--window-size=1000,800".to_owned(),
        ],
        &url,
    );
    assert!(
        out.status.success(),
        "chromium --screenshot failed ({}); stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes =
        std::fs::read(&png).unwrap_or_else(|e| panic!("no screenshot at {}: {e}", png.display()));
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "screenshot is not a PNG"
    );
    assert!(bytes.len() > 10_000, "screenshot is suspiciously small");
    eprintln!("screenshot: {}", png.display());
}
