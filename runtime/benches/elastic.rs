//! `make bench`, elastic: on a formed DVM of a controller and 8 nodes with 41 spare hosts,
//! the time from a `palloc` request to its `PMIX_DVM_IS_READY` for a grow of +8 and +32
//! daemons and a shrink of −8, each beside the machine's floor for the same work measured in
//! the same run (the launch agent starting a process that exits at once on as many hosts,
//! all at once), and the delay a held job sees beyond the campaign: from the grow's event to
//! the job's process starting, beside an idle DVM's submit-to-start time. Median of
//! `DVMLAB_BENCH_REPS` (default 3) where it repeats. Backend as for the other benches
//! (`DVMLAB_BACKEND`, default process). Writes `target/bench/elastic.json`.

mod support;

use std::time::Duration;

use dvmlab_bench::floor;
use dvmlab_bench::stats::median;
use dvmlab_harness::{agent, wait_until, BackendKind, Cluster, ClusterSpec, IpMode, PrteConf};
use serde_json::{json, Value};
use support::dvm::{run, wait_formed, PCTL, PRTED, PRUN};

const PALLOC: &str = env!("CARGO_BIN_EXE_palloc");

fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A formed elastic DVM: `ctl`, 8 nodes, spare hosts `g01…g{spares}` (the launch agent
/// gated when `gated`).
fn dvm(
    backend: BackendKind,
    spares: usize,
    gated: bool,
) -> Result<(Cluster, std::path::PathBuf), String> {
    let nodes: Vec<String> = (1..=8).map(|i| format!("n{i:02}")).collect();
    let mut hosts = vec!["ctl".to_string()];
    hosts.extend(nodes.iter().cloned());
    hosts.extend((1..=spares).map(|i| format!("g{i:02}")));
    let conf = PrteConf::new()
        .set("ClusterName", "elastic")
        .set("DVMNodes", "n[2:1-8]")
        .set("DVMControllerHost", "ctl");
    let mut spec = ClusterSpec::new("elasticbench", &hosts, vec![]);
    spec.backend = backend;
    spec.ip = IpMode::V4;
    spec.conf = conf.render();
    spec.env.push(("DVMLAB_LOG".into(), "warn".into()));
    let mut cluster = Cluster::new(spec)?;
    let mut launch = cluster.write_agent(&agent::program()?)?;
    if gated {
        launch = agent::write_gated(cluster.run_dir(), &launch)?;
    }
    let mut argv = vec![PRTED.to_string(), "--bootstrap".to_string()];
    for (k, v) in [
        ("prte_elastic_mode", "1"),
        ("plm_ssh_agent", launch.to_str().unwrap_or_default()),
    ] {
        argv.extend(["--prtemca".to_string(), k.to_string(), v.to_string()]);
    }
    cluster.set_daemon(argv);
    cluster.start_many(&hosts[..=8])?;
    wait_formed(&cluster)?;
    let agent_path = cluster.run_dir().join("agent");
    Ok((cluster, agent_path))
}

/// `palloc ARGS --json` to its end; the event's arrival (µs since the epoch) after a start
/// at `t0`, in ms.
fn palloc_ms(cluster: &Cluster, args: &[&str]) -> Result<f64, String> {
    let mut a: Vec<&str> = args.to_vec();
    a.push("--json");
    let t0 = unix_us();
    let out = run(cluster, PALLOC, &a)?;
    let event: Value = out
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["phase"] == "event")
        .ok_or(format!("no event: {out}"))?;
    if event["code"] != -195 {
        return Err(format!("not ready: {event}"));
    }
    let at = event["at_us"].as_u64().ok_or("no at_us")?;
    Ok(at.saturating_sub(t0) as f64 / 1000.0)
}

fn spares(from: usize, n: usize) -> Vec<String> {
    (from..from + n).map(|i| format!("g{i:02}")).collect()
}

