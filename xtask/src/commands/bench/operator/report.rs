//! The summary of every operator run under `target/bench/`:
//! `operators.md` (tables, targets) and `ready-over-time.svg` (objects Ready
//! over time after the create, one line per run).

use super::chart;
use super::procfs::mib;
use super::record::{Requests, RunRecord};
use crate::commands::bench::common::{out_dir, round3, table};
use crate::commands::bench::machine::Machine;
use anyhow::{Context, Result};
use serde::Deserialize;
use std::fmt::Write as _;
use std::fs;
use xtask::{say, say_err};

/// Idle RSS target, MiB.
const IDLE_TARGET_MIB: f64 = 10.0;
/// Peak RSS target with 1,000 PodSets of 3 replicas, MiB (the other kinds have none).
const PEAK_TARGET_MIB: f64 = 40.0;
/// Writes per object within this share above the minimum count as close to it.
const WRITES_TOLERANCE: f64 = 0.05;

/// The operator's name, `?` when the record has none.
fn operator(run: &RunRecord) -> &str {
    if run.operator.is_empty() {
        "?"
    } else {
        &run.operator
    }
}

/// `podset-100`, `podset-100 + 5000 stranger pods`, `podset-100 (Go original)`.
fn run_label(run: &RunRecord) -> String {
    let base = format!("{}-{}", operator(run), run.objects);
    let base = match run.stranger_pods {
        0 => base,
        m => format!("{base} + {m} stranger pods"),
    };
    let base = match run.namespace_count() {
        1 => base,
        k => format!("{base} in {k} namespaces"),
    };
    if is_go(run) {
        format!("{base} (Go original)")
    } else {
        base
    }
}

/// Whether the run is of the Go original (`--go-ref`).
pub(super) fn is_go(run: &RunRecord) -> bool {
    run.implementation == "go"
}

/// The operator column: `podset`, `podset (+5000 stranger pods)`, `podset (Go original)`.
fn operator_cell(run: &RunRecord) -> String {
    let base = match run.stranger_pods {
        0 => operator(run).to_owned(),
        m => format!("{} (+{m} stranger pods)", operator(run)),
    };
    let base = match run.namespace_count() {
        1 => base,
        k => format!("{base} (in {k} namespaces)"),
    };
    if is_go(run) {
        format!("{base} (Go original)")
    } else {
        base
    }
}

/// A number of seconds (or any fraction) as the JSON record writes it:
/// `2.0`, not `2`.
pub(super) fn float(x: f64) -> String {
    serde_json::Value::from(x).to_string()
}

/// One line for the console after a run.
pub(super) fn one_line(run: &RunRecord) -> String {
    format!(
        "    {}: idle {} MiB, peak {} MiB, all Ready {}s (p50 {}s, p99 {}s), {} requests/object, {} extra pods, {} quiet writes, CPU {}s{}",
        run_label(run),
        mib(run.startup.idle_rss_kib),
        mib(run.end.hwm_kib),
        float(run.create.all_ready_seconds),
        float(run.create.latency_p50_seconds),
        float(run.create.latency_p99_seconds),
        float(run.create.requests.per_object),
        run.pods.extra,
        run.steady.writes,
        float(run.end.cpu_seconds),
        run.reaction.as_ref().map_or(String::new(), |r| format!(
            ", reaction p50 {} ms to a child write, {} ms to the status",
            ms(r.child_write_p50_seconds),
            ms(r.status_p50_seconds)
        )),
    )
}

/// Seconds as whole milliseconds.
fn ms(seconds: f64) -> String {
    format!("{:.0}", seconds * 1000.0)
}

/// `p50 / p99` of a reaction, in milliseconds, or `-`.
fn reaction_cell(run: &RunRecord, status: bool) -> String {
    run.reaction.as_ref().map_or("-".to_owned(), |r| {
        if status {
            format!(
                "{} / {}",
                ms(r.status_p50_seconds),
                ms(r.status_p99_seconds)
            )
        } else {
            format!(
                "{} / {}",
                ms(r.child_write_p50_seconds),
                ms(r.child_write_p99_seconds)
            )
        }
    })
}

