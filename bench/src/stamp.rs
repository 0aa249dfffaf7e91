//! Where and when a figure was measured: written into every bench's JSON and shown under
//! its chart, because a ratio is only comparable with one from the same kind of machine.

use serde::Serialize;

/// The machine, the moment and the code a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Stamp {
    pub host: String,
    pub cpu: String,
    pub cores: usize,
    pub kernel: String,
    /// UTC, `YYYY-MM-DDTHH:MM:SSZ`.
    pub date: String,
    /// `git describe --always --dirty` of the checkout, when it is one.
    pub git: String,
    /// How the measured runtime was built, as the Makefile's bench targets say it
    /// (`DVMLAB_BENCH_BUILD`: with profile-guided optimization or without); none when the
    /// bench was run by hand.
    pub build: Option<String>,
}

impl Stamp {
    pub fn now() -> Stamp {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpu = read("/proc/cpuinfo")
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let run = |prog: &str, args: &[&str]| {
            std::process::Command::new(prog)
                .args(args)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_else(|| "unknown".into())
        };
        Stamp {
            host: read("/proc/sys/kernel/hostname").trim().to_string(),
            cpu,
            cores: crate::floor::cores(),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            date: run("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
            git: run("git", &["describe", "--always", "--dirty"]),
            build: std::env::var("DVMLAB_BENCH_BUILD")
                .ok()
                .filter(|b| !b.is_empty()),
        }
    }

    /// One line for a chart's foot or a table's heading.
    pub fn line(&self) -> String {
        let build = self
            .build
            .as_ref()
            .map(|b| format!(" · {b}"))
            .unwrap_or_default();
        format!(
            "{} · {} cores ({}) · Linux {} · {} · {}{build}",
            self.date, self.cores, self.cpu, self.kernel, self.host, self.git
        )
    }
}
