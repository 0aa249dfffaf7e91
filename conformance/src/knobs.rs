//! Matrix knobs: the environment variables that choose where and how the suite runs.
//!
//! | variable | values | default |
//! |---|---|---|
//! | `DVMLAB_IP` | `4`, `6`, or a list `4,6` | `4` |
//! | `DVMLAB_RADIX` | a radix ≥ 2, or a list `2,3,64` | `3` |
//! | `DVMLAB_BACKEND` | `netns`, `process`, `docker` | netns when root, else process |
//! | `DVMLAB_NODES` | DVMNodes entries in the general formation tests, 1–500 | `8` |
//! | `DVMLAB_SEED` | seed of the randomized fault schedules | drawn from the clock |
//!
//! More than one value for `DVMLAB_IP` or `DVMLAB_RADIX` makes a matrix: every item becomes
//! one trial per cell, named `<cell>/<item>`.

use std::fmt;

use dvmlab_harness::BackendKind;

/// One cell of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell {
    pub ip: u8,
    pub radix: u32,
    pub backend: BackendKind,
    pub nodes: usize,
}

impl Cell {
    /// `ip4-r3-netns-n8`.
    pub fn name(&self) -> String {
        format!(
            "ip{}-r{}-{}-n{}",
            self.ip,
            self.radix,
            match self.backend {
                BackendKind::Netns => "netns",
                BackendKind::Process => "process",
                BackendKind::Docker => "docker",
            },
            self.nodes
        )
    }
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// Every knob, read from the environment.
#[derive(Debug, Clone)]
pub struct Knobs {
    pub cells: Vec<Cell>,
    pub seed: u64,
    /// Whether the seed came from `DVMLAB_SEED` (a replay) or the clock.
    pub seed_given: bool,
}

fn list<T: std::str::FromStr>(
    var: &str,
    default: &str,
    ok: impl Fn(&T) -> bool,
    what: &str,
) -> Result<Vec<T>, String> {
    let raw = std::env::var(var).unwrap_or_else(|_| default.to_string());
    let mut v = Vec::new();
    for part in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.parse::<T>() {
            Ok(x) if ok(&x) => v.push(x),
            _ => return Err(format!("{var}={raw}: {part:?} is not {what}")),
        }
    }
    if v.is_empty() {
        return Err(format!("{var}={raw}: expected {what}"));
    }
    Ok(v)
}

impl Knobs {
    pub fn from_env() -> Result<Knobs, String> {
        let ips: Vec<u8> = list("DVMLAB_IP", "4", |x| *x == 4 || *x == 6, "4 or 6")?;
        let radixes: Vec<u32> = list(
            "DVMLAB_RADIX",
            "3",
            |x| (2..=4096).contains(x),
            "a radix from 2 to 4096",
        )?;
        let nodes: Vec<usize> = list(
            "DVMLAB_NODES",
            "8",
            |x| (1..=500).contains(x),
            "a node count from 1 to 500",
        )?;
        if nodes.len() != 1 {
            return Err("DVMLAB_NODES takes one value".into());
        }
        let backend = BackendKind::from_env()?;
        let (seed, seed_given) = match std::env::var("DVMLAB_SEED") {
            Ok(s) => (
                s.trim()
                    .parse()
                    .map_err(|_| format!("DVMLAB_SEED={s}: expected an unsigned integer"))?,
                true,
            ),
            // Every process of one nextest run must draw the same seed: derive it from the
            // run's id there, from the clock otherwise.
            Err(_) => (
                match std::env::var("NEXTEST_RUN_ID") {
                    Ok(id) => {
                        id.bytes().fold(1469598103934665603u64, |h, b| {
                            (h ^ u64::from(b)).wrapping_mul(1099511628211)
                        }) % 1_000_000_007
                    }
                    Err(_) => std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_nanos() as u64 % 1_000_000_007)
                        .unwrap_or(1),
                },
                false,
            ),
        };
        let mut cells = Vec::new();
        for &ip in &ips {
            for &radix in &radixes {
                cells.push(Cell {
                    ip,
                    radix,
                    backend,
                    nodes: nodes[0],
                });
            }
        }
        Ok(Knobs {
            cells,
            seed,
            seed_given,
        })
    }

    pub fn is_matrix(&self) -> bool {
        self.cells.len() > 1
    }
}
