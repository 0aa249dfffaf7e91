//! `dvmlab-soak`: run a soak and check its history, or check a history alone.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use dvmlab_harness::BackendKind;
use dvmlab_soak::driver::Config;
use dvmlab_soak::{checker, history, report, soak};

/// A Jepsen-style soak of an elastic DVM: a seeded workload and nemesis for DURATION,
/// every operation recorded as a history, then checked by an independent checker.
///
/// Exit status: 0 every property held; 1 a violation (the report names the seed and the
/// window of history that shows it); 2 the soak could not run. With --expect-violation P
/// (a run of a runtime broken on purpose): 0 when P was violated, 1 when it held.
#[derive(Parser)]
#[command(name = "dvmlab-soak", version, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a soak, then check it and write its report.
    Run {
        /// Nodes of the DVM (DVMNodes), beside its controller.
        #[arg(long, default_value_t = 64)]
        nodes: usize,
        /// Hosts outside the DVM it may grow onto.
        #[arg(long, default_value_t = 8)]
        spares: usize,
        #[arg(long, default_value_t = 4)]
        radix: u32,
        /// Seconds of workload and faults.
        #[arg(long, default_value_t = 1800)]
        duration: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// netns, process or docker.
        #[arg(long, default_value = "netns")]
        backend: String,
        /// Where the history, report, charts and logs go.
        #[arg(long, default_value = "target/soak")]
        out: PathBuf,
        /// Break the runtime on purpose in this way (`dvmlab_test_elastic_fault`:
        /// launch-on-departing, lose-held-jobs, duplicate-terminal and the others prted
        /// names), to show the checker catching it.
        #[arg(long, value_name = "DEFECT")]
        runtime_fault: Option<String>,
        /// Succeed only if this property is violated (see --runtime-fault).
        #[arg(long, value_name = "PROPERTY", value_parser = property)]
        expect_violation: Option<String>,
    },
    /// Check a history and write its report beside it.
    Check {
        history: PathBuf,
        /// Succeed only if this property is violated.
        #[arg(long, value_name = "PROPERTY", value_parser = property)]
        expect_violation: Option<String>,
    },
}

/// A property the checker knows.
fn property(s: &str) -> Result<String, String> {
    let names: Vec<&str> = checker::PROPERTIES.iter().map(|p| p.0).collect();
    if names.contains(&s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "no property {s}; the checker has {}",
            names.join(", ")
        ))
    }
}

fn backend(s: &str) -> Result<BackendKind, String> {
    match s {
        "netns" => Ok(BackendKind::Netns),
        "process" => Ok(BackendKind::Process),
        "docker" => Ok(BackendKind::Docker),
        other => Err(format!(
            "--backend {other}: expected netns, process or docker"
        )),
    }
}

/// Checks `path`, writes the report beside it and prints the verdicts; true when every
/// property held, or, given `expect`, when that property was violated.
fn check(path: &Path, expect: Option<&str>) -> Result<bool, String> {
    let h = history::read(path)?;
    let verdicts = checker::check(&h);
    let dir = path.parent().unwrap_or(Path::new("."));
    report::write(dir, &h, &verdicts)?;
    let mut ok = true;
    for v in &verdicts {
        println!(
            "{:<26} {} ({} checked, {} violations)",
            v.property,
            v.verdict(),
            v.checked,
            v.violations.len()
        );
        for x in &v.violations {
            ok = false;
            let (a, b) = x.window(&h);
            println!("    {} [history {a}..{b} us, lines {:?}]", x.what, x.lines);
        }
    }
    println!("report: {}", dir.join("report.md").display());
    let Some(want) = expect else { return Ok(ok) };
    let caught = verdicts
        .iter()
        .any(|v| v.property == want && !v.violations.is_empty());
    println!(
        "expected a violation of {want}: {}",
        if caught { "caught" } else { "NOT caught" }
    );
    Ok(caught)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Run {
            nodes,
            spares,
            radix,
            duration,
            seed,
            backend: b,
            out,
            runtime_fault,
            expect_violation,
        } => backend(&b).and_then(|backend| {
            let cfg = Config {
                nodes,
                spares,
                radix,
                duration: Duration::from_secs(duration),
                seed,
                backend,
                out,
                runtime_fault,
            };
            let path = soak::run(&cfg)?;
            let ok = check(&path, expect_violation.as_deref())?;
            if !ok && expect_violation.is_none() {
                println!("seed {seed}: violations found");
            }
            Ok(ok)
        }),
        Cmd::Check {
            history,
            expect_violation,
        } => check(&history, expect_violation.as_deref()),
    };
    match res {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("dvmlab-soak: {e}");
            ExitCode::from(2)
        }
    }
}
