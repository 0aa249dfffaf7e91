//! Where a job's time goes, by a command rather than a profiler session: a DVM formed through
//! the profile and held, jobs of one `/bin/true` per node each beside a run of the job's
//! floor, and the CPU of each split by who ran it, read from the kernel's own counts.
//!
//! - The job: its wall time; the machine's CPU over it (`/proc/stat`, in ticks of 10 ms,
//!   steal included); the runtime's daemons (every thread of each daemon process the harness
//!   started, `schedstat`, thread by thread); the tool with its start and exit (the
//!   processes this bench waited for, `getrusage`); the rest (the job's programs and their
//!   start, and what none of those ran: the kernel's work for nobody, the bench's own).
//! - The floor, the same way: the machine, the workers from their first spawn on, their
//!   start and exit, the programs they spawned (each worker's own `getrusage`), the rest.
//! - Per daemon, by its place (the controller's; where the status reports ranks and
//!   parents, those with children and those without; otherwise the others together): CPU,
//!   context switches and, where each host has its own network namespace, the TCP segments
//!   its host sent and received, per job.
//!
//! Each window is the job (or floor run) and a fixed quarter second after it, which holds
//! the job's end (acknowledgements, the end reaching every daemon); what the idle DVM and
//! machine do in as long (heartbeats, housekeeping) is measured first, over [`IDLE`], and
//! taken off both sides; its rates are printed with the tables.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use conformance::sut::Dvm;
use dvmlab_harness::BackendKind;
use serde::Serialize;

use crate::driver::{self, Runtime};
use crate::floor;
use crate::procfs;
use crate::quiet::{busy_ms, Settles, GAP};
use crate::stats::{self, median};
use conformance::status::{Field, Status};

/// How long the held DVM is watched idle, for what it does without a job: several of its
/// heartbeats, and enough ticks of `/proc/stat` for their rounding not to matter.
const IDLE: Duration = Duration::from_secs(5);

/// The daemons of one place in the tree, per daemon and job.
#[derive(Debug, Clone, Serialize)]
pub struct Role {
    pub name: String,
    pub daemons: usize,
    pub cpu_us: f64,
    pub switches: f64,
    /// TCP segments its host sent and received (none when hosts share a namespace).
    pub segments: Option<(f64, f64)>,
}

/// One size's jobs and floor runs, taken apart (CPU in ms per run, means over the jobs;
/// wall times medians).
#[derive(Debug, Clone, Serialize)]
pub struct Anatomy {
    pub nodes: usize,
    pub jobs: usize,
    pub job_ms: f64,
    pub floor_ms: f64,
    pub job_cpu_ms: f64,
    pub floor_cpu_ms: f64,
    pub daemons_ms: f64,
    pub workers_ms: f64,
    pub tool_ms: f64,
    pub workers_start_ms: f64,
    pub job_rest_ms: f64,
    pub programs_ms: f64,
    pub floor_rest_ms: f64,
    pub roles: Vec<Role>,
    /// What the idle DVM's daemons and the idle machine ran, ms per second.
    pub idle_daemons_ms_per_s: f64,
    pub idle_machine_ms_per_s: f64,
    pub settles: Settles,
}

/// What a daemon did so far: each thread's CPU ns and switches, and its host's TCP segments
/// sent and received.
#[derive(Debug, Clone, Default)]
struct Counts {
    cpu_ns: HashMap<u32, u64>,
    switches: HashMap<u32, u64>,
    segments: (u64, u64),
}

type Snapshot = HashMap<String, Counts>;

fn snapshot(pids: &BTreeMap<String, u32>, segments: bool) -> Result<Snapshot, String> {
    let mut s = HashMap::with_capacity(pids.len());
    for (host, &pid) in pids {
        let on = |e: String| format!("the daemon on {host} (pid {pid}): {e}");
        let c = Counts {
            cpu_ns: procfs::thread_cpu_ns(pid).map_err(on)?,
            switches: procfs::thread_switches(pid).map_err(on)?,
            segments: if segments {
                procfs::tcp_segments(pid).map_err(on)?
            } else {
                (0, 0)
            },
        };
        s.insert(host.clone(), c);
    }
    Ok(s)
}