/// Every `target/bench/*.json` of an operator run, in the standard order.
fn runs() -> Result<Vec<RunRecord>> {
    /// Which benchmark a file is of.
    #[derive(Deserialize)]
    struct Benchmark {
        #[serde(default)]
        benchmark: String,
    }
    let dir = out_dir()?;
    let mut runs = Vec::new();
    for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        if !serde_json::from_str::<Benchmark>(&text).is_ok_and(|b| b.benchmark == "operator") {
            continue;
        }
        match serde_json::from_str::<RunRecord>(&text) {
            Ok(run) => runs.push(run),
            Err(e) => say_err!("bench: {} left out: {e}", path.display()),
        }
    }
    let order = |r: &RunRecord| {
        let i = xtask::support::operators::KINDS
            .iter()
            .position(|k| k.short == r.operator)
            .unwrap_or(9);
        (i, r.objects, r.stranger_pods, r.namespace_count(), is_go(r))
    };
    runs.sort_by_key(order);
    Ok(runs)
}

/// Requests by verb: `get pods: 2, list pods: 1`, or `-`.
fn by_verb(requests: &Requests) -> String {
    let parts: Vec<String> = requests
        .by_verb
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(", ")
    }
}

fn mark(ok: bool) -> &'static str {
    if ok { "met" } else { "**missed**" }
}

/// Writes `operators.md` and `ready-over-time.svg` from every run (with a Go original's
/// run, `side-by-side.md`; with a kind run at several N, `cost-curve.md` and
/// `memory-per-object.svg`); returns the Markdown of `operators.md`.
pub fn write_summary() -> Result<String> {
    let runs = runs()?;
    let dir = out_dir()?;
    let md = markdown(&runs);
    let md_path = dir.join("operators.md");
    fs::write(&md_path, &md).with_context(|| format!("writing {}", md_path.display()))?;
    if runs.iter().any(is_go) {
        let path = dir.join("side-by-side.md");
        fs::write(&path, side_by_side(&runs))
            .with_context(|| format!("writing {}", path.display()))?;
        say!("wrote {}", path.display());
    }
    let series = super::cost::series(&runs);
    if !series.is_empty() {
        let (md_path, svg_path) = (dir.join("cost-curve.md"), dir.join("memory-per-object.svg"));
        fs::write(&md_path, super::cost::markdown(&series))
            .with_context(|| format!("writing {}", md_path.display()))?;
        fs::write(&svg_path, super::cost::svg(&series))
            .with_context(|| format!("writing {}", svg_path.display()))?;
        say!("wrote {} and {}", md_path.display(), svg_path.display());
    }
    let svg_path = dir.join("ready-over-time.svg");
    fs::write(&svg_path, svg(&runs)).with_context(|| format!("writing {}", svg_path.display()))?;
    say!("wrote {} and {}", md_path.display(), svg_path.display());
    Ok(md)
}

