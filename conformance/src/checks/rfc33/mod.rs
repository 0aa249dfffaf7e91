//! Tests of Flux RFC 33 (distributed job control) as mapped onto the DVM
//! (`catalog/rfc33.toml` maps them to its items). Jobs are driven through the profile's
//! `[jobs]` commands only.

use std::time::{Duration, Instant};

use dvmlab_harness::{wait_until, Direction, PrteConf};

use crate::checks::{tests, TestDef};
use crate::outcome::{check, fail, OrUnresolved, Problem, Verdict};
use crate::status::Field;
use crate::sut::{node_names, Ctx, Dvm};

const FORM: Duration = Duration::from_secs(30);
const JOB: Duration = Duration::from_secs(30);

pub(crate) fn tests() -> Vec<TestDef> {
    tests![
        a_job_runs_exactly_where_it_was_placed_and_all_output_reaches_the_submitter
            => ["placed", "output", "listed"],
        the_job_status_is_the_greatest_wait_status => ["exit", "listed"],
        the_controller_hears_one_message_per_child_subtree_not_per_rank => ["forwarded", "reduced"],
        started_is_reported_only_after_every_shell_started,
        finished_is_reported_only_after_every_shell_exited,
        a_fatal_exception_kills_every_shell_of_the_job,
        signals_reach_every_process_of_the_job,
        a_time_limit_ends_the_job_with_an_exception,
        a_restarted_controller_recovers_running_jobs,
        a_check_for_a_job_that_died_with_its_daemon_raises_an_exception,
        a_stray_job_left_on_a_cut_off_daemon_is_terminated_when_it_returns,
        a_lost_daemon_fails_its_job_and_leaves_no_process,
        a_barrier_releases_no_process_before_every_process_entered_it,
    ]
}

fn with_ctl(nodes: &[String]) -> Vec<String> {
    let mut h = vec!["ctl".to_string()];
    h.extend(nodes.iter().cloned());
    h
}

fn conf(ctx: &Ctx, nodes: &[String]) -> PrteConf {
    PrteConf::new()
        .set("DVMNodes", nodes.join(","))
        .set("DVMControllerHost", "ctl")
        .set("DVMRadix", ctx.cell.radix)
        .set("DVMIPVersion", ctx.cell.ip)
}

/// A formed DVM of `n` nodes (the profile must have `[jobs]`).
fn formed<'a>(ctx: &'a Ctx, label: &str, n: usize) -> Result<(Dvm<'a>, Vec<String>), Problem> {
    if ctx.profile.jobs.is_none() {
        return Err(Problem::Unsupported(
            "the profile has no [jobs] section (how to run jobs)".into(),
        ));
    }
    let nodes = node_names(n);
    let hosts = with_ctl(&nodes);
    let mut dvm = Dvm::new(ctx, label, &hosts, &conf(ctx, &nodes))?;
    dvm.start_all()?;
    dvm.wait_formed(FORM)?;
    Ok((dvm, nodes))
}

fn proc_env(ctx: &Ctx) -> String {
    ctx.profile
        .jobs
        .as_ref()
        .map(|j| j.proc_env.clone())
        .unwrap_or_default()
}

/// Processes on this machine whose command line starts with `prefix`.
fn count(prefix: &str) -> usize {
    std::process::Command::new("pgrep")
        .args(["-f", &format!("^{prefix}")])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
        .unwrap_or(0)
}

/// Waits until exactly `n` processes named `prefix…` run on this machine; says how many did
/// otherwise.
fn wait_count(prefix: &str, n: usize, within: Duration) -> Result<(), String> {
    wait_until(within, Duration::from_millis(10), || match count(prefix) {
        c if c == n => Ok(()),
        c => Err(format!("{c} processes named {prefix}")),
    })
}

fn marker(ctx: &Ctx, what: &str) -> String {
    format!("dvlconf{}{what}{}", std::process::id(), ctx.cell.radix)
}

