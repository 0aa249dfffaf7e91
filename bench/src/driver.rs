//! Measures one runtime through its conformance profile only — the daemon command, the
//! status, the submit and stop commands, and for grow and shrink the `[elastic]` pushes —
//! on harness hosts, as the conformance suite drives it: a vendor's runtime is measured
//! exactly as dvmlab's own is. Every figure is taken beside the machine's floor for the
//! same work on the same hosts ([`crate::floor`]). Each job, each floor run and each block
//! of sequential jobs starts on a quiet machine ([`crate::quiet`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::knobs::Cell;
use conformance::profile::Profile;
use conformance::status::Status;
use conformance::sut::{Ctx, Dvm};
use dvmlab_harness::{agent, wait_until, BackendKind, PrteConf};
use serde::Serialize;

use crate::floor;
use crate::quiet::Settles;
use crate::stats::median;

/// What every job of the benches runs.
pub(crate) const TRUE: &str = "/bin/true";

/// How long a DVM may take to form before the bench gives up on it.
const FORM_LIMIT: Duration = Duration::from_secs(180);

/// How often the bench reads the status while it waits, when the status does not say when
/// the DVM formed (`formed_at_unix_ms`): the resolution of such a formation figure.
pub const POLL: Duration = Duration::from_millis(10);

/// How long a job, a grow or a shrink may take before it counts as hung.
const COMMAND_LIMIT: Duration = Duration::from_secs(120);

/// The tree's radix on every DVM the benches form.
pub const RADIX: u32 = 64;

/// Hosts per core beyond which a DVM counts as crowded and its daemons get the profile's
/// `crowded_env`: 128 hosts on two cores is not crowded, 1024 is.
pub const CROWDED_PER_CORE: usize = 128;

/// Whether `n` hosts (and the controller's) on `cores` cores are crowded.
pub(crate) fn crowded(n: usize, cores: usize) -> bool {
    n + 1 > CROWDED_PER_CORE * cores.max(1)
}

/// A runtime to measure: its profile, loaded and built.
pub struct Runtime {
    /// What tables and charts call it: the profile's `[implementation] name`.
    pub name: String,
    pub profile: Arc<Profile>,
}

impl Runtime {
    /// Loads the profile at `path` and runs its build command.
    pub fn load(path: &std::path::Path) -> Result<Runtime, String> {
        let profile = Profile::load(path)?;
        if !profile.has_dvm {
            return Err(format!(
                "profile {}: it drives no DVM (it has no [daemon], [status] and [stop]), so there is nothing to measure",
                path.display()
            ));
        }
        profile.build()?;
        Ok(Runtime {
            name: profile.implementation.name.clone(),
            profile: Arc::new(profile),
        })
    }
}

/// What a figure measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Every daemon started together (the controller first): from the first start to formed.
    FormTogether,
    /// The same formation, from the last daemon's start to formed: what the DVM still needs
    /// once everything it is made of has been started.
    FormTogetherAfterLast,
    /// The nodes started, then the controller: from the controller's start to formed.
    FormControllerLast,
    /// A job of one `/bin/true` per node on a formed DVM, submit to exit.
    Job,
    /// One-process jobs one after another: ms per job.
    Sequential,
    /// A push growing the DVM onto new hosts, to its end.
    Grow,
    /// A push shrinking those hosts away, to its end.
    Shrink,
    /// One-shot work with no DVM beforehand: start the daemons, form, run a job of one
    /// `/bin/true` per node (Open MPI: one `mpirun`), from the first start to the job's end.
    OneShot,
}