/// What each host's daemon did between two snapshots (µs of CPU, switches, segments sent
/// and received), added into `into`.
fn add_since(into: &mut HashMap<String, [f64; 4]>, before: &Snapshot, after: &Snapshot) {
    let none = Counts::default();
    for (host, a) in after {
        let b = before.get(host).unwrap_or(&none);
        let e = into.entry(host.clone()).or_default();
        e[0] += procfs::grown(&b.cpu_ns, &a.cpu_ns) as f64 / 1e3;
        e[1] += procfs::grown(&b.switches, &a.switches) as f64;
        e[2] += a.segments.0.saturating_sub(b.segments.0) as f64;
        e[3] += a.segments.1.saturating_sub(b.segments.1) as f64;
    }
}

/// Every host's place, from the status when the profile reports ranks and parents.
fn places(
    rt: &Runtime,
    dvm: &Dvm,
    hosts: &[String],
) -> Result<BTreeMap<String, &'static str>, String> {
    let tree_known =
        rt.profile.status.reports(Field::Ranks) && rt.profile.status.reports(Field::Parents);
    let status = if tree_known {
        Some(
            dvm.status_now("the tree, for the daemons' places")
                .map_err(|p| p.to_string())?,
        )
    } else {
        None
    };
    Ok(places_in(status.as_ref(), hosts, &dvm.ctl))
}

/// Every host's place: the controller's (`ctl`), a daemon some other daemon's status names
/// as its parent, or another. Without a status giving every host a rank the tree is not
/// known, and every daemon but the controller's is one of "the others".
fn places_in(
    status: Option<&Status>,
    hosts: &[String],
    ctl: &str,
) -> BTreeMap<String, &'static str> {
    let listed = |s: &&Status| {
        hosts
            .iter()
            .all(|h| s.members.iter().any(|m| m.host == *h && m.rank.is_some()))
    };
    let parents: Option<BTreeSet<&str>> = status.filter(listed).map(|s| {
        let host_of: HashMap<u32, &str> = s
            .members
            .iter()
            .filter_map(|m| Some((m.rank?, m.host.as_str())))
            .collect();
        s.members
            .iter()
            .filter_map(|m| host_of.get(&m.parent?).copied())
            .collect()
    });
    hosts
        .iter()
        .map(|h| {
            let place = match &parents {
                _ if h == ctl => CONTROLLER,
                None => "the others",
                Some(p) if p.contains(h.as_str()) => "with children",
                Some(_) => "without children",
            };
            (h.clone(), place)
        })
        .collect()
}

const CONTROLLER: &str = "the controller's";

/// Takes `jobs` jobs and as many floor runs apart at each of `sizes`.
pub fn measure(
    rt: &Runtime,
    backend: BackendKind,
    sizes: &[usize],
    jobs: usize,
    say: &mut dyn FnMut(&str),
) -> Result<Vec<Anatomy>, String> {
    if jobs == 0 {
        return Err("--jobs 0: nothing to take apart".into());
    }
    sizes
        .iter()
        .map(|&n| size(rt, backend, n, jobs, say))
        .collect()
}

