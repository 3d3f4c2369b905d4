//! How the cost of one operator grows with the number of objects: every series of runs of
//! one kind, replica count and implementation at several N (no stranger pods, one
//! namespace), as a table (`cost-curve.md`) and a chart of memory per object against N
//! (`memory-per-object.svg`, N on a logarithmic axis).

use super::chart::{self, BOTTOM, LEFT, RIGHT, TOP};
use super::procfs::mib;
use super::record::RunRecord;
use super::report::{float, is_go, tick_step};
use crate::commands::bench::common::{round3, table};
use std::fmt::Write as _;

/// The runs of one kind, replica count and implementation, by N (at least two N).
pub(super) struct Series<'a> {
    /// `podset x 1, Rust` or `podset x 1, Go original`.
    pub label: String,
    /// Its runs, by N ascending (the newest run of each N).
    pub runs: Vec<&'a RunRecord>,
}

/// Every series of `runs` with two N or more.
pub(super) fn series(runs: &[RunRecord]) -> Vec<Series<'_>> {
    let mut out: Vec<Series<'_>> = Vec::new();
    let alike = |a: &RunRecord, b: &RunRecord| {
        (a.operator.as_str(), a.replicas, is_go(a)) == (b.operator.as_str(), b.replicas, is_go(b))
    };
    let plain = runs
        .iter()
        .filter(|r| r.stranger_pods == 0 && r.namespace_count() == 1);
    for run in plain.clone() {
        if out.iter().any(|s| alike(s.runs[0], run)) {
            continue;
        }
        let mut members: Vec<&RunRecord> = Vec::new();
        for r in plain.clone().filter(|r| alike(r, run)) {
            match members.iter_mut().find(|m| m.objects == r.objects) {
                Some(m) if m.unix_time < r.unix_time => *m = r,
                Some(_) => {}
                None => members.push(r),
            }
        }
        members.sort_by_key(|r| r.objects);
        out.push(Series {
            label: format!(
                "{} x {}, {}",
                run.operator,
                run.replicas,
                if is_go(run) { "Go original" } else { "Rust" }
            ),
            runs: members,
        });
    }
    out.retain(|s| s.runs.len() >= 2);
    out
}

/// The table of every series: one row per run.
pub(super) fn markdown(series: &[Series<'_>]) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# How the cost grows with N\n\n\
         Each run of one kind at one replica count measured at several N (`cargo xtask bench \
         operator --objects N --replicas R`, `--go-ref` for the Go original beside it). Memory \
         per object is the resident memory after the quiet window above idle, divided by N; \
         `memory-per-object.svg` draws it against N.\n"
    );
    if series.is_empty() {
        let _ = writeln!(md, "No kind measured at two N yet.");
        return md;
    }
    let header = "| series | N | idle / peak / after the quiet window, MiB | KiB per object | all Ready, s (p50) | CPU until all Ready / whole run, s | requests per object (create) | restart: all reconciled, s (writes; new process, MiB) | quiet writes | commit |";
    let align = "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |";
    let rows = series.iter().flat_map(|s| {
        s.runs.iter().map(|r| {
            format!(
                "| {} | {} | {} / {} / {} | {:.1} | {} ({}) | {} / {} | {} | {} | {} | {} |",
                s.label,
                r.objects,
                mib(r.startup.idle_rss_kib),
                mib(r.end.hwm_kib),
                mib(r.steady.rss_kib),
                r.kib_per_object,
                float(r.create.all_ready_seconds),
                float(r.create.latency_p50_seconds),
                float(round3(r.startup.cpu_seconds + r.create.cpu_seconds)),
                float(r.end.cpu_seconds),
                float(r.create.requests.per_object),
                r.restart.as_ref().map_or("-".to_owned(), |x| format!(
                    "{} ({}; {})",
                    float(x.all_reconciled_seconds),
                    x.writes,
                    mib(x.rss_kib)
                )),
                r.steady.writes,
                r.git_commit.clone().unwrap_or_default(),
            )
        })
    });
    table(&mut md, header, align, rows);
    md
}

