//! Two runtimes' jobs measured in pairs: both DVMs formed and held side by side, each on
//! hosts of its own, their jobs alternated (A then B, B then A, …), and each job compared
//! with its neighbour. One DVM measured after another cannot resolve a few per cent on a VM
//! whose neighbours come and go (runs of the same binaries an hour apart differ by 10 %); a
//! difference taken within each pair can, and its standard error says how well. A job's CPU
//! is the machine's busy time while it ran, from `/proc/stat`: the other DVM is idle then.
//! Its daemons' CPU is what the daemon processes the harness started (every thread, not
//! what they start) ran over the job and a fixed quarter second after it, from each one's
//! `schedstat` in nanoseconds: it leaves out the job's own processes, the tool and
//! everything else on the machine, so it shows a change in the daemons' own work that the
//! machine's figure hides in its noise.

use std::collections::HashMap;
use std::time::Instant;

use dvmlab_harness::BackendKind;
use serde::Serialize;

use crate::driver::{self, Runtime};
use crate::procfs::{self, thread_cpu_ns};
use crate::quiet::{busy_ms, Settles, GAP};
use crate::stats::mean_and_se;

/// One size's pairs and what they say.
#[derive(Debug, Clone, Serialize)]
pub struct Paired {
    pub nodes: usize,
    pub pairs: usize,
    /// Wall time of a job, submit to exit, ms: the mean of A's, of B's, and of B − A within
    /// each pair with its standard error.
    pub a_ms: f64,
    pub b_ms: f64,
    pub diff_ms: f64,
    pub diff_se_ms: f64,
    /// The machine's CPU time over a job, ms (the same three).
    pub a_cpu_ms: f64,
    pub b_cpu_ms: f64,
    pub cpu_diff_ms: f64,
    pub cpu_diff_se_ms: f64,
    /// The daemons' own CPU time over a job, ms (the same three).
    pub a_daemons_ms: f64,
    pub b_daemons_ms: f64,
    pub daemons_diff_ms: f64,
    pub daemons_diff_se_ms: f64,
    /// The jobs that waited for a quiet machine, and those that did not get one.
    pub settles: Settles,
}

/// Every thread of the daemons on `hosts` of `dvm`, by (pid, tid), with its CPU time so far.
type Threads = HashMap<(u32, u32), u64>;

fn daemon_threads(dvm: &conformance::sut::Dvm, hosts: &[String]) -> Result<Threads, String> {
    let mut all = HashMap::new();
    for h in hosts {
        let pid = dvm
            .cluster
            .pid(h)
            .ok_or_else(|| format!("no daemon running on {h}"))?;
        all.extend(
            thread_cpu_ns(pid)?
                .into_iter()
                .map(|(t, ns)| ((pid, t), ns)),
        );
    }
    Ok(all)
}

/// The CPU time the threads in `after` ran since `before`, ms (see [`procfs::grown`]).
fn ran_ms(before: &Threads, after: &Threads) -> f64 {
    procfs::grown(before, after) as f64 / 1e6
}

/// Measures `pairs` pairs of jobs of one `/bin/true` per node at each of `sizes`.
pub fn measure(
    a: &Runtime,
    b: &Runtime,
    backend: BackendKind,
    sizes: &[usize],
    pairs: usize,
    say: &mut dyn FnMut(&str),
) -> Result<Vec<Paired>, String> {
    if pairs < 2 {
        return Err(format!(
            "--pairs {pairs}: a standard error needs at least 2 pairs"
        ));
    }
    sizes
        .iter()
        .map(|&n| size(a, b, backend, n, pairs, say))
        .collect()
}