fn size(
    rt: &Runtime,
    backend: BackendKind,
    n: usize,
    jobs: usize,
    say: &mut dyn FnMut(&str),
) -> Result<Anatomy, String> {
    say(&format!(
        "{n} nodes: {jobs} jobs, each beside a run of its floor"
    ));
    let names = driver::nodes(n);
    let mut hosts = vec!["ctl".to_string()];
    hosts.extend(names.iter().cloned());
    let ctx = driver::ctx(rt, backend, n);
    let mut dvm = driver::dvm(&ctx, "anatomy", &hosts, n)?;
    let r = (|| {
        driver::form(&mut dvm, &hosts)?;
        let argv = dvm
            .submit_argv(n, &names, &[], &[driver::TRUE])
            .map_err(|p| p.to_string())?;
        // The first job of a DVM pays for cold caches.
        driver::timed(&dvm, &argv)?;
        let pids: BTreeMap<String, u32> = hosts
            .iter()
            .map(|h| {
                dvm.cluster
                    .pid(h)
                    .map(|p| (h.clone(), p))
                    .ok_or_else(|| format!("no daemon running on {h}"))
            })
            .collect::<Result<_, _>>()?;
        // Segments per host mean something only where each host has a namespace of its own.
        let namespaces: BTreeSet<String> = pids
            .values()
            .map(|&p| procfs::netns(p))
            .collect::<Result<_, _>>()?;
        let segments = namespaces.len() == pids.len();
        let place = places(rt, &dvm, &hosts)?;
        let mut settles = Settles::default();

        // What the held DVM and the machine do without a job, per ms.
        settles.settle()?;
        let t = Instant::now();
        let (b0, d0) = (busy_ms()?, snapshot(&pids, segments)?);
        std::thread::sleep(IDLE);
        let (d1, b1) = (snapshot(&pids, segments)?, busy_ms()?);
        let idle_ms = t.elapsed().as_secs_f64() * 1000.0;
        let mut idle = HashMap::new();
        add_since(&mut idle, &d0, &d1);
        let machine_idle = (b1 - b0) / idle_ms;

        let (mut wall, mut floor_wall) = (Vec::new(), Vec::new());
        let mut per_host: HashMap<String, [f64; 4]> = HashMap::new();
        let mut windows = 0.0;
        let (mut job_cpu, mut tool, mut floor_cpu, mut started) = (0.0, 0.0, 0.0, 0.0);
        let mut floors = floor::SpawnRun::default();
        for _ in 0..jobs {
            settles.settle()?;
            let d0 = snapshot(&pids, segments)?;
            let (b0, c0, t) = (busy_ms()?, procfs::children_cpu_ms()?, Instant::now());
            wall.push(driver::timed(&dvm, &argv)?);
            std::thread::sleep(GAP);
            let window = t.elapsed().as_secs_f64() * 1000.0;
            let (b1, c1) = (busy_ms()?, procfs::children_cpu_ms()?);
            add_since(&mut per_host, &d0, &snapshot(&pids, segments)?);
            windows += window;
            job_cpu += b1 - b0 - machine_idle * window;
            tool += c1 - c0;

            settles.settle()?;
            let (b0, c0, t) = (busy_ms()?, procfs::children_cpu_ms()?, Instant::now());
            let run = floor::spawn_cpu(&dvm.cluster, &dvm.ctl, driver::TRUE, n)?;
            std::thread::sleep(GAP);
            let window = t.elapsed().as_secs_f64() * 1000.0;
            let (b1, c1) = (busy_ms()?, procfs::children_cpu_ms()?);
            floor_wall.push(run.ms);
            floor_cpu += b1 - b0 - machine_idle * window;
            // How they were started (the bench's waited-for children) is what they and theirs
            // ran in all, less what they said they ran from their first spawn on.
            started += c1 - c0 - run.workers_ms - run.programs_ms;
            floors.workers_ms += run.workers_ms;
            floors.programs_ms += run.programs_ms;
        }
        driver::stop(&mut dvm)?;
        let k = jobs as f64;
        // A daemon's figures less what it does idle over as long as the jobs' windows.
        let own = |host: &str| -> [f64; 4] {
            let j = per_host.get(host).copied().unwrap_or_default();
            let i = idle.get(host).copied().unwrap_or_default();
            std::array::from_fn(|x| (j[x] - i[x] * windows / idle_ms) / k)
        };
        let mut roles = Vec::new();
        for name in [
            CONTROLLER,
            "with children",
            "without children",
            "the others",
        ] {
            let members: Vec<[f64; 4]> = hosts
                .iter()
                .filter(|h| place.get(*h) == Some(&name))
                .map(|h| own(h))
                .collect();
            if members.is_empty() {
                continue;
            }
            let m = members.len() as f64;
            let mean = |x: usize| members.iter().map(|v| v[x]).sum::<f64>() / m;
            roles.push(Role {
                name: name.to_string(),
                daemons: members.len(),
                cpu_us: mean(0),
                switches: mean(1),
                segments: segments.then(|| (mean(2), mean(3))),
            });
        }
        let daemons_ms = hosts.iter().map(|h| own(h)[0]).sum::<f64>() / 1e3;
        let idle_daemons = idle.values().map(|v| v[0]).sum::<f64>() / idle_ms;
        let (job_cpu, tool, floor_cpu) = (job_cpu / k, tool / k, floor_cpu / k);
        let (workers_ms, programs_ms, workers_start_ms) =
            (floors.workers_ms / k, floors.programs_ms / k, started / k);
        Ok(Anatomy {
            nodes: n,
            jobs,
            job_ms: median(&wall),
            floor_ms: median(&floor_wall),
            job_cpu_ms: job_cpu,
            floor_cpu_ms: floor_cpu,
            daemons_ms,
            workers_ms,
            tool_ms: tool,
            workers_start_ms,
            job_rest_ms: job_cpu - daemons_ms - tool,
            programs_ms,
            floor_rest_ms: floor_cpu - workers_ms - programs_ms - workers_start_ms,
            roles,
            idle_daemons_ms_per_s: idle_daemons,
            idle_machine_ms_per_s: machine_idle * 1000.0,
            settles,
        })
    })();
    match r {
        Ok(a) => {
            driver::discard(dvm);
            Ok(a)
        }
        Err(e) => Err(driver::failed(dvm, e)),
    }
}