fn markdown(runs: &[RunRecord]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Benchmark: the operators at scale\n");
    let _ = writeln!(
        md,
        "Each run: the operator's static release binary (the one its image ships) as a local process (its ServiceAccount's \
         token, through the bench's counting proxy; one fresh namespace watched, or `--namespaces K` with the objects spread over them), on the local cluster (`cargo xtask cluster up`: \
         real API server, kwok nodes). N objects are created at once, left alone for a quiet \
         window, changed, then deleted (`cargo xtask bench operator --operator <op> \
         --objects <N> --replicas 3`; the set below: `cargo xtask bench --all`).\n"
    );
    let _ = writeln!(md, "{}\n", Machine::probe().markdown());
    if let Some(machine) = runs.first().map(|r| &r.machine) {
        let _ = writeln!(
            md,
            "Runs recorded on: {} CPUs, {:.1} GiB, {}.\n",
            machine.nproc,
            machine.memory_kib as f64 / 1024.0 / 1024.0,
            if machine.cpu_model.is_empty() {
                "?"
            } else {
                &machine.cpu_model
            }
        );
    }
    table(
        &mut md,
        "| operator | N | pods | idle RSS MiB (anon) | peak RSS MiB | RSS after quiet MiB (anon) | threads | \
         all Ready s | p50 s | p99 s | requests/obj | writes/obj (min) | extra pods | \
         quiet writes (s) | restart s (writes) | KiB/obj | change s | delete s | CPU s | \
         reaction ms: child write p50 / p99 | reaction ms: status p50 / p99 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | \
         ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        runs.iter().map(run_row),
    );
    let _ = writeln!(
        md,
        "\n- RSS: `VmRSS` of `/proc/<pid>/status`; idle = 3 s after `/readyz` with no objects; \
         peak = `VmHWM` at the end of the run. Anon: `RssAnon` (heap and stacks); the rest of \
         RSS is mostly the executable's own (file-backed, shared, reclaimable) pages.\n\
         - All Ready: from the first create to every object `Ready` (condition `True` for its \
         current generation; the Go originals: `readyReplicas` equal to `spec.replicas` for \
         PodSet, `Available` for the current size for Memcached, and for Lolcow and \
         PulsarConsumer, which write no status worth reading, their Deployment rolled out at \
         the current spec (and Lolcow's Service on `spec.port`): each record's `readiness`) \
         with exactly the wanted pods, each pod `Ready`; p50/p99 per object, create request \
         to Ready.\n\
         - Reaction: one object at rest changed at a time (scaled up or down by one through \
         its scale subresource, as `kubectl scale` does; Lolcow: its greeting edited), 12 \
         rounds; from just before the change is sent to the operator's first write to that \
         object's children (a pod created or marked for deletion, a Deployment created or its \
         spec changed), and to the status showing the change done (Ready at the new spec; \
         the Go Lolcow and PulsarConsumer: their children showing it, as for all Ready). \
         Both ends are seen by the bench's own watches (the time each event reached the \
         bench).\n\
         - Requests and writes: the create phase (until all Ready), counted at the client \
         (kube-rs logs one debug event per HTTP request; `apiserver_request_total` has no \
         per-client label and the cluster is shared). Minimum writes: one create/apply per \
         child, the finalizer (Memcached), one status write per real change (created: \
         `Progressing`; then `Ready`) and one event per condition transition (two); met within \
         5 %.\n\
         - Extra pods: pods ever seen (a watch on the namespace) beyond N x replicas, before \
         the change. Quiet writes: writes during the window after convergence.\n\
         - Restart: with every object converged, the operator is stopped (SIGTERM) and \
         started again; seconds from the stop until `controller_runtime_reconcile_total` \
         reaches N (every object reconciled once), and the writes it made meanwhile (0 \
         expected). KiB/obj: RSS after the quiet window above idle RSS, per object.\n\
         - Change: every spec changed at once (replicas - 1; Lolcow: a new greeting) until \
         all Ready again; delete: every object deleted until no child is left.\n\
         - CPU: `utime + stime` of the operator over the whole run.\n\
         - `+M stranger pods`: the namespace also holds M pods that are nobody's, created \
         before the operator starts (`--stranger-pods M`). The operator watches only pods \
         labelled as its own, so the figures match the run without them.\n"
    );

    let _ = writeln!(md, "## Targets\n");
    table(
        &mut md,
        &format!(
            "| run | idle RSS <= {IDLE_TARGET_MIB} MiB | peak RSS <= {PEAK_TARGET_MIB} MiB (1,000 PodSets x 3) | 0 extra pods | 0 quiet writes | writes/obj close to the minimum |"
        ),
        "| --- | --- | --- | --- | --- | --- |",
        runs.iter().filter(|r| !is_go(r)).map(targets_row),
    );

    let _ = writeln!(md, "\n## Requests by verb\n");
    table(
        &mut md,
        "| run | startup | create phase | quiet window | change | delete |",
        "| --- | --- | --- | --- | --- | --- |",
        runs.iter().map(|r| {
            format!(
                "| {} | {} | {} | {} | {} | {} |",
                run_label(r),
                by_verb(&r.startup.requests),
                by_verb(&r.create.requests),
                by_verb(&r.steady.requests),
                by_verb(&r.change.requests),
                by_verb(&r.delete.requests),
            )
        }),
    );
    let _ = writeln!(
        md,
        "\nObjects Ready over time after the create: `ready-over-time.svg`.\n"
    );
    md
}