fn size(
    a: &Runtime,
    b: &Runtime,
    backend: BackendKind,
    n: usize,
    pairs: usize,
    say: &mut dyn FnMut(&str),
) -> Result<Paired, String> {
    say(&format!(
        "{n} nodes: {} and {} side by side, {pairs} pairs of jobs",
        a.name, b.name
    ));
    let names = driver::nodes(n);
    let mut hosts = vec!["ctl".to_string()];
    hosts.extend(names.iter().cloned());
    let (ctx_a, ctx_b) = (driver::ctx(a, backend, n), driver::ctx(b, backend, n));
    let mut dvm_a = driver::dvm(&ctx_a, "pair-a", &hosts, n)?;
    let mut dvm_b = match driver::dvm(&ctx_b, "pair-b", &hosts, n) {
        Ok(d) => d,
        Err(e) => {
            // A's daemons never started: there are no logs to keep.
            driver::discard(dvm_a);
            return Err(e);
        }
    };
    let r = (|| {
        driver::form(&mut dvm_a, &hosts)?;
        driver::form(&mut dvm_b, &hosts)?;
        let argv = |d: &conformance::sut::Dvm| {
            d.submit_argv(n, &names, &[], &[driver::TRUE])
                .map_err(|p| p.to_string())
        };
        let dvms = [(&dvm_a, argv(&dvm_a)?), (&dvm_b, argv(&dvm_b)?)];
        // One job each first: the first job of a DVM pays for cold caches.
        for (d, argv) in &dvms {
            driver::timed(d, argv)?;
        }
        let mut wall = [Vec::new(), Vec::new()];
        let mut cpu = [Vec::new(), Vec::new()];
        let mut own = [Vec::new(), Vec::new()];
        let mut settles = Settles::default();
        settles.settle()?;
        for p in 0..pairs {
            // Alternate which goes first, so that neither always follows the other.
            for k in [p % 2, 1 - p % 2] {
                let (d, argv) = &dvms[k];
                // Read outside the machine's window: reading every daemon's count takes
                // CPU of its own.
                let daemons_before = daemon_threads(d, &hosts)?;
                let before = busy_ms()?;
                let t = Instant::now();
                driver::timed(d, argv)?;
                wall[k].push(t.elapsed().as_secs_f64() * 1000.0);
                cpu[k].push(busy_ms()? - before);
                // The daemons' count a fixed time after the job: what its end leaves them to
                // do (acknowledgements after the tool exited) is the job's work too, and the
                // same window adds the same idle work (timers) to A's and to B's.
                std::thread::sleep(GAP);
                own[k].push(ran_ms(&daemons_before, &daemon_threads(d, &hosts)?));
                settles.settle()?;
            }
        }
        driver::stop(&mut dvm_a)?;
        driver::stop(&mut dvm_b)?;
        Ok(summarize(n, &wall, &cpu, &own, settles))
    })();
    if let Err(e) = r {
        return Err(driver::failed(dvm_b, driver::failed(dvm_a, e)));
    }
    driver::discard(dvm_a);
    driver::discard(dvm_b);
    r
}

/// The means of A's and B's figures and of their difference within each pair.
fn summarize(
    nodes: usize,
    wall: &[Vec<f64>; 2],
    cpu: &[Vec<f64>; 2],
    own: &[Vec<f64>; 2],
    settles: Settles,
) -> Paired {
    let diffs =
        |v: &[Vec<f64>; 2]| -> Vec<f64> { v[1].iter().zip(&v[0]).map(|(b, a)| b - a).collect() };
    let (diff_ms, diff_se_ms) = mean_and_se(&diffs(wall));
    let (cpu_diff_ms, cpu_diff_se_ms) = mean_and_se(&diffs(cpu));
    let (daemons_diff_ms, daemons_diff_se_ms) = mean_and_se(&diffs(own));
    Paired {
        nodes,
        pairs: wall[0].len().min(wall[1].len()),
        a_ms: mean_and_se(&wall[0]).0,
        b_ms: mean_and_se(&wall[1]).0,
        diff_ms,
        diff_se_ms,
        a_cpu_ms: mean_and_se(&cpu[0]).0,
        b_cpu_ms: mean_and_se(&cpu[1]).0,
        cpu_diff_ms,
        cpu_diff_se_ms,
        a_daemons_ms: mean_and_se(&own[0]).0,
        b_daemons_ms: mean_and_se(&own[1]).0,
        daemons_diff_ms,
        daemons_diff_se_ms,
        settles,
    }
}

