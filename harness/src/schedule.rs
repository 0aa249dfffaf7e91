//! Seeded random fault schedules: a timeline of boots, freezes, partitions and impaired links
//! drawn from a seed, so a run that fails can be replayed exactly by giving the same seed.
//!
//! Every fault in a schedule ends before the schedule does (everything thawed, healed and
//! booted), so a correct system must converge once it has run.

use std::fmt;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{Cluster, Direction, Impairment, PartitionId};

/// One thing a schedule does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Boot(String),
    Freeze(String),
    Thaw(String),
    /// Partition number `id` of this schedule between two host sets.
    Partition {
        id: usize,
        a: Vec<String>,
        b: Vec<String>,
        dir: Direction,
    },
    Heal(usize),
    Impair(String, Impairment),
    Unimpair(String),
}

/// An action and when (after the schedule starts) it happens.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub at: Duration,
    pub action: Action,
}

/// A timeline of steps, ordered by time.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub seed: u64,
    pub steps: Vec<Step>,
}

/// What a schedule may draw from.
#[derive(Debug, Clone)]
pub struct ScheduleSpec {
    /// Every host is booted once, in a random order, at a random time in `[0, boot_window)`.
    pub hosts: Vec<String>,
    pub boot_window: Duration,
    /// Hosts that may be frozen for a while after they booted.
    pub freezable: Vec<String>,
    /// Whether to cut a random group of hosts off (both ways or one way) for a while.
    pub partitions: bool,
    /// Whether to put one random host's link through the emulator (delay, loss, duplication).
    pub impair: bool,
}

fn ms(rng: &mut ChaCha8Rng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo..hi.max(lo + 1)))
}

impl Schedule {
    /// Draws a schedule from `seed`. The same seed and spec always give the same schedule.
    pub fn generate(seed: u64, spec: &ScheduleSpec) -> Schedule {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let window = spec.boot_window.as_millis() as u64;
        let mut steps = Vec::new();
        let mut order = spec.hosts.clone();
        order.shuffle(&mut rng);
        let mut booted_at = std::collections::HashMap::new();
        for h in order {
            let at = ms(&mut rng, 0, window);
            booted_at.insert(h.clone(), at);
            steps.push(Step {
                at,
                action: Action::Boot(h),
            });
        }
        for h in &spec.freezable {
            if !rng.random_bool(0.25) {
                continue;
            }
            let start = booted_at.get(h).copied().unwrap_or_default() + ms(&mut rng, 100, 1000);
            steps.push(Step {
                at: start,
                action: Action::Freeze(h.clone()),
            });
            steps.push(Step {
                at: start + ms(&mut rng, 300, 2000),
                action: Action::Thaw(h.clone()),
            });
        }
        if spec.partitions && spec.hosts.len() >= 2 {
            let mut pool = spec.hosts.clone();
            pool.shuffle(&mut rng);
            let k = rng.random_range(1..=pool.len().div_ceil(3));
            let (a, b) = pool.split_at(k);
            let dir = if rng.random_bool(0.5) {
                Direction::Both
            } else {
                Direction::OneWay
            };
            let start = ms(&mut rng, 0, window);
            steps.push(Step {
                at: start,
                action: Action::Partition {
                    id: 0,
                    a: a.to_vec(),
                    b: b.to_vec(),
                    dir,
                },
            });
            steps.push(Step {
                at: start + ms(&mut rng, 500, 3000),
                action: Action::Heal(0),
            });
        }
        if spec.impair && !spec.hosts.is_empty() {
            let h = spec.hosts[rng.random_range(0..spec.hosts.len())].clone();
            let imp = Impairment {
                delay: ms(&mut rng, 5, 60),
                jitter: ms(&mut rng, 0, 5),
                loss: f64::from(rng.random_range(0..5u32)) / 100.0,
                duplicate: f64::from(rng.random_range(0..5u32)) / 100.0,
                seed: rng.random(),
            };
            steps.push(Step {
                at: Duration::ZERO,
                action: Action::Impair(h.clone(), imp),
            });
            steps.push(Step {
                at: spec.boot_window + ms(&mut rng, 0, 2000),
                action: Action::Unimpair(h),
            });
        }
        steps.sort_by_key(|s| s.at);
        Schedule { seed, steps }
    }