impl Metric {
    pub const ALL: [Metric; 8] = [
        Metric::FormTogether,
        Metric::FormTogetherAfterLast,
        Metric::FormControllerLast,
        Metric::Job,
        Metric::Sequential,
        Metric::Grow,
        Metric::Shrink,
        Metric::OneShot,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Metric::FormTogether => "formation, all started together",
            Metric::FormTogetherAfterLast => {
                "formation, all started together, after the last start"
            }
            Metric::FormControllerLast => "formation, controller last",
            Metric::Job => "job, one /bin/true per node",
            Metric::Sequential => "sequential one-process jobs",
            Metric::Grow => "grow (push)",
            Metric::Shrink => "shrink (push)",
            Metric::OneShot => "one-shot: daemons started, one /bin/true per node, done",
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Metric::Sequential => "ms per job",
            _ => "ms",
        }
    }

    /// Whether it is set against its floor as a ratio. Not formation after the last start:
    /// a status gives its formation time in whole milliseconds, and from the last start the
    /// rest takes a few of them (the floor's connections, about one), so a ratio would show
    /// the rounding; the figure stands for the scale goal, in ms, beside the floor's.
    pub fn has_ratio(self) -> bool {
        self != Metric::FormTogetherAfterLast
    }

    /// What its floor is.
    pub fn floor(self) -> &'static str {
        match self {
            Metric::FormTogether | Metric::FormControllerLast => {
                "as many processes started on the same hosts, each making one TCP connection to a process on ctl, until all are accepted"
            }
            Metric::FormTogetherAfterLast => {
                "the same processes and connections, from the last one's start until all are accepted"
            }
            Metric::Job => {
                "as many /bin/true spawned and waited for by one worker per core, the workers started on ctl as the tool is"
            }
            Metric::Sequential => {
                "one worker started on ctl spawning one /bin/true (two starts, as a tool and its process)"
            }
            Metric::Grow | Metric::Shrink => {
                "the launch agent starting /bin/true on each of the hosts, all at once"
            }
            Metric::OneShot => {
                "the formation floor plus the job floor: processes started on the hosts each connecting to ctl, then as many /bin/true spawned"
            }
        }
    }
}

/// One measured figure, beside its floor from the same run.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub metric: Metric,
    pub nodes: usize,
    pub value: f64,
    pub floor: f64,
    /// The formation figure is timed by the bench's status reads (the status has no
    /// `formed_at_unix_ms`): good to [`POLL`].
    pub polled: bool,
}

/// Memory of the daemons the harness started, once the DVM has run its jobs.
#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    pub nodes: usize,
    /// Peak resident set (VmHWM) of the controller's process, MiB.
    pub controller_mib: f64,
    pub daemon_mean_mib: f64,
    pub daemon_max_mib: f64,
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    pub backend: BackendKind,
    pub sizes: Vec<usize>,
    /// Jobs timed per DVM (their median is the figure).
    pub job_reps: usize,
    /// Sequential one-process jobs on each DVM (0: none): a small job's cost should not
    /// grow with the DVM it runs on.
    pub sequential: usize,
    /// Hosts a grow adds, on a DVM of the smallest size (0: no grow or shrink).
    pub grow: usize,
    /// Formation only: no jobs (the largest scales).
    pub formation_only: bool,
}

/// Everything one repetition of a plan measured for one runtime.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Measured {
    pub samples: Vec<Sample>,
    pub memory: Vec<Memory>,
    /// What a reader of the figures must know: what was not measured and why, and what the
    /// runtime was given beyond its plain profile.
    pub notes: Vec<String>,
    /// The timed runs that waited for a quiet machine, and those that did not get one.
    pub settles: Settles,
}

/// `n0001`, … (the width DVMNodes' range names).
pub(crate) fn nodes(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("n{i:04}")).collect()
}

pub(crate) fn conf(n: usize) -> PrteConf {
    PrteConf::new()
        .set("ClusterName", "bench")
        .set("DVMNodes", format!("n[4:1-{n}]"))
        .set("DVMControllerHost", "ctl")
        .set("DVMRadix", RADIX)
        .set("DVMIPVersion", 4)
}

/// The cluster of `hosts` (the controller's first, then `n` nodes) for a DVM of the benches'
/// conf; crowded, its daemons get the profile's `crowded_env` too.
pub(crate) fn dvm<'a>(
    ctx: &'a Ctx,
    label: &str,
    hosts: &[String],
    n: usize,
) -> Result<Dvm<'a>, String> {
    Dvm::with(ctx, label, hosts, &conf(n), |spec| {
        if crowded(n, floor::cores()) {
            spec.env.extend(ctx.profile.daemon.crowded_env.clone());
        }
    })
    .map_err(|p| p.to_string())
}

