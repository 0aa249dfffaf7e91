//! What the benches share: their knobs and clock.

// Not every bench uses every helper.
#[allow(dead_code)]
pub mod dvm;
// Not every bench has a spawn floor yet.
#[allow(dead_code)]
pub mod floor;
// Not every bench draws.
#[allow(dead_code)]
pub mod svg;

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

/// Prints the targets and any missed, then writes `target/bench/<name>.json` (and `.svg`,
/// for a bench with a plot).
pub fn report(
    targets: &str,
    misses: &[String],
    name: &str,
    svg: Option<String>,
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
    let json = serde_json::to_string_pretty(doc).unwrap_or_default();
    let svg = svg.map(|s| (dir.join(format!("{name}.svg")), s));
    for (path, text) in svg
        .into_iter()
        .chain([(dir.join(format!("{name}.json")), json)])
    {
        match std::fs::write(&path, text) {
            Ok(()) => println!("written: {}", path.display()),
            Err(e) => eprintln!("cannot write {}: {e}", path.display()),
        }
    }
}
