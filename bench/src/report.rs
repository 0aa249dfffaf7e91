//! What a bench run prints and writes: for every figure, the median over the repetitions and
//! its spread, beside the floor from the same run and every other runtime measured in it,
//! with the ratios — as a Markdown table (printed, and kept for the README), JSON stamped
//! with the machine and the moment, and an SVG chart.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::driver::{Measured, Memory, Metric};
use crate::plot::{self, Panel, Series};
use crate::quiet::Settles;
use crate::stamp::Stamp;
use crate::stats::{median, range, ratio};

/// Every repetition one runtime went through, under its name.
pub struct Runs {
    pub name: String,
    pub reps: Vec<Measured>,
}

/// A figure's repetitions, summarized.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub count: usize,
    /// Timed by the bench's status reads rather than the runtime's own formation time.
    pub polled: bool,
}

impl Summary {
    fn of(v: &[f64], polled: bool) -> Option<Summary> {
        if v.is_empty() {
            return None;
        }
        let (min, max) = range(v);
        Some(Summary {
            median: median(v),
            min,
            max,
            count: v.len(),
            polled,
        })
    }

    fn cell(&self) -> String {
        let mark = if self.polled { "†" } else { "" };
        if self.count > 1 {
            format!("{:.1}{mark} ({:.1}–{:.1})", self.median, self.min, self.max)
        } else {
            format!("{:.1}{mark}", self.median)
        }
    }
}

/// One line of the table: a figure at one size, for the floor and every runtime.
pub struct Row {
    pub metric: Metric,
    pub nodes: usize,
    pub floor: Summary,
    /// In the order of the runs.
    pub runtimes: Vec<Option<Summary>>,
    /// Per runtime, its ratio to the floor (see [`Ratio`]); none where its figure has no
    /// floor measured beside it.
    pub ratios: Vec<Option<Ratio>>,
}

/// A runtime's ratio to the floor at one figure and size, taken within each repetition (the
/// repetition's median over the median of the floor measured beside it there), so a slow
/// moment of the machine moves both sides and not the ratio.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    /// The median over the repetitions: with an odd count, one of them.
    pub median: f64,
    /// The smallest and largest; a goal between them is not settled by the run.
    pub min: f64,
    pub max: f64,
    pub reps: usize,
}

impl Ratio {
    fn of(reps: &[Measured], key: (Metric, usize)) -> Option<Ratio> {
        let per_rep: Vec<f64> = reps
            .iter()
            .filter_map(|m| {
                let here: Vec<_> = m
                    .samples
                    .iter()
                    .filter(|s| (s.metric, s.nodes) == key && s.floor.is_finite())
                    .collect();
                let values: Vec<f64> = here.iter().map(|s| s.value).collect();
                let floors: Vec<f64> = here.iter().map(|s| s.floor).collect();
                (!here.is_empty())
                    .then(|| ratio(median(&values), median(&floors)))
                    .flatten()
            })
            .collect();
        if per_rep.is_empty() {
            return None;
        }
        let (min, max) = range(&per_rep);
        Some(Ratio {
            median: median(&per_rep),
            min,
            max,
            reps: per_rep.len(),
        })
    }

    /// `1.50×`, with `(1.47–1.52)` beside it over several repetitions.
    fn cell(&self) -> String {
        if self.reps > 1 {
            format!("{:.2}× ({:.2}–{:.2})", self.median, self.min, self.max)
        } else {
            format!("{:.2}×", self.median)
        }
    }
}

impl Row {
    /// Runtime `i`'s ratio to the floor: its own (see [`Ratio`]), or, when its figures carry
    /// no floor of their own (a peer measured beside the floor of another), its median over
    /// the row's floor, as one figure without a spread.
    pub fn ratio(&self, i: usize) -> Option<Ratio> {
        if !self.metric.has_ratio() {
            return None;
        }
        if let Some(r) = self.ratios.get(i).copied().flatten() {
            return Some(r);
        }
        let median = ratio(
            self.runtimes.get(i).copied().flatten()?.median,
            self.floor.median,
        )?;
        Some(Ratio {
            median,
            min: median,
            max: median,
            reps: 1,
        })
    }
}