/// Memory per object above idle against N (logarithmic), one line per series.
pub(super) fn svg(series: &[Series<'_>]) -> String {
    let all = || series.iter().flat_map(|s| s.runs.iter());
    let n_min = all()
        .map(|r| f64::from(r.objects.max(1)))
        .fold(f64::MAX, f64::min);
    let n_max = all()
        .map(|r| f64::from(r.objects.max(1)))
        .fold(1.0, f64::max);
    let (lo, hi) = if n_min < n_max {
        (n_min.log10(), n_max.log10())
    } else {
        (n_min.log10() - 0.5, n_min.log10() + 0.5)
    };
    let kib_max = all().map(|r| r.kib_per_object).fold(1.0, f64::max);
    let step = tick_step(kib_max);
    let y_max = (kib_max / step).ceil() * step;
    // A little room either side of the smallest and largest N.
    let pad = (hi - lo) * 0.05;
    let x = |n: f64| LEFT + (n.log10() - lo + pad) / (hi - lo + 2.0 * pad) * (RIGHT - LEFT);
    let y = |kib: f64| BOTTOM - kib / y_max * (BOTTOM - TOP);

    let mut s = String::new();
    chart::open(
        &mut s,
        "Memory per object above idle, after the quiet window",
    );
    let mut kib = 0.0;
    while kib <= y_max + 1e-9 {
        let yy = y(kib);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{RIGHT}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{kib}</text>"##,
            LEFT - 6.0,
            yy + 4.0
        );
        kib += step;
    }
    // A tick at each N measured.
    let mut ns: Vec<u32> = all().map(|r| r.objects).collect();
    ns.sort_unstable();
    ns.dedup();
    for n in ns {
        let xx = x(f64::from(n.max(1)));
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{BOTTOM}" stroke="#eee"/><text x="{xx:.1}" y="{}" text-anchor="middle">{n}</text>"##,
            BOTTOM + 16.0
        );
    }
    chart::axes(&mut s, "objects (N, logarithmic)", "KiB per object");
    for (i, one) in series.iter().enumerate() {
        let color = chart::color(i);
        let points: Vec<(f64, f64)> = one
            .runs
            .iter()
            .map(|r| (x(f64::from(r.objects.max(1))), y(r.kib_per_object)))
            .collect();
        let line: Vec<String> = points
            .iter()
            .map(|(px, py)| format!("{px:.1},{py:.1}"))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            line.join(" ")
        );
        for (r, (px, py)) in one.runs.iter().zip(&points) {
            let _ = writeln!(
                s,
                r#"<circle cx="{px:.1}" cy="{py:.1}" r="3.5" fill="{color}"/><text x="{px:.1}" y="{:.1}" text-anchor="middle" fill="{color}">{:.1}</text>"#,
                py - 8.0,
                r.kib_per_object
            );
        }
        chart::legend(&mut s, i, &one.label);
    }
    chart::close(&mut s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Result;
    use serde_json::json;

    fn run(implementation: &str, objects: u32, kib: f64, unix_time: u64) -> Result<RunRecord> {
        Ok(serde_json::from_value(json!({
            "operator": "podset",
            "implementation": implementation,
            "objects": objects,
            "replicas": 1,
            "unix_time": unix_time,
            "kib_per_object": kib,
            "startup": {"idle_rss_kib": 9216},
            "steady": {"rss_kib": 9216 + 1024},
        }))?)
    }

    #[test]
    fn a_series_per_kind_replicas_and_implementation_at_two_n_or_more() -> Result<()> {
        let runs = vec![
            run("rust", 10_000, 5.3, 1)?,
            run("rust", 1000, 7.9, 1)?,
            // The newer run of an N replaces the older one.
            run("rust", 1000, 7.5, 2)?,
            run("go", 1000, 26.7, 1)?,
            run("go", 30_000, 20.0, 1)?,
            // One N only: no series.
            RunRecord {
                replicas: 3,
                ..run("rust", 1000, 12.0, 1)?
            },
            // Stranger pods or several namespaces measure something else.
            RunRecord {
                stranger_pods: 5000,
                ..run("rust", 100, 50.0, 1)?
            },
        ];
        let all = series(&runs);
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].label, "podset x 1, Rust");
        let objects: Vec<(u32, f64)> = all[0]
            .runs
            .iter()
            .map(|r| (r.objects, r.kib_per_object))
            .collect();
        assert_eq!(objects, vec![(1000, 7.5), (10_000, 5.3)]);
        assert_eq!(all[1].label, "podset x 1, Go original");

        let md = markdown(&all);
        assert!(
            md.lines()
                .any(|l| l.starts_with("| podset x 1, Go original | 30000 | 9 / 0 / 10 | 20.0 |")),
            "{md}"
        );
        let chart = svg(&all);
        assert_eq!(chart.matches("<polyline").count(), 2);
        assert_eq!(chart.matches("<circle").count(), 4);
        assert!(chart.contains(">30000</text>"));
        assert!(chart.trim_end().ends_with("</svg>"));
        assert!(markdown(&[]).contains("No kind measured at two N yet."));
        Ok(())
    }
}