/// Premise: a 6-process job exits 0 and the job list shows its 6 placements. Aspects:
/// `placed` (each process ran once, on the host it was placed on), `output` (every
/// process's stdout and stderr reached the submitter), `listed` (the list shows it ended).
pub fn a_job_runs_exactly_where_it_was_placed_and_all_output_reaches_the_submitter(
    ctx: &Ctx,
) -> Verdict {
    ctx.need_own_networks("host names of job processes")?;
    let (dvm, nodes) = formed(ctx, "placed", 6)?;
    let env = proc_env(ctx);
    let script = format!("echo out ${env} $(hostname); echo err ${env} >&2");
    let (code, out, err) = dvm.run_job(6, &nodes, &["sh", "-c", &script])?;
    check(
        code == Some(0),
        "the job exits 0",
        format!("exit {code:?}: {err}"),
    )?;
    let job = dvm
        .jobs()?
        .pop()
        .ok_or_else(|| fail("the job in the job list", "an empty list"))?;
    check(
        job.placement.len() == 6,
        "six processes placed",
        format!("{:?}", job.placement),
    )?;
    ctx.aspect(
        "placed",
        job.placement.iter().try_for_each(|p| {
            let line = format!("out {} {}", p.proc, p.host);
            check(
                out.lines().filter(|l| *l == line).count() == 1,
                format!(
                    "process {} ran once, on {} where it was placed",
                    p.proc, p.host
                ),
                format!("stdout:\n{out}"),
            )
        }),
    );
    ctx.aspect(
        "output",
        (0..6).try_for_each(|i| {
            check(
                out.lines()
                    .filter(|l| l.starts_with(&format!("out {i} ")))
                    .count()
                    == 1
                    && err.lines().filter(|l| *l == format!("err {i}")).count() == 1,
                format!("process {i}'s stdout and stderr reached the submitter"),
                format!("stdout:\n{out}\nstderr:\n{err}"),
            )
        }),
    );
    ctx.aspect(
        "listed",
        check(
            job.state == "INACTIVE",
            "the job is INACTIVE once it ended",
            format!("{job:?}"),
        ),
    );
    Ok(())
}

/// Premise: a job whose processes exit 3 to 6 runs. Aspects: `exit` (the submitter exits
/// with the greatest status, 6), `listed` (the job list shows it ended with wait status
/// 6 << 8).
pub fn the_job_status_is_the_greatest_wait_status(ctx: &Ctx) -> Verdict {
    let (dvm, nodes) = formed(ctx, "status", 4)?;
    let env = proc_env(ctx);
    let script = format!("exit $((${env} + 3))");
    let (code, _, err) = dvm.run_job(4, &nodes, &["sh", "-c", &script])?;
    ctx.aspect(
        "exit",
        check(
            code == Some(6),
            "the job's status is its processes' greatest (exit 6 of 3..6)",
            format!("exit {code:?}: {err}"),
        ),
    );
    let job = dvm.wait_job(JOB, "the job INACTIVE", |j| j.state == "INACTIVE");
    ctx.aspect(
        "listed",
        job.and_then(|job| {
            check(
                job.status == Some(6 << 8),
                "the job list shows it ended with the greatest wait status (6 << 8)",
                format!("{job:?}"),
            )
        }),
    );
    Ok(())
}

