//! What the bench's SVG charts share: the canvas, its title, axes and legend, so that
//! each chart writes only its grid and lines.

use std::fmt::Write as _;

/// Canvas width.
pub(super) const W: f64 = 820.0;
/// Canvas height.
pub(super) const H: f64 = 440.0;
/// The plot's left edge.
pub(super) const LEFT: f64 = 60.0;
/// The plot's right edge (the legend is to its right).
pub(super) const RIGHT: f64 = 600.0;
/// The plot's top edge.
pub(super) const TOP: f64 = 40.0;
/// The plot's bottom edge.
pub(super) const BOTTOM: f64 = 380.0;
/// One color per line, in turn.
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];

/// The color of the `i`-th line.
pub(super) fn color(i: usize) -> &'static str {
    COLORS[i % COLORS.len()]
}

/// `s` as SVG text.
pub(super) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The opening of a chart titled `title`, on a white canvas.
pub(super) fn open(s: &mut String, title: &str) {
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        (LEFT + RIGHT) / 2.0,
        esc(title)
    );
}

/// The two axes and what they show.
pub(super) fn axes(s: &mut String, x_label: &str, y_label: &str) {
    let _ = writeln!(
        s,
        r#"<line x1="{LEFT}" y1="{BOTTOM}" x2="{RIGHT}" y2="{BOTTOM}" stroke="black"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{BOTTOM}" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (LEFT + RIGHT) / 2.0,
        BOTTOM + 36.0,
        esc(x_label)
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"#,
        (TOP + BOTTOM) / 2.0,
        (TOP + BOTTOM) / 2.0,
        esc(y_label)
    );
}

/// The `i`-th line's entry in the legend.
pub(super) fn legend(s: &mut String, i: usize, label: &str) {
    let ly = TOP + 10.0 + i as f64 * 20.0;
    let _ = writeln!(
        s,
        r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
        RIGHT + 20.0,
        RIGHT + 44.0,
        color(i),
        RIGHT + 50.0,
        ly + 4.0,
        esc(label)
    );
}

/// The closing of a chart.
pub(super) fn close(s: &mut String) {
    let _ = writeln!(s, "</svg>");
}
