//! A formed DVM to measure on: every bench that times formation or jobs starts one here.

use std::time::{Duration, Instant};

use dvmlab_harness::{wait_until, BackendKind, Cluster, ClusterSpec, IpMode, PrteConf};

pub const PRTED: &str = env!("CARGO_BIN_EXE_prted");
pub const PCTL: &str = env!("CARGO_BIN_EXE_pctl");
pub const PRUN: &str = env!("CARGO_BIN_EXE_prun");

/// Runs `prog ARGS` on the controller's host; its stdout.
pub fn run(cluster: &Cluster, prog: &str, args: &[&str]) -> Result<String, String> {
    let mut argv = vec![prog.to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    let out = cluster.exec("ctl", &argv)?;
    if !out.status.success() {
        return Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// A controller and `n` nodes (radix 64), every daemon started at once, waited for until
/// formed; with the DVM key the harness makes when `keyed`. The cluster, and how long after
/// the last start the DVM formed.
pub fn formed(
    label: &str,
    backend: BackendKind,
    n: usize,
    keyed: bool,
) -> Result<(Cluster, u64), String> {
    let nodes: Vec<String> = (1..=n).map(|i| format!("n{i:04}")).collect();
    let mut hosts = vec!["ctl".to_string()];
    hosts.extend(nodes.iter().cloned());
    let conf = PrteConf::new()
        .set("ClusterName", label)
        .set("DVMNodes", format!("n[4:1-{n}]"))
        .set("DVMControllerHost", "ctl");
    let mut spec = ClusterSpec::new(label, &hosts, vec![PRTED.into(), "--bootstrap".into()]);
    spec.backend = backend;
    spec.ip = IpMode::V4;
    spec.conf = conf.render();
    spec.env.push(("DVMLAB_LOG".into(), "warn".into()));
    if keyed {
        spec.env
            .push(("PRTE_MCA_dvmlab_dvm_key_file".into(), "{key}".into()));
    }
    let mut cluster = Cluster::new(spec)?;
    cluster.start_all()?;
    let last = super::unix_ms();
    let status = wait_formed(&cluster)?;
    if status["authenticated"] != keyed {
        return Err(format!("asked for keyed={keyed}, the DVM says {status}"));
    }
    let formed_ms = status["formed_at_unix_ms"]
        .as_u64()
        .ok_or("no formed_at")?
        .saturating_sub(last);
    Ok((cluster, formed_ms))
}

/// Waits (at most 60 s) until the DVM says it is formed; its status.
pub fn wait_formed(cluster: &Cluster) -> Result<serde_json::Value, String> {
    wait_until(Duration::from_secs(60), Duration::from_millis(50), || {
        let s: serde_json::Value =
            serde_json::from_str(&run(cluster, PCTL, &["status", "--json"])?)
                .map_err(|e| e.to_string())?;
        if s["formed"] == true {
            Ok(s)
        } else {
            Err(format!("joined {}", s["joined"]))
        }
    })
}

/// The median, in ms, of `reps` runs of `prun` with `args`.
pub fn job_ms(cluster: &Cluster, args: &[&str], reps: usize) -> Result<f64, String> {
    let mut times = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        run(cluster, PRUN, args)?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(dvmlab_bench::stats::median(&times))
}

/// Stops the DVM and removes its hosts.
pub fn stop(cluster: Cluster) -> Result<(), String> {
    run(&cluster, PCTL, &["stop"])?;
    cluster.destroy();
    Ok(())
}