pub(crate) fn ctx(rt: &Runtime, backend: BackendKind, n: usize) -> Ctx {
    let cell = Cell {
        ip: 4,
        radix: RADIX,
        backend,
        nodes: n,
    };
    Ctx::new(rt.profile.clone(), cell, 0, "bench")
}

pub(crate) fn unix_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Waits until the status says formed, reading it every [`POLL`] without loading the hosts;
/// the status and when the bench saw it (Unix ms).
pub(crate) fn wait_formed(dvm: &Dvm) -> Result<(Status, f64), String> {
    let mut last = String::from("no status yet");
    wait_until(FORM_LIMIT, POLL, || match dvm.status_unobserved() {
        Ok(s) if s.formed => Ok((s, unix_ms())),
        Ok(s) => {
            last = format!("{} joined", s.joined());
            Err(last.clone())
        }
        Err(Ok(why)) => {
            last = why;
            Err(last.clone())
        }
        Err(Err(p)) => Err(p.to_string()),
    })
    .map_err(|e| format!("the DVM did not form within {FORM_LIMIT:?} ({last}): {e}"))
}

/// How long a DVM took to form.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Formed {
    /// From the first daemon's start, ms.
    pub(crate) from_first: f64,
    /// From the last daemon's start, ms.
    pub(crate) from_last: f64,
    /// Timed by the bench's own status reads (the status reports no formation time).
    pub(crate) polled: bool,
}

/// Starts `order` and waits until formed.
pub(crate) fn form(dvm: &mut Dvm, order: &[String]) -> Result<Formed, String> {
    let first = unix_ms();
    dvm.start_many(order).map_err(|p| p.to_string())?;
    let last = unix_ms();
    let (status, seen) = wait_formed(dvm)?;
    // A status's formation time is in whole milliseconds, rounded down: the starts are
    // taken the same way, so that a difference of a few ms is not biased low by half of one.
    let (at, first, last, polled) = match status.formed_at_unix_ms {
        Some(at) => (at as f64, first.floor(), last.floor(), false),
        None => (seen, first, last, true),
    };
    Ok(Formed {
        from_first: (at - first).max(0.0),
        from_last: (at - last).max(0.0),
        polled,
    })
}

/// Runs `argv` on the controller's host; ms to its exit (which must be 0 within `limit`).
pub(crate) fn timed_within(dvm: &Dvm, argv: &[String], limit: Duration) -> Result<f64, String> {
    let t = Instant::now();
    let (code, out, err) = dvm
        .run_on(&dvm.ctl, argv, limit)
        .map_err(|p| p.to_string())?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let end = match code {
        Some(0) => return Ok(ms),
        Some(c) => format!("exited {c}"),
        None => format!("did not end within {limit:?}"),
    };
    Err(format!("{argv:?} {end}:\n{}\n{}", out.trim(), err.trim()))
}

/// [`timed_within`] the limit of a job, a grow or a shrink.
pub(crate) fn timed(dvm: &Dvm, argv: &[String]) -> Result<f64, String> {
    timed_within(dvm, argv, COMMAND_LIMIT)
}

pub(crate) fn stop(dvm: &mut Dvm) -> Result<(), String> {
    dvm.stop().map_err(|p| format!("stopping the DVM: {p}"))
}

/// Removes the cluster and its run directory (the suite keeps them for its reports; a
/// bench that succeeded has nothing to show in them).
pub(crate) fn discard(dvm: Dvm) {
    let dir = dvm.cluster.run_dir().to_path_buf();
    dvm.cluster.destroy();
    if let Err(e) = dvmlab_harness::rundir::remove_kept(&dir) {
        eprintln!("dvmlab-bench: {e}");
    }
}

/// Tears down a cluster whose measurement failed, keeping its run directory (its daemons'
/// logs) for a look, and says where it is in `error`.
pub(crate) fn failed(dvm: Dvm, error: String) -> String {
    let dir = dvm.cluster.run_dir().to_path_buf();
    dvm.cluster.destroy();
    format!(
        "{error}\n(the daemons' logs: {}; `dvmlab-harness gc` removes it)",
        dir.display()
    )
}

