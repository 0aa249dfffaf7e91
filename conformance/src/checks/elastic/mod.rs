//! Tests of the elastic DVM (`catalog/elastic.toml` maps them to its items). A DVM is made
//! elastic and changed in size only through the profile's `[elastic]` commands, its new
//! daemons started on the suite's spare hosts through the harness's launch agent (given
//! as the profile's agent parameter); jobs go through `[jobs]`. Everything is judged from
//! the request's JSON lines, the job list, the status and the hosts' processes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use dvmlab_harness::{agent, wait_until, PrteConf};
use serde_json::Value;

use crate::checks::{tests, TestDef};
use crate::outcome::{check, fail, OrUnresolved, Problem, Verdict};
use crate::profile::Elastic;
use crate::status::{JobView, MemberState, Status};
use crate::sut::{node_names, Ctx, Dvm};

const FORM: Duration = Duration::from_secs(30);
/// How long a change may take once nothing holds it.
const CHANGE: Duration = Duration::from_secs(60);
/// How long a request listens after its terminal event for another one.
const LINGER: u32 = 2;

pub(crate) fn tests() -> Vec<TestDef> {
    tests![
        a_grow_and_a_release_are_answered_at_once_then_end_in_one_event_for_the_requester_alone
            => ["accept_sync", "async_event", "exactly_one", "ready_payload", "codes",
                "grown_nodes_run_jobs", "directed", "release_departs", "shrunk_dvm_whole",
                "targets_fixed"],
        a_shrinks_release_cycle_runs_before_its_event => ["offered", "before_event"],
        a_fixed_size_dvm_refuses_to_change_and_sends_no_event => ["refused", "no_event", "never_held"],
        an_elastic_dvm_that_never_changes_size_holds_no_job => ["never_held"],
        jobs_arriving_during_a_grow_wait_then_run_on_the_grown_dvm
            => ["held", "invisible", "admitted_onto_new_nodes", "waiting_state", "passive",
                "premapped_unstalled", "unrelated_loss", "no_unready_map", "not_before_wired"],
        a_grow_whose_launch_fails_is_undone_exactly_and_its_held_jobs_end
            => ["rolled_back", "held_jobs_end", "err_payload", "stable_after", "nothing_ran"],
        concurrent_grows_and_a_shrink_are_each_accounted_for
            => ["other_grow_completes", "rollback_scoped", "shrink_completes", "held_until_all"],
        a_shrink_completes_on_its_targets_actual_departure_even_a_crash_counted_once
            => ["intent_not_enough", "crash_counts", "once"],
        a_job_held_at_the_launch_boundary_is_remapped_off_a_departing_node
            => ["held_at_launch", "remapped", "no_launch_to_departing", "unaffected_job",
                "map_held", "map_survivors", "grow_no_launch_stall"],
        a_push_and_a_request_that_changes_nothing_send_no_event
            => ["push_no_event", "no_change_no_event"],
        stopping_the_dvm_during_a_grow_ends_the_jobs_held_for_it,
    ]
}

/// A test's elastic DVM: `ctl`, nodes `n01…` (formed) and spare hosts `g01…` the launch
/// agent can start daemons on.
struct Site<'a> {
    dvm: Dvm<'a>,
    nodes: Vec<String>,
    run_dir: PathBuf,
    e: Elastic,
    /// Hosts killed on purpose (they do not exit cleanly at the stop).
    killed: Vec<String>,
}

/// What to set up beyond the defaults.
#[derive(Default)]
struct Opts<'o> {
    spares: usize,
    /// Grows wait for the test ([`agent::write_gated`]).
    gated: bool,
    /// Elastic mode left off.
    fixed: bool,
    /// More MCA parameters.
    mca: &'o [(&'o str, &'o str)],
    /// More `prte.conf` keys.
    conf: Vec<(String, String)>,
    /// Give the profile's release command parameter a script that records, in
    /// `RUN_DIR/released`, when (microseconds since the epoch) it was given which hosts.
    record_release: bool,
}

fn elastic_profile(ctx: &Ctx) -> Result<Elastic, Problem> {
    ctx.profile.elastic.clone().ok_or_else(|| {
        Problem::Unsupported(
            "the profile has no [elastic] section (how to grow and shrink the DVM)".into(),
        )
    })
}

