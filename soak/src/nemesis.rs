//! The nemesis: faults drawn from the soak's seed, from every kind the harness has — kill
//! (and a late boot), freeze and thaw, partitions both ways and one way, impaired links,
//! a controller restart, launch failures of grow targets — at most two at once, each
//! recorded when it starts and when it is undone, and all undone at the end.

use std::time::{Duration, Instant};

use dvmlab_harness::{Direction, Impairment, PartitionId};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::driver::Ctx;
use crate::history::{Entry, Fault};

/// Faults in effect at once, at most.
const MAX_ACTIVE: usize = 2;

/// A fault in effect and how to undo it.
struct Active {
    id: u64,
    fault: Fault,
    until: Instant,
    partition: Option<PartitionId>,
    /// Hosts it marked busy.
    busy: Vec<String>,
}

/// Runs faults until the soak's deadline, then undoes every one still in effect.
pub fn run(ctx: &Ctx) -> Result<(), String> {
    let mut r = ChaCha8Rng::seed_from_u64(ctx.seed ^ 0x006e_656d_6573_6973);
    let mut active: Vec<Active> = Vec::new();
    let mut next_id = 1u64;
    let mut next_fault = Instant::now() + Duration::from_millis(r.random_range(1000..4000));
    while Instant::now() < ctx.deadline {
        let now = Instant::now();
        let (due, rest): (Vec<Active>, Vec<Active>) =
            active.into_iter().partition(|a| a.until <= now);
        active = rest;
        for a in due {
            undo(ctx, a)?;
        }
        if now >= next_fault && active.len() < MAX_ACTIVE {
            if let Some(a) = inject(ctx, &mut r, next_id)? {
                next_id += 1;
                active.push(a);
            }
            next_fault = now + Duration::from_millis(r.random_range(1500..6000));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for a in active {
        undo(ctx, a)?;
    }
    Ok(())
}

fn pick(r: &mut ChaCha8Rng, pool: &[String]) -> Option<String> {
    (!pool.is_empty()).then(|| pool[r.random_range(0..pool.len())].clone())
}

/// Starts one fault (or none, if nothing can take one now).
fn inject(ctx: &Ctx, r: &mut ChaCha8Rng, id: u64) -> Result<Option<Active>, String> {
    let (joined_free, killable, free_spares) = {
        let w = ctx.world.lock().map_err(|_| "world lock poisoned")?;
        let free = w.free_joined();
        let killable: Vec<String> = free
            .iter()
            .filter(|h| ctx.initial.contains(h) && !w.launched.contains(*h))
            .cloned()
            .collect();
        (free, killable, w.free_outside(ctx))
    };
    let roll = r.random_range(0..100);
    let (fault, dur) = match roll {
        0..=19 => {
            let Some(host) = pick(r, &killable) else {
                return Ok(None);
            };
            let late = r.random_bool(0.4);
            let ms = if late {
                r.random_range(12_000..25_000)
            } else {
                r.random_range(500..3000)
            };
            (Fault::Kill { host, late }, ms)
        }
        20..=39 => {
            let Some(host) = pick(r, &joined_free) else {
                return Ok(None);
            };
            (Fault::Freeze { host }, r.random_range(500..6000))
        }
        40..=61 => {
            let mut pool = joined_free.clone();
            if pool.is_empty() {
                return Ok(None);
            }
            pool.shuffle(r);
            let k = r.random_range(1..=3.min(pool.len()));
            let a: Vec<String> = pool[..k].to_vec();
            let all = ctx
                .cluster
                .lock()
                .map_err(|_| "cluster lock poisoned")?
                .hosts()
                .to_vec();
            let b: Vec<String> = all
                .iter()
                .map(|h| h.name.clone())
                .filter(|h| !a.contains(h))
                .collect();
            (
                Fault::Partition {
                    a,
                    b,
                    one_way: r.random_bool(0.5),
                },
                r.random_range(1000..7000),
            )
        }
        62..=79 => {
            let Some(host) = pick(r, &joined_free) else {
                return Ok(None);
            };
            (
                Fault::Impair {
                    host,
                    delay_ms: r.random_range(5..60),
                    loss_pct: r.random_range(0..6),
                },
                r.random_range(2000..9000),
            )
        }
        80..=87 => (
            Fault::ControllerRestart {
                host: ctx.ctl.clone(),
            },
            r.random_range(300..2000),
        ),
        _ => {
            if free_spares.is_empty() {
                return Ok(None);
            }
            (
                Fault::LaunchFailure { hosts: free_spares },
                r.random_range(5000..15_000),
            )
        }
    };
    let mut partition = None;
    {
        let mut c = ctx.cluster.lock().map_err(|_| "cluster lock poisoned")?;
        let res = match &fault {
            Fault::Kill { host, .. } => c.kill(host),
            Fault::Freeze { host } => c.freeze(host),
            Fault::Partition { a, b, one_way } => c
                .partition(
                    a,
                    b,
                    if *one_way {
                        Direction::OneWay
                    } else {
                        Direction::Both
                    },
                )
                .map(|p| partition = Some(p)),
            Fault::Impair {
                host,
                delay_ms,
                loss_pct,
            } => c.impair(
                host,
                Impairment {
                    delay: Duration::from_millis(*delay_ms),
                    jitter: Duration::from_millis(delay_ms / 4),
                    loss: f64::from(*loss_pct) / 100.0,
                    duplicate: 0.0,
                    seed: r.random(),
                },
            ),
            Fault::ControllerRestart { host } => c.kill(host),
            Fault::LaunchFailure { hosts } => hosts
                .iter()
                .try_for_each(|h| dvmlab_harness::agent::fail_launches(c.run_dir(), h, true)),
        };
        if let Err(e) = res {
            // A target that went away meanwhile (a daemon that left, a host shrunk), or a
            // fault the harness could not show in effect (a delay lost in a loaded
            // machine's noise), is not the nemesis's failure: whatever part of it was made
            // is undone, so that no fault the history does not name stays, and the next
            // one is drawn.
            let _ = match &fault {
                Fault::Freeze { host } => c.thaw(host),
                Fault::LaunchFailure { hosts } => hosts
                    .iter()
                    .try_for_each(|h| dvmlab_harness::agent::fail_launches(c.run_dir(), h, false)),
                // The harness takes back a partition or impairment it could not verify.
                Fault::Kill { .. }
                | Fault::Partition { .. }
                | Fault::Impair { .. }
                | Fault::ControllerRestart { .. } => Ok(()),
            };
            eprintln!("soak: nemesis: {fault:?} could not be made: {e}");
            return Ok(None);
        }
    }
    ctx.hist.record(Entry::Fault {
        id,
        start: true,
        fault: fault.clone(),
    });
    // The hosts it is about are left alone by the workload's grows and shrinks meanwhile
    // (a partition's cut-off side only).
    let mut busy = Vec::new();
    if let Ok(mut w) = ctx.world.lock() {
        let hs = match &fault {
            Fault::Partition { a, .. } => a.clone(),
            f => f.hosts().unwrap_or_default(),
        };
        for h in hs {
            if w.busy.insert(h.clone()) {
                busy.push(h);
            }
        }
    }
    Ok(Some(Active {
        id,
        fault,
        until: Instant::now() + Duration::from_millis(dur),
        partition,
        busy,
    }))
}

/// Undoes fault `a`, then records it.
fn undo(ctx: &Ctx, a: Active) -> Result<(), String> {
    {
        let mut c = ctx.cluster.lock().map_err(|_| "cluster lock poisoned")?;
        let res = match &a.fault {
            Fault::Kill { host, .. } | Fault::ControllerRestart { host } => c.start(host),
            Fault::Freeze { host } => c.thaw(host),
            Fault::Partition { .. } => match a.partition {
                Some(p) => c.heal(p),
                None => Ok(()),
            },
            Fault::Impair { host, .. } => c.unimpair(host),
            Fault::LaunchFailure { hosts } => hosts
                .iter()
                .try_for_each(|h| dvmlab_harness::agent::fail_launches(c.run_dir(), h, false)),
        };
        res.map_err(|e| format!("undoing {:?}: {e}", a.fault))?;
    }
    ctx.hist.record(Entry::Fault {
        id: a.id,
        start: false,
        fault: a.fault.clone(),
    });
    if let Ok(mut w) = ctx.world.lock() {
        for h in &a.busy {
            w.busy.remove(h);
        }
    }
    Ok(())
}