/// Peak resident set of `pid` (VmHWM), MiB.
fn peak_rss_mib(pid: u32) -> Option<f64> {
    let kib: f64 = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

fn memory(dvm: &Dvm, nodes: &[String]) -> Option<Memory> {
    let rss: Vec<f64> = nodes
        .iter()
        .filter_map(|h| peak_rss_mib(dvm.cluster.pid(h)?))
        .collect();
    if rss.is_empty() {
        return None;
    }
    Some(Memory {
        nodes: nodes.len(),
        controller_mib: peak_rss_mib(dvm.cluster.pid(&dvm.ctl)?)?,
        daemon_mean_mib: rss.iter().sum::<f64>() / rss.len() as f64,
        daemon_max_mib: rss.iter().cloned().fold(0.0, f64::max),
    })
}

/// One repetition of `plan` for `rt`; `say` is told what is being measured.
pub fn measure(rt: &Runtime, plan: &Plan, say: &mut dyn FnMut(&str)) -> Result<Measured, String> {
    let mut m = Measured::default();
    let smallest = plan.sizes.iter().copied().min().unwrap_or(0);
    for &n in &plan.sizes {
        let seq = plan.sequential;
        say(&format!("{}: {n} nodes", rt.name));
        if crowded(n, floor::cores()) && !rt.profile.daemon.crowded_env.is_empty() {
            let env: Vec<String> = rt
                .profile
                .daemon
                .crowded_env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let note = format!(
                "{}: at {n} hosts on {} cores (more than {CROWDED_PER_CORE} a core) its daemons had the profile's crowded_env: {}.",
                rt.name,
                floor::cores(),
                env.join(" ")
            );
            say(&note);
            if !m.notes.contains(&note) {
                m.notes.push(note);
            }
        }
        size(rt, plan, n, seq, &mut m).map_err(|e| format!("{}, {n} nodes: {e}", rt.name))?;
    }
    if plan.grow > 0 && !plan.formation_only {
        if rt.profile.elastic.is_none() {
            m.notes.push(format!(
                "{}: grow and shrink not measured: its profile has no [elastic] section",
                rt.name
            ));
        } else {
            say(&format!("{}: grow and shrink by {}", rt.name, plan.grow));
            elastic(rt, plan, smallest.max(1), &mut m)
                .map_err(|e| format!("{}, grow and shrink: {e}", rt.name))?;
        }
    }
    Ok(m)
}

fn size(rt: &Runtime, plan: &Plan, n: usize, seq: usize, m: &mut Measured) -> Result<(), String> {
    let ctx = ctx(rt, plan.backend, n);
    let names = nodes(n);
    let mut hosts = vec!["ctl".to_string()];
    hosts.extend(names.iter().cloned());
    let mut dvm = dvm(&ctx, "bench", &hosts, n)?;
    match size_on(&mut dvm, plan, n, seq, &names, &hosts, m) {
        Ok(()) => {
            discard(dvm);
            Ok(())
        }
        Err(e) => Err(failed(dvm, e)),
    }
}

fn size_on(
    dvm: &mut Dvm,
    plan: &Plan,
    n: usize,
    seq: usize,
    names: &[String],
    hosts: &[String],
    m: &mut Measured,
) -> Result<(), String> {
    let sample = |metric, value, floor, polled| Sample {
        metric,
        nodes: n,
        value,
        floor,
        polled,
    };
    let together = form(dvm, hosts)?;
    let mut jobs = None;
    if !plan.formation_only {
        let argv = dvm
            .submit_argv(n, names, &[], &[TRUE])
            .map_err(|p| p.to_string())?;
        // Each job beside a floor run, alternately: on a VM whose neighbours come and go, a
        // floor measured after all the jobs moved by half between repetitions.
        let mut times = Vec::with_capacity(plan.job_reps);
        let mut floors = Vec::with_capacity(plan.job_reps);
        for _ in 0..plan.job_reps.max(1) {
            m.settles.settle()?;
            times.push(timed(dvm, &argv)?);
            m.settles.settle()?;
            floors.push(floor::spawn_ms(&dvm.cluster, &dvm.ctl, TRUE, n, 1)?);
        }
        jobs = Some(sample(Metric::Job, median(&times), median(&floors), false));
        if seq > 0 {
            let one = dvm
                .submit_argv(1, &names[..1], &[], &[TRUE])
                .map_err(|p| p.to_string())?;
            m.settles.settle()?;
            let t = Instant::now();
            for _ in 0..seq {
                timed(dvm, &one)?;
            }
            let per_job = t.elapsed().as_secs_f64() * 1000.0 / seq as f64;
            m.settles.settle()?;
            let t = Instant::now();
            for _ in 0..seq {
                floor::spawn_ms(&dvm.cluster, &dvm.ctl, TRUE, 1, 1)?;
            }
            let floor_per_job = t.elapsed().as_secs_f64() * 1000.0 / seq as f64;
            m.samples
                .push(sample(Metric::Sequential, per_job, floor_per_job, false));
        }
    }
    m.memory.extend(memory(dvm, names));
    stop(dvm)?;
    let ctl_last = form(dvm, &names_then_ctl(hosts))?;
    stop(dvm)?;
    let floor = floor::connect_ms(&dvm.cluster, &dvm.ctl, hosts)?;
    m.samples.push(sample(
        Metric::FormTogether,
        together.from_first,
        floor.from_first,
        together.polled,
    ));
    m.samples.push(sample(
        Metric::FormTogetherAfterLast,
        together.from_last,
        floor.from_last,
        together.polled,
    ));
    m.samples.push(sample(
        Metric::FormControllerLast,
        ctl_last.from_last,
        floor.from_first,
        ctl_last.polled,
    ));
    m.samples.extend(jobs);
    Ok(())
}

/// The nodes first, the controller (the first host) last.
fn names_then_ctl(hosts: &[String]) -> Vec<String> {
    let mut order = hosts[1..].to_vec();
    order.extend(hosts.first().cloned());
    order
}

/// A DVM of `n` nodes and `plan.grow` spare hosts the profile's launch agent can start
/// daemons on: a grow onto all spares, then a shrink of them, each timed to its end.
fn elastic(rt: &Runtime, plan: &Plan, n: usize, m: &mut Measured) -> Result<(), String> {
    let e = rt
        .profile
        .elastic
        .clone()
        .ok_or("the profile has no [elastic] section")?;
    let ctx = ctx(rt, plan.backend, n);
    let names = nodes(n);
    let spares: Vec<String> = (1..=plan.grow).map(|i| format!("g{i:04}")).collect();
    let mut hosts = vec!["ctl".to_string()];
    hosts.extend(names.iter().cloned());
    let formed = hosts.clone();
    hosts.extend(spares.iter().cloned());
    let mut dvm = dvm(&ctx, "benchel", &hosts, n)?;
    let r = (|| {
        let program = agent::program()?;
        let launch = dvm.cluster.write_agent(&program)?;
        let mut daemon = rt.profile.daemon.command.clone();
        daemon.extend(rt.profile.elastic_words(&launch.to_string_lossy(), false)?);
        dvm.cluster.set_daemon(daemon);
        let floor = floor::agent_ms(&dvm.cluster, &dvm.ctl, &launch, &spares)?;
        form(&mut dvm, &formed)?;
        let push = |words: &[String]| -> Vec<String> {
            words
                .iter()
                .map(|w| w.replace("{hosts}", &spares.join(",")))
                .collect()
        };
        let grow = timed(&dvm, &push(&e.grow))?;
        let shrink = timed(&dvm, &push(&e.shrink))?;
        stop(&mut dvm)?;
        for (metric, value) in [(Metric::Grow, grow), (Metric::Shrink, shrink)] {
            m.samples.push(Sample {
                metric,
                nodes: spares.len(),
                value,
                floor,
                polled: false,
            });
        }
        Ok(())
    })();
    if let Err(e) = r {
        return Err(failed(dvm, e));
    }
    discard(dvm);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thousand_hosts_on_two_cores_are_crowded_and_the_job_benches_sizes_are_not() {
        assert!(!crowded(128, 2));
        assert!(!crowded(255, 2));
        assert!(crowded(256, 2));
        assert!(crowded(1024, 2));
        assert!(!crowded(1024, 16));
        assert!(crowded(200, 0));
    }
}
