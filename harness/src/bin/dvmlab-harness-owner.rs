//! `dvmlab-harness-owner netns|process`: builds a cluster of three hosts running `sleep`,
//! prints `RUN <run name> <run dir> <pid,pid,pid>`, and waits to be killed. The harness's gc
//! test kills it to leave behind what only `gc` can remove.

use std::process::ExitCode;

use dvmlab_harness::{BackendKind, Cluster, ClusterSpec};

fn main() -> ExitCode {
    let backend = match std::env::args().nth(1).as_deref() {
        Some("netns") => BackendKind::Netns,
        Some("process") => BackendKind::Process,
        other => {
            eprintln!("dvmlab-harness-owner: expected netns or process, got {other:?}");
            return ExitCode::from(2);
        }
    };
    let hosts: Vec<String> = (0..3).map(|i| format!("h{i}")).collect();
    let mut spec = ClusterSpec::new("crashed", &hosts, vec!["sleep".into(), "1000".into()]);
    spec.backend = backend;
    let c = match Cluster::new(spec).and_then(|mut c| c.start_all().map(|()| c)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("dvmlab-harness-owner: {e}");
            return ExitCode::from(1);
        }
    };
    let pids: Vec<String> = hosts
        .iter()
        .filter_map(|h| c.pid(h))
        .map(|p| p.to_string())
        .collect();
    println!(
        "RUN {} {} {}",
        c.run_name(),
        c.run_dir().display(),
        pids.join(",")
    );
    // Until killed (the cluster, never dropped, is left behind): the point is to die
    // without cleaning up.
    loop {
        std::thread::park();
    }
}