fn site<'a>(ctx: &'a Ctx, label: &str, n: usize, o: Opts) -> Result<Site<'a>, Problem> {
    let e = elastic_profile(ctx)?;
    let nodes = node_names(n);
    let mut hosts = vec!["ctl".to_string()];
    hosts.extend(nodes.iter().cloned());
    hosts.extend((1..=o.spares).map(|i| format!("g{i:02}")));
    let mut conf = PrteConf::new()
        .set("DVMNodes", nodes.join(","))
        .set("DVMControllerHost", "ctl")
        .set("DVMRadix", ctx.cell.radix)
        .set("DVMIPVersion", ctx.cell.ip);
    for (k, v) in &o.conf {
        conf = conf.set(k, v);
    }
    let mca = |name: &str, value: &str| {
        ctx.profile.mca_cli(name, value).ok_or_else(|| {
            Problem::Unsupported(
                "the profile has no [mca] section (how to set elastic mode and the agent)".into(),
            )
        })
    };
    let mut dvm = Dvm::new(ctx, label, &hosts, &conf)?;
    let run_dir = dvm.cluster.run_dir().to_path_buf();
    let program = agent::program().or_unresolved("building the harness's launch agent")?;
    let mut launch = dvm
        .cluster
        .write_agent(&program)
        .or_unresolved("writing the launch agent")?;
    if o.gated {
        launch = agent::write_gated(&run_dir, &launch).or_unresolved("writing the gated agent")?;
    }
    let mut daemon = ctx.profile.daemon.command.clone();
    if o.record_release {
        let param = e.release_command.clone().ok_or_else(|| {
            Problem::Unsupported(
                "the profile names no release command parameter ([elastic] release_command)".into(),
            )
        })?;
        let recorder = run_dir.join("record-release");
        std::fs::write(
            &recorder,
            format!(
                "#!/bin/sh\necho \"$(date +%s%6N) $*\" >> '{}/released'\n",
                run_dir.display()
            ),
        )
        .or_unresolved("writing the release recorder")?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&recorder, std::fs::Permissions::from_mode(0o755))
            .or_unresolved("making the release recorder executable")?;
        daemon.extend(mca(&param, &recorder.to_string_lossy())?);
    }
    daemon.extend(
        ctx.profile
            .elastic_words(&launch.to_string_lossy(), o.fixed)
            .map_err(Problem::Unsupported)?,
    );
    for (k, v) in o.mca {
        daemon.extend(mca(k, v)?);
    }
    dvm.cluster.set_daemon(daemon);
    dvm.start_many(&hosts[..=n])?;
    dvm.wait_formed(FORM)?;
    Ok(Site {
        dvm,
        nodes,
        run_dir,
        e,
        killed: Vec::new(),
    })
}

/// One line a request printed.
fn phase(lines: &[Value], p: &str) -> Vec<Value> {
    lines.iter().filter(|l| l["phase"] == p).cloned().collect()
}

impl Site<'_> {
    fn request_argv(
        &self,
        directive: &str,
        hosts: &[&str],
        alloc: Option<&str>,
        req: Option<&str>,
    ) -> Vec<String> {
        let fill = |words: &[String], k: &str, v: &str| -> Vec<String> {
            words.iter().map(|w| w.replace(k, v)).collect()
        };
        let mut argv: Vec<String> = self
            .e
            .request
            .iter()
            .map(|w| {
                w.replace("{directive}", directive)
                    .replace("{linger}", &LINGER.to_string())
            })
            .collect();
        if !hosts.is_empty() {
            argv.extend(fill(&self.e.hosts, "{hosts}", &hosts.join(",")));
        }
        if let Some(a) = alloc {
            argv.extend(fill(&self.e.alloc_id, "{id}", a));
        }
        if let Some(r) = req {
            argv.extend(fill(&self.e.req_id, "{id}", r));
        }
        argv
    }

    /// Runs a request to its end: (exit code, JSON lines).
    fn request(
        &self,
        directive: &str,
        hosts: &[&str],
        alloc: Option<&str>,
        req: Option<&str>,
    ) -> Result<(Option<i32>, Vec<Value>), Problem> {
        let argv = self.request_argv(directive, hosts, alloc, req);
        let (code, out, err) = self.dvm.run_on(&self.dvm.ctl, &argv, CHANGE)?;
        let lines = parse_lines(&out)
            .map_err(|e| fail("the request prints JSON lines", format!("{e}\n{err}")))?;
        Ok((code, lines))
    }

    /// Starts a request in the background; its lines go to `RUN_DIR/<name>.out`.
    fn spawn_request(
        &self,
        name: &str,
        directive: &str,
        hosts: &[&str],
    ) -> Result<Background, Problem> {
        let argv = self.request_argv(directive, hosts, None, Some(name));
        let (child, out, _) = self.dvm.spawn_job(name, &argv)?;
        Ok(Background {
            child,
            out,
            what: format!("request {name}"),
        })
    }

    /// Starts a job in the background: on `hosts`, or, with none, wherever the DVM places
    /// it.
    fn spawn_job(
        &self,
        name: &str,
        nprocs: usize,
        hosts: &[String],
        cmd: &[&str],
    ) -> Result<Background, Problem> {
        let argv = if hosts.is_empty() {
            let mut a: Vec<String> = self
                .e
                .submit
                .iter()
                .map(|w| w.replace("{nprocs}", &nprocs.to_string()))
                .collect();
            a.extend(cmd.iter().map(|c| c.to_string()));
            a
        } else {
            self.dvm.submit_argv(nprocs, hosts, &[], cmd)?
        };
        let (child, out, _) = self.dvm.spawn_job(name, &argv)?;
        Ok(Background {
            child,
            out,
            what: format!("job {name}"),
        })
    }

    fn push(&self, words: &[String], hosts: &[&str]) -> Result<(Option<i32>, String), Problem> {
        let argv: Vec<String> = words
            .iter()
            .map(|w| w.replace("{hosts}", &hosts.join(",")))
            .collect();
        let (code, out, err) = self.dvm.run_on(&self.dvm.ctl, &argv, CHANGE)?;
        Ok((code, format!("{out}{err}")))
    }

    fn gate(&self, host: &str, open: bool) -> Verdict {
        agent::gate(&self.run_dir, host, open).or_unresolved("opening the agent's gate")
    }

    fn status(&self, what: &str) -> Result<Status, Problem> {
        self.dvm.status_now(what)
    }

    fn state_of(s: &Status, host: &str) -> Option<MemberState> {
        s.members
            .iter()
            .rev()
            .find(|m| m.host == host)
            .map(|m| m.state)
    }

    fn jobs(&self) -> Result<Vec<JobView>, Problem> {
        self.dvm.jobs()
    }

    /// Waits until job `id` shows the held state.
    fn wait_held(&self, id: u64) -> Result<JobView, Problem> {
        let held = self.e.waiting_state.clone();
        let mut last = String::new();
        let r = wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
            let js = self.jobs().map_err(|e| e.to_string())?;
            match js.into_iter().find(|j| j.id == id) {
                Some(j) if j.state == held => Ok(j),
                other => {
                    last = format!("{other:?}");
                    Err(last.clone())
                }
            }
        });
        r.map_err(|_| {
            fail(
                format!("job {id} shown as {held:?} (held for the change)"),
                last,
            )
        })
    }

    fn kill(&mut self, host: &str) -> Verdict {
        self.dvm
            .cluster
            .kill(host)
            .or_unresolved(&format!("killing {host}"))?;
        self.killed.push(host.to_string());
        Ok(())
    }

    /// Stops the DVM; every daemon not killed on purpose exits cleanly.
    fn stop(mut self) -> Verdict {
        let killed = std::mem::take(&mut self.killed);
        self.dvm.stop_sparing(&killed)
    }
}