/// `a ÷ b` as the tables print it; "–" where there is none (or a figure came out negative:
/// less than the idle rate taken off, which the table shows as it is).
fn ratio(a: f64, b: f64) -> String {
    match stats::ratio(a, b) {
        Some(r) if a >= 0.0 => format!("{r:.2}×"),
        _ => "–".into(),
    }
}

/// The Markdown tables of `rows`.
pub fn table(rows: &[Anatomy]) -> String {
    let mut s = String::new();
    for a in rows {
        s.push_str(&format!(
            "\n{} nodes, {} jobs (CPU: means per run, ms; wall: medians):\n\n\
             | per run | the job | its floor | ÷ floor |\n|---|---:|---:|---:|\n",
            a.nodes, a.jobs
        ));
        let mut line = |what: &str, job: f64, floor: f64| {
            s.push_str(&format!(
                "| {what} | {job:.1} | {floor:.1} | {} |\n",
                ratio(job, floor)
            ));
        };
        line("wall, ms", a.job_ms, a.floor_ms);
        line("the machine's CPU, ms", a.job_cpu_ms, a.floor_cpu_ms);
        line(
            "the daemons' CPU (the floor: its workers'), ms",
            a.daemons_ms,
            a.workers_ms,
        );
        line(
            "the tool with its start and exit (the floor: the workers' start and exit), ms",
            a.tool_ms,
            a.workers_start_ms,
        );
        line(
            "the rest: the programs with their start, and what none of the above ran (the kernel's work for nobody, the bench's own), ms",
            a.job_rest_ms,
            a.programs_ms + a.floor_rest_ms,
        );
        s.push_str(&format!(
            "\nOf the floor's rest, its programs ran {:.1} ms (each worker's `getrusage` of its children). \
             Taken off every window: the idle DVM's daemons {:.1} ms and the idle machine {:.1} ms of CPU per second.\n",
            a.programs_ms, a.idle_daemons_ms_per_s, a.idle_machine_ms_per_s
        ));
        let per_spawn = a.workers_ms * 1e3 / a.nodes.max(1) as f64;
        s.push_str(&format!(
            "\n| daemons | how many | CPU per daemon and job, µs | ÷ a floor worker's per spawn ({per_spawn:.0} µs) | context switches per job | TCP segments sent / received per job |\n|---|---:|---:|---:|---:|---:|\n"
        ));
        for r in &a.roles {
            // The controller's host runs none of the job's processes: no spawn to compare.
            let vs = if r.name == CONTROLLER {
                "–".to_string()
            } else {
                ratio(r.cpu_us, per_spawn)
            };
            let segs = r
                .segments
                .map_or("–".to_string(), |(o, i)| format!("{o:.1} / {i:.1}"));
            s.push_str(&format!(
                "| {} | {} | {:.0} | {vs} | {:.1} | {segs} |\n",
                r.name, r.daemons, r.cpu_us, r.switches
            ));
        }
        if a.settles.busy > 0 {
            s.push_str(&format!(
                "\n{} of {} runs started on a machine that did not get quiet within the bench's wait; their figures may carry other work.\n",
                a.settles.busy, a.settles.runs
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Anatomy {
        Anatomy {
            nodes: 4,
            jobs: 2,
            job_ms: 12.0,
            floor_ms: 8.0,
            job_cpu_ms: 20.0,
            floor_cpu_ms: 14.0,
            daemons_ms: 6.0,
            workers_ms: 1.0,
            tool_ms: 2.0,
            workers_start_ms: 1.0,
            job_rest_ms: 12.0,
            programs_ms: 11.0,
            floor_rest_ms: 1.0,
            idle_daemons_ms_per_s: 30.0,
            idle_machine_ms_per_s: 45.5,
            roles: vec![
                Role {
                    name: "the controller's".into(),
                    daemons: 1,
                    cpu_us: 3000.0,
                    switches: 10.0,
                    segments: Some((8.0, 9.0)),
                },
                Role {
                    name: "without children".into(),
                    daemons: 4,
                    cpu_us: 500.0,
                    switches: 3.5,
                    segments: None,
                },
            ],
            settles: Settles::default(),
        }
    }

    #[test]
    fn each_figure_stands_beside_the_floors_with_its_ratio() {
        let t = table(&[sample()]);
        assert!(t.contains("| wall, ms | 12.0 | 8.0 | 1.50× |"), "{t}");
        assert!(
            t.contains("| the machine's CPU, ms | 20.0 | 14.0 | 1.43× |"),
            "{t}"
        );
        assert!(t.contains("6.0 | 1.0 | 6.00× |"), "{t}");
        assert!(t.contains("| 12.0 | 12.0 | 1.00× |"), "{t}");
        // A floor worker ran 1 ms for 4 spawns: 250 µs each.
        assert!(t.contains("per spawn (250 µs)"), "{t}");
        // The controller's host runs no process of the job: no ratio to a spawn.
        assert!(
            t.contains("| the controller's | 1 | 3000 | – | 10.0 | 8.0 / 9.0 |"),
            "{t}"
        );
        assert!(t.contains("its programs ran 11.0 ms"), "{t}");
        assert!(
            t.contains("the idle DVM's daemons 30.0 ms and the idle machine 45.5 ms"),
            "{t}"
        );
        assert!(
            t.contains("| without children | 4 | 500 | 2.00× | 3.5 | – |"),
            "{t}"
        );
        assert!(!t.contains("did not get quiet"), "{t}");
        let busy = Anatomy {
            settles: Settles { runs: 5, busy: 1 },
            ..sample()
        };
        assert!(table(&[busy]).contains("1 of 5 runs started on a machine that did not get quiet"));
    }

    #[test]
    fn places_follow_the_reported_tree_and_without_one_the_daemons_are_the_others() {
        let hosts: Vec<String> = ["ctl", "n1", "n2", "n3"].map(String::from).to_vec();
        let member = |rank: u32, host: &str, parent: Option<u32>| conformance::status::Member {
            rank: Some(rank),
            host: host.into(),
            parent,
            state: conformance::status::MemberState::Joined,
        };
        let status = Status {
            formed: true,
            members: vec![
                member(0, "ctl", None),
                member(1, "n1", Some(0)),
                member(2, "n2", Some(1)),
                member(3, "n3", Some(0)),
            ],
            ..Status::default()
        };
        let p = places_in(Some(&status), &hosts, "ctl");
        assert_eq!(
            p.values().copied().collect::<Vec<_>>(),
            [
                CONTROLLER,
                "with children",
                "without children",
                "without children"
            ]
        );
        // A host the status does not list, or no status at all: the tree is not known.
        let partial = Status {
            members: status.members[..3].to_vec(),
            ..status.clone()
        };
        for unknown in [
            places_in(Some(&partial), &hosts, "ctl"),
            places_in(None, &hosts, "ctl"),
        ] {
            assert_eq!(
                unknown.values().copied().collect::<Vec<_>>(),
                [CONTROLLER, "the others", "the others", "the others"]
            );
        }
    }

    #[test]
    fn a_daemons_counts_between_snapshots_are_added_up() {
        let c = |threads: &[(u32, u64, u64)], o, i| Counts {
            cpu_ns: threads.iter().map(|&(t, ns, _)| (t, ns)).collect(),
            switches: threads.iter().map(|&(t, _, n)| (t, n)).collect(),
            segments: (o, i),
        };
        // Thread 2 ended between the two (what it ran is left out, not taken off thread
        // 1's), thread 3 began.
        let before: Snapshot =
            [("n1".to_string(), c(&[(1, 1_000, 2), (2, 9_000, 9)], 10, 20))].into();
        let after: Snapshot = [
            ("n1".to_string(), c(&[(1, 5_000, 6), (3, 1_000, 1)], 13, 25)),
            ("n2".to_string(), c(&[(7, 2_000, 1)], 1, 1)),
        ]
        .into();
        let mut into = HashMap::new();
        add_since(&mut into, &before, &after);
        add_since(&mut into, &before, &after);
        assert_eq!(into["n1"], [10.0, 10.0, 6.0, 10.0]);
        // A daemon first seen counts from nothing.
        assert_eq!(into["n2"], [4.0, 2.0, 2.0, 2.0]);
    }
}