/// A run's row of the main table.
fn run_row(r: &RunRecord) -> String {
    format!(
        "| {} | {} | {} | {} ({}) | {} | {} ({}) | {} | {} | {} | {} | {} | {} ({}) | {} | {} ({}) | {} ({}) | {:.1} | {} | {} | {} | {} | {} |",
        operator_cell(r),
        r.objects,
        r.pods.desired,
        mib(r.startup.idle_rss_kib),
        mib(r.startup.idle_anon_kib),
        mib(r.end.hwm_kib),
        mib(r.steady.rss_kib),
        mib(r.steady.anon_kib),
        r.create.threads,
        float(r.create.all_ready_seconds),
        float(r.create.latency_p50_seconds),
        float(r.create.latency_p99_seconds),
        float(r.create.requests.per_object),
        float(r.create.requests.writes_per_object),
        r.minimum_writes_per_object,
        r.pods.extra,
        r.steady.writes,
        r.steady.window_seconds,
        // `-` for a run recorded before the restart phase existed.
        r.restart
            .as_ref()
            .map_or("-".to_owned(), |r| float(r.all_reconciled_seconds)),
        r.restart
            .as_ref()
            .map_or("-".to_owned(), |r| r.writes.to_string()),
        r.kib_per_object,
        r.change.all_ready_cell(),
        float(r.delete.children_gone_seconds),
        float(r.end.cpu_seconds),
        reaction_cell(r, false),
        reaction_cell(r, true),
    )
}