/// A job printing when its process started (µs since the epoch), in the background.
fn timed_job(cluster: &Cluster, out: &std::path::Path) -> Result<std::process::Child, String> {
    let argv: Vec<String> = [PRUN, "-n", "1", "--", "sh", "-c", "date +%s%6N"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    cluster
        .command("ctl", &argv)?
        .stdout(std::fs::File::create(out).map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| e.to_string())
}

fn started_us(out: &std::path::Path) -> Result<u64, String> {
    std::fs::read_to_string(out)
        .map_err(|e| e.to_string())?
        .trim()
        .parse()
        .map_err(|e| format!("job output: {e}"))
}

fn main() {
    let backend = support::backend();
    let reps = support::reps(3);
    if let Err(e) = bench(backend, reps) {
        eprintln!("elastic bench: {e}");
        std::process::exit(1);
    }
}

fn bench(backend: BackendKind, reps: usize) -> Result<(), String> {
    println!("Elastic DVM ({backend:?} backend, radix 64, 8 nodes; request to PMIX_DVM_IS_READY; floor = the launch agent starting /bin/true on as many hosts at once; median of {reps})");
    println!(
        "{:>10} {:>12} {:>10} {:>7}",
        "change", "ms", "floor ms", "ratio"
    );
    let (cluster, agent_path) = dvm(backend, 8 + 32, false)?;
    let mut rows = Vec::new();
    let mut table = support::Table {
        caption: format!(
            "Elastic DVM ({backend:?} backend, radix 64, 8 nodes; median of {reps}): a `palloc` request to its `PMIX_DVM_IS_READY`, beside the launch agent starting `/bin/true` on as many hosts at once; a held job's start after its grow, beside an idle DVM's submit to start"
        ),
        header: vec!["change", "measured", "floor", "ratio"],
        rows: Vec::new(),
    };
    let mut misses = Vec::new();
    let mut report = |name: &str, ms: f64, floor: f64, target: Option<f64>| {
        println!(
            "{name:>10} {ms:>12.1} {floor:>10.1} {:>7.1}",
            ms / floor.max(0.001)
        );
        table.rows.push(vec![
            name.to_string(),
            format!("{ms:.1} ms"),
            format!("{floor:.1} ms"),
            format!("{:.1}", ms / floor.max(0.001)),
        ]);
        if let Some(t) = target {
            if ms > t {
                misses.push(format!("{name}: {ms:.1} ms (target {t} ms)"));
            }
        }
        rows.push(json!({"change": name, "ms": ms, "floor_ms": floor}));
    };
    let (mut g8, mut s8, mut f8) = (Vec::new(), Vec::new(), Vec::new());
    let eight = spares(1, 8);
    for _ in 0..reps {
        f8.push(floor::agent_ms(&cluster, "ctl", &agent_path, &eight)?);
        g8.push(palloc_ms(&cluster, &["new", "--host", &eight.join(",")])?);
        s8.push(palloc_ms(
            &cluster,
            &["release", "--host", &eight.join(",")],
        )?);
        // A released host may be grown onto again (under a new rank).
    }
    let floor8 = median(&f8);
    report("grow +8", median(&g8), floor8, Some(300.0));
    report("shrink -8", median(&s8), floor8, None);
    let thirty_two = spares(9, 32);
    let floor32 = floor::agent_ms(&cluster, "ctl", &agent_path, &thirty_two)?;
    let g32 = palloc_ms(&cluster, &["new", "--host", &thirty_two.join(",")])?;
    report("grow +32", g32, floor32, Some(1000.0));
    run(&cluster, PCTL, &["stop"])?;
    cluster.destroy();

    // The delay a held job sees beyond the campaign.
    let (cluster, _) = dvm(backend, 1, true)?;
    let dir = cluster.run_dir().to_path_buf();
    let mut idle = Vec::new();
    for i in 0..reps {
        let out = dir.join(format!("idle{i}.out"));
        let t0 = unix_us();
        let mut j = timed_job(&cluster, &out)?;
        j.wait().map_err(|e| e.to_string())?;
        idle.push(started_us(&out)?.saturating_sub(t0) as f64 / 1000.0);
    }
    let palloc_out = dir.join("grow.out");
    let mut grow = cluster
        .command(
            "ctl",
            &[PALLOC, "new", "--host", "g01", "--json"].map(String::from),
        )?
        .stdout(std::fs::File::create(&palloc_out).map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| e.to_string())?;
    wait_until(Duration::from_secs(20), Duration::from_millis(10), || {
        let t = std::fs::read_to_string(&palloc_out).unwrap_or_default();
        if t.contains("accepted") {
            Ok(())
        } else {
            Err("not accepted yet".to_string())
        }
    })?;
    let held_out = dir.join("held.out");
    let mut held = timed_job(&cluster, &held_out)?;
    wait_until(Duration::from_secs(20), Duration::from_millis(10), || {
        let jobs = run(&cluster, PCTL, &["jobs", "--json"])?;
        if jobs.contains("WAITING FOR DAEMON CAMPAIGN") {
            Ok(())
        } else {
            Err("not held yet".to_string())
        }
    })?;
    agent::gate(&dir, "g01", true)?;
    grow.wait().map_err(|e| e.to_string())?;
    held.wait().map_err(|e| e.to_string())?;
    let event: Value = std::fs::read_to_string(&palloc_out)
        .map_err(|e| e.to_string())?
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["phase"] == "event")
        .ok_or("no event")?;
    let at = event["at_us"].as_u64().ok_or("no at_us")?;
    let delay = started_us(&held_out)?.saturating_sub(at) as f64 / 1000.0;
    let idle_ms = median(&idle);
    println!(
        "{:>10} {delay:>12.1} {idle_ms:>10.1} {:>7.1}   (held job: campaign's event to its process start; floor: an idle DVM's submit to start)",
        "held job",
        delay / idle_ms.max(0.001)
    );
    if delay > 20.0 {
        misses.push(format!(
            "held job: started {delay:.1} ms after the campaign (target 20 ms)"
        ));
    }
    table.rows.push(vec![
        "a held job: its grow's event to its process starting".into(),
        format!("{delay:.1} ms"),
        format!("{idle_ms:.1} ms"),
        format!("{:.1}", delay / idle_ms.max(0.001)),
    ]);
    rows.push(json!({"change": "held job", "ms": delay, "floor_ms": idle_ms}));
    run(&cluster, PCTL, &["stop"])?;
    cluster.destroy();
    support::report(
        "grow +8 <= 300 ms, grow +32 <= 1 s (request to PMIX_DVM_IS_READY); a held job starts <= 20 ms after its campaign completes",
        &misses,
        "elastic",
        &[table],
        None,
        &json!({"backend": format!("{backend:?}"), "reps": reps, "rows": rows}),
    );
    Ok(())
}