fn parse_lines(out: &str) -> Result<Vec<Value>, String> {
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| format!("{e}: {l:?}")))
        .collect()
}

/// A command running in the background.
struct Background {
    child: std::process::Child,
    out: PathBuf,
    what: String,
}

impl Background {
    /// Waits for it to end (at most [`CHANGE`]): its exit code and output.
    fn finish(mut self) -> Result<(Option<i32>, String), Problem> {
        let mut broken = None;
        let st = wait_until(CHANGE, Duration::from_millis(20), || {
            match self.child.try_wait() {
                Ok(Some(st)) => Ok(Some(st)),
                Ok(None) => Err(String::new()),
                Err(e) => {
                    broken = Some(e.to_string());
                    Ok(None)
                }
            }
        });
        if let Some(e) = broken {
            return Err(Problem::Unresolved(format!("{}: {e}", self.what)));
        }
        match st {
            Ok(Some(st)) => {
                let out = std::fs::read_to_string(&self.out).unwrap_or_default();
                Ok((st.code(), out))
            }
            _ => {
                let _ = self.child.kill();
                Err(fail(
                    format!("{} ends within {CHANGE:?}", self.what),
                    "it is still running",
                ))
            }
        }
    }

    /// Waits until a background request printed its synchronous answer (accepted).
    fn accepted(&self) -> Result<Value, Problem> {
        let mut last = Vec::new();
        wait_until(Duration::from_secs(30), Duration::from_millis(20), || {
            last = self.lines();
            phase(&last, "accepted")
                .into_iter()
                .next()
                .ok_or_else(String::new)
        })
        .map_err(|_| fail(format!("{} is accepted", self.what), format!("{last:?}")))
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn lines(&self) -> Vec<Value> {
        parse_lines(&std::fs::read_to_string(&self.out).unwrap_or_default()).unwrap_or_default()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hosts_of(j: &JobView) -> Vec<String> {
    let mut h: Vec<String> = j.placement.iter().map(|p| p.host.clone()).collect();
    h.sort();
    h.dedup();
    h
}

/// The non-departed members (rank, host).
fn membership(s: &Status) -> Vec<(Option<u32>, String)> {
    s.members
        .iter()
        .filter(|m| m.state != MemberState::Departed)
        .map(|m| (m.rank, m.host.clone()))
        .collect()
}

pub fn a_grow_and_a_release_are_answered_at_once_then_end_in_one_event_for_the_requester_alone(
    ctx: &Ctx,
) -> Verdict {
    let s = site(
        ctx,
        "grow-release",
        2,
        Opts {
            spares: 2,
            ..Opts::default()
        },
    )?;
    // A bystander on another node registered for both codes hears nothing: the event is
    // for the requester alone.
    let bystander = match &ctx.profile.events {
        Some(_) => Some(s.dvm.listen(
            &s.nodes[0],
            "bystander",
            &serde_json::json!([{"name": "b", "codes": [-195, -196]}]),
            20,
        )?),
        None => None,
    };
    if let Some(b) = &bystander {
        b.wait_ready(1, Duration::from_secs(15))?;
    }
    let (code, lines) = s.request("new", &["g01", "g02"], None, Some("r1"))?;
    let shown = format!("{lines:?}");
    let accepted = phase(&lines, "accepted");
    let events = phase(&lines, "event");
    let alloc = accepted
        .first()
        .map(|a| a["alloc_id"].clone())
        .unwrap_or(Value::Null);
    ctx.aspect(
        "accept_sync",
        check(
            lines.first().is_some_and(|l| {
                l["phase"] == "accepted" && l["status"] == 0 && l["alloc_id"].is_string()
            }),
            "the synchronous answer first: accepted, status 0, with the allocation id",
            shown.clone(),
        ),
    );
    ctx.aspect(
        "async_event",
        check(
            code == Some(0) && !events.is_empty(),
            "then the terminal event (the request exits 0 on PMIX_DVM_IS_READY)",
            format!("exit {code:?}: {shown}"),
        ),
    );
    ctx.aspect(
        "exactly_one",
        check(
            events.len() == 1,
            format!("exactly one terminal event (listening {LINGER} s after it)"),
            shown.clone(),
        ),
    );
    ctx.aspect(
        "codes",
        check(
            events.first().is_some_and(|e| e["code"] == -195),
            "PMIX_DVM_IS_READY is -195",
            shown.clone(),
        ),
    );
    ctx.aspect(
        "ready_payload",
        check(
            events
                .first()
                .is_some_and(|e| e["alloc_id"] == alloc && e["req_id"] == "r1"),
            "the event carries the allocation id and the requester's own id",
            shown.clone(),
        ),
    );
    let st = s.status("the status after the grow")?;
    let (jc, jout, jerr) =
        s.dvm
            .run_job(2, &["g01".to_string(), "g02".to_string()], &["hostname"])?;
    ctx.aspect(
        "grown_nodes_run_jobs",
        check(
            Site::state_of(&st, "g01") == Some(MemberState::Joined)
                && Site::state_of(&st, "g02") == Some(MemberState::Joined)
                && jc == Some(0)
                && jout.contains("g01")
                && jout.contains("g02"),
            "after the event the new daemons are joined and run a job's processes",
            format!("{}\njob exit {jc:?}: {jout}{jerr}", st.describe()),
        ),
    );
    let alloc_s = alloc.as_str().unwrap_or_default().to_string();
    let (code, lines) = s.request("release", &[], Some(&alloc_s), None)?;
    let shown = format!("{lines:?}");
    let events = phase(&lines, "event");
    let accepted = phase(&lines, "accepted");
    let st = s.status("the status after the release")?;
    ctx.aspect(
        "targets_fixed",
        check(
            accepted
                .first()
                .is_some_and(|a| a["ranks"].as_array().is_some_and(|r| r.len() == 2)),
            "a release of the allocation names its two ranks as its targets",
            shown.clone(),
        ),
    );
    ctx.aspect(
        "release_departs",
        check(
            code == Some(0)
                && events.len() == 1
                && events[0]["code"] == -195
                && Site::state_of(&st, "g01") == Some(MemberState::Departed)
                && Site::state_of(&st, "g02") == Some(MemberState::Departed),
            "one PMIX_DVM_IS_READY, and then both released daemons departed",
            format!("exit {code:?}: {shown}\n{}", st.describe()),
        ),
    );
    let all = s.nodes.clone();
    let (jc, jout, jerr) = s.dvm.run_job(all.len(), &all, &["hostname"])?;
    ctx.aspect(
        "shrunk_dvm_whole",
        check(
            jc == Some(0) && st.formed,
            "after a shrink's event the remaining DVM is formed and runs a job on every node",
            format!("{}\njob exit {jc:?}: {jout}{jerr}", st.describe()),
        ),
    );
    if let Some(b) = bystander {
        let heard: Vec<_> = b.stop().into_iter().filter(|l| l.is_call()).collect();
        ctx.aspect(
            "directed",
            check(
                heard.is_empty(),
                "no terminal event reaches a process that did not make the request",
                format!("{heard:?}"),
            ),
        );
    } else {
        ctx.aspect(
            "directed",
            Err(Problem::Unsupported(
                "the profile has no [events] section (a bystander listener)".into(),
            )),
        );
    }
    s.stop()
}

pub fn a_fixed_size_dvm_refuses_to_change_and_sends_no_event(ctx: &Ctx) -> Verdict {
    let s = site(
        ctx,
        "fixed",
        2,
        Opts {
            spares: 1,
            fixed: true,
            ..Opts::default()
        },
    )?;
    let (code, lines) = s.request("new", &["g01"], None, None)?;
    ctx.aspect(
        "refused",
        check(
            code != Some(0) && phase(&lines, "rejected").len() == 1,
            "with elastic mode off a grow request is rejected",
            format!("exit {code:?}: {lines:?}"),
        ),
    );
    ctx.aspect(
        "no_event",
        check(
            phase(&lines, "event").is_empty(),
            format!("a rejected request hears no event (listening {LINGER} s)"),
            format!("{lines:?}"),
        ),
    );
    let (pc, pout) = s.push(&s.e.grow, &["g01"])?;
    let st = s.status("the status after refused changes")?;
    let (jc, _, jerr) = s.dvm.run_job(2, &s.nodes, &["true"])?;
    let held = s.jobs()?.iter().any(|j| j.state == s.e.waiting_state);
    ctx.aspect(
        "never_held",
        check(
            pc != Some(0) && Site::state_of(&st, "g01").is_none_or(|m| m == MemberState::Departed) && jc == Some(0) && !held,
            "a fixed-size DVM refuses a push too, keeps its members, and runs jobs without holding them",
            format!("push exit {pc:?}: {pout}\n{}\njob exit {jc:?}: {jerr}", st.describe()),
        ),
    );
    s.stop()
}

pub fn an_elastic_dvm_that_never_changes_size_holds_no_job(ctx: &Ctx) -> Verdict {
    let s = site(ctx, "static", 2, Opts::default())?;
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(s.dvm.run_job(2, &s.nodes, &["true"])?.0);
    }
    let jobs = s.jobs()?;
    ctx.aspect(
        "never_held",
        check(
            codes.iter().all(|c| *c == Some(0)) && jobs.iter().all(|j| j.state != s.e.waiting_state),
            "an elastic DVM that does not change size runs jobs with the plain submit command, none held",
            format!("exits {codes:?}, jobs {jobs:?}"),
        ),
    );
    s.stop()
}

pub fn jobs_arriving_during_a_grow_wait_then_run_on_the_grown_dvm(ctx: &Ctx) -> Verdict {
    let mut s = site(
        ctx,
        "held",
        3,
        Opts {
            spares: 1,
            gated: true,
            ..Opts::default()
        },
    )?;
    // Running before the grow: never stalled by it.
    let flag = s.run_dir.join("let-it-end");
    let wait_cmd = format!("while [ ! -e '{}' ]; do sleep 0.05; done", flag.display());
    let early = s.spawn_job("early", 1, &[s.nodes[0].clone()], &["sh", "-c", &wait_cmd])?;
    s.dvm
        .wait_job(Duration::from_secs(20), "job 1 running", |j| {
            j.id == 1 && j.state == "RUNNING"
        })?;
    let req = s.spawn_request("grow", "new", &["g01"])?;
    req.accepted()?;
    // The grow is in progress as long as its daemon is held back: a job submitted now waits.
    let job = s.spawn_job("late", 3, &[], &["hostname"])?;
    let held = s.wait_held(2);
    ctx.aspect("held", held.as_ref().map(|_| ()).map_err(Clone::clone));
    ctx.aspect(
        "waiting_state",
        held.as_ref().map(|_| ()).map_err(Clone::clone),
    );
    let j2 = s.jobs()?.into_iter().find(|j| j.id == 2);
    ctx.aspect(
        "no_unready_map",
        check(
            !j2.as_ref()
                .is_some_and(|j| hosts_of(j).contains(&"g01".to_string())),
            "no job is placed on a daemon that has not even started",
            format!("{j2:?}"),
        ),
    );
    let mut req = req;
    let lines = req.lines();
    ctx.aspect(
        "not_before_wired",
        check(
            req.running() && phase(&lines, "event").is_empty(),
            "the grow is not complete (no event) while its daemon has not even started",
            format!("{lines:?}"),
        ),
    );
    std::fs::write(&flag, "").or_unresolved("letting job 1 end")?;
    let early_end = early.finish()?;
    ctx.aspect(
        "premapped_unstalled",
        check(
            early_end.0 == Some(0),
            "a job already running is not stalled by a grow in progress",
            format!("{early_end:?}"),
        ),
    );
    // A daemon no campaign targets dies: the grow and the held job carry on.
    s.kill(&s.nodes[1].clone())?;
    s.dvm
        .wait_status(Duration::from_secs(20), "n02 reported lost", |st| {
            Site::state_of(st, "n02") == Some(MemberState::Lost)
        })?;
    let still = s.wait_held(2);
    ctx.aspect(
        "unrelated_loss",
        check(still.is_ok() && req.running(), "losing a daemon no campaign targets neither releases nor aborts the held job, nor ends the grow", format!("{still:?}")),
    );
    s.gate("g01", true)?;
    let (rc, _) = req.finish()?;
    let (jc, jout) = job.finish()?;
    let j = s.jobs()?.into_iter().find(|j| j.id == 2);
    ctx.aspect(
        "invisible",
        check(
            jc == Some(0),
            "the held job simply runs later: its submit command succeeds",
            format!("exit {jc:?}: {jout}"),
        ),
    );
    ctx.aspect(
        "admitted_onto_new_nodes",
        check(
            rc == Some(0) && j.as_ref().is_some_and(|j| hosts_of(j).contains(&"g01".to_string()) && !hosts_of(j).contains(&"n02".to_string())),
            "once the grow completed the held job is mapped onto the DVM as it then is (the new node in, the lost one out)",
            format!("request exit {rc:?}; job {j:?}"),
        ),
    );
    ctx.aspect(
        "passive",
        check(
            j.as_ref().is_some_and(|j| j.state != s.e.waiting_state),
            "the held state ends by itself when the campaign ends",
            format!("{j:?}"),
        ),
    );
    s.stop()
}

pub fn a_grow_whose_launch_fails_is_undone_exactly_and_its_held_jobs_end(ctx: &Ctx) -> Verdict {
    let s = site(
        ctx,
        "rollback",
        2,
        Opts {
            spares: 1,
            gated: true,
            ..Opts::default()
        },
    )?;
    let before = membership(&s.status("the status before the grow")?);
    let req = s.spawn_request("grow", "new", &["g01"])?;
    req.accepted()?;
    let job = s.spawn_job("held", 2, &[], &["hostname"])?;
    s.wait_held(1)?;
    s.gate("g01", false)?;
    let (rc, _) = {
        let lines = req.lines();
        let r = req.finish()?;
        (r.0, lines)
    };
    let lines =
        parse_lines(&std::fs::read_to_string(s.run_dir.join("grow.out")).unwrap_or_default())
            .unwrap_or_default();
    let events = phase(&lines, "event");
    let accepted = phase(&lines, "accepted");
    ctx.aspect(
        "err_payload",
        check(
            rc != Some(0)
                && events.len() == 1
                && events[0]["code"] == -196
                && events[0]["cause"].is_i64()
                && events[0]["alloc_id"]
                    == accepted
                        .first()
                        .map_or(Value::Null, |a| a["alloc_id"].clone())
                && events[0]["req_id"] == "grow",
            "one PMIX_ERR_DVM_MOD (-196) carrying the allocation id, the request id and the cause",
            format!("exit {rc:?}: {lines:?}"),
        ),
    );
    let (jc, jout) = job.finish()?;
    let j = s.jobs()?.into_iter().find(|j| j.id == 1);
    ctx.aspect(
        "held_jobs_end",
        check(
            jc != Some(0) && j.as_ref().is_some_and(|j| j.exception.is_some()),
            "a job held for a failed grow ends (its submit command fails, the job list says why)",
            format!("exit {jc:?}: {jout}; {j:?}"),
        ),
    );
    ctx.aspect(
        "nothing_ran",
        check(
            j.as_ref().is_some_and(|j| j.placement.is_empty()),
            "it never ran anywhere",
            format!("{j:?}"),
        ),
    );
    let after = s.status("the status after the failed grow")?;
    ctx.aspect(
        "rolled_back",
        check(
            membership(&after) == before,
            "exactly the membership before the grow",
            format!("before {before:?}\nafter {}", after.describe()),
        ),
    );
    let (jc, _, jerr) = s.dvm.run_job(2, &s.nodes, &["true"])?;
    ctx.aspect(
        "stable_after",
        check(
            after.formed && jc == Some(0),
            "after -196 the DVM is stable and runs jobs as before",
            format!("{}\njob exit {jc:?}: {jerr}", after.describe()),
        ),
    );
    s.stop()
}

pub fn concurrent_grows_and_a_shrink_are_each_accounted_for(ctx: &Ctx) -> Verdict {
    let s = site(
        ctx,
        "concurrent",
        3,
        Opts {
            spares: 2,
            gated: true,
            ..Opts::default()
        },
    )?;
    let before_n = membership(&s.status("the status before")?);
    let a = s.spawn_request("ga", "new", &["g01"])?;
    let b = s.spawn_request("gb", "new", &["g02"])?;
    let c = s.spawn_request("sc", "release", &["n03"])?;
    for r in [&a, &b, &c] {
        r.accepted()?;
    }
    let job = s.spawn_job("held", 2, &[], &["hostname"])?;
    s.wait_held(1)?;
    let (cc, _) = c.finish()?;
    let still = s.wait_held(1);
    ctx.aspect(
        "shrink_completes",
        check(
            cc == Some(0),
            "the shrink completes beside the grows",
            format!(
                "exit {cc:?}: {:?}",
                std::fs::read_to_string(s.run_dir.join("sc.out"))
            ),
        ),
    );
    ctx.aspect(
        "held_until_all",
        check(
            still.is_ok(),
            "a held job stays held while other campaigns are still in progress",
            format!("{still:?}"),
        ),
    );
    s.gate("g01", false)?;
    let (ac, _) = a.finish()?;
    s.gate("g02", true)?;
    let (bc, _) = b.finish()?;
    let st = s.status("the status after")?;
    ctx.aspect(
        "other_grow_completes",
        check(
            ac != Some(0)
                && bc == Some(0)
                && Site::state_of(&st, "g02") == Some(MemberState::Joined),
            "one grow fails, the other completes",
            format!("ga exit {ac:?}, gb exit {bc:?}\n{}", st.describe()),
        ),
    );
    let mut expect: Vec<(Option<u32>, String)> =
        before_n.into_iter().filter(|(_, h)| h != "n03").collect();
    let g02 = st
        .members
        .iter()
        .find(|m| m.host == "g02")
        .map(|m| (m.rank, m.host.clone()));
    expect.extend(g02);
    ctx.aspect(
        "rollback_scoped",
        check(membership(&st) == expect, "the failed grow took only its own host out: the other grow's and the shrink's results stand", format!("expected {expect:?}\n{}", st.describe())),
    );
    let _ = job.finish()?;
    s.stop()
}

pub fn a_shrink_completes_on_its_targets_actual_departure_even_a_crash_counted_once(
    ctx: &Ctx,
) -> Verdict {
    let mut s = site(ctx, "departure", 3, Opts::default())?;
    s.dvm.cluster.freeze("n03").or_unresolved("freezing n03")?;
    let mut req = s.spawn_request("sh", "release", &["n03"])?;
    s.dvm
        .wait_status(Duration::from_secs(20), "n03 departing", |st| {
            Site::state_of(st, "n03") == Some(MemberState::Departing)
        })?;
    // Told to leave, it cannot: the shrink must not count the intent.
    let window = Instant::now() + Duration::from_secs(2);
    let mut early = false;
    while Instant::now() < window {
        early |= !req.running() || !phase(&req.lines(), "event").is_empty();
        std::thread::sleep(Duration::from_millis(100));
    }
    ctx.aspect(
        "intent_not_enough",
        check(
            !early,
            "no terminal event while the target is still there (2 s)",
            format!("{:?}", req.lines()),
        ),
    );
    s.kill("n03")?;
    let (rc, out) = req.finish()?;
    let lines = parse_lines(&out).unwrap_or_default();
    let events = phase(&lines, "event");
    ctx.aspect(
        "crash_counts",
        check(
            rc == Some(0) && events.first().is_some_and(|e| e["code"] == -195),
            "a target that crashes completes the shrink as one that leaves",
            format!("exit {rc:?}: {lines:?}"),
        ),
    );
    ctx.aspect(
        "once",
        check(
            events.len() == 1,
            "its departure counted once: one event",
            format!("{lines:?}"),
        ),
    );
    // It comes back: it is told to leave again, and the DVM does not change.
    s.dvm.start("n03")?;
    let ok = s.dvm.holds_for(
        Duration::from_secs(2),
        "n03 stays departed and the DVM formed",
        |st| st.formed && Site::state_of(st, "n03") == Some(MemberState::Departed),
    );
    ctx.aspect("once", ok);
    let _ = s.dvm.cluster.wait_exit("n03", Duration::from_secs(10));
    s.stop()
}

pub fn a_job_held_at_the_launch_boundary_is_remapped_off_a_departing_node(ctx: &Ctx) -> Verdict {
    let e = elastic_profile(ctx)?;
    let (Some(limit), Some(prolog)) = (e.launch_limit.clone(), e.prolog_key.clone()) else {
        return Err(Problem::Unsupported(
            "the profile names no launch limit and prolog ([elastic] launch_limit, prolog_key): nothing waits at the launch boundary long enough to see".into(),
        ));
    };
    ctx.need_netns("a prolog that knows its host by its host name")?;
    // Every launch onto n01 waits in its prolog for the word `go` (in the run directory,
    // two levels above the host's TMPDIR); with one launch at a time, job 1 (on n01) holds
    // the slot and the others wait, mapped, at the launch boundary.
    let hold =
        "[ \"$(hostname)\" != n01 ] || while [ ! -e \"$TMPDIR/../../go\" ]; do sleep 0.05; done";
    let mut s = site(
        ctx,
        "remap",
        4,
        Opts {
            spares: 1,
            gated: true,
            mca: &[(&limit, "1")],
            conf: vec![(prolog, hold.to_string())],
            ..Opts::default()
        },
    )?;
    let first = s.spawn_job("first", 1, &["n01".to_string()], &["true"])?;
    s.dvm
        .wait_job(Duration::from_secs(20), "job 1 listed", |j| j.id == 1)?;
    let second = s.spawn_job("second", 4, &[], &["hostname"])?;
    s.dvm
        .wait_job(Duration::from_secs(20), "job 2 listed", |j| j.id == 2)?;
    let third = s.spawn_job("third", 1, &["n02".to_string()], &["hostname"])?;
    let mapped = s
        .dvm
        .wait_job(Duration::from_secs(20), "job 3 listed", |j| j.id == 3)?;
    let j2 = s.jobs()?.into_iter().find(|j| j.id == 2);
    if !j2
        .as_ref()
        .is_some_and(|j| hosts_of(j).contains(&"n04".to_string()))
    {
        return Err(Problem::Unresolved(format!(
            "job 2 was not mapped onto n04 before the shrink: {j2:?} {mapped:?}"
        )));
    }
    // n04 cannot leave while frozen: the shrink stays in progress until it is killed.
    s.dvm.cluster.freeze("n04").or_unresolved("freezing n04")?;
    let shrink = s.spawn_request("sh", "release", &["n04"])?;
    shrink.accepted()?;
    let held = s.wait_held(2);
    ctx.aspect(
        "held_at_launch",
        held.as_ref().map(|_| ()).map_err(Clone::clone),
    );
    // Submitted during the shrink: mapped only after it, onto the survivors.
    let fourth = s.spawn_job("fourth", 3, &[], &["hostname"])?;
    let held4 = s.wait_held(4);
    ctx.aspect("map_held", held4.as_ref().map(|_| ()).map_err(Clone::clone));
    s.kill("n04")?;
    let (sc, _) = shrink.finish()?;
    if sc != Some(0) {
        return Err(fail("the shrink of n04 completes", format!("exit {sc:?}")));
    }
    // A grow in progress does not hold the launch boundary.
    let grow = s.spawn_request("gr", "new", &["g01"])?;
    grow.accepted()?;
    std::fs::write(s.run_dir.join("go"), "").or_unresolved("letting the launches go")?;
    let (c1, _) = first.finish()?;
    let (c2, o2) = second.finish()?;
    let (c3, _) = third.finish()?;
    let jobs = s.jobs()?;
    let find = |id| jobs.iter().find(|j| j.id == id).cloned();
    let (j2, j3, j4) = (find(2), find(3), find(4));
    ctx.aspect(
        "grow_no_launch_stall",
        check(c2 == Some(0) && c3 == Some(0), "mapped jobs launch while a grow is still in progress: only shrinks hold the launch boundary", format!("job 2 exit {c2:?}, job 3 exit {c3:?}")),
    );
    ctx.aspect(
        "remapped",
        check(
            c1 == Some(0)
                && c2 == Some(0)
                && j2.as_ref().is_some_and(|j| {
                    !hosts_of(j).contains(&"n04".to_string()) && j.placement.len() == 4
                }),
            "the held job is mapped again onto the survivors and runs, not failed",
            format!("exit {c2:?}: {o2}\n{j2:?}"),
        ),
    );
    ctx.aspect(
        "no_launch_to_departing",
        check(
            !o2.contains("n04"),
            "no process of it ran on the departing node",
            o2.clone(),
        ),
    );
    ctx.aspect(
        "unaffected_job",
        check(
            j3.as_ref().is_some_and(|j| hosts_of(j) == ["n02"]),
            "a held job with no process on the departing node launches on its mapping",
            format!("{j3:?}"),
        ),
    );
    s.gate("g01", true)?;
    let (gc, _) = grow.finish()?;
    let (c4, o4) = fourth.finish()?;
    let j4 = find(4).or(j4);
    ctx.aspect(
        "map_survivors",
        check(
            gc == Some(0) && c4 == Some(0) && !o4.contains("n04"),
            "a job held at the map-eligible boundary during the shrink runs on survivors only",
            format!("exit {c4:?}: {o4}\n{j4:?}"),
        ),
    );
    s.stop()
}

pub fn a_push_and_a_request_that_changes_nothing_send_no_event(ctx: &Ctx) -> Verdict {
    let s = site(
        ctx,
        "quiet",
        2,
        Opts {
            spares: 1,
            ..Opts::default()
        },
    )?;
    if ctx.profile.events.is_none() {
        return Err(Problem::Unsupported(
            "the profile has no [events] section (a listener to hear no event)".into(),
        ));
    }
    let l = s.dvm.listen(
        "ctl",
        "all",
        &serde_json::json!([{"name": "any", "codes": [-195, -196]}]),
        15,
    )?;
    l.wait_ready(1, Duration::from_secs(15))?;
    let (pc, pout) = s.push(&s.e.grow, &["g01"])?;
    let (code, lines) = s.request("new", &["n01"], None, None)?;
    let heard: Vec<_> = l.stop().into_iter().filter(|l| l.is_call()).collect();
    ctx.aspect(
        "push_no_event",
        check(
            pc == Some(0) && heard.is_empty(),
            "a push with no requester completes and raises no terminal event",
            format!("push exit {pc:?}: {pout}\nheard {heard:?}"),
        ),
    );
    ctx.aspect(
        "no_change_no_event",
        check(
            code == Some(0) && phase(&lines, "accepted").first().is_some_and(|a| a["changed"] == false) && phase(&lines, "event").is_empty(),
            format!("a request that changes nothing is accepted and hears no event (listening {LINGER} s)"),
            format!("exit {code:?}: {lines:?}"),
        ),
    );
    s.stop()
}

pub fn stopping_the_dvm_during_a_grow_ends_the_jobs_held_for_it(ctx: &Ctx) -> Verdict {
    let s = site(
        ctx,
        "teardown",
        2,
        Opts {
            spares: 1,
            gated: true,
            ..Opts::default()
        },
    )?;
    let req = s.spawn_request("grow", "new", &["g01"])?;
    req.accepted()?;
    let job = s.spawn_job("held", 2, &[], &["true"])?;
    s.wait_held(1)?;
    let stopped = s.stop();
    let (jc, jout) = job.finish()?;
    stopped?;
    check(
        jc != Some(0),
        "a job held when the DVM stops ends (its submit command fails) rather than waiting forever",
        format!("exit {jc:?}: {jout}"),
    )
}

pub fn a_shrinks_release_cycle_runs_before_its_event(ctx: &Ctx) -> Verdict {
    let s = site(
        ctx,
        "release",
        2,
        Opts {
            spares: 1,
            record_release: true,
            ..Opts::default()
        },
    )?;
    let (pc, pout) = s.push(&s.e.grow, &["g01"])?;
    if pc != Some(0) {
        return Err(fail(
            "a push grow onto g01 completes",
            format!("exit {pc:?}: {pout}"),
        ));
    }
    let (code, lines) = s.request("release", &["g01"], None, None)?;
    let event = phase(&lines, "event").into_iter().next();
    let record = std::fs::read_to_string(s.run_dir.join("released")).unwrap_or_default();
    let released: Vec<(u64, String)> = record
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(t, h)| Some((t.parse().ok()?, h.to_string())))
        .collect();
    ctx.aspect(
        "offered",
        check(
            released.iter().any(|(_, h)| h.split_whitespace().any(|w| w == "g01")),
            "the finished shrink offers its hosts to the release component (the release command got g01)",
            format!("recorded {record:?}"),
        ),
    );
    let at = event.as_ref().and_then(|e| e["at_us"].as_u64());
    ctx.aspect(
        "before_event",
        check(
            code == Some(0) && at.is_some_and(|at| released.iter().any(|(t, _)| *t < at)),
            "the release cycle finishes before PMIX_DVM_IS_READY is sent (the command ran before the event arrived)",
            format!("exit {code:?}: {lines:?}\nrecorded {record:?}"),
        ),
    );
    s.stop()
}