/// Aspects `forwarded` (the controller hears of the job's start, finish and release from
/// its children) and `reduced` (at most one message of each per child, not one per rank).
/// The controller's children are read from the network.
pub fn the_controller_hears_one_message_per_child_subtree_not_per_rank(ctx: &Ctx) -> Verdict {
    ctx.need_report(
        Field::JobMessages,
        "counting the job messages the controller hears",
    )?;
    let (dvm, nodes) = formed(ctx, "reduce", 64)?;
    let before = dvm.status_now("a status")?.job_messages.unwrap_or_default();
    let (code, _, err) = dvm.run_job(64, &nodes, &["true"])?;
    check(
        code == Some(0),
        "a 64-process job exits 0",
        format!("exit {code:?}: {err}"),
    )?;
    let after = dvm.status_now("a status")?.job_messages.unwrap_or_default();
    let links = dvm.observe()?;
    let children = links
        .values()
        .filter(|up| up.iter().any(|h| h == &dvm.ctl))
        .count() as u64;
    let d = |a: u64, b: u64| a.saturating_sub(b);
    let (st, fi, re) = (
        d(after.start, before.start),
        d(after.finish, before.finish),
        d(after.release, before.release),
    );
    ctx.note(format!(
        "controller children (from the network) {children}; start {st}, finish {fi}, release {re} for one 64-rank job"
    ));
    ctx.aspect(
        "forwarded",
        check(
            st >= 1 && fi >= 1 && re >= 1,
            "the controller hears of the job's start, finish and release from its children",
            format!("start {st}, finish {fi}, release {re}"),
        ),
    );
    ctx.aspect(
        "reduced",
        check(
            st <= children && fi <= children && re <= children,
            format!(
                "the controller receives at most one start, finish and release per child ({children}), not one per rank (64)"
            ),
            format!("start {st}, finish {fi}, release {re}"),
        ),
    );
    Ok(())
}

/// Starts a 3-process job on `nodes[..3]` in the background whose processes print `up`
/// and then wait for the gate file; returns (child, stdout path, gate path).
fn gated_job<'a>(
    ctx: &Ctx,
    dvm: &Dvm<'a>,
    nodes: &[String],
    name: &str,
    exit_now: Option<&str>,
) -> Result<(std::process::Child, std::path::PathBuf, std::path::PathBuf), Problem> {
    let gate = dvm.cluster.run_dir().join(format!("{name}.gate"));
    let env = proc_env(ctx);
    let quick = exit_now
        .map(|p| format!("[ ${env} = {p} ] && exit 0; "))
        .unwrap_or_default();
    let script = format!(
        "echo up ${env}; {quick}while [ ! -e {} ]; do sleep 0.05; done",
        gate.display()
    );
    let argv = dvm.submit_argv(3, &nodes[..3], &[], &["sh", "-c", &script])?;
    let (child, out, _) = dvm.spawn_job(name, &argv)?;
    Ok((child, out, gate))
}

fn ups(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("up "))
        .count()
}

pub fn started_is_reported_only_after_every_shell_started(ctx: &Ctx) -> Verdict {
    let (mut dvm, nodes) = formed(ctx, "startall", 3)?;
    // n03's daemon is stopped dead (for less than its liveness window): its shell cannot
    // start until it is thawed.
    dvm.cluster.freeze("n03").or_unresolved("freezing n03")?;
    let (mut child, out, gate) = gated_job(ctx, &dvm, &nodes, "startall", None)?;
    let two = wait_until(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || match ups(&out) {
            2 => Ok(()),
            n => Err(format!("{n} processes up")),
        },
    );
    let early = dvm.jobs().map(|j| j.last().map(|j| j.state.clone()));
    dvm.cluster.thaw("n03").or_unresolved("thawing n03")?;
    two.map_err(Problem::Unresolved)?;
    let early = early?.unwrap_or_default();
    let r = check(
        early == "STARTING",
        "not reported started while n03's shell has not started",
        format!("state {early}"),
    )
    .and_then(|()| {
        dvm.wait_job(JOB, "RUNNING once every shell started", |j| {
            j.state == "RUNNING"
        })
        .map(|_| ())
    });
    let _ = std::fs::write(&gate, "");
    let _ = child.wait();
    r
}

pub fn finished_is_reported_only_after_every_shell_exited(ctx: &Ctx) -> Verdict {
    let (dvm, nodes) = formed(ctx, "finishall", 3)?;
    let (mut child, out, gate) = gated_job(ctx, &dvm, &nodes, "finishall", Some("0"))?;
    wait_until(
        Duration::from_secs(10),
        Duration::from_millis(20),
        || match ups(&out) {
            3 => Ok(()),
            n => Err(format!("{n} processes up")),
        },
    )
    .map_err(Problem::Unresolved)?;
    let r = dvm
        .holds_for(Duration::from_millis(1500), "the DVM answers", |_| true)
        .and_then(|()| {
            let j = dvm.jobs()?.pop().unwrap_or_else(|| crate::status::JobView {
                id: 0,
                state: String::new(),
                placement: vec![],
                status: None,
                exception: None,
            });
            check(
                j.state == "RUNNING",
                "still RUNNING while two of three processes run (process 0 exited)",
                format!("{j:?}"),
            )
        });
    let _ = std::fs::write(&gate, "");
    let st = child
        .wait()
        .or_unresolved("waiting for the submit command")?;
    r?;
    check(
        st.code() == Some(0),
        "the job exits 0 once all exited",
        format!("{st}"),
    )?;
    dvm.wait_job(JOB, "INACTIVE after every shell exited", |j| {
        j.state == "INACTIVE"
    })
    .map(|_| ())
}