/// The rows of `runs`, in metric then size order.
pub fn rows(runs: &[Runs]) -> Vec<Row> {
    type Key = (Metric, usize);
    let mut values: BTreeMap<Key, Vec<(Vec<f64>, bool)>> = BTreeMap::new();
    let mut floors: BTreeMap<Key, Vec<f64>> = BTreeMap::new();
    for (i, r) in runs.iter().enumerate() {
        for s in r.reps.iter().flat_map(|m| &m.samples) {
            let key = (s.metric, s.nodes);
            let v = values
                .entry(key)
                .or_insert_with(|| vec![(Vec::new(), false); runs.len()]);
            v[i].0.push(s.value);
            v[i].1 |= s.polled;
            if s.floor.is_finite() {
                floors.entry(key).or_default().push(s.floor);
            }
        }
    }
    values
        .into_iter()
        .filter_map(|(key, per)| {
            Some(Row {
                metric: key.0,
                nodes: key.1,
                floor: Summary::of(floors.get(&key)?, false)?,
                runtimes: per.iter().map(|(v, p)| Summary::of(v, *p)).collect(),
                ratios: runs.iter().map(|r| Ratio::of(&r.reps, key)).collect(),
            })
        })
        .collect()
}

fn x(r: Option<f64>) -> String {
    r.map_or("–".into(), |r| format!("{r:.2}×"))
}

/// The Markdown table of `rows`: per runtime its median (spread) and its ratio to the floor;
/// with several runtimes, each one's ratio to the first.
pub fn markdown(runs: &[Runs], rows: &[Row]) -> String {
    let mut s = String::new();
    let mut head = "| measure | nodes | floor ms |".to_string();
    let mut rule = "|---|---:|---:|".to_string();
    for (i, r) in runs.iter().enumerate() {
        let _ = write!(head, " {} | ÷ floor |", r.name);
        rule.push_str("---:|---:|");
        if i > 0 {
            let _ = write!(head, " ÷ {} |", runs[0].name);
            rule.push_str("---:|");
        }
    }
    let _ = writeln!(s, "{head}\n{rule}");
    for row in rows {
        let _ = write!(
            s,
            "| {} ({}) | {} | {} |",
            row.metric.title(),
            row.metric.unit(),
            row.nodes,
            row.floor.cell()
        );
        let first = row.runtimes.first().copied().flatten();
        for (i, v) in row.runtimes.iter().enumerate() {
            match v {
                Some(v) => {
                    let r = row.ratio(i).map_or("–".into(), |r| r.cell());
                    let _ = write!(s, " {} | {r} |", v.cell());
                }
                None => s.push_str(" – | – |"),
            }
            if i > 0 {
                let r = v
                    .zip(first)
                    .filter(|_| row.metric.has_ratio())
                    .and_then(|(v, f)| ratio(v.median, f.median));
                let _ = write!(s, " {} |", x(r));
            }
        }
        s.push('\n');
    }
    s
}

/// The Markdown table of the daemons' memory, per runtime and size (medians).
pub fn memory_markdown(runs: &[Runs]) -> String {
    let mut s = String::from(
        "| runtime | nodes | controller peak RSS MiB | daemon peak RSS MiB, mean | max |\n|---|---:|---:|---:|---:|\n",
    );
    for r in runs {
        let mut by: BTreeMap<usize, Vec<&Memory>> = BTreeMap::new();
        for m in r.reps.iter().flat_map(|m| &m.memory) {
            by.entry(m.nodes).or_default().push(m);
        }
        for (n, ms) in by {
            let med = |f: fn(&Memory) -> f64| median(&ms.iter().map(|m| f(m)).collect::<Vec<_>>());
            let _ = writeln!(
                s,
                "| {} | {n} | {:.1} | {:.1} | {:.1} |",
                r.name,
                med(|m| m.controller_mib),
                med(|m| m.daemon_mean_mib),
                med(|m| m.daemon_max_mib)
            );
        }
    }
    s
}