/// Each Go original's run beside the Rust operator's run of the same size, one column
/// each (the issue's table): what `target/bench/side-by-side.md` holds.
pub(super) fn side_by_side(runs: &[RunRecord]) -> String {
    let same = |a: &RunRecord, b: &RunRecord| {
        (
            a.operator.as_str(),
            a.objects,
            a.replicas,
            a.stranger_pods,
            a.namespace_count(),
        ) == (
            b.operator.as_str(),
            b.objects,
            b.replicas,
            b.stranger_pods,
            b.namespace_count(),
        )
    };
    let columns: Vec<&RunRecord> = runs
        .iter()
        .filter(|go| is_go(go))
        .filter_map(|go| {
            let rust = runs.iter().rev().find(|r| !is_go(r) && same(r, go))?;
            Some([rust, go])
        })
        .flatten()
        .collect();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Side by side: the Rust operators and the Go originals\n\n\
         Each pair measured in one `cargo xtask bench operator --operator <op> --objects <N> \
         --go-ref` (the Rust operator's static release binary, then the seed's Go original on \
         controller-runtime, each in a fresh namespace on the simulated nodes (or the same number of fresh ones with \
         `--namespaces K`), the same objects and phases). Both talk to the API server through the bench's counting proxy (loopback \
         HTTP/1.1 in, one HTTP/2 connection on to the API server), which counts their requests.\n"
    );
    if columns.is_empty() {
        let _ = writeln!(md, "No pair recorded yet.");
        return md;
    }
    let name = |r: &RunRecord| {
        let kind = xtask::support::operators::KINDS
            .iter()
            .find(|k| k.short == r.operator)
            .map_or(r.operator.as_str(), |k| k.kind);
        format!(
            "{} {kind} ({} x {}{})",
            if is_go(r) { "Go" } else { "Rust" },
            r.objects,
            r.replicas,
            match r.namespace_count() {
                1 => String::new(),
                k => format!(", {k} namespaces"),
            }
        )
    };
    let header = format!(
        "| | {} |",
        columns
            .iter()
            .map(|r| name(r))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let align = format!("| --- |{}", " ---: |".repeat(columns.len()));
    let row = |label: &str, cell: &dyn Fn(&RunRecord) -> String| {
        format!(
            "| {label} | {} |",
            columns
                .iter()
                .map(|r| cell(r))
                .collect::<Vec<_>>()
                .join(" | ")
        )
    };
    let rows = vec![
        row("idle / peak RSS, MiB", &|r| {
            format!("{} / {}", mib(r.startup.idle_rss_kib), mib(r.end.hwm_kib))
        }),
        row("all Ready, s", &|r| float(r.create.all_ready_seconds)),
        row("... their status / their pods, s", &|r| {
            format!(
                "{} / {}",
                float(r.create.objects_ready_seconds),
                float(r.create.pods_ready_seconds)
            )
        }),
        row("CPU, s (whole run)", &|r| float(r.end.cpu_seconds)),
        row("CPU until all Ready, s", &|r| {
            float(round3(r.startup.cpu_seconds + r.create.cpu_seconds))
        }),
        row("reconciles (create)", &|r| r.create.reconciles.to_string()),
        row("status writes (create)", &|r| {
            r.create.requests.status_writes().to_string()
        }),
        row("writes / requests (create)", &|r| {
            format!("{} / {}", r.create.requests.writes, r.create.requests.total)
        }),
        row("quiet writes / restart writes", &|r| {
            format!(
                "{} / {}",
                r.steady.writes,
                r.restart
                    .as_ref()
                    .map_or("-".to_owned(), |x| x.writes.to_string())
            )
        }),
        row("reaction to a child write p50 / p99, ms", &|r| {
            reaction_cell(r, false)
        }),
        row("reaction to the status p50 / p99, ms", &|r| {
            reaction_cell(r, true)
        }),
        row("change, all Ready again, s", &|r| r.change.all_ready_cell()),
        row("commit", &|r| r.git_commit.clone().unwrap_or_default()),
    ];
    table(&mut md, &header, &align, rows);
    // What Ready was read from, where a column's record says.
    let mut notes: Vec<String> = Vec::new();
    for r in &columns {
        let note = format!("- {}: Ready read from {}.", name(r), r.readiness);
        if !r.readiness.is_empty() && !notes.contains(&note) {
            notes.push(note);
        }
    }
    if !notes.is_empty() {
        let _ = writeln!(md, "\n{}", notes.join("\n"));
    }
    md
}

/// A run's row of the targets table.
fn targets_row(r: &RunRecord) -> String {
    let idle = mib(r.startup.idle_rss_kib);
    let peak = mib(r.end.hwm_kib);
    let peak_cell = if r.objects >= 1000 && r.operator == "podset" && r.replicas == 3 {
        format!("{} ({peak})", mark(peak <= PEAK_TARGET_MIB))
    } else {
        format!("n/a ({peak})")
    };
    let writes = r.create.requests.writes_per_object;
    let min = r.minimum_writes_per_object as f64;
    format!(
        "| {} | {} ({idle}) | {peak_cell} | {} | {} | {} ({writes} vs {min}) |",
        run_label(r),
        mark(idle <= IDLE_TARGET_MIB),
        mark(r.pods.extra == 0),
        mark(r.steady.writes == 0),
        mark(min > 0.0 && writes <= min * (1.0 + WRITES_TOLERANCE)),
    )
}

