//! A run's report: the verdict of every property, counts, the seed, a timeline chart
//! (faults, membership, jobs) and a latency chart, drawn with plotters as SVG; for every
//! violation the smallest window of history that shows it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use crate::checker::Verdict;
use crate::history::{Entry, Op, Record};

/// Seconds since the history's first line.
fn secs(h: &[Record], t: u64) -> f64 {
    let t0 = h.first().map(|r| r.t_us).unwrap_or(0);
    t.saturating_sub(t0) as f64 / 1e6
}

fn op_kind(op: &Op) -> String {
    match op {
        Op::Job { shape, .. } => format!("job ({shape})"),
        Op::KillJob { .. } => "job kill".into(),
        Op::Grow { requester, .. } => {
            format!("grow{}", if *requester { " (palloc)" } else { " (pctl)" })
        }
        Op::Shrink { requester, .. } => {
            format!("shrink{}", if *requester { " (palloc)" } else { " (pctl)" })
        }
        Op::Notify { range, .. } => format!("notify {range}"),
    }
}

fn fault_kind(e: &Entry) -> Option<&'static str> {
    use crate::history::Fault::*;
    match e {
        Entry::Fault { fault, .. } => Some(match fault {
            Kill { late: false, .. } => "kill",
            Kill { late: true, .. } => "kill, late boot",
            Freeze { .. } => "freeze",
            Partition { one_way: false, .. } => "partition",
            Partition { one_way: true, .. } => "partition one way",
            Impair { .. } => "impaired link",
            ControllerRestart { .. } => "controller restart",
            LaunchFailure { .. } => "launch failure",
        }),
        _ => None,
    }
}

/// Operations by kind: (invoked, completed with exit 0, latencies in seconds).
type OpStats = BTreeMap<String, (usize, usize, Vec<(f64, f64)>)>;

fn op_stats(h: &[Record]) -> OpStats {
    let mut inv: BTreeMap<u64, (String, u64)> = BTreeMap::new();
    let mut stats: OpStats = BTreeMap::new();
    for r in h {
        match &r.entry {
            Entry::Invoke { op, what, .. } => {
                let k = op_kind(what);
                stats.entry(k.clone()).or_default().0 += 1;
                inv.insert(*op, (k, r.t_us));
            }
            Entry::Complete { op, exit, .. } => {
                if let Some((k, t)) = inv.get(op) {
                    let s = stats.entry(k.clone()).or_default();
                    if *exit == Some(0) {
                        s.1 += 1;
                    }
                    s.2.push((secs(h, r.t_us), (r.t_us - t) as f64 / 1e6));
                }
            }
            _ => {}
        }
    }
    stats
}

