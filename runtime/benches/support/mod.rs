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

/// Prints the targets and any missed, then writes `target/bench/<name>.json`, stamped with
/// the machine and the moment, and, for a bench with a chart, `<name>.svg`.
pub fn report(
    targets: &str,
    misses: &[String],
    name: &str,
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
