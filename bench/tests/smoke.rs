//! The bench programs end to end at the smallest sizes, so that `make bench`, `make
//! bench-compare`, `make bench-pair`, `make bench-anatomy` and `make bench-peers` cannot rot
//! between the (long, manual) bench runs:
//! every figure is produced, with its floor and ratio, through the profile only. These
//! check that the benches measure, not how fast anything is (that is the benches' job).

use std::path::{Path, PathBuf};
use std::process::Command;

use dvmlab_harness::{netns_available, skip};

const BENCH: &str = env!("CARGO_BIN_EXE_dvmlab-bench");

fn profile(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../conformance/profiles/{name}.toml"))
}

fn out_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dvmlab-bench-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Runs the bench program; its Markdown table `NAME.md` in `out`.
fn bench(args: &[&str], out: &Path, name: &str) -> String {
    let o = Command::new(BENCH)
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .expect("running dvmlab-bench");
    assert!(
        o.status.success(),
        "dvmlab-bench {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let md = std::fs::read_to_string(out.join(format!("{name}.md"))).expect("the table");
    let json = std::fs::read_to_string(out.join(format!("{name}.json"))).expect("the JSON");
    let doc: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert!(
        doc["stamp"]["cores"].as_u64().is_some_and(|c| c > 0),
        "{doc}"
    );
    md
}

/// The cells of the first table row of `md` that `is` picks (`what` names it if none does).
fn cells(md: &str, what: &str, is: impl Fn(&str) -> bool) -> Vec<String> {
    md.lines()
        .find(|l| is(l))
        .unwrap_or_else(|| panic!("no row {what} in\n{md}"))
        .split('|')
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
        .collect()
}

/// The table row of `measure` (its whole title, without the unit) at `nodes`: its cells.
fn row(md: &str, measure: &str, nodes: usize) -> Vec<String> {
    cells(md, &format!("{measure:?} at {nodes} nodes"), |l| {
        l.starts_with(&format!("| {measure} (")) && l.contains(&format!(" | {nodes} |"))
    })
}

/// The ratio in a cell: `1.50×`, or `1.50× (1.47–1.52)` over several repetitions.
fn ratio(cell: &str) -> f64 {
    cell.split(' ')
        .next()
        .unwrap_or(cell)
        .trim_end_matches('×')
        .parse()
        .unwrap_or_else(|_| panic!("{cell:?} is not a ratio"))
}

#[test]
fn two_profiles_compared_give_every_figure_beside_its_floor_and_each_other() {
    if !netns_available() {
        return skip(
            "two_profiles_compared_give_every_figure_beside_its_floor_and_each_other",
            "needs root and ip (netns hosts)",
        );
    }
    let out = out_dir("compare");
    let (a, b) = (profile("reference"), profile("human-status-example"));
    let md = bench(
        &[
            "run",
            "--profile",
            a.to_str().unwrap(),
            "--profile",
            b.to_str().unwrap(),
            "--sizes",
            "2,3",
            "--reps",
            "1",
            "--job-reps",
            "1",
            "--sequential",
            "3",
            "--grow",
            "1",
        ],
        &out,
        "compare",
    );
    for (measure, nodes) in [
        ("formation, all started together", 2),
        ("formation, controller last", 3),
        ("job, one /bin/true per node", 3),
        ("sequential one-process jobs", 2),
    ] {
        // measure, nodes, floor, A, A/floor, B, B/floor, B/A
        let r = row(&md, measure, nodes);
        assert_eq!(r.len(), 8, "{measure}: {r:?}");
        for i in [4, 6, 7] {
            assert!(ratio(&r[i]) > 0.0, "{measure}: {r:?}");
        }
    }
    // The adapter's profile has no [elastic]: its grow and shrink are left blank, with why.
    for measure in ["grow (push)", "shrink (push)"] {
        let r = row(&md, measure, 1);
        assert!(ratio(&r[4]) > 0.0, "{measure}: {r:?}");
        assert_eq!(r[5], "–", "{measure}: {r:?}");
    }
    assert!(
        md.contains("grow and shrink not measured: its profile has no [elastic] section"),
        "{md}"
    );
    // The adapter's status has no formation time: its figures say they were polled.
    assert!(
        row(&md, "formation, all started together", 2)[5].contains('†'),
        "{md}"
    );
    assert!(out.join("compare.svg").exists());
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn open_mpi_runs_beside_dvmlab_on_the_same_hosts() {
    if !netns_available() {
        return skip(
            "open_mpi_runs_beside_dvmlab_on_the_same_hosts",
            "needs root and ip (netns hosts)",
        );
    }
    if Command::new("mpirun").arg("--version").output().is_err() {
        return skip(
            "open_mpi_runs_beside_dvmlab_on_the_same_hosts",
            "needs Open MPI's mpirun (apt-get install openmpi-bin; .ci/run does)",
        );
    }
    let out = out_dir("peers");
    let p = profile("reference");
    let md = bench(
        &[
            "peers",
            "--profile",
            p.to_str().unwrap(),
            "--sizes",
            "3",
            "--reps",
            "1",
        ],
        &out,
        "peers",
    );
    let r = row(
        &md,
        "one-shot: daemons started, one /bin/true per node, done",
        3,
    );
    assert_eq!(r.len(), 8, "{r:?}");
    assert!(md.contains("Open MPI"), "{md}");
    for i in [4, 6, 7] {
        assert!(ratio(&r[i]) > 0.0, "{r:?}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn two_profiles_held_side_by_side_give_paired_differences_and_a_ratio() {
    if !netns_available() {
        return skip(
            "two_profiles_held_side_by_side_give_paired_differences_and_a_ratio",
            "needs root and ip (netns hosts)",
        );
    }
    let out = out_dir("pair");
    let (a, b) = (profile("reference"), profile("human-status-example"));
    let md = bench(
        &[
            "pair",
            "--profile",
            a.to_str().unwrap(),
            "--profile",
            b.to_str().unwrap(),
            "--sizes",
            "3",
            "--pairs",
            "2",
        ],
        &out,
        "pair",
    );
    // nodes, pairs, A, B, B − A ± se, B / A, A CPU, B CPU, B − A CPU ± se, A daemons' CPU,
    // B daemons' CPU, B − A daemons' CPU ± se, B / A daemons' CPU
    let r = cells(&md, "at 3 nodes", |l| l.starts_with("| 3 | 2 |"));
    assert_eq!(r.len(), 13, "{r:?}");
    assert!(ratio(&r[5]) > 0.0, "{r:?}");
    assert!(ratio(&r[12]) > 0.0, "{r:?}");
    // Three daemons forming, serving and running a job take some CPU of their own.
    for i in [9, 10] {
        assert!(r[i].parse::<f64>().is_ok_and(|ms| ms > 0.0), "{r:?}");
    }
    for i in [4, 8, 11] {
        assert!(r[i].contains(" ± "), "{r:?}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_job_taken_apart_splits_its_cpu_beside_its_floors_with_the_daemons_by_place() {
    if !netns_available() {
        return skip(
            "a_job_taken_apart_splits_its_cpu_beside_its_floors_with_the_daemons_by_place",
            "needs root and ip (netns hosts)",
        );
    }
    let out = out_dir("anatomy");
    let p = profile("reference");
    let md = bench(
        &[
            "anatomy",
            "--profile",
            p.to_str().unwrap(),
            "--sizes",
            "3",
            "--jobs",
            "2",
        ],
        &out,
        "anatomy",
    );
    let cells = |start: &str| cells(&md, start, |l| l.starts_with(start));
    // what, the job, its floor, the ratio
    let wall = cells("| wall, ms |");
    assert_eq!(wall.len(), 4, "{wall:?}");
    assert!(ratio(&wall[3]) > 0.0, "{wall:?}");
    let daemons = cells("| the daemons' CPU");
    assert!(
        daemons[1].parse::<f64>().is_ok_and(|ms| ms > 0.0),
        "{daemons:?}"
    );
    // A tree of radix 64 over three nodes: the controller and three without children, each
    // with its CPU, the ratio to a floor worker's per spawn, switches and its host's segments.
    let ctl = cells("| the controller's |");
    assert_eq!(ctl[1], "1", "{ctl:?}");
    // Its host runs none of the job's processes: nothing to set beside a spawn.
    assert_eq!(ctl[3], "–", "{ctl:?}");
    assert!(
        ctl[5].contains(" / "),
        "netns hosts have segments of their own: {ctl:?}"
    );
    let leaves = cells("| without children |");
    assert_eq!(leaves[1], "3", "{leaves:?}");
    assert!(ratio(&leaves[3]) > 0.0, "{leaves:?}");
    assert!(
        md.contains("Taken off every window: the idle DVM's daemons"),
        "{md}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