    /// Carries the schedule out on `cluster`, each step at its time (or as soon as the
    /// previous one is done, if that took longer). Fails on the first step that fails, a
    /// fault included that could not be verified, naming the step.
    pub fn run(&self, cluster: &mut Cluster, mut log: impl FnMut(&str)) -> Result<(), String> {
        let start = Instant::now();
        let mut parts: std::collections::HashMap<usize, PartitionId> = Default::default();
        for s in &self.steps {
            let now = start.elapsed();
            if s.at > now {
                // Waiting for the step's scheduled time, not for a condition.
                std::thread::sleep(s.at - now);
            }
            log(&format!(
                "t={:>6.2}s {}",
                start.elapsed().as_secs_f64(),
                s.action
            ));
            let r = match &s.action {
                Action::Boot(h) => cluster.start(h),
                Action::Freeze(h) => cluster.freeze(h),
                Action::Thaw(h) => cluster.thaw(h),
                Action::Partition { id, a, b, dir } => cluster.partition(a, b, *dir).map(|p| {
                    parts.insert(*id, p);
                }),
                Action::Heal(id) => match parts.remove(id) {
                    Some(p) => cluster.heal(p),
                    None => Err(format!("partition {id} was never made")),
                },
                Action::Impair(h, imp) => cluster.impair(h, *imp),
                Action::Unimpair(h) => cluster.unimpair(h),
            };
            r.map_err(|e| format!("seed {}: step `{}` failed: {e}", self.seed, s.action))?;
        }
        Ok(())
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Boot(h) => write!(f, "boot {h}"),
            Action::Freeze(h) => write!(f, "freeze {h}"),
            Action::Thaw(h) => write!(f, "thaw {h}"),
            Action::Partition { id, a, b, dir } => write!(
                f,
                "partition #{id} {} {} {}",
                a.join(","),
                if *dir == Direction::Both {
                    "<x>"
                } else {
                    "-x>"
                },
                b.join(",")
            ),
            Action::Heal(id) => write!(f, "heal partition #{id}"),
            Action::Impair(h, i) => write!(
                f,
                "impair {h}: delay {:?} ±{:?}, loss {:.0}%, dup {:.0}%",
                i.delay,
                i.jitter,
                i.loss * 100.0,
                i.duplicate * 100.0
            ),
            Action::Unimpair(h) => write!(f, "restore {h}'s link"),
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "fault schedule, seed {}:", self.seed)?;
        for s in &self.steps {
            writeln!(f, "  t={:>6.2}s {}", s.at.as_secs_f64(), s.action)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ScheduleSpec {
        let hosts: Vec<String> = (0..8).map(|i| format!("h{i}")).collect();
        ScheduleSpec {
            hosts: hosts.clone(),
            boot_window: Duration::from_secs(3),
            freezable: hosts[1..].to_vec(),
            partitions: true,
            impair: true,
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
        let s = spec();
        assert_eq!(Schedule::generate(7, &s), Schedule::generate(7, &s));
        assert_ne!(Schedule::generate(7, &s), Schedule::generate(8, &s));
    }

    #[test]
    fn every_fault_of_a_schedule_is_undone_and_every_host_booted_once() {
        for seed in 0..200 {
            let sch = Schedule::generate(seed, &spec());
            let boots: Vec<&str> = sch
                .steps
                .iter()
                .filter_map(|s| match &s.action {
                    Action::Boot(h) => Some(h.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(boots.len(), 8, "seed {seed}");
            let count =
                |f: &dyn Fn(&Action) -> bool| sch.steps.iter().filter(|s| f(&s.action)).count();
            assert_eq!(
                count(&|a| matches!(a, Action::Freeze(_))),
                count(&|a| matches!(a, Action::Thaw(_))),
                "seed {seed}"
            );
            assert_eq!(
                count(&|a| matches!(a, Action::Partition { .. })),
                count(&|a| matches!(a, Action::Heal(_))),
                "seed {seed}"
            );
            assert!(sch.steps.windows(2).all(|w| w[0].at <= w[1].at));
        }
    }
}