/// Writes `report.md`, `timeline.svg` and `latency.svg` into `dir`; returns the report.
pub fn write(dir: &Path, h: &[Record], verdicts: &[Verdict]) -> Result<String, String> {
    let mut md = String::new();
    let (seed, backend, initial, spares, dur, fault) = h
        .iter()
        .find_map(|r| match &r.entry {
            Entry::Meta {
                seed,
                backend,
                initial,
                spares,
                duration_s,
                runtime_fault,
                ..
            } => Some((
                *seed,
                backend.clone(),
                initial.len(),
                spares.len(),
                *duration_s,
                runtime_fault.clone(),
            )),
            _ => None,
        })
        .unwrap_or_default();
    let bad: usize = verdicts.iter().map(|v| v.violations.len()).sum();
    let _ = writeln!(
        md,
        "# Soak report\n\nSeed **{seed}**, {initial} nodes and {spares} spare hosts ({backend}), {dur} s of workload and faults; {} history lines. **{}**.\n",
        h.len(),
        if bad == 0 { "No violation".to_string() } else { format!("{bad} violations") }
    );
    if let Some(f) = fault {
        let _ = writeln!(
            md,
            "The runtime was **broken on purpose** (`dvmlab_test_elastic_fault {f}`): this run shows the checker catching it.\n"
        );
    }
    let _ = writeln!(
        md,
        "| property | verdict | checked | violations | what it promises |\n|---|---|---:|---:|---|"
    );
    for v in verdicts {
        let _ = writeln!(
            md,
            "| `{}` | {} | {} | {} | {} |",
            v.property,
            v.verdict(),
            v.checked,
            v.violations.len(),
            v.claim
        );
    }
    let stats = op_stats(h);
    let _ = writeln!(md, "\n## Operations\n\n| operation | invoked | exit 0 | median latency (s) | max (s) |\n|---|---:|---:|---:|---:|");
    for (k, (n, ok, lat)) in &stats {
        let mut l: Vec<f64> = lat.iter().map(|x| x.1).collect();
        l.sort_by(|a, b| a.total_cmp(b));
        let med = l.get(l.len() / 2).copied().unwrap_or(0.0);
        let max = l.last().copied().unwrap_or(0.0);
        let _ = writeln!(md, "| {k} | {n} | {ok} | {med:.2} | {max:.2} |");
    }
    let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
    for r in h {
        if let (Some(k), Entry::Fault { start: true, .. }) = (fault_kind(&r.entry), &r.entry) {
            *faults.entry(k).or_default() += 1;
        }
    }
    let count = |f: &dyn Fn(&Entry) -> bool| h.iter().filter(|r| f(&r.entry)).count();
    let _ = writeln!(md, "\n## Faults\n\n| fault | count |\n|---|---:|");
    for (k, n) in &faults {
        let _ = writeln!(md, "| {k} | {n} |");
    }
    let _ = writeln!(
        md,
        "\nMembership or campaign changes seen: {}. Job processes started (from the hosts' logs): {}. Listener deliveries: {}.",
        count(&|e| matches!(e, Entry::Status { .. })),
        count(&|e| matches!(e, Entry::ProcStart { .. })),
        count(&|e| matches!(e, Entry::Listener { phase: crate::history::ListenerPhase::Event, .. })),
    );
    let _ = writeln!(
        md,
        "\n![timeline](timeline.svg)\n\n![latency](latency.svg)\n"
    );
    if bad > 0 {
        let _ = writeln!(
            md,
            "## Violations\n\nReplay with seed {seed}. Every host's log is in `logs/`.\n"
        );
        for v in verdicts {
            for x in &v.violations {
                let (a, b) = x.window(h);
                let _ = writeln!(
                    md,
                    "### `{}`: {}\n\nWindow {:.3} s to {:.3} s:\n\n```",
                    v.property,
                    x.what,
                    secs(h, a),
                    secs(h, b)
                );
                for &i in &x.lines {
                    if let Some(r) = h.get(i) {
                        let _ = writeln!(md, "{}", serde_json::to_string(r).unwrap_or_default());
                    }
                }
                let _ = writeln!(md, "```\n");
            }
        }
    }
    std::fs::write(dir.join("report.md"), &md)
        .map_err(|e| format!("write {}: {e}", dir.join("report.md").display()))?;
    timeline(&dir.join("timeline.svg"), h)?;
    latency(&dir.join("latency.svg"), &stats, seed)?;
    Ok(md)
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn timeline(path: &Path, h: &[Record]) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());
    let end = h.last().map(|r| secs(h, r.t_us)).unwrap_or(1.0).max(1.0);
    // Joined daemons and live jobs over time.
    let mut joined = Vec::new();
    let mut live_jobs = Vec::new();
    // A job is live from when pctl shows it until pctl shows it ended or its prun returns
    // (a controller restart may take its end from view).
    let mut states: BTreeMap<u64, bool> = BTreeMap::new();
    let mut id_of_op: BTreeMap<u64, u64> = BTreeMap::new();
    let mut op_of_tag: BTreeMap<&str, u64> = BTreeMap::new();
    for r in h {
        let changed = match &r.entry {
            Entry::Status { members, .. } => {
                joined.push((
                    secs(h, r.t_us),
                    members.iter().filter(|m| m.state == "joined").count() as f64,
                ));
                false
            }
            Entry::Invoke {
                op,
                what: Op::Job { tag, .. },
                ..
            } => {
                op_of_tag.insert(tag, *op);
                false
            }
            Entry::Job { id, state, tag, .. } => {
                if let Some(op) = tag.as_deref().and_then(|t| op_of_tag.get(t)) {
                    id_of_op.insert(*op, *id);
                }
                states.insert(*id, state != "INACTIVE");
                true
            }
            Entry::Complete { op, .. } => id_of_op
                .remove(op)
                .and_then(|id| states.insert(id, false))
                .is_some(),
            _ => false,
        };
        if changed {
            live_jobs.push((
                secs(h, r.t_us),
                states.values().filter(|l| **l).count() as f64,
            ));
        }
    }
    let top = joined
        .iter()
        .chain(&live_jobs)
        .map(|p| p.1)
        .fold(1.0, f64::max)
        * 1.1;
    // A count holds until its next change: steps, not slopes between sparse changes.
    let steps = |pts: &[(f64, f64)]| -> Vec<(f64, f64)> {
        let mut v: Vec<(f64, f64)> = Vec::with_capacity(pts.len() * 2 + 1);
        for &(t, y) in pts {
            if let Some(&(_, prev)) = v.last() {
                v.push((t, prev));
            }
            v.push((t, y));
        }
        if let Some(&(_, y)) = v.last() {
            v.push((end, y));
        }
        v
    };
    let (joined, live_jobs) = (steps(&joined), steps(&live_jobs));
    // Faults and campaigns as bars, one row per kind.
    let mut rows: Vec<String> = Vec::new();
    let mut bars: Vec<(usize, f64, f64)> = Vec::new();
    let mut open: BTreeMap<u64, (usize, f64)> = BTreeMap::new();
    let mut ops: BTreeMap<u64, (usize, f64)> = BTreeMap::new();
    let row = |k: &str, rows: &mut Vec<String>| {
        rows.iter().position(|x| x == k).unwrap_or_else(|| {
            rows.push(k.to_string());
            rows.len() - 1
        })
    };
    for r in h {
        match &r.entry {
            Entry::Fault { id, start, .. } => {
                let k = fault_kind(&r.entry).unwrap_or("fault");
                if *start {
                    let y = row(k, &mut rows);
                    open.insert(*id, (y, secs(h, r.t_us)));
                } else if let Some((y, t0)) = open.remove(id) {
                    bars.push((y, t0, secs(h, r.t_us).max(t0 + 0.2)));
                }
            }
            Entry::Invoke {
                op,
                what: what @ (Op::Grow { .. } | Op::Shrink { .. }),
                ..
            } => {
                let k = if matches!(what, Op::Grow { .. }) {
                    "grow"
                } else {
                    "shrink"
                };
                let y = row(k, &mut rows);
                ops.insert(*op, (y, secs(h, r.t_us)));
            }
            Entry::Complete { op, .. } => {
                if let Some((y, t0)) = ops.remove(op) {
                    bars.push((y, t0, secs(h, r.t_us).max(t0 + 0.2)));
                }
            }
            _ => {}
        }
    }
    let root = SVGBackend::new(path, (1100, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (upper, lower) = root.split_vertically(320);
    let mut c = ChartBuilder::on(&upper)
        .caption("DVM daemons joined and jobs live", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..end, 0.0..top)
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .x_desc("seconds")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (name, pts)) in [("daemons joined", &joined), ("jobs live", &live_jobs)]
        .into_iter()
        .enumerate()
    {
        let color = COLORS[i];
        c.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    let n = rows.len().max(1) as f64;
    let mut f = ChartBuilder::on(&lower)
        .caption(
            "faults and campaigns (one row per kind)",
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(150)
        .build_cartesian_2d(0.0..end, -0.5..n - 0.5)
        .map_err(|e| err(&e))?;
    let labels = rows.clone();
    f.configure_mesh()
        .x_desc("seconds")
        .y_labels(rows.len().max(1))
        .y_label_formatter(&|y| {
            let i = y.round();
            if (y - i).abs() < 0.01 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .draw()
        .map_err(|e| err(&e))?;
    f.draw_series(bars.iter().map(|&(y, a, b)| {
        let color = COLORS[y % COLORS.len()];
        Rectangle::new([(a, y as f64 - 0.3), (b, y as f64 + 0.3)], color.filled())
    }))
    .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

fn latency(path: &Path, stats: &OpStats, seed: u64) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());
    // Jobs together, and each elastic request kind and notifications on their own.
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for (k, (_, _, pts)) in stats {
        let name = if k.starts_with("job (") {
            "jobs".to_string()
        } else {
            k.clone()
        };
        series.entry(name).or_default().extend(pts);
    }
    let end = series.values().flatten().map(|p| p.0).fold(1.0, f64::max);
    // Notifications take milliseconds, jobs seconds: a log scale shows both.
    let floor = 0.001;
    let top = series.values().flatten().map(|p| p.1).fold(0.1, f64::max) * 1.5;
    let root = SVGBackend::new(path, (1100, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut c = ChartBuilder::on(&root)
        .caption(
            format!("operation latency, seed {seed}"),
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..end, (floor..top).log_scale())
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .x_desc("completed at (s)")
        .y_desc("latency (s, log scale)")
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        c.draw_series(
            pts.iter()
                .map(|&(t, l)| Circle::new((t, l.max(floor)), 2, color.filled())),
        )
        .map_err(|e| err(&e))?
        .label(name.as_str())
        .legend(move |(x, y)| Circle::new((x + 8, y), 3, color.filled()));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}
