//! One soak run from start to end: the DVM formed, the workload, nemesis and observer run
//! until the deadline, every fault undone, the DVM left to settle and its final state
//! recorded, leftover job processes looked for, the DVM stopped, and the hosts' logs read
//! into the history.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::driver::{Config, Ctx};
use crate::history::{Entry, Writer};
use crate::observer::{campaigns_of, members_of, HELD};
use crate::{logs, nemesis, observer, workload};

/// How long the DVM has to settle after the final heal.
const SETTLE: Duration = Duration::from_secs(180);
/// Job submitters running at once.
const SUBMITTERS: u64 = 3;

/// Runs a soak; returns the history's path.
pub fn run(cfg: &Config) -> Result<PathBuf, String> {
    std::fs::create_dir_all(&cfg.out).map_err(|e| format!("create {}: {e}", cfg.out.display()))?;
    let path = cfg.out.join("history.jsonl");
    let ctx = Ctx::start(cfg, Writer::create(&path)?)?;
    ctx.hist.record(Entry::Meta {
        seed: cfg.seed,
        backend: format!("{:?}", cfg.backend).to_lowercase(),
        controller: ctx.ctl.clone(),
        initial: ctx.initial.clone(),
        spares: ctx.spares.clone(),
        duration_s: cfg.duration.as_secs(),
        runtime_fault: cfg.runtime_fault.clone(),
    });
    eprintln!(
        "soak: {} nodes and {} spares formed; running for {:?} with seed {}",
        ctx.initial.len(),
        ctx.spares.len(),
        cfg.duration,
        cfg.seed
    );
    let stop_observing = AtomicBool::new(false);
    let nemesis = std::thread::scope(|s| {
        let ctx = &ctx;
        let stop_observing = &stop_observing;
        let obs = s.spawn(move || observer::run(ctx, stop_observing));
        // The workload picks targets from what the observer saw: let it see once first.
        let _ =
            dvmlab_harness::wait_until(Duration::from_secs(30), Duration::from_millis(50), || {
                match ctx.world.lock() {
                    Ok(w) if !w.joined.is_empty() => Ok(()),
                    _ => Err("no status read yet".to_string()),
                }
            });
        let mut workers = Vec::new();
        for i in 0..SUBMITTERS {
            workers.push(s.spawn(move || workload::jobs(ctx, i)));
        }
        workers.push(s.spawn(move || workload::elastic(ctx)));
        workers.push(s.spawn(move || workload::notifier(ctx)));
        workers.push(s.spawn(move || workload::listeners(ctx)));
        let nem = nemesis::run(ctx);
        ctx.stop.store(true, Ordering::Relaxed);
        eprintln!("soak: deadline reached; waiting for the operations in flight");
        for w in workers {
            let _ = w.join();
        }
        let settled = settle(ctx);
        stop_observing.store(true, Ordering::Relaxed);
        let _ = obs.join();
        nem.and(settled)
    });
    leftovers(&ctx);
    let logs_dir = cfg.out.join("logs");
    finish(&ctx, &logs_dir);
    nemesis?;
    Ok(path)
}

/// Starts again every daemon of `DVMNodes` that the DVM still counts on but that is not
/// running, waits until the DVM is formed with no campaign and no live job, and records
/// its final state.
fn settle(ctx: &Ctx) -> Result<(), String> {
    if let Some(s) = ctx.status() {
        let launched = ctx
            .world
            .lock()
            .map(|w| w.launched.clone())
            .unwrap_or_default();
        let mut c = ctx.cluster.lock().map_err(|_| "cluster lock poisoned")?;
        for m in members_of(&s) {
            if (m.state == "lost" || m.state == "waiting")
                && ctx.initial.contains(&m.host)
                && !launched.contains(&m.host)
                && !c.is_running(&m.host)
            {
                eprintln!("soak: final heal: starting {} again", m.host);
                c.start(&m.host)?;
            }
        }
    }
    let settled = dvmlab_harness::wait_until(SETTLE, Duration::from_millis(500), || {
        let s = ctx.status().ok_or("no status")?;
        let jobs = ctx.jobs().ok_or("no jobs list")?;
        let live = jobs.iter().filter(|j| j["state"] != "INACTIVE").count();
        if s["formed"] == true && campaigns_of(&s).is_empty() && live == 0 {
            Ok(())
        } else {
            Err(format!(
                "formed {}, {} campaigns, {live} live jobs",
                s["formed"],
                campaigns_of(&s).len()
            ))
        }
    });
    if let Err(e) = &settled {
        eprintln!("soak: the DVM did not settle after the final heal: {e}");
    }
    let s = ctx.status().unwrap_or_default();
    let jobs = ctx.jobs().unwrap_or_default();
    let ids = |pred: &dyn Fn(&str) -> bool| -> Vec<u64> {
        jobs.iter()
            .filter(|j| pred(j["state"].as_str().unwrap_or("")))
            .filter_map(|j| j["id"].as_u64())
            .collect()
    };
    ctx.hist.record(Entry::Final {
        formed: s["formed"] == true,
        members: members_of(&s),
        campaigns: campaigns_of(&s),
        unended: ids(&|st| st != "INACTIVE"),
        held: ids(&|st| st == HELD),
    });
    Ok(())
}

/// Records every process on this machine that carries the run's `DVMLAB_SOAK` (a job
/// process: jobs get it), now that the DVM has no live job.
fn leftovers(ctx: &Ctx) {
    let want = format!("DVMLAB_SOAK={}", ctx.run_tag);
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
        if !vars.contains(&want.as_bytes()) {
            continue;
        }
        let job = vars
            .iter()
            .find_map(|v| v.strip_prefix(b"DVMLAB_JOB_ID="))
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .trim()
                    .to_string()
            })
            .unwrap_or_default();
        ctx.hist.record(Entry::Leftover { pid, job, cmdline });
    }
}

/// Stops the DVM, reads every host's log into the history and keeps a copy of it.
fn finish(ctx: &Ctx, logs_dir: &Path) {
    let _ = ctx.run(
        &ctx.ctl,
        &[ctx.bin("pctl"), "stop".into()],
        Duration::from_secs(30),
    );
    let Ok(mut c) = ctx.cluster.lock() else {
        return;
    };
    let hosts: Vec<String> = c.hosts().iter().map(|h| h.name.clone()).collect();
    for h in &hosts {
        if c.is_running(h) {
            let _ = c.wait_exit(h, Duration::from_secs(10));
        }
    }
    let _ = std::fs::create_dir_all(logs_dir);
    let mut recs = Vec::new();
    for h in &hosts {
        let log = c.log(h);
        let _ = std::fs::write(logs_dir.join(format!("{h}.log")), &log);
        recs.extend(logs::records(h, &log));
    }
    recs.sort_by_key(|(t, _)| *t);
    for (t, e) in recs {
        ctx.hist.record_at(t, e);
    }
}