/// Starts a 3-process job of long sleepers named `<marker>-<proc>`; waits until all run.
fn sleepers<'a>(
    ctx: &Ctx,
    dvm: &Dvm<'a>,
    nodes: &[String],
    mark: &str,
    extra: &[String],
) -> Result<(std::process::Child, std::path::PathBuf, std::path::PathBuf), Problem> {
    let env = proc_env(ctx);
    // The process renames itself `<mark>-<index>` (so the suite can find it) and answers
    // SIGTERM by printing `got-term` and exiting 7.
    let script = format!(
        "exec -a {mark}-${env} bash -c 'trap \"echo got-term; exit 7\" TERM; while :; do sleep 0.05; done'"
    );
    let argv = dvm.submit_argv(3, &nodes[..3], extra, &["bash", "-c", &script])?;
    let (child, out, err) = dvm.spawn_job(mark, &argv)?;
    wait_count(mark, 3, Duration::from_secs(10)).map_err(Problem::Unresolved)?;
    Ok((child, out, err))
}

/// No process named `mark…` is left, and the job ended with an exception on record.
fn ended_with_exception(dvm: &Dvm, mark: &str) -> Verdict {
    check(
        count(mark) == 0,
        "no process of the job is left",
        format!("{} left", count(mark)),
    )?;
    let j = dvm.wait_job(JOB, "INACTIVE", |j| j.state == "INACTIVE")?;
    check(
        j.exception.is_some(),
        "the job records an exception",
        format!("{j:?}"),
    )
}

fn ended(child: &mut std::process::Child, within: Duration) -> Result<Option<i32>, Problem> {
    let st = wait_until(within, Duration::from_millis(20), || {
        child
            .try_wait()
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "still running".to_string())
    })
    .map_err(|e| fail("the submit command ends with its job", e))?;
    Ok(st.code())
}

pub fn a_fatal_exception_kills_every_shell_of_the_job(ctx: &Ctx) -> Verdict {
    let (dvm, nodes) = formed(ctx, "fatal", 3)?;
    let mark = marker(ctx, "fatal");
    let (mut child, _, _) = sleepers(ctx, &dvm, &nodes, &mark, &[])?;
    let id = dvm.jobs()?.pop().map(|j| j.id).unwrap_or(0);
    dvm.kill_job(id, "KILL")?;
    let code = ended(&mut child, JOB)?;
    check(
        code == Some(137),
        "the job ends killed (137)",
        format!("{code:?}"),
    )?;
    ended_with_exception(&dvm, &mark)
}

pub fn signals_reach_every_process_of_the_job(ctx: &Ctx) -> Verdict {
    let (dvm, nodes) = formed(ctx, "signals", 3)?;
    let mark = marker(ctx, "signals");
    let (mut child, out, _) = sleepers(ctx, &dvm, &nodes, &mark, &[])?;
    let id = dvm.jobs()?.pop().map(|j| j.id).unwrap_or(0);
    dvm.kill_job(id, "TERM")?;
    let code = ended(&mut child, JOB)?;
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    check(
        code == Some(7) && text.matches("got-term").count() == 3,
        "SIGTERM reaches all three processes, which exit 7",
        format!("exit {code:?}, output:\n{text}"),
    )
}

