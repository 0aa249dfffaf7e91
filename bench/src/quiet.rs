//! Waiting for a quiet machine before a timed run. A job's figure is a few milliseconds of
//! two cores; what the last run left behind (a DVM's teardown, reaped processes, the kernel
//! freeing a namespace's memory) lands inside the next run unless it is waited out, and that
//! spread the repetitions of one run by more than the change a bench should resolve.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Time left after the previous run before the machine is first looked at: the end of a job
/// (its daemons' acknowledgements, the tool's exit) is done within it.
pub const GAP: Duration = Duration::from_millis(250);
/// The window the machine's busy time is read over: /proc/stat counts in ticks of 10 ms,
/// so a window must hold several ticks of the quiet share for a tick's rounding not to
/// decide.
const WINDOW: Duration = Duration::from_millis(200);
/// Quiet means at most this share of one core busy over a window: the harness's own
/// watchers and a VM's housekeeping stay below it, a teardown does not.
const QUIET_CORES: f64 = 0.3;
/// How long to wait for quiet beyond the gap before going on anyway (and saying so): a
/// machine that is never quiet still gets measured.
const CAP: Duration = Duration::from_secs(2);

/// The machine's busy CPU time so far, ms: every state of `/proc/stat`'s `cpu` line but
/// idle and iowait.
pub fn busy_ms() -> Result<f64, String> {
    let stat = std::fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
    busy_ms_of(&stat, clock_ticks()?)
}

fn clock_ticks() -> Result<u64, String> {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|&h| h > 0)
        .map(|h| h as u64)
        .ok_or_else(|| "sysconf(CLK_TCK) failed".to_string())
}

fn busy_ms_of(stat: &str, hz: u64) -> Result<f64, String> {
    let line = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .ok_or("/proc/stat: no `cpu` line")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| {
            f.parse()
                .map_err(|_| format!("/proc/stat: {f:?} in {line:?}"))
        })
        .collect::<Result<_, _>>()?;
    if ticks.len() < 8 {
        return Err(format!("/proc/stat: fewer than 8 counts in {line:?}"));
    }
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let busy: u64 = ticks
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, t)| t)
        .sum();
    Ok(busy as f64 * 1000.0 / hz as f64)
}

/// Whether the last settle ran out its cap: a machine busy with someone else's work all the
/// time (a parallel test run, a noisy neighbour) gains nothing from waiting at every run.
static LAST_NOT_QUIET: AtomicBool = AtomicBool::new(false);

/// Waits until the machine is quiet: the gap, then windows until one has at most
/// [`QUIET_CORES`] of a core busy, for at most [`CAP`] (one window only while the machine
/// stays busy after a settle that ran out its cap). Returns whether it was quiet; a machine
/// that stops being quiet is reported on stderr, since its figures may carry someone else's
/// work.
pub fn settle() -> Result<bool, String> {
    let was_busy = LAST_NOT_QUIET.load(Ordering::Relaxed);
    let cap = if was_busy { Duration::ZERO } else { CAP };
    let quiet = settle_within(GAP, cap, !was_busy)?;
    LAST_NOT_QUIET.store(!quiet, Ordering::Relaxed);
    Ok(quiet)
}

/// How many timed runs waited to settle, and how many of them started on a machine that did
/// not get quiet: what the reader of their figures must be told.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Settles {
    pub runs: usize,
    pub busy: usize,
}

impl Settles {
    /// [`settle`], counted.
    pub fn settle(&mut self) -> Result<(), String> {
        self.runs += 1;
        if !settle()? {
            self.busy += 1;
        }
        Ok(())
    }

    pub fn add(&mut self, other: Settles) {
        self.runs += other.runs;
        self.busy += other.busy;
    }
}

fn settle_within(gap: Duration, cap: Duration, report: bool) -> Result<bool, String> {
    std::thread::sleep(gap);
    let start = Instant::now();
    let mut busiest = 0.0f64;
    loop {
        let before = busy_ms()?;
        let t = Instant::now();
        std::thread::sleep(WINDOW);
        let cores = (busy_ms()? - before) / (t.elapsed().as_secs_f64() * 1000.0);
        if cores <= QUIET_CORES {
            return Ok(true);
        }
        busiest = busiest.max(cores);
        if start.elapsed() >= cap {
            if report {
                eprintln!(
                    "bench: the machine was not quiet within {:.1} s (up to {busiest:.2} cores busy); measuring anyway, and waiting no longer while it stays busy",
                    cap.as_secs_f64()
                );
            }
            return Ok(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_time_leaves_out_idle_and_iowait_and_counts_in_milliseconds() {
        // user 10, nice 1, system 5, idle 1000, iowait 7, irq 2, softirq 3, steal 4, guest 9.
        let stat = "cpu  10 1 5 1000 7 2 3 4 9 0\ncpu0 1 1 1 1 1 1 1 1 0 0\n";
        let ms = busy_ms_of(stat, 100).expect("parses");
        assert_eq!(ms, 250.0);
        assert!(busy_ms_of("cpu0 1 2 3\n", 100).is_err());
        assert!(busy_ms_of("cpu  1 2 x 4 5 6 7 8\n", 100).is_err());
        assert!(busy_ms_of("cpu  1 2 3\n", 100).is_err());
    }

    #[test]
    fn a_thread_kept_running_shows_in_the_machines_busy_time() {
        // While this thread spins, some core is busy all the time (running it or whatever
        // took its place): 200 ms of wall is at least that much busy time, less the two
        // reads' tick.
        let before = busy_ms().expect("/proc/stat");
        let t = Instant::now();
        while t.elapsed().as_millis() < 200 {
            std::hint::black_box(0u64);
        }
        let busy = busy_ms().expect("/proc/stat") - before;
        assert!(busy >= 150.0, "{busy} ms busy over 200 ms of spinning");
    }

    #[test]
    fn settling_waits_out_a_busy_core() {
        // A thread that keeps a whole core busy for 600 ms: settling may not say quiet while
        // it runs, so it returns after the spinner is done (or reports it never was quiet).
        let spin_until = Instant::now() + Duration::from_millis(600);
        let spinner = std::thread::spawn(move || {
            while Instant::now() < spin_until {
                std::hint::black_box(0u64);
            }
        });
        let t = Instant::now();
        let quiet =
            settle_within(Duration::ZERO, Duration::from_secs(3), false).expect("/proc/stat");
        let waited = t.elapsed();
        spinner.join().expect("spinner");
        if quiet {
            assert!(
                waited >= Duration::from_millis(550),
                "called quiet after {waited:?} while a core spun for 600 ms"
            );
        } else {
            assert!(
                waited >= Duration::from_secs(3),
                "gave up after {waited:?}, before its 3 s cap"
            );
        }
    }
}