/// What the reader must know when some of a runtime's timed runs started on a machine that
/// did not get quiet: their figures may carry someone else's work.
pub fn busy_note(r: &Runs) -> Option<String> {
    let mut all = Settles::default();
    for m in &r.reps {
        all.add(m.settles);
    }
    (all.busy > 0).then(|| {
        format!(
            "{}: {} of {} timed runs (jobs, floor runs, blocks of sequential jobs) started on a machine that did not get quiet within the bench's wait; their figures may carry other work.",
            r.name, all.busy, all.runs
        )
    })
}

/// What the floors are, and the marks, under a table.
pub fn legend(rows: &[Row]) -> String {
    let mut s = String::new();
    // Metrics sharing one floor are named together.
    let mut floors: Vec<(&str, Vec<&str>)> = Vec::new();
    for r in rows {
        let (f, t) = (r.metric.floor(), r.metric.title());
        match floors.iter_mut().find(|(g, _)| *g == f) {
            Some((_, ts)) if !ts.contains(&t) => ts.push(t),
            Some(_) => {}
            None => floors.push((f, vec![t])),
        }
    }
    for (f, ts) in floors {
        let _ = writeln!(s, "- floor of *{}*: {f}.", ts.join("*, *"));
    }
    if rows
        .iter()
        .any(|r| r.runtimes.iter().flatten().any(|v| v.polled))
    {
        let _ = writeln!(
            s,
            "- † timed by the bench's own status reads (every {} ms): that runtime's status does not report `formed_at_unix_ms`.",
            crate::driver::POLL.as_millis()
        );
    }
    let mut unrated: Vec<&str> = rows
        .iter()
        .filter(|r| !r.metric.has_ratio())
        .map(|r| r.metric.title())
        .collect();
    unrated.dedup();
    if !unrated.is_empty() {
        let _ = writeln!(
            s,
            "- *{}*: no ratio; a status gives its formation time in whole milliseconds, and these figures are a few of them.",
            unrated.join("*, *")
        );
    }
    s.push_str("- Medians over the repetitions, (min–max) beside them. A ratio to the floor is taken within each repetition (its median over the floor measured beside it there): the median of those, (min–max) beside it.\n");
    if rows.iter().any(|r| {
        r.runtimes
            .iter()
            .zip(&r.ratios)
            .any(|(v, own)| v.is_some() && own.is_none())
    }) {
        s.push_str("- A ratio with no (min–max) beside it over several repetitions belongs to a runtime measured beside another's floor: it is its median over the floor's.\n");
    }
    s
}

/// Writes `dir/NAME.md` (heading, tables, legend), `dir/NAME.json` and, when `panels` has
/// any, `dir/NAME.svg`; prints the Markdown. The paths written.
pub fn write(
    dir: &Path,
    name: &str,
    title: &str,
    stamp: &Stamp,
    runs: &[Runs],
    extra: serde_json::Value,
    panels: Vec<Panel>,
) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let rows = rows(runs);
    let mut md = format!("{title}\n\nMeasured {}.\n\n", stamp.line());
    md.push_str(&markdown(runs, &rows));
    md.push('\n');
    md.push_str(&legend(&rows));
    if runs
        .iter()
        .any(|r| r.reps.iter().any(|m| !m.memory.is_empty()))
    {
        md.push('\n');
        md.push_str(&memory_markdown(runs));
    }
    for r in runs {
        for why in r.reps.first().map(|m| m.notes.clone()).unwrap_or_default() {
            let _ = writeln!(md, "\n{why}");
        }
        if let Some(why) = busy_note(r) {
            let _ = writeln!(md, "\n{why}");
        }
    }
    println!("\n{md}");
    let doc = json!({
        "title": title,
        "stamp": stamp,
        "runtimes": runs.iter().map(|r| json!({"name": r.name, "reps": r.reps})).collect::<Vec<_>>(),
        "extra": extra,
    });
    let mut written = Vec::new();
    let md_path = dir.join(format!("{name}.md"));
    std::fs::write(&md_path, &md).map_err(|e| format!("{}: {e}", md_path.display()))?;
    written.push(md_path);
    let json_path = dir.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    std::fs::write(&json_path, text).map_err(|e| format!("{}: {e}", json_path.display()))?;
    written.push(json_path);
    if !panels.is_empty() {
        let svg = dir.join(format!("{name}.svg"));
        // A chart has room for the title's first clause only; the table keeps it whole.
        let short = title.split(':').next().unwrap_or(title);
        plot::chart(&svg, short, &stamp.line(), &panels)?;
        written.push(svg);
    }
    for p in &written {
        println!("written: {}", p.display());
    }
    Ok(written)
}

