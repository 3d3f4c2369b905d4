//! The two ways to see the cow: an HTML page for browsers and plain text
//! for terminals, plus the content negotiation that picks between them.

use crate::cow::{DEFAULT_WIDTH, cowsay, escape_html};

/// Renders the cow saying `greeting` as plain text (ends with a newline).
pub fn render_text(greeting: &str) -> String {
    cowsay(greeting, DEFAULT_WIDTH)
}

/// Renders the full HTML page: a title, the greeting (in the element with
/// `id="greeting"`) and the cow saying it. Self-contained: inline CSS, no
/// scripts, fonts or other outside resources. Everything from `greeting` is
/// HTML-escaped.
pub fn render_html(greeting: &str) -> String {
    let greeting_html = escape_html(greeting.trim());
    let cow_html = escape_html(&render_text(greeting));
    format!(
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>lolcow</title>
<style>{STYLE}</style>
</head>
<body>
<main class="card">
<h1 class="title"><span class="lol">lol</span>cow</h1>
<p class="subtitle">today the cow says</p>
<p id="greeting" class="greeting">{greeting_html}</p>
<pre class="cow" aria-label="A cow saying the greeting in a speech bubble">{cow_html}</pre>
<footer class="footer">served fresh from the pasture by lolcow-web</footer>
</main>
</body>
</html>
"#
    )
}

/// The page's stylesheet: pastel and playful, system fonts only.
const STYLE: &str = r#"
:root { color-scheme: light; }
* { box-sizing: border-box; }
html, body { margin: 0; min-height: 100%; }
body {
  min-height: 100vh;
  display: flex;
  align-items: center;
  justify-content: center;
  padding: 2rem 1rem;
  font-family: "Trebuchet MS", "Segoe UI", system-ui, sans-serif;
  color: #4b3b5c;
  background:
    radial-gradient(circle at 12% 18%, rgba(255,255,255,.55) 0 3rem, transparent 3.1rem),
    radial-gradient(circle at 88% 78%, rgba(255,255,255,.45) 0 4.5rem, transparent 4.6rem),
    radial-gradient(circle at 80% 12%, rgba(255,255,255,.35) 0 2rem, transparent 2.1rem),
    linear-gradient(135deg, #ffd6e8 0%, #fff1c9 35%, #d5f5e3 65%, #d8e4ff 100%);
}
.card {
  max-width: min(46rem, 100%);
  padding: 2rem 2.5rem 1.5rem;
  background: rgba(255, 255, 255, .78);
  border: 3px dashed #f4a7c7;
  border-radius: 28px;
  box-shadow: 0 14px 40px rgba(120, 80, 140, .18);
  text-align: center;
}
.title {
  margin: 0;
  font-size: 3.2rem;
  letter-spacing: .06em;
  color: #6d5a8a;
}
.lol {
  background: linear-gradient(90deg, #ff7eb6, #ffb36b, #f7d94c, #6fd6a0, #6fb8ff, #b18cff);
  -webkit-background-clip: text;
  background-clip: text;
  color: transparent;
}
.subtitle {
  margin: .25rem 0 1rem;
  font-size: .95rem;
  text-transform: uppercase;
  letter-spacing: .2em;
  color: #a08bb8;
}
.greeting {
  margin: 0 auto 1.25rem;
  max-width: 36rem;
  font-size: 1.35rem;
  font-weight: bold;
  line-height: 1.4;
  white-space: pre-line;
  overflow-wrap: anywhere;
  color: #5a3f73;
}
.cow {
  display: inline-block;
  margin: 0;
  padding: 1.25rem 1.75rem;
  text-align: left;
  font-family: "DejaVu Sans Mono", "Menlo", "Consolas", ui-monospace, monospace;
  font-size: 1.15rem;
  line-height: 1.3;
  color: #3f3550;
  background: #fffdf6;
  border: 2px solid #cdeedd;
  border-radius: 18px;
  box-shadow: inset 0 0 0 4px #f3fbf7;
  overflow-x: auto;
  max-width: 100%;
  animation: bob 3s ease-in-out infinite;
}
@keyframes bob { 50% { transform: translateY(-4px) rotate(-.4deg); } }
@media (prefers-reduced-motion: reduce) { .cow { animation: none; } }
.footer { margin-top: 1.25rem; font-size: .85rem; color: #a797b8; }
"#;

/// Decides from the `Accept` and `User-Agent` request headers whether to
/// answer with plain text rather than HTML.
///
/// Plain text wins when the client prefers `text/plain` (by quality value,
/// or by naming it more specifically than `text/html`). When both are only
/// accepted through the same wildcard (such as `*/*`, or no `Accept` at all),
/// terminal clients (`curl/`, `Wget/`, `HTTPie/` user agents) get plain
/// text and everyone else gets HTML.
pub fn wants_plain_text(accept: Option<&str>, user_agent: Option<&str>) -> bool {
    let accept = match accept.map(str::trim) {
        Some(a) if !a.is_empty() => a,
        _ => "*/*",
    };
    let html = preference(accept, "text", "html");
    let plain = preference(accept, "text", "plain");
    match (html, plain) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(html), Some(plain)) => {
            if plain.quality != html.quality {
                plain.quality > html.quality
            } else if plain.quality <= 0.0 {
                false
            } else if plain.specificity != html.specificity {
                plain.specificity > html.specificity
            } else {
                is_terminal_client(user_agent)
            }
        }
    }
}

/// How much an `Accept` header wants one media type.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Preference {
    /// 2 for an exact `type/subtype`, 1 for `type/*`, 0 for `*/*`.
    specificity: u8,
    /// The `q` parameter (1 when absent).
    quality: f32,
}