pub fn a_time_limit_ends_the_job_with_an_exception(ctx: &Ctx) -> Verdict {
    let limit = ctx
        .profile
        .jobs
        .as_ref()
        .map(|j| j.time_limit.clone())
        .unwrap_or_default();
    ctx.need_feature("jobs.time_limit", !limit.is_empty())?;
    let (dvm, nodes) = formed(ctx, "limit", 3)?;
    let words: Vec<String> = limit.iter().map(|w| w.replace("{secs}", "1")).collect();
    let mark = marker(ctx, "limit");
    let started = Instant::now();
    let (mut child, _, _) = sleepers(ctx, &dvm, &nodes, &mark, &words)?;
    let code = ended(&mut child, JOB)?;
    let took = started.elapsed();
    check(
        code == Some(137) && took >= Duration::from_millis(900),
        "the job is killed (137) once its 1 s limit is up, not before",
        format!("exit {code:?} after {took:?}"),
    )?;
    ended_with_exception(&dvm, &mark)
}

/// Runs a gated 6-process job, restarts the controller while it runs (killing `also` too),
/// and returns the DVM, the gate and the marks directory.
fn restart_mid_job<'a>(
    ctx: &'a Ctx,
    label: &str,
    also: Option<&str>,
) -> Result<(Dvm<'a>, std::path::PathBuf, std::path::PathBuf, Vec<String>), Problem> {
    let (mut dvm, nodes) = formed(ctx, label, 6)?;
    let marks = dvm.cluster.run_dir().join("marks");
    std::fs::create_dir_all(&marks).or_unresolved("marks directory")?;
    let gate = marks.join("go");
    let env = proc_env(ctx);
    let script = format!(
        "echo start >> {m}/p${env}; while [ ! -e {g} ]; do sleep 0.05; done; echo end >> {m}/p${env}",
        m = marks.display(),
        g = gate.display()
    );
    let argv = dvm.submit_argv(6, &nodes, &[], &["sh", "-c", &script])?;
    let (mut child, _, _) = dvm.spawn_job(label, &argv)?;
    dvm.wait_job(JOB, "RUNNING", |j| j.state == "RUNNING")?;
    dvm.cluster
        .kill("ctl")
        .or_unresolved("killing the controller")?;
    if let Some(h) = also {
        dvm.cluster.kill(h).or_unresolved("killing a daemon")?;
    }
    let _ = child.wait();
    ctx.note(format!(
        "controller{} killed mid-job and restarted",
        also.map(|h| format!(" and {h}")).unwrap_or_default()
    ));
    dvm.start("ctl")?;
    if let Some(h) = also {
        dvm.start(h)?;
    }
    dvm.wait_formed(FORM)?;
    Ok((dvm, gate, marks, nodes))
}

pub fn a_restarted_controller_recovers_running_jobs(ctx: &Ctx) -> Verdict {
    let (mut dvm, gate, marks, nodes) = restart_mid_job(ctx, "recover", None)?;
    let j = dvm.jobs()?;
    check(
        j.len() == 1 && j[0].state == "RUNNING",
        "the restarted controller knows the running job",
        format!("{j:?}"),
    )?;
    std::fs::write(&gate, "").or_unresolved("opening the gate")?;
    let j = dvm.wait_job(JOB, "INACTIVE", |j| j.state == "INACTIVE")?;
    check(
        j.status == Some(0) && j.exception.is_none(),
        "the recovered job ends normally",
        format!("{j:?}"),
    )?;
    for p in 0..nodes.len() {
        let text = std::fs::read_to_string(marks.join(format!("p{p}"))).unwrap_or_default();
        check(
            text == "start\nend\n",
            format!("process {p} ran exactly once, to its end"),
            format!("{text:?}"),
        )?;
    }
    dvm.stop()
}

pub fn a_check_for_a_job_that_died_with_its_daemon_raises_an_exception(ctx: &Ctx) -> Verdict {
    let (mut dvm, gate, _, _) = restart_mid_job(ctx, "checkmiss", Some("n02"))?;
    std::fs::write(&gate, "").or_unresolved("opening the gate")?;
    let j = dvm.wait_job(JOB, "the job ends", |j| j.state == "INACTIVE")?;
    check(
        j.exception.is_some(),
        "a job missing on a rank where it should run raises an exception",
        format!("{j:?}"),
    )?;
    dvm.stop()
}