/// The Markdown table of `rows` (its heading names A and B).
pub fn table(rows: &[Paired]) -> String {
    let mut s = String::from(
        "| nodes | pairs | A ms | B ms | B − A ms | B / A | A CPU ms | B CPU ms | B − A CPU ms | A daemons' CPU ms | B daemons' CPU ms | B − A daemons' CPU ms | B / A daemons' CPU |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let ratio = |b: f64, a: f64| {
            crate::stats::ratio(b, a).map_or_else(|| "–".to_string(), |x| format!("{x:.3}×"))
        };
        s.push_str(&format!(
            "| {} | {} | {:.2} | {:.2} | {:+.2} ± {:.2} | {} | {:.1} | {:.1} | {:+.1} ± {:.1} | {:.2} | {:.2} | {:+.2} ± {:.2} | {} |\n",
            r.nodes,
            r.pairs,
            r.a_ms,
            r.b_ms,
            r.diff_ms,
            r.diff_se_ms,
            ratio(r.b_ms, r.a_ms),
            r.a_cpu_ms,
            r.b_cpu_ms,
            r.cpu_diff_ms,
            r.cpu_diff_se_ms,
            r.a_daemons_ms,
            r.b_daemons_ms,
            r.daemons_diff_ms,
            r.daemons_diff_se_ms,
            ratio(r.b_daemons_ms, r.a_daemons_ms),
        ));
    }
    for r in rows.iter().filter(|r| r.settles.busy > 0) {
        s.push_str(&format!(
            "\n{} nodes: {} of {} jobs started on a machine that did not get quiet within the bench's wait; their figures may carry other work.\n",
            r.nodes, r.settles.busy, r.settles.runs
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::resource::{getrusage, UsageWho};

    #[test]
    fn each_difference_is_taken_within_its_pair() {
        // B is 1 ms slower than A in every pair, while both drift by 10 ms: the pairs see
        // exactly 1 ms, with no spread; the means alone would hide it in the drift.
        let a: Vec<f64> = (0..6).map(|i| 20.0 + 10.0 * f64::from(i)).collect();
        let b: Vec<f64> = a.iter().map(|x| x + 1.0).collect();
        let own = [vec![1.0, 2.0], vec![1.5, 2.5]];
        let p = summarize(
            32,
            &[a, b],
            &[vec![5.0, 7.0], vec![6.0, 10.0]],
            &own,
            Settles::default(),
        );
        assert_eq!((p.diff_ms, p.diff_se_ms), (1.0, 0.0));
        assert_eq!((p.a_ms, p.b_ms), (45.0, 46.0));
        assert_eq!((p.cpu_diff_ms, p.cpu_diff_se_ms), (2.0, 1.0));
        assert_eq!((p.daemons_diff_ms, p.daemons_diff_se_ms), (0.5, 0.0));
        assert_eq!(p.pairs, 6);
        let t = table(std::slice::from_ref(&p));
        assert!(
            t.contains("| 32 | 6 | 45.00 | 46.00 | +1.00 ± 0.00 | 1.022× |"),
            "{t}"
        );
        assert!(!t.contains("did not get quiet"), "{t}");
        let busy = Paired {
            settles: Settles { runs: 13, busy: 2 },
            ..p
        };
        let t = table(&[busy]);
        assert!(
            t.contains("32 nodes: 2 of 13 jobs started on a machine that did not get quiet"),
            "{t}"
        );
    }

    #[test]
    fn a_thread_kept_running_shows_in_its_processes_cpu_and_a_sleeping_one_does_not() {
        let me = std::process::id();
        let threads = || -> Threads {
            thread_cpu_ns(me)
                .expect("schedstat")
                .into_iter()
                .map(|(t, ns)| ((me, t), ns))
                .collect()
        };
        let before = threads();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let asleep = threads();
        // Spun until the kernel's own account of this thread (getrusage) shows 60 ms more:
        // on a loaded machine that takes longer than 60 ms of wall, however long.
        let thread_ms = || {
            let u = getrusage(UsageWho::RUSAGE_THREAD).expect("getrusage");
            let ms =
                |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e3 + t.tv_usec() as f64 / 1e3;
            ms(u.user_time()) + ms(u.system_time())
        };
        let start = thread_ms();
        let t = Instant::now();
        while thread_ms() - start < 60.0 {
            assert!(
                t.elapsed().as_secs() < 60,
                "60 ms of CPU not had in a minute"
            );
            std::hint::black_box(0u64);
        }
        let tid = nix::unistd::gettid().as_raw() as u32;
        let mine = |from: &Threads, to: &Threads| {
            ran_ms(
                &from
                    .iter()
                    .filter(|(k, _)| k.1 == tid)
                    .map(|(k, v)| (*k, *v))
                    .collect(),
                &to.iter()
                    .filter(|(k, _)| k.1 == tid)
                    .map(|(k, v)| (*k, *v))
                    .collect(),
            )
        };
        let slept = mine(&before, &asleep);
        let spun = mine(&asleep, &threads());
        // What the thread ran shows (getrusage and schedstat count the same runtime, read
        // at slightly different moments); sleeping runs next to nothing.
        assert!(spun >= 55.0, "{spun} ms of CPU over 60 ms of spinning");
        assert!(slept < 20.0, "{slept} ms of CPU over 100 ms of sleeping");
    }
}