/// A tick step giving at most about 8 ticks over `max`.
pub(super) fn tick_step(max: f64) -> f64 {
    [
        1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    ]
    .into_iter()
    .find(|s| max / s <= 8.0)
    .unwrap_or(1200.0)
}

/// Percent of objects Ready against seconds since the create, one step line
/// per run.
fn svg(runs: &[RunRecord]) -> String {
    use super::chart::{BOTTOM, LEFT, RIGHT, TOP};
    let curves: Vec<(String, Vec<f64>)> = runs
        .iter()
        .map(|r| {
            let label = format!("{} N={}", operator(r), r.objects);
            (label, r.create.ready_curve_seconds.clone())
        })
        .collect();
    let max_t = curves
        .iter()
        .filter_map(|(_, t)| t.last().copied())
        .fold(1.0_f64, f64::max);
    let step = tick_step(max_t);
    let x_max = (max_t / step).ceil() * step;
    let x = |t: f64| LEFT + t / x_max * (RIGHT - LEFT);
    let y = |pct: f64| BOTTOM - pct / 100.0 * (BOTTOM - TOP);

    let mut s = String::new();
    chart::open(&mut s, "Objects Ready after creating N at once");
    // Grid, ticks and labels.
    for i in 0..=4 {
        let pct = f64::from(i) * 25.0;
        let yy = y(pct);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy}" x2="{RIGHT}" y2="{yy}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{pct}%</text>"##,
            LEFT - 6.0,
            yy + 4.0
        );
    }
    let mut t = 0.0;
    while t <= x_max + 1e-9 {
        let xx = x(t);
        let _ = writeln!(
            s,
            r##"<line x1="{xx}" y1="{TOP}" x2="{xx}" y2="{BOTTOM}" stroke="#eee"/><text x="{xx}" y="{}" text-anchor="middle">{t}</text>"##,
            BOTTOM + 16.0
        );
        t += step;
    }
    chart::axes(
        &mut s,
        "seconds since the first create",
        "objects Ready (% of N)",
    );
    // One step line per run, and the legend.
    for (i, (label, times)) in curves.iter().enumerate() {
        let n = times.len().max(1) as f64;
        let mut points = vec![format!("{:.1},{:.1}", x(0.0), y(0.0))];
        for (k, t) in times.iter().enumerate() {
            points.push(format!("{:.1},{:.1}", x(*t), y(k as f64 / n * 100.0)));
            points.push(format!("{:.1},{:.1}", x(*t), y((k + 1) as f64 / n * 100.0)));
        }
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            chart::color(i),
            points.join(" ")
        );
        chart::legend(&mut s, i, label);
    }
    chart::close(&mut s);
    s
}

#[cfg(test)]
mod tests {
    use super::super::record::tests::SAMPLE;
    use super::*;
    use serde_json::json;

    #[test]
    fn ticks() {
        assert_eq!(tick_step(5.0), 1.0);
        assert_eq!(tick_step(30.0), 5.0);
        assert_eq!(tick_step(200.0), 30.0);
    }

