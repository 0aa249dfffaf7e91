//! What the benches share: their knobs and clock.

// Not every bench uses every helper.
#[allow(dead_code)]
pub mod dvm;
use std::time::SystemTime;

use dvmlab_harness::BackendKind;

/// `DVMLAB_BACKEND` (default process: its numbers are the daemons' own work); exits on a bad
/// value.
pub fn backend() -> BackendKind {
    match std::env::var("DVMLAB_BACKEND").ok().as_deref() {
        None | Some("process") => BackendKind::Process,
        Some("netns") => BackendKind::Netns,
        Some(other) => {
            eprintln!("DVMLAB_BACKEND={other}: expected netns or process");
            std::process::exit(2);
        }
    }
}

/// A comma-separated list of sizes from `var`, else `default`.
// Not every bench takes sizes.
#[allow(dead_code)]
pub fn sizes(var: &str, default: &str) -> Vec<usize> {
    std::env::var(var)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// `DVMLAB_BENCH_REPS`, at least 1, else `default`.
pub fn reps(default: usize) -> usize {
    std::env::var("DVMLAB_BENCH_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
        .max(1)
}

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A bench's figures as the README shows them: a caption over a table, every cell written
/// from the measured values (`make bench-readme` copies it into the README as it is).
pub struct Table {
    pub caption: String,
    pub header: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    fn markdown(&self) -> String {
        let line = |cells: Vec<&str>| format!("| {} |\n", cells.join(" | "));
        let mut md = format!("{}\n\n", self.caption);
        md.push_str(&line(self.header.clone()));
        // The first column names the row; the figures are right-aligned.
        let mut rule = vec!["---"];
        rule.extend(std::iter::repeat_n(
            "---:",
            self.header.len().saturating_sub(1),
        ));
        md.push_str(&line(rule));
        for r in &self.rows {
            md.push_str(&line(r.iter().map(String::as_str).collect()));
        }
        md
    }
}

/// Prints the targets and any missed, then writes `target/bench/<name>.json`, stamped with
/// the machine and the moment, `<name>.md` (the tables, the stamp, the targets and which
/// were missed) and, for a bench with a chart, `<name>.svg`.
pub fn report(
    targets: &str,
    misses: &[String],
    name: &str,
    tables: &[Table],
    chart: Option<(&str, Vec<dvmlab_bench::plot::Panel>)>,
    doc: &serde_json::Value,
) {
    println!("targets: {targets}");
    if misses.is_empty() {
        println!("all targets met");
    }
    for m in misses {
        println!("MISSED: {m}");
    }
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("../bench");
    let _ = std::fs::create_dir_all(&dir);
    let stamp = dvmlab_bench::stamp::Stamp::now();
    if let Some((title, panels)) = chart {
        let path = dir.join(format!("{name}.svg"));
        match dvmlab_bench::plot::chart(&path, title, &stamp.line(), &panels) {
            Ok(()) => println!("written: {}", path.display()),
            Err(e) => eprintln!("{e}"),
        }
    }
    let mut md = String::new();
    for t in tables {
        md.push_str(&t.markdown());
        md.push('\n');
    }
    md.push_str(&format!(
        "Measured {}.\n\nTargets: {targets}: ",
        stamp.line()
    ));
    if misses.is_empty() {
        md.push_str("all met.\n");
    } else {
        md.push_str(&format!("**MISSED**: {}.\n", misses.join("; ")));
    }
    let path = dir.join(format!("{name}.md"));
    match std::fs::write(&path, md) {
        Ok(()) => println!("written: {}", path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", path.display()),
    }
    let doc = serde_json::json!({"stamp": stamp, "results": doc});
    let path = dir.join(format!("{name}.json"));
    match std::fs::write(
        &path,
        serde_json::to_string_pretty(&doc).unwrap_or_default(),
    ) {
        Ok(()) => println!("written: {}", path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", path.display()),
    }
}