/// The most specific range in `accept` that matches `ty/subtype`, if any.
fn preference(accept: &str, ty: &str, subtype: &str) -> Option<Preference> {
    let mut best: Option<Preference> = None;
    for range in accept.split(',') {
        let mut params = range.split(';');
        let media = params.next().unwrap_or_default().trim();
        let Some((t, s)) = media.split_once('/') else {
            continue;
        };
        let (t, s) = (t.trim(), s.trim());
        let specificity = if t.eq_ignore_ascii_case(ty) && s.eq_ignore_ascii_case(subtype) {
            2
        } else if t.eq_ignore_ascii_case(ty) && s == "*" {
            1
        } else if t == "*" && s == "*" {
            0
        } else {
            continue;
        };
        let quality = params
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
            .and_then(|(_, v)| v.trim().parse::<f32>().ok())
            .filter(|q| q.is_finite())
            .map_or(1.0, |q| q.clamp(0.0, 1.0));
        if best.is_none_or(|b| specificity > b.specificity) {
            best = Some(Preference {
                specificity,
                quality,
            });
        }
    }
    best
}

/// Whether the user agent is a command-line HTTP client.
fn is_terminal_client(user_agent: Option<&str>) -> bool {
    let Some(ua) = user_agent else {
        return false;
    };
    let ua = ua.trim_start().to_ascii_lowercase();
    ["curl/", "wget/", "httpie/"]
        .iter()
        .any(|prefix| ua.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIREFOX_ACCEPT: &str =
        "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8";
    const CHROME_UA: &str = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/120";

    #[test]
    fn browsers_get_html() {
        assert!(!wants_plain_text(Some(FIREFOX_ACCEPT), Some(CHROME_UA)));
        assert!(!wants_plain_text(Some(FIREFOX_ACCEPT), Some("curl/8.5.0")));
    }

    #[test]
    fn explicit_text_plain_gets_text() {
        assert!(wants_plain_text(Some("text/plain"), None));
        assert!(wants_plain_text(
            Some("TEXT/PLAIN; charset=utf-8"),
            Some(CHROME_UA)
        ));
        assert!(wants_plain_text(Some("text/plain, */*;q=0.5"), None));
        assert!(wants_plain_text(Some("text/plain, */*"), None));
        assert!(wants_plain_text(Some("text/html;q=0.5, text/plain"), None));
    }

    #[test]
    fn html_preferred_by_quality_wins() {
        assert!(!wants_plain_text(Some("text/plain;q=0.4, text/html"), None));
        assert!(!wants_plain_text(Some("text/html"), Some("curl/8.5.0")));
        assert!(!wants_plain_text(
            Some("text/*, text/plain;q=0"),
            Some("curl/8")
        ));
    }

    #[test]
    fn curl_with_wildcard_gets_text() {
        assert!(wants_plain_text(Some("*/*"), Some("curl/8.5.0")));
        assert!(wants_plain_text(None, Some("curl/7.88.1")));
        assert!(wants_plain_text(Some(""), Some("Wget/1.21")));
        assert!(wants_plain_text(Some("text/*"), Some("HTTPie/3.2.2")));
    }

    #[test]
    fn others_with_wildcard_get_html() {
        assert!(!wants_plain_text(Some("*/*"), Some(CHROME_UA)));
        assert!(!wants_plain_text(None, None));
        assert!(!wants_plain_text(Some("*/*"), Some("not-curl/1.0")));
    }

    #[test]
    fn unrelated_types_get_html() {
        assert!(!wants_plain_text(Some("application/json"), Some("curl/8")));
        assert!(!wants_plain_text(Some("garbage"), None));
    }

    #[test]
    fn text_has_the_cow() {
        let text = render_text("Moo!");
        assert!(text.starts_with(" ______\n< Moo! >\n"));
        assert!(text.contains("(oo)"));
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn html_has_the_greeting_in_its_element() {
        let html = render_html("Hello, pasture");
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains(r#"<p id="greeting" class="greeting">Hello, pasture</p>"#));
        assert!(html.contains("&lt; Hello, pasture &gt;"));
        assert!(html.contains("(oo)"));
    }

    #[test]
    fn html_escapes_everything_from_the_greeting() {
        let html = render_html(r#"<script>alert("x")</script> & 'quotes'"#);
        assert!(!html.contains("<script"));
        assert!(
            html.contains(
                "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;quotes&#39;"
            )
        );
    }

    #[test]
    fn html_uses_no_outside_resources() {
        let html = render_html("hi");
        for forbidden in ["http://", "https://", "<script", "<link", "@import", "url("] {
            assert!(!html.contains(forbidden), "page contains {forbidden}");
        }
    }
}