    #[test]
    fn svg_has_one_line_per_run() -> Result<()> {
        let runs: Vec<RunRecord> = vec![
            serde_json::from_value(
                json!({"operator": "podset", "objects": 2, "create": {"ready_curve_seconds": [1.0, 2.5]}}),
            )?,
            serde_json::from_value(
                json!({"operator": "a<b", "objects": 1, "create": {"ready_curve_seconds": []}}),
            )?,
        ];
        let s = svg(&runs);
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains("a&lt;b N=1"));
        assert!(s.trim_end().ends_with("</svg>"));
        Ok(())
    }

    #[test]
    fn rows_of_a_recorded_run() -> Result<()> {
        let run: RunRecord = serde_json::from_str(SAMPLE)?;
        let older = RunRecord {
            restart: None,
            reaction: None,
            implementation: String::new(),
            ..run.clone()
        };
        let md = markdown(&[run.clone(), older]);
        let rows = [
            "| podset (+5000 stranger pods) | 10 | 30 | 7 (1) | 21 | 14.6 (2.9) | 5 | 4.321 | 1.5 | 3.0 | 7.0 | 7.0 (7) | 0 | 0 (10) | 1.0 (0) | 123.5 | 2.0 | 1.5 | 1.234 | 21 / 34 | 112 / 150 |",
            "| podset (+5000 stranger pods) | 10 | 30 | 7 (1) | 21 | 14.6 (2.9) | 5 | 4.321 | 1.5 | 3.0 | 7.0 | 7.0 (7) | 0 | 0 (10) | - (-) | 123.5 | 2.0 | 1.5 | 1.234 | - | - |",
            "| podset-10 + 5000 stranger pods | met (7) | n/a (21) | met | met | met (7 vs 7) |",
            "| podset-10 + 5000 stranger pods | list podsets: 1, watch podsets: 1 | create events: 20, create pods: 30, patch podsets/status: 20 | - | create pods: 3, delete pods: 10 | - |",
            "Runs recorded on: 2 CPUs, 8.0 GiB, Test CPU.",
            "| run | idle RSS <= 10 MiB | peak RSS <= 40 MiB (1,000 PodSets x 3) | 0 extra pods | 0 quiet writes | writes/obj close to the minimum |",
        ];
        for row in rows {
            assert!(md.lines().any(|l| l == row), "no row {row} in\n{md}");
        }
        assert_eq!(
            one_line(&run),
            "    podset-10 + 5000 stranger pods: idle 7 MiB, peak 21 MiB, all Ready 4.321s (p50 1.5s, p99 3.0s), 7.0 requests/object, 0 extra pods, 0 quiet writes, CPU 1.234s, reaction p50 21 ms to a child write, 112 ms to the status"
        );
        Ok(())
    }

    #[test]
    fn the_go_original_beside_the_rust_run_of_the_same_size() -> Result<()> {
        let rust: RunRecord = serde_json::from_str(SAMPLE)?;
        let go = RunRecord {
            implementation: "go".to_owned(),
            reaction: None,
            ..rust.clone()
        };
        let other_size = RunRecord {
            objects: 11,
            ..go.clone()
        };
        let md = side_by_side(&[rust.clone(), go.clone(), other_size]);
        let rows = [
            "| | Rust PodSet (10 x 3) | Go PodSet (10 x 3) |",
            "| idle / peak RSS, MiB | 7 / 21 | 7 / 21 |",
            "| status writes (create) | 20 | 20 |",
            "| reaction to a child write p50 / p99, ms | 21 / 34 | - |",
        ];
        for row in rows {
            assert!(md.lines().any(|l| l == row), "no row {row} in\n{md}");
        }
        // The Go run has its own row in the main table, and none among the targets.
        let main = markdown(&[rust.clone(), go]);
        assert!(main.contains("| podset (+5000 stranger pods) (Go original) | 10 |"));
        assert_eq!(
            main.matches("| podset-10 + 5000 stranger pods | met")
                .count(),
            1
        );
        assert!(side_by_side(&[]).contains("No pair recorded yet."));
        // What each column read Ready from, when its record says.
        let lolcow = RunRecord {
            operator: "lolcow".to_owned(),
            readiness: "its children".to_owned(),
            ..rust.clone()
        };
        let lolcow_go = RunRecord {
            implementation: "go".to_owned(),
            readiness: "its Deployment".to_owned(),
            ..lolcow.clone()
        };
        let md = side_by_side(&[lolcow, lolcow_go]);
        for row in [
            "| | Rust Lolcow (10 x 3) | Go Lolcow (10 x 3) |",
            "- Rust Lolcow (10 x 3): Ready read from its children.",
            "- Go Lolcow (10 x 3): Ready read from its Deployment.",
        ] {
            assert!(md.lines().any(|l| l == row), "no row {row} in\n{md}");
        }
        Ok(())
    }
}
