//! The workload: jobs of varied sizes and lengths (with barriers, failing on purpose, killed,
//! with time limits), grow and shrink requests with and without requesters, event
//! notifications and the listeners that hear them. Every operation is recorded as its
//! invocation and completion; the choices are drawn from the soak's seed.

use std::time::Duration;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::checker::SOAK_CODE;
use crate::driver::{run_command, Ctx, Outcome};
use crate::history::{Entry, Expect, ListenerPhase, Op};

/// How long any one operation may take before the soak kills its tool.
const OP_DEADLINE: Duration = Duration::from_secs(150);
/// Listeners kept running at once.
const LISTENERS: usize = 3;

fn rng(ctx: &Ctx, stream: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(ctx.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ stream)
}

/// Think time between a thread's operations (pacing, not synchronisation).
fn pause(ctx: &Ctx, r: &mut ChaCha8Rng, lo_ms: u64, hi_ms: u64) {
    let end = std::time::Instant::now() + Duration::from_millis(r.random_range(lo_ms..hi_ms));
    while !ctx.stopping() && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Records the operation `what` on `host`, runs `argv` there and records how it ended.
fn operate(ctx: &Ctx, op: u64, host: &str, what: Op, argv: &[String]) -> Outcome {
    ctx.hist.record(Entry::Invoke {
        op,
        host: host.to_string(),
        what,
    });
    let o = ctx.run(host, argv, OP_DEADLINE);
    record_complete(ctx, op, &o);
    o
}

fn record_complete(ctx: &Ctx, op: u64, o: &Outcome) {
    ctx.hist.record(Entry::Complete {
        op,
        exit: o.exit,
        out: o.out.iter().rev().take(50).rev().cloned().collect(),
        err: o.err.iter().rev().take(20).rev().cloned().collect(),
    });
}

/// A host the tools may run on: the controller's mostly, else a joined node nobody is
/// working on.
fn tool_host(ctx: &Ctx, r: &mut ChaCha8Rng) -> String {
    if r.random_bool(0.7) {
        return ctx.ctl.clone();
    }
    let w = match ctx.world.lock() {
        Ok(w) => w,
        Err(_) => return ctx.ctl.clone(),
    };
    let free = w.free_joined();
    if free.is_empty() {
        ctx.ctl.clone()
    } else {
        free[r.random_range(0..free.len())].clone()
    }
}

/// One job submitter: runs jobs one after another until the soak stops.
pub fn jobs(ctx: &Ctx, stream: u64) {
    let mut r = rng(ctx, 100 + stream);
    while !ctx.stopping() {
        let op = ctx.op_id();
        let tag = format!("soak-job-{op}");
        // Mostly on some of the nodes nobody is shrinking (so that shrinks find idle
        // nodes), now and then one process per node of the whole DVM.
        let free = ctx
            .world
            .lock()
            .map(|w| w.free_joined())
            .unwrap_or_default();
        let (hosts, width) = if free.is_empty() || r.random_bool(0.1) {
            (
                None,
                ctx.world.lock().map(|w| w.joined.len()).unwrap_or(1).max(1),
            )
        } else {
            let k = r.random_range(1..=free.len().min(8));
            let mut pick: Vec<String> = free.clone();
            pick.shuffle(&mut r);
            pick.truncate(k);
            (Some(pick.join(",")), k)
        };
        let nprocs = r.random_range(width as u32..=(width as u32 * 2));
        let pick = r.random_range(0..100);
        let (shape, script, expect, limit) = match pick {
            0..=34 => ("true", "exit 0".to_string(), Expect::Exit(0), None),
            35..=54 => (
                "barrier",
                format!(
                    "echo 'barrier 1' >&3; read r <&3; sleep 0.{}; echo 'barrier 2' >&3; read r <&3",
                    r.random_range(1..9)
                ),
                Expect::Exit(0),
                None,
            ),
            55..=69 => (
                "long",
                format!("sleep {}", r.random_range(2..8)),
                Expect::Exit(0),
                None,
            ),
            70..=81 => (
                "fail",
                "[ \"$DVMLAB_PROC\" = 0 ] && exit 5; exit 0".to_string(),
                Expect::Exit(5),
                None,
            ),
            82..=90 => ("killed", "sleep 60".to_string(), Expect::Killed, None),
            _ => ("timeout", "sleep 60".to_string(), Expect::TimedOut, Some("1")),
        };
        let host = tool_host(ctx, &mut r);
        let mut argv = vec![
            ctx.bin("prun"),
            "-n".into(),
            nprocs.to_string(),
            "--stdin".into(),
            "none".into(),
            "-x".into(),
            format!("DVMLAB_SOAK={}", ctx.run_tag),
        ];
        if let Some(l) = limit {
            argv.extend(["--time-limit".into(), l.into()]);
        }
        if let Some(h) = hosts {
            argv.extend(["--host".into(), h]);
        }
        argv.extend(["sh".into(), "-c".into(), script, tag.clone()]);
        let what = Op::Job {
            tag: tag.clone(),
            shape: shape.into(),
            nprocs,
            expect,
        };
        if shape == "killed" {
            killed_job(ctx, &mut r, op, &host, what, &argv, &tag);
        } else {
            operate(ctx, op, &host, what, &argv);
        }
        pause(ctx, &mut r, 50, 800);
    }
}

/// A job the workload kills once it runs: prun in the background, `pctl kill ID KILL` as
/// an operation of its own.
fn killed_job(
    ctx: &Ctx,
    r: &mut ChaCha8Rng,
    op: u64,
    host: &str,
    what: Op,
    argv: &[String],
    tag: &str,
) {
    ctx.hist.record(Entry::Invoke {
        op,
        host: host.to_string(),
        what,
    });
    let cmd = match ctx.command(host, argv) {
        Ok(c) => c,
        Err(e) => {
            record_complete(
                ctx,
                op,
                &Outcome {
                    exit: None,
                    out: vec![],
                    err: vec![e],
                },
            );
            return;
        }
    };
    let prun = std::thread::scope(|s| {
        let h = s.spawn(|| run_command(cmd, OP_DEADLINE, |_| {}));
        // Wait for the job to run, as the observer sees it, then kill it (unless prun
        // ended first: the job never ran, or a fault ended it).
        let running =
            dvmlab_harness::wait_until(Duration::from_secs(30), Duration::from_millis(100), || {
                match ctx.world.lock().ok().and_then(|w| w.jobs.get(tag).cloned()) {
                    Some((id, state)) if state == "RUNNING" => Ok(Some(id)),
                    _ if h.is_finished() => Ok(None),
                    other => Err(format!("{tag} not running yet: {other:?}")),
                }
            });
        if let Ok(Some(id)) = running {
            pause(ctx, r, 100, 1500);
            let kill = ctx.op_id();
            operate(
                ctx,
                kill,
                &ctx.ctl.clone(),
                Op::KillJob {
                    target: op,
                    job: id,
                },
                &[
                    ctx.bin("pctl"),
                    "kill".into(),
                    id.to_string(),
                    "KILL".into(),
                ],
            );
        }
        h.join().unwrap_or_default()
    });
    record_complete(ctx, op, &prun);
}

/// Grows and shrinks, one at a time, with a requester (`palloc`) or without (`pctl`), now
/// and then one that must be rejected.
pub fn elastic(ctx: &Ctx) {
    let mut r = rng(ctx, 200);
    while !ctx.stopping() {
        pause(ctx, &mut r, 2000, 7000);
        if ctx.stopping() {
            break;
        }
        let (grow, hosts) = {
            let Ok(mut w) = ctx.world.lock() else { return };
            let outside = w.free_outside(ctx);
            // Initial nodes may go, but at least half of them stay.
            let initial_in = ctx.initial.iter().filter(|h| w.joined.contains(*h)).count();
            let inside: Vec<String> = w
                .joined
                .iter()
                .filter(|h| !w.busy.contains(*h))
                .filter(|h| !ctx.initial.contains(h) || initial_in > ctx.initial.len().div_ceil(2))
                .cloned()
                .collect();
            let wrong = r.random_bool(0.1);
            let grow = if outside.is_empty() {
                false
            } else if inside.is_empty() {
                true
            } else {
                r.random_bool(0.55)
            };
            let pool = match (grow, wrong) {
                (true, false) | (false, true) => &outside,
                _ => &inside,
            };
            if pool.is_empty() {
                continue;
            }
            let k = if grow && !wrong {
                r.random_range(1..=2.min(pool.len()))
            } else {
                1
            };
            let mut hosts = Vec::new();
            while hosts.len() < k {
                let h = pool[r.random_range(0..pool.len())].clone();
                if !hosts.contains(&h) {
                    hosts.push(h);
                }
            }
            if !wrong {
                w.busy.extend(hosts.iter().cloned());
            }
            (grow, hosts)
        };
        if !grow {
            // A release of a node running job processes is refused: give the jobs there
            // time to end (new ones keep off a busy node), then ask anyway.
            let _ = dvmlab_harness::wait_until(
                Duration::from_secs(20),
                Duration::from_millis(100),
                || match ctx.world.lock() {
                    Ok(w) if hosts.iter().any(|h| w.running_on.contains(h)) => {
                        Err("jobs still run there".to_string())
                    }
                    _ => Ok(()),
                },
            );
        }
        let requester = r.random_bool(0.5);
        let op = ctx.op_id();
        let list = hosts.join(",");
        let argv: Vec<String> = match (grow, requester) {
            // `--linger` keeps palloc listening after the terminal event, so that a second
            // one would be recorded.
            (_, true) => vec![
                ctx.bin("palloc"),
                if grow { "new" } else { "release" }.into(),
                "--host".into(),
                list,
                "--request-id".into(),
                format!("r{op}"),
                "--json".into(),
                "--linger".into(),
                "2".into(),
                "--timeout".into(),
                "90".into(),
            ],
            (true, false) => vec![
                ctx.bin("pctl"),
                "grow".into(),
                "--add-host".into(),
                list,
                "--wait".into(),
                "--json".into(),
                "--timeout".into(),
                "90".into(),
            ],
            (false, false) => vec![
                ctx.bin("pctl"),
                "shrink".into(),
                list,
                "--wait".into(),
                "--json".into(),
                "--timeout".into(),
                "90".into(),
            ],
        };
        let what = if grow {
            Op::Grow {
                hosts: hosts.clone(),
                requester,
            }
        } else {
            Op::Shrink {
                hosts: hosts.clone(),
                requester,
            }
        };
        let o = operate(ctx, op, &ctx.ctl.clone(), what, &argv);
        if let Ok(mut w) = ctx.world.lock() {
            for h in &hosts {
                w.busy.remove(h);
                if grow && o.exit == Some(0) {
                    w.launched.insert(h.clone());
                }
            }
        }
    }
}

/// Notifications of the soak's code, each with a tag of its own, from tools on random
/// hosts, with a node-local or DVM-wide range.
pub fn notifier(ctx: &Ctx) {
    let mut r = rng(ctx, 300);
    while !ctx.stopping() {
        pause(ctx, &mut r, 500, 2500);
        let op = ctx.op_id();
        let tag = format!("n{op}");
        let range = if r.random_bool(0.3) {
            "LOCAL"
        } else {
            "GLOBAL"
        };
        let host = tool_host(ctx, &mut r);
        operate(
            ctx,
            op,
            &host,
            Op::Notify {
                range: range.into(),
                tag: tag.clone(),
            },
            &[
                ctx.bin("pevent"),
                "notify".into(),
                SOAK_CODE.to_string(),
                "--range".into(),
                range.into(),
                "--info".into(),
                format!("soak.tag={tag}"),
            ],
        );
    }
}

/// Keeps [`LISTENERS`] event listeners running on random hosts, each registered for the
/// soak's code and for job ends; one that ends is replaced by a new one.
pub fn listeners(ctx: &Ctx) {
    let mut r = rng(ctx, 400);
    std::thread::scope(|s| {
        let mut running: Vec<std::thread::ScopedJoinHandle<()>> = Vec::new();
        let mut next = 1u64;
        while !ctx.stopping() {
            running.retain(|h| !h.is_finished());
            while running.len() < LISTENERS && !ctx.stopping() {
                let host = tool_host(ctx, &mut r);
                let id = next;
                next += 1;
                running.push(s.spawn(move || listen(ctx, id, host)));
            }
            pause(ctx, &mut r, 300, 600);
        }
        let _ = running;
    });
}

fn listen(ctx: &Ctx, id: u64, host: String) {
    let argv = vec![
        ctx.bin("pevent"),
        "listen".into(),
        "--handler".into(),
        format!("name=soak,codes={SOAK_CODE}:-145"),
        "--timeout".into(),
        (ctx.deadline
            .saturating_duration_since(std::time::Instant::now())
            .as_secs()
            + 1)
        .to_string(),
    ];
    let rec = |phase, line| {
        ctx.hist.record(Entry::Listener {
            listener: id,
            host: host.clone(),
            phase,
            line,
        })
    };
    let cmd = match ctx.command(&host, &argv) {
        Ok(c) => c,
        Err(_) => return,
    };
    rec(ListenerPhase::Started, None);
    // Runs until the soak's end or until its daemon goes.
    let left = ctx
        .deadline
        .saturating_duration_since(std::time::Instant::now());
    run_command(cmd, left + Duration::from_secs(5), |line| {
        let v: serde_json::Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(_) => return,
        };
        if v.get("ready").is_some() {
            rec(ListenerPhase::Ready, None);
        } else if v.get("handler").is_some() {
            rec(ListenerPhase::Event, Some(v));
        }
    });
    rec(ListenerPhase::Ended, None);
}