/// A panel of `metric` against size: every runtime's median and the floor.
pub fn panel(runs: &[Runs], metric: Metric) -> Option<Panel> {
    let rows: Vec<Row> = rows(runs)
        .into_iter()
        .filter(|r| r.metric == metric)
        .collect();
    if rows.len() < 2 {
        return None;
    }
    let mut series: Vec<Series> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| Series {
            name: r.name.clone(),
            points: rows
                .iter()
                .filter_map(|row| Some((row.nodes as f64, row.runtimes[i]?.median)))
                .collect(),
            reference: false,
        })
        .collect();
    series.push(Series {
        name: "machine floor".into(),
        points: rows
            .iter()
            .map(|r| (r.nodes as f64, r.floor.median))
            .collect(),
        reference: true,
    });
    Some(Panel {
        title: metric.title().to_string(),
        unit: metric.unit().to_string(),
        series,
    })
}

/// A panel of every runtime's ratio to the floor for `metrics`, against size, with the
/// `target` ratio as a reference line.
pub fn ratio_panel(runs: &[Runs], metrics: &[Metric], target: Option<f64>) -> Option<Panel> {
    let all = rows(runs);
    let mut series = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        for &m in metrics {
            let points: Vec<(f64, f64)> = all
                .iter()
                .filter(|row| row.metric == m)
                .filter_map(|row| Some((row.nodes as f64, row.ratio(i)?.median)))
                .collect();
            if points.len() >= 2 {
                series.push(Series {
                    name: format!("{}: {}", r.name, short(m)),
                    points,
                    reference: false,
                });
            }
        }
    }
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s: &Series| s.points.iter().map(|p| p.0))
        .collect();
    if let (Some(t), Some(lo), Some(hi)) = (
        target,
        xs.iter().copied().reduce(f64::min),
        xs.iter().copied().reduce(f64::max),
    ) {
        series.push(Series {
            name: format!("target {t}×"),
            points: vec![(lo, t), (hi, t)],
            reference: true,
        });
    }
    (!series.is_empty()).then(|| Panel {
        title: "ratio to the machine floor".into(),
        unit: "× floor".into(),
        series,
    })
}

