//! A real peer in the same run: Open MPI's `mpirun` (Debian's `openmpi-bin`), which has no
//! persistent DVM, against dvmlab doing the same one-shot work on the same netns hosts —
//! start the daemons, form, run one `/bin/true` per node — alternated repetition by
//! repetition, beside the machine's floor for that work.
//!
//! `mpirun` runs on the controller's host and starts its `orted`s through the harness's
//! launch agent (what `ssh` is to real machines), the routed radix at the benches' 64, as
//! dvmlab's daemons are; tree spawn on, so past 64 nodes the orteds launch the next level
//! through the agent from inside their own hosts.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use conformance::sut::Dvm;
use dvmlab_harness::{agent, BackendKind};

use crate::driver::{self, Measured, Metric, Runtime, Sample};
use crate::floor;

/// How long one `mpirun` may take before it counts as hung.
const MPIRUN_LIMIT: Duration = Duration::from_secs(180);

/// The program a peer run needs.
pub const MPIRUN: &str = "mpirun";

/// `mpirun --version`'s first line ("mpirun (Open MPI) 4.1.4"), or why it cannot run.
pub fn version() -> Result<String, String> {
    let out = std::process::Command::new(MPIRUN)
        .arg("--version")
        .output()
        .map_err(|e| {
            format!("{MPIRUN}: {e} (install Debian's openmpi-bin: .ci/run does, or apt-get install openmpi-bin)")
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .next()
        .map(|l| l.trim().to_string())
        .filter(|l| out.status.success() && !l.is_empty())
        .ok_or_else(|| format!("{MPIRUN} --version failed: {}", out.status))
}

/// Open MPI hands its agent `HOST WORD…` where the words are a shell command line (it
/// expects a remote shell, as `ssh` gives): this script runs them through `sh -c` on the
/// host, through the harness's agent.
fn write_rsh(dir: &Path, agent: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("ompi-rsh");
    let text = format!(
        "#!/bin/sh\n# Open MPI's rsh agent for this run: HOST COMMAND-LINE...\nh=\"$1\"; shift\nexec '{}' \"$h\" sh -c \"$*\"\n",
        agent.display()
    );
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

fn mpirun_argv(rsh: &Path, nodes: &[String]) -> Vec<String> {
    let mut argv: Vec<String> = [MPIRUN, "--allow-run-as-root", "--mca", "plm_rsh_agent"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    argv.push(rsh.display().to_string());
    // Tree spawn is on (Open MPI's default): past 64 nodes the orteds launch the next level
    // themselves, through the same agent from inside their hosts.
    for (k, v) in [
        ("plm_rsh_no_tree_spawn", "0"),
        ("routed", "radix"),
        ("routed_radix", "64"),
    ] {
        argv.extend(["--mca".to_string(), k.to_string(), v.to_string()]);
    }
    argv.extend([
        "--host".to_string(),
        nodes.join(","),
        "--map-by".to_string(),
        "node".to_string(),
        "-np".to_string(),
        nodes.len().to_string(),
        "/bin/true".to_string(),
    ]);
    argv
}

/// One repetition at `n` nodes: dvmlab's one-shot time, `mpirun`'s, and the floor, on one
/// set of hosts (`mpirun_first` decides who goes first).
pub fn one(
    rt: &Runtime,
    n: usize,
    mpirun_first: bool,
    say: &mut dyn FnMut(&str),
) -> Result<(Measured, Measured), String> {
    let ctx = driver::ctx(rt, BackendKind::Netns, n);
    let names = driver::nodes(n);
    let mut hosts = vec!["ctl".to_string()];
    hosts.extend(names.iter().cloned());
    let mut dvm = driver::dvm(&ctx, "peers", &hosts, n)?;
    let r = (|| {
        let launch = dvm.cluster.write_agent(&agent::program()?)?;
        let rsh = write_rsh(dvm.cluster.run_dir(), &launch)?;
        let mut ours = 0.0;
        let mut theirs = 0.0;
        for turn in 0..2 {
            if (turn == 0) == mpirun_first {
                say(&format!("mpirun: {n} nodes"));
                theirs = mpirun(&dvm, &rsh, &names)?;
            } else {
                say(&format!("{}: {n} nodes, one-shot", rt.name));
                ours = one_shot(&mut dvm, &hosts, &names)?;
            }
        }
        let floor = floor::connect_ms(&dvm.cluster, &dvm.ctl, &hosts)?.from_first
            + floor::spawn_ms(&dvm.cluster, &dvm.ctl, "/bin/true", n, 1)?;
        // One floor measurement serves both: only dvmlab's sample carries it, so that the
        // table does not count it twice.
        let m = |value, floor| Measured {
            samples: vec![Sample {
                metric: Metric::OneShot,
                nodes: n,
                value,
                floor,
                polled: false,
            }],
            ..Measured::default()
        };
        Ok((m(ours, floor), m(theirs, f64::NAN)))
    })();
    if let Err(e) = r {
        return Err(driver::failed(dvm, e));
    }
    driver::discard(dvm);
    r
}

/// dvmlab from nothing: every daemon started, formed (seen by reading the status every
/// [`driver::POLL`], as a script would), the job run; ms from the first start to the job's
/// exit. The DVM is stopped after.
fn one_shot(dvm: &mut Dvm, hosts: &[String], nodes: &[String]) -> Result<f64, String> {
    let t = Instant::now();
    dvm.start_many(hosts).map_err(|p| p.to_string())?;
    driver::wait_formed(dvm)?;
    let argv = dvm
        .submit_argv(nodes.len(), nodes, &[], &["/bin/true"])
        .map_err(|p| p.to_string())?;
    driver::timed(dvm, &argv)?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    driver::stop(dvm)?;
    Ok(ms)
}

/// One `mpirun` of a `/bin/true` per node from the controller's host; ms to its exit.
fn mpirun(dvm: &Dvm, rsh: &Path, nodes: &[String]) -> Result<f64, String> {
    driver::timed_within(dvm, &mpirun_argv(rsh, nodes), MPIRUN_LIMIT)
}
