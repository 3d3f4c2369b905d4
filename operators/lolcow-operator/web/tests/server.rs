//! Starts the real `lolcow-web` binary and checks what it serves.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::Server;

const CHROME_ACCEPT: &str =
    "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8";

#[test]
fn healthz_answers_ok() {
    let server = Server::start(Some("Hi"));
    let resp = server.get("/healthz", &[]);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, "ok");
    assert!(
        resp.header("content-type")
            .unwrap()
            .starts_with("text/plain")
    );
}

#[test]
fn the_probe_port_serves_healthz_and_nothing_else() {
    let server = Server::start(Some("Hi"));
    let resp = server.get_probe("/healthz");
    assert_eq!((resp.status, resp.body.as_str()), (200, "ok"));
    let page = server.get_probe("/");
    assert_eq!(page.status, 404, "the page is served on the probe port");
    assert!(!page.body.contains("Hi"), "{}", page.body);
    let log = server.log();
    assert!(
        log.lines()
            .any(|l| l.contains("serving /healthz for probes")
                && l.contains(&format!("127.0.0.1:{}", server.probe_port))),
        "{log}"
    );
}

#[test]
fn a_probe_port_equal_to_the_page_port_is_refused() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lolcow-web"))
        .args([
            "--listen",
            "127.0.0.1",
            "--port",
            "18081",
            "--probe-port",
            "18081",
        ])
        .env_remove("PORT")
        .env_remove("PROBE_PORT")
        .env_remove("BIND_ADDRESS")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--probe-port"), "{stderr}");
}

#[test]
fn browsers_get_the_html_page_with_the_escaped_greeting() {
    let server = Server::start(Some(r#"Moo <script>alert("hi")</script> & 'friends'"#));
    let resp = server.get(
        "/",
        &[("Accept", CHROME_ACCEPT), ("User-Agent", "Mozilla/5.0")],
    );
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let escaped = "Moo &lt;script&gt;alert(&quot;hi&quot;)&lt;/script&gt; &amp; &#39;friends&#39;";
    assert!(
        resp.body
            .contains(&format!(r#"id="greeting" class="greeting">{escaped}</p>"#)),
        "{}",
        resp.body
    );
    assert!(!resp.body.contains("<script"), "unescaped script tag");
    // The cow is drawn in the page too, bubble included.
    assert!(resp.body.contains(r"(__)\       )\/\"));
    assert!(
        resp.body
            .contains("/ Moo &lt;script&gt;alert(&quot;hi&quot;)&lt;/script&gt; &amp;")
    );
}

#[test]
fn text_plain_gets_the_plain_cow() {
    let server = Server::start(Some("Hello from the pasture"));
    let expected = concat!(
        " ________________________\n",
        "< Hello from the pasture >\n",
        " ------------------------\n",
        "        \\   ^__^\n",
        "         \\  (oo)\\_______\n",
        "            (__)\\       )\\/\\\n",
        "                ||----w |\n",
        "                ||     ||\n",
    );
    let resp = server.get("/", &[("Accept", "text/plain")]);
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(resp.body, expected);

    // curl's defaults: Accept: */* with a curl/ user agent.
    let resp = server.get("/", &[("Accept", "*/*"), ("User-Agent", "curl/8.5.0")]);
    assert_eq!(
        resp.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(resp.body, expected);

    // A browser-ish client sending */* gets HTML.
    let resp = server.get("/", &[("Accept", "*/*"), ("User-Agent", "Mozilla/5.0")]);
    assert_eq!(
        resp.header("content-type"),
        Some("text/html; charset=utf-8")
    );
}

#[test]
fn without_a_greeting_the_cow_tells_a_fortune() {
    let server = Server::start(None);
    let resp = server.get("/", &[("Accept", "text/plain")]);
    assert_eq!(resp.status, 200);
    let said: String = resp
        .body
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with(" -"))
        .map(|l| l[2..l.len() - 2].trim())
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        lolcow_web::fortune::FORTUNES.contains(&said.as_str()),
        "{said:?} is not a built-in fortune"
    );
}

#[test]
fn startup_is_logged_with_address_and_greeting() {
    let server = Server::start(Some("logged greeting"));
    let log = server.log();
    let line = log
        .lines()
        .find(|l| l.contains("lolcow-web listening"))
        .unwrap_or_else(|| panic!("no startup line in log:\n{log}"));
    assert!(
        line.contains(&format!("127.0.0.1:{}", server.port)),
        "{line}"
    );
    assert!(line.contains("logged greeting"), "{line}");
}

#[test]
fn unknown_paths_are_404() {
    let server = Server::start(Some("Hi"));
    assert_eq!(server.get("/nope", &[]).status, 404);
}

#[test]
fn sigterm_shuts_down_gracefully() {
    let mut server = Server::start(Some("bye"));
    let status = server
        .terminate(Duration::from_secs(10))
        .expect("server did not exit within 10s of SIGTERM");
    assert!(status.success(), "exit status {status}");
    assert!(server.log().contains("SIGTERM"), "{}", server.log());
}