fn short(m: Metric) -> &'static str {
    match m {
        Metric::FormTogether => "formation",
        Metric::FormTogetherAfterLast => "formation, after last start",
        Metric::FormControllerLast => "formation, ctl last",
        Metric::Job => "job",
        Metric::Sequential => "sequential",
        Metric::Grow => "grow",
        Metric::Shrink => "shrink",
        Metric::OneShot => "one-shot",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Sample;

    fn job(value: f64, floor: f64) -> Sample {
        Sample {
            metric: Metric::Job,
            nodes: 128,
            value,
            floor,
            polled: false,
        }
    }

    fn rep(samples: Vec<Sample>) -> Measured {
        Measured {
            samples,
            ..Measured::default()
        }
    }

    #[test]
    fn runs_that_started_on_a_busy_machine_are_counted_over_every_repetition_and_said() {
        let busy = |runs, busy| Measured {
            settles: Settles { runs, busy },
            ..Measured::default()
        };
        let quiet = Runs {
            name: "r".into(),
            reps: vec![busy(10, 0), busy(10, 0)],
        };
        assert_eq!(busy_note(&quiet), None);
        let noisy = Runs {
            name: "r".into(),
            reps: vec![busy(10, 0), busy(10, 3), busy(12, 1)],
        };
        let note = busy_note(&noisy).expect("some runs were busy");
        assert!(note.starts_with("r: 4 of 32 timed runs"), "{note}");
    }

    /// Each repetition's ratio is its own median over the floor measured beside it, so a
    /// repetition on a slow moment of the machine (both slower) does not widen the spread;
    /// the headline is the median of those ratios, so it lies within their spread.
    #[test]
    fn the_ratio_is_taken_within_each_repetition_and_its_median_lies_in_its_spread() {
        let runs = [Runs {
            name: "r".into(),
            reps: vec![
                rep(vec![job(70.0, 50.0), job(75.0, 50.0), job(80.0, 50.0)]),
                rep(vec![
                    job(140.0, 100.0),
                    job(150.0, 100.0),
                    job(160.0, 100.0),
                ]),
                rep(vec![job(74.0, 50.0), job(78.0, 52.0), job(76.0, 51.0)]),
            ],
        }];
        let rows = rows(&runs);
        let r = rows[0].ratios[0].expect("three repetitions");
        assert!((r.min - 76.0 / 51.0).abs() < 1e-9, "{r:?}");
        assert!((r.max - 1.5).abs() < 1e-9, "{r:?}");
        assert_eq!(r.median, 1.5);
        assert_eq!(r.reps, 3);
        let md = markdown(&runs, &rows);
        assert!(md.contains("| 1.50× (1.49–1.50) |"), "{md}");
    }

    /// In a comparison each runtime is set against the floor measured beside its own
    /// figures, not the floors pooled over every runtime.
    #[test]
    fn each_runtime_is_set_against_the_floor_measured_beside_it() {
        let fast = |v| rep(vec![job(v, 100.0)]);
        let slow = |v| rep(vec![job(v, 130.0)]);
        let runs = [
            Runs {
                name: "a".into(),
                reps: vec![slow(195.0), slow(195.0), slow(195.0)],
            },
            Runs {
                name: "b".into(),
                reps: vec![fast(155.0), fast(160.0), fast(165.0)],
            },
        ];
        let rows = rows(&runs);
        let b = rows[0].ratios[1].expect("b was measured");
        assert!((b.median - 1.60).abs() < 1e-9, "{b:?}");
        assert!(
            (b.min - 1.55).abs() < 1e-9 && (b.max - 1.65).abs() < 1e-9,
            "{b:?}"
        );
        let a = rows[0].ratios[0].expect("a was measured");
        assert!((a.median - 1.5).abs() < 1e-9, "{a:?}");
    }

    #[test]
    fn one_repetition_has_a_ratio_and_no_spread() {
        let runs = [Runs {
            name: "r".into(),
            reps: vec![rep(vec![job(70.0, 50.0), job(75.0, 50.0)])],
        }];
        let rows = rows(&runs);
        assert_eq!(rows[0].ratios[0].map(|r| r.reps), Some(1));
        assert!(markdown(&runs, &rows).contains("| 1.50× |"));
    }

    /// A figure of a few whole milliseconds is shown beside its floor, never as a ratio that
    /// would show the rounding.
    #[test]
    fn formation_after_the_last_start_is_shown_without_a_ratio() {
        let s = Sample {
            metric: Metric::FormTogetherAfterLast,
            nodes: 32,
            value: 3.0,
            floor: 1.0,
            polled: false,
        };
        let runs = vec![Runs {
            name: "a".into(),
            reps: vec![rep(vec![s])],
        }];
        let rows = rows(&runs);
        assert_eq!(rows[0].ratio(0), None);
        let md = markdown(&runs, &rows);
        let line = md
            .lines()
            .find(|l| l.contains("after the last start"))
            .expect("the row");
        assert!(line.ends_with("| 3.0 | – |"), "{line}");
        assert!(legend(&rows).contains("no ratio"));
    }

    /// A figure without a floor of its own (a peer measured beside another's floor) still
    /// gets a ratio, against the row's floor.
    #[test]
    fn a_figure_without_its_own_floor_is_set_against_the_rows_floor() {
        let runs = [
            Runs {
                name: "a".into(),
                reps: vec![rep(vec![job(60.0, 50.0)])],
            },
            Runs {
                name: "peer".into(),
                reps: vec![rep(vec![job(500.0, f64::NAN)])],
            },
        ];
        let rows = rows(&runs);
        assert_eq!(rows[0].ratios[1], None);
        assert_eq!(rows[0].ratio(1).map(|r| r.median), Some(10.0));
        let md = markdown(&runs, &rows);
        assert!(md.contains("| 10.00× |"), "{md}");
        assert!(legend(&rows).contains("measured beside another's floor"));
    }
}