pub fn a_stray_job_left_on_a_cut_off_daemon_is_terminated_when_it_returns(ctx: &Ctx) -> Verdict {
    ctx.need_own_networks("a partition")?;
    let (mut dvm, nodes) = formed(ctx, "stray", 3)?;
    let mark = marker(ctx, "stray");
    let (mut child, _, _) = sleepers(ctx, &dvm, &nodes, &mark, &[])?;
    // n03 disappears for everyone: the DVM counts it lost and the job fails without it.
    let others: Vec<String> = dvm.hosts().into_iter().filter(|h| h != "n03").collect();
    let p = dvm
        .cluster
        .partition(&["n03".to_string()], &others, Direction::Both)
        .or_unresolved("partitioning n03")?;
    let code = ended(&mut child, Duration::from_secs(60))?;
    ctx.note(format!("the job ended with {code:?} while n03 was cut off"));
    let left = count(&format!("{mark}-2"));
    check(
        left == 1,
        "n03's process still runs while it is cut off",
        format!("{left}"),
    )?;
    dvm.cluster.heal(p).or_unresolved("healing the partition")?;
    dvm.wait_formed(FORM)?;
    wait_count(&format!("{mark}-2"), 0, Duration::from_secs(10)).map_err(|e| {
        fail(
            "n03 terminates the job it runs that upstream no longer has",
            e,
        )
    })?;
    dvm.stop()
}

pub fn a_lost_daemon_fails_its_job_and_leaves_no_process(ctx: &Ctx) -> Verdict {
    let (mut dvm, nodes) = formed(ctx, "lost", 3)?;
    let mark = marker(ctx, "lost");
    let (mut child, _, _) = sleepers(ctx, &dvm, &nodes, &mark, &[])?;
    dvm.cluster.kill("n02").or_unresolved("killing n02")?;
    wait_count(&format!("{mark}-1"), 0, Duration::from_secs(1))
        .map_err(|e| fail("n02's job process dies within 1 s of its daemon", e))?;
    let code = ended(&mut child, JOB)?;
    check(
        code.is_some_and(|c| c != 0),
        "the job fails",
        format!("{code:?}"),
    )?;
    check(
        count(&mark) == 0,
        "no process of the job is left",
        format!("{}", count(&mark)),
    )?;
    let j = dvm.wait_job(JOB, "INACTIVE", |j| j.state == "INACTIVE")?;
    check(
        j.exception.is_some(),
        "the job records an exception",
        format!("{j:?}"),
    )?;
    dvm.start("n02")?;
    dvm.wait_formed(FORM)?;
    dvm.stop()
}

pub fn a_barrier_releases_no_process_before_every_process_entered_it(ctx: &Ctx) -> Verdict {
    let fd = ctx
        .profile
        .jobs
        .as_ref()
        .and_then(|j| j.barrier_fd_env.clone());
    ctx.need_feature("jobs.barrier_fd_env", fd.is_some())?;
    let fd = fd.unwrap_or_default();
    let (dvm, nodes) = formed(ctx, "barrier", 3)?;
    let env = proc_env(ctx);
    let flag = dvm.cluster.run_dir().join("late-entered");
    // The last process enters late, after leaving a mark: nobody may leave before it exists.
    let script = format!(
        "if [ ${env} = 5 ]; then sleep 0.5; touch {f}; fi; \
         echo 'barrier 1' >&${fd}; read reply <&${fd}; \
         if [ -e {f} ]; then echo left-after-all; else echo early; fi",
        f = flag.display()
    );
    let (code, out, err) = dvm.run_job(6, &nodes, &["sh", "-c", &script])?;
    check(
        code == Some(0),
        "the job exits 0",
        format!("exit {code:?}: {err}"),
    )?;
    check(
        !out.contains("early") && out.matches("left-after-all").count() == 6,
        "all six processes leave barrier 1 only after the last one entered it",
        out,
    )
}
