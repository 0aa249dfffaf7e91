//! The controller's job manager: takes jobs from tools, places them on daemon ranks, hands
//! them to the job-exec module, follows their states from its events, streams their output
//! back to the submitting tool, enforces time limits, and keeps the list of live jobs the
//! shell persists so a restarted controller can recover them.
//!
//! A job goes accept → map → launch. In an elastic DVM two boundaries hold jobs while the
//! DVM changes size ([`Fence`]): a job waits before it is mapped while any grow or shrink is
//! in progress, and a mapped job waits before its launch data goes out while a shrink is; a
//! held job shows `WAITING FOR DAEMON CAMPAIGN` (PRRTE's state 17). Launches also wait their
//! turn when [`JobManager::set_max_launching`] jobs are starting at once. A job is launched
//! only onto compute ranks: one whose placement lost a rank while it waited is mapped again
//! onto the survivors. Its submitter hears `Submitted` only at its launch, so holding a job
//! looks like a delay and nothing else.
//!
//! Sans-IO: the shell feeds [`Input`]s and carries out [`Output`]s.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use std::collections::VecDeque;

use crate::campaign::{Fault, Fence};
use crate::exec::{self, JobEvent, JobId, JobSpec};
use crate::overlay::LinkId;
use crate::roster::{Roster, State};
use crate::tree::Rank;
use dvmlab_proto::idset::IdSet;
use dvmlab_proto::limits::{
    JOB_HISTORY, MAX_JOB_SPEC_BYTES, MAX_LIVE_JOBS, MAX_PROCS_PER_JOB, MAX_PROCS_PER_NODE,
};
use dvmlab_proto::placement::Placement;
use dvmlab_proto::wire::{JobSummary, Submit, ToolReply};

#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Place and start a job on the roster's compute ranks.
    Submit {
        link: LinkId,
        job: Submit,
    },
    Jobs {
        link: LinkId,
    },
    Kill {
        link: LinkId,
        id: JobId,
        signal: i32,
    },
    /// Stdin for process 0 of a job, from the tool that submitted it.
    Stdin {
        link: LinkId,
        id: JobId,
        data: Vec<u8>,
        eof: bool,
    },
    /// A tool's connection closed: its jobs keep running, their output is dropped.
    ToolGone {
        link: LinkId,
    },
    Event(JobEvent),
    TimeLimit(JobId),
    /// The elastic fence moved (see the module documentation).
    Fence(Fence),
    /// A grow failed or the DVM is stopping: the jobs held at the map-eligible boundary
    /// (and, with `launch_too`, the mapped ones not yet launched) end without starting.
    AbortParked {
        launch_too: bool,
        cause: String,
    },
}

/// PRRTE's name and number of the state of a job held for a campaign.
pub const WAITING_FOR_DAEMONS: &str = "WAITING FOR DAEMON CAMPAIGN";
pub const WAITING_FOR_DAEMONS_CODE: u32 = 17;

#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    Exec(exec::Input),
    Reply {
        link: LinkId,
        reply: ToolReply,
    },
    /// Call back with `TimeLimit(id)` after `delay`.
    SetTimer {
        id: JobId,
        delay: Duration,
    },
    /// The job's time limit set by `SetTimer` is moot: it ended first.
    CancelTimer {
        id: JobId,
    },
    /// The live jobs and the next job id, to be written where a restarted controller
    /// finds them.
    Persist(Saved),
    /// Job `id` ended (every rank released) with this greatest wait status.
    Ended {
        id: JobId,
        status: i32,
        exception: Option<String>,
    },
    /// Job `id` entered a state worth a verbose log line.
    State {
        id: JobId,
        state: &'static str,
        code: u32,
    },
}

/// What a controller keeps across its restarts: its live jobs, and the id its next job
/// gets, so that no id (nor the PMIx namespace made from it) is ever given to two jobs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saved {
    #[serde(default)]
    pub next_id: JobId,
    pub live: Vec<Persisted>,
}

/// A live job as persisted across controller restarts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Persisted {
    pub id: JobId,
    pub userid: u32,
    pub ranks: IdSet,
    pub spec: JobSpec,
    pub report: JobSummary,
    pub time_limit_ms: Option<u64>,
    /// The job's first fatal exception, raised again by the restarted controller: shells
    /// the first one did not reach (cut off, or started late) are still to be killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fatal: Option<Fatal>,
}

/// A fatal exception (severity 0) as a job's record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fatal {
    pub kind: String,
    pub note: String,
}

/// Where a job stands on its way to a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Stage {
    /// Held at the map-eligible boundary.
    Unmapped,
    /// Mapped; held at the launch boundary or waiting for its turn to launch.
    Mapped,
    /// Its launch data went out (it may have ended since).
    Launched,
}

/// What a job asked for, kept to map it (again) later.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Want {
    nprocs: Option<u32>,
    map_by: dvmlab_proto::placement::MapBy,
    hosts: Option<Vec<String>>,
}

#[derive(Debug, Clone)]
struct Job {
    userid: u32,
    ranks: IdSet,
    spec: JobSpec,
    report: JobSummary,
    tool: Option<LinkId>,
    time_limit_ms: Option<u64>,
    stage: Stage,
    want: Want,
    /// Counted among the launches in progress (launched, not yet started or ended).
    launching: bool,
    fatal: Option<Fatal>,
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct JobManager {
    next_id: JobId,
    /// The next id as last written out ([`Output::Persist`]).
    saved_next_id: JobId,
    jobs: BTreeMap<JobId, Job>,
    fence: Fence,
    /// Jobs held at the map-eligible boundary, in submission order.
    unmapped: VecDeque<JobId>,
    /// Mapped jobs waiting for their launch, in submission order.
    mapped: VecDeque<JobId>,
    max_launching: usize,
    launching: usize,
    /// A deliberate defect of the job side (tests only, see [`Fault`]).
    fault: Option<Fault>,
    out: Vec<Output>,
}

/// The bytes a job's description takes: what [`MAX_JOB_SPEC_BYTES`] bounds.
fn spec_bytes(job: &Submit) -> usize {
    let strings = job.argv.iter().chain(job.hosts.iter().flatten());
    let env = job.env.iter().map(|(k, v)| k.len() + v.len() + 2);
    strings.map(|a| a.len() + 1).sum::<usize>()
        + env.sum::<usize>()
        + job.cwd.as_ref().map_or(0, String::len)
}

/// Places a job on `joined` (or those of the hosts it names), or says why not.
fn map(roster: &Roster, joined: Vec<Rank>, want: &Want) -> Result<Placement, String> {
    let nodes: Vec<Rank> = match &want.hosts {
        Some(hosts) => {
            let mut v = Vec::new();
            for h in hosts {
                match roster.rank_of(h) {
                    Some(r) if joined.contains(&r) => v.push(r),
                    Some(_) => return Err(format!("host {h} has no joined daemon")),
                    None => return Err(format!("host {h} is not in the DVM")),
                }
            }
            v
        }
        None => joined,
    };
    if nodes.is_empty() {
        return Err("no joined daemon to run the job on".into());
    }
    // One process per node unless told otherwise.
    let nprocs = want.nprocs.unwrap_or(nodes.len() as u32);
    let placement = Placement::new(nprocs, nodes, want.map_by);
    if let Some((rank, n)) = placement
        .counts()
        .iter()
        .find(|(_, n)| **n > MAX_PROCS_PER_NODE)
    {
        let host = roster.host(*rank);
        return Err(format!("-n {nprocs}: {n} processes would run on {host} (rank {rank}); at most {MAX_PROCS_PER_NODE} of one job run on one node"));
    }
    Ok(placement)
}

impl JobManager {
    /// A job manager recovering `live` (read
    /// back after a restart; empty on a fresh start). The first output tells job-exec which
    /// jobs run, so its hello can begin.
    pub fn new(saved: Saved) -> (JobManager, Vec<Output>) {
        let live = saved.live;
        let next_id = live
            .iter()
            .map(|p| p.id + 1)
            .chain([saved.next_id, 1])
            .max()
            .unwrap_or(1);
        let mut m = JobManager {
            next_id,
            saved_next_id: next_id,
            jobs: BTreeMap::new(),
            fence: Fence::OPEN,
            unmapped: VecDeque::new(),
            mapped: VecDeque::new(),
            max_launching: MAX_LIVE_JOBS,
            launching: 0,
            fault: None,
            out: Vec::new(),
        };
        let mut recovered = Vec::new();
        let mut raise = Vec::new();
        for p in live {
            recovered.push((p.id, p.userid, p.ranks.clone(), p.spec.clone()));
            if let Some(f) = &p.fatal {
                raise.push(exec::Input::Raise {
                    id: p.id,
                    severity: 0,
                    kind: f.kind.clone(),
                    note: f.note.clone(),
                });
            }
            m.jobs.insert(
                p.id,
                Job {
                    userid: p.userid,
                    ranks: p.ranks,
                    spec: p.spec,
                    report: p.report,
                    tool: None,
                    time_limit_ms: p.time_limit_ms,
                    stage: Stage::Launched,
                    want: Want {
                        nprocs: None,
                        map_by: dvmlab_proto::placement::MapBy::Node,
                        hosts: None,
                    },
                    launching: false,
                    fatal: p.fatal,
                },
            );
        }
        m.emit(Output::Exec(exec::Input::Recovered(recovered)));
        for r in raise {
            m.emit(Output::Exec(r));
        }
        let out = std::mem::take(&mut m.out);
        (m, out)
    }

    /// At most `n` (at least 1) jobs launching at once: the rest wait, mapped, for their turn.
    pub fn set_max_launching(&mut self, n: usize) {
        self.max_launching = n.clamp(1, MAX_LIVE_JOBS);
    }

    /// Makes the manager deliberately wrong in `fault`'s way, where that is its part (the
    /// test-only `dvmlab_test_elastic_fault`).
    pub fn set_fault(&mut self, fault: Option<Fault>) {
        self.fault = fault;
    }

    /// The ranks a job may run on: the compute ranks (and, broken on purpose, departing
    /// ones).
    fn runnable(&self, roster: &Roster) -> Vec<Rank> {
        let mut ranks = roster.compute_ranks();
        if self.fault == Some(Fault::LaunchOnDeparting) {
            ranks.extend(
                roster
                    .iter()
                    .filter(|(_, m)| m.state == State::Departing)
                    .map(|(r, _)| r),
            );
            ranks.sort_unstable();
        }
        ranks
    }

    /// Ranks running (or about to run) processes of a launched job that has not ended.
    pub fn busy(&self) -> IdSet {
        self.jobs
            .values()
            .filter(|j| j.stage == Stage::Launched && j.report.state != "INACTIVE")
            .fold(IdSet::new(), |acc, j| acc.union(&j.ranks))
    }

    /// Every job not yet launched, with whether it is held at the map-eligible boundary
    /// (else it is mapped onto `ranks`).
    pub fn unlaunched(&self) -> impl Iterator<Item = (JobId, bool, &IdSet)> {
        self.jobs
            .iter()
            .filter(|(_, j)| j.stage != Stage::Launched && j.report.state != "INACTIVE")
            .map(|(id, j)| (*id, j.stage == Stage::Unmapped, &j.ranks))
    }

    /// Feeds one input; `roster` is the DVM's membership as the controller sees it now.
    pub fn handle(&mut self, roster: &Roster, input: Input) -> Vec<Output> {
        match input {
            Input::Submit { link, job } => self.submit(roster, link, job),
            Input::Jobs { link } => {
                let jobs: Vec<JobSummary> = self.jobs.values().map(|j| j.report.clone()).collect();
                for j in jobs {
                    self.reply(link, ToolReply::Job(j));
                }
                self.reply(link, ToolReply::JobsEnd);
            }
            Input::Kill { link, id, signal } => self.kill(link, id, signal),
            Input::Stdin {
                link,
                id,
                data,
                eof,
            } => self.stdin(link, id, data, eof),
            Input::ToolGone { link } => {
                for j in self.jobs.values_mut() {
                    if j.tool == Some(link) {
                        j.tool = None;
                    }
                }
            }
            Input::Event(e) => self.on_event(roster, e),
            Input::Fence(f) => {
                if f == Fence::OPEN && self.fault == Some(Fault::LoseHeldJobs) {
                    self.forget_held();
                }
                self.fence = f;
                self.admit(roster);
            }
            Input::AbortParked { launch_too, cause } => {
                let mut ids: Vec<JobId> = self.unmapped.drain(..).collect();
                if launch_too {
                    ids.extend(self.mapped.drain(..));
                }
                for id in ids {
                    self.end_unlaunched(id, cause.clone());
                }
            }
            Input::TimeLimit(id) => {
                let live = self
                    .jobs
                    .get(&id)
                    .is_some_and(|j| matches!(j.report.state.as_str(), "STARTING" | "RUNNING"));
                if live {
                    let ms = self
                        .jobs
                        .get(&id)
                        .and_then(|j| j.time_limit_ms)
                        .unwrap_or(0);
                    self.emit(Output::Exec(exec::Input::Raise {
                        id,
                        severity: 0,
                        kind: "timeout".into(),
                        note: format!("time limit of {ms} ms reached"),
                    }));
                }
            }
        }
        std::mem::take(&mut self.out)
    }

    fn emit(&mut self, o: Output) {
        self.out.push(o);
    }

    fn reply(&mut self, link: LinkId, reply: ToolReply) {
        self.emit(Output::Reply { link, reply });
    }

    fn error(&mut self, link: LinkId, message: String) {
        self.reply(link, ToolReply::Error { message });
    }

    fn submit(&mut self, roster: &Roster, link: LinkId, job: Submit) {
        if job.argv.is_empty() {
            return self.error(link, "a job needs a command".into());
        }
        if job.nprocs == Some(0) {
            return self.error(link, "a job needs at least one process (-n)".into());
        }
        if let Some(n) = job.nprocs.filter(|n| *n > MAX_PROCS_PER_JOB) {
            return self.error(
                link,
                format!("-n {n}: a job may have at most {MAX_PROCS_PER_JOB} processes"),
            );
        }
        let bytes = spec_bytes(&job);
        if bytes > MAX_JOB_SPEC_BYTES {
            return self.error(
                link,
                format!("the job's command, environment, directory and hosts take {bytes} bytes; at most {MAX_JOB_SPEC_BYTES} are accepted"),
            );
        }
        let live = self
            .jobs
            .values()
            .filter(|j| j.report.state != "INACTIVE")
            .count();
        if live >= MAX_LIVE_JOBS {
            return self.error(
                link,
                format!("{live} jobs are running, the most the DVM runs at once; try again when one ends"),
            );
        }
        let want = Want {
            nprocs: job.nprocs,
            map_by: job.map_by,
            hosts: job.hosts.clone(),
        };
        // Mapped now when the boundary is open, so that a job that cannot be placed is
        // refused at once, before it gets an id.
        let placement = if self.fence.map_open {
            match map(roster, self.runnable(roster), &want) {
                Ok(p) => Some(p),
                Err(e) => return self.error(link, e),
            }
        } else {
            None
        };
        let id = self.next_id;
        self.next_id += 1;
        let placement = placement.unwrap_or_else(|| Placement::unmapped(want.map_by));
        let spec = JobSpec {
            argv: job.argv.clone(),
            env: job.env.clone(),
            cwd: job.cwd.clone(),
            placement: placement.clone(),
            stdin: job.stdin,
        };
        let report = JobSummary {
            id,
            state: "STARTING".into(),
            argv: job.argv,
            placement: placement.clone(),
            status: None,
            exception: None,
        };
        self.jobs.insert(
            id,
            Job {
                userid: job.userid,
                ranks: placement.ranks(),
                spec,
                report,
                tool: Some(link),
                time_limit_ms: job.time_limit_ms,
                stage: if self.fence.map_open {
                    Stage::Mapped
                } else {
                    Stage::Unmapped
                },
                want,
                launching: false,
                fatal: None,
            },
        );
        self.prune_history();
        if self.fence.map_open {
            self.mapped.push_back(id);
        } else {
            self.unmapped.push_back(id);
            self.park(id);
        }
        self.admit(roster);
        // A job that did not launch at once was not written out with its id: the id is,
        // so a restarted controller does not give it to another job.
        if self.saved_next_id < self.next_id {
            self.persist();
        }
    }

    /// Moves held jobs on as far as the fence and the launch limit let them, in order.
    fn admit(&mut self, roster: &Roster) {
        if self.fence.map_open {
            while let Some(id) = self.unmapped.pop_front() {
                self.map_job(roster, id);
            }
        }
        while self.fence.launch_open && self.launching < self.max_launching {
            let Some(id) = self.mapped.pop_front() else {
                break;
            };
            self.launch(roster, id);
        }
        let held: Vec<JobId> = self.mapped.iter().copied().collect();
        for id in held {
            if self.fence.launch_open {
                // Only its turn to launch keeps it now, no campaign: it is starting.
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.report.state = "STARTING".into();
                }
            } else {
                self.park(id);
            }
        }
    }

    /// Every job the manager remembers, with its state.
    pub fn states(&self) -> impl Iterator<Item = (JobId, &str)> {
        self.jobs
            .iter()
            .map(|(id, j)| (*id, j.report.state.as_str()))
    }

    /// Shows job `id` as held for a campaign (once).
    fn park(&mut self, id: JobId) {
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        if j.report.state == WAITING_FOR_DAEMONS {
            return;
        }
        j.report.state = WAITING_FOR_DAEMONS.into();
        self.emit(Output::State {
            id,
            state: WAITING_FOR_DAEMONS,
            code: WAITING_FOR_DAEMONS_CODE,
        });
    }

    /// The defect `lose-held-jobs`: every job held for a campaign is dropped without a word
    /// to its submitter.
    fn forget_held(&mut self) {
        let held: Vec<JobId> = self
            .unmapped
            .drain(..)
            .chain(self.mapped.iter().copied().filter(|id| {
                self.jobs
                    .get(id)
                    .is_some_and(|j| j.report.state == WAITING_FOR_DAEMONS)
            }))
            .collect();
        self.mapped.retain(|id| !held.contains(id));
        for id in &held {
            self.jobs.remove(id);
        }
    }

    /// Maps a job that was held at the map-eligible boundary; one that cannot be placed
    /// any more ends.
    fn map_job(&mut self, roster: &Roster, id: JobId) {
        let Some(want) = self.jobs.get(&id).map(|j| j.want.clone()) else {
            return;
        };
        match map(roster, self.runnable(roster), &want) {
            Ok(p) => {
                self.place(id, p);
                self.mapped.push_back(id);
            }
            Err(e) => self.end_unlaunched(id, format!("map: {e}")),
        }
    }

    fn place(&mut self, id: JobId, p: Placement) {
        if let Some(j) = self.jobs.get_mut(&id) {
            j.ranks = p.ranks();
            j.spec.placement = p.clone();
            j.report.placement = p;
            j.stage = Stage::Mapped;
        }
    }

    /// Sends job `id`'s launch data, mapping it again first if a rank it was placed on can
    /// no longer run it (it departed, is departing or was lost while the job waited).
    fn launch(&mut self, roster: &Roster, id: JobId) {
        let Some(j) = self.jobs.get(&id) else {
            return;
        };
        let compute: IdSet = self.runnable(roster).into_iter().collect();
        if !j.ranks.difference(&compute).is_empty() {
            let want = j.want.clone();
            match map(roster, compute.iter().collect(), &want) {
                Ok(p) => self.place(id, p),
                Err(e) => return self.end_unlaunched(id, format!("remap: {e}")),
            }
        }
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        j.stage = Stage::Launched;
        j.launching = true;
        j.report.state = "STARTING".into();
        let (link, userid, ranks, spec) = (j.tool, j.userid, j.ranks.clone(), j.spec.clone());
        self.launching += 1;
        self.persist();
        if let Some(link) = link {
            self.reply(
                link,
                ToolReply::Submitted {
                    id,
                    placement: spec.placement.clone(),
                },
            );
        }
        self.emit(Output::Exec(exec::Input::Submit {
            id,
            userid,
            ranks,
            spec,
        }));
    }

    /// Ends a job that never launched: nothing ran, so nothing is released; its submitter
    /// and the job-end event hear why.
    fn end_unlaunched(&mut self, id: JobId, exception: String) {
        let exception = crate::exec::cut(exception);
        self.unmapped.retain(|j| *j != id);
        self.mapped.retain(|j| *j != id);
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        if j.stage == Stage::Launched || j.report.state == "INACTIVE" {
            return;
        }
        j.report.state = "INACTIVE".into();
        j.report.exception = Some(exception.clone());
        let tool = j.tool.take();
        // No process ran; the job failed all the same (exit status 1, as a shell reports a
        // command that could not start), and the exception says why.
        let status = 1 << 8;
        if let Some(link) = tool {
            self.reply(
                link,
                ToolReply::JobEnded {
                    id,
                    status,
                    exception: Some(exception.clone()),
                },
            );
        }
        self.emit(Output::Ended {
            id,
            status,
            exception: Some(exception),
        });
    }

    /// A launch is over (the job started or ended): the next waiting one may go.
    fn launched(&mut self, roster: &Roster, id: JobId) {
        if let Some(j) = self.jobs.get_mut(&id) {
            if j.launching {
                j.launching = false;
                self.launching -= 1;
            }
        }
        self.admit(roster);
    }

    fn kill(&mut self, link: LinkId, id: JobId, signal: i32) {
        let Some(j) = self.jobs.get(&id) else {
            return self.error(link, format!("no job {id}"));
        };
        if j.stage != Stage::Launched {
            // Nothing runs yet: any signal ends it, as a cancellation.
            self.end_unlaunched(id, "cancel: killed by a tool before it launched".into());
            return self.reply(link, ToolReply::Signalled { id });
        }
        // SIGKILL is the job's end: a fatal exception, as the RFC has it for cancellation.
        self.emit(Output::Exec(if signal == 9 {
            exec::Input::Raise {
                id,
                severity: 0,
                kind: "cancel".into(),
                note: "killed by a tool".into(),
            }
        } else {
            exec::Input::Signal { id, signal }
        }));
        self.reply(link, ToolReply::Signalled { id });
    }

    /// Only the submitting connection feeds a job's stdin, and only while the job runs:
    /// another tool cannot write into someone's job.
    fn stdin(&mut self, link: LinkId, id: JobId, data: Vec<u8>, eof: bool) {
        let Some(j) = self.jobs.get(&id) else {
            return self.error(link, format!("no job {id}"));
        };
        if j.tool != Some(link) {
            return self.error(
                link,
                format!("job {id} was not submitted on this connection: only its submitter feeds its stdin"),
            );
        }
        if !j.spec.stdin {
            return self.error(link, format!("job {id} was submitted without stdin"));
        }
        if j.report.state == "INACTIVE" {
            return;
        }
        self.emit(Output::Exec(exec::Input::Stdin { id, data, eof }));
    }

    fn on_event(&mut self, roster: &Roster, e: JobEvent) {
        match e {
            JobEvent::Started { id } => {
                self.launched(roster, id);
                let limit = self.jobs.get_mut(&id).and_then(|j| {
                    j.report.state = "RUNNING".into();
                    j.time_limit_ms
                });
                if let Some(ms) = limit {
                    self.emit(Output::SetTimer {
                        id,
                        delay: Duration::from_millis(ms),
                    });
                }
                self.persist();
            }
            JobEvent::Finished { id, status } => {
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.report.state = "CLEANUP".into();
                    j.report.status = Some(status);
                }
                self.persist();
            }
            JobEvent::Exception {
                id,
                severity,
                kind,
                note,
            } => {
                let Some(j) = self.jobs.get_mut(&id) else {
                    return;
                };
                j.report.exception.get_or_insert(format!("{kind}: {note}"));
                if severity == 0 && j.fatal.is_none() {
                    j.fatal = Some(Fatal { kind, note });
                    self.persist();
                }
            }
            JobEvent::Released { id, last, .. } => {
                if !last {
                    return;
                }
                let Some(j) = self.jobs.get_mut(&id) else {
                    return;
                };
                j.report.state = "INACTIVE".into();
                let (tool, status, exception, limited) = (
                    j.tool.take(),
                    j.report.status.unwrap_or(0),
                    j.report.exception.clone(),
                    j.time_limit_ms.is_some(),
                );
                // A short job with a long limit would otherwise leave its timer with the
                // shell until the limit passed: entries bounded by time, not by live jobs.
                if limited {
                    self.emit(Output::CancelTimer { id });
                }
                if let Some(link) = tool {
                    self.reply(
                        link,
                        ToolReply::JobEnded {
                            id,
                            status,
                            exception: exception.clone(),
                        },
                    );
                }
                self.emit(Output::Ended {
                    id,
                    status,
                    exception,
                });
                self.persist();
                self.launched(roster, id);
            }
            JobEvent::StdinAck { id, bytes } => {
                if let Some(link) = self.jobs.get(&id).and_then(|j| j.tool) {
                    self.reply(link, ToolReply::StdinAck { id, bytes });
                }
            }
            JobEvent::Output {
                id,
                proc,
                stream,
                data,
            } => {
                if let Some(link) = self.jobs.get(&id).and_then(|j| j.tool) {
                    self.reply(
                        link,
                        ToolReply::JobOutput {
                            id,
                            proc,
                            stream,
                            data,
                        },
                    );
                }
            }
        }
    }

    fn prune_history(&mut self) {
        while self.jobs.len() > JOB_HISTORY {
            let Some(old) = self
                .jobs
                .iter()
                .find(|(_, j)| j.report.state == "INACTIVE")
                .map(|(id, _)| *id)
            else {
                break;
            };
            self.jobs.remove(&old);
        }
    }

    fn persist(&mut self) {
        // A job not yet launched is not kept: its submitter's connection ends with this
        // controller, and nothing of it runs to be recovered.
        let live = self
            .jobs
            .iter()
            .filter(|(_, j)| j.report.state != "INACTIVE" && j.stage == Stage::Launched)
            .map(|(id, j)| Persisted {
                id: *id,
                userid: j.userid,
                ranks: j.ranks.clone(),
                spec: j.spec.clone(),
                report: j.report.clone(),
                time_limit_ms: j.time_limit_ms,
                fatal: j.fatal.clone(),
            })
            .collect();
        self.saved_next_id = self.next_id;
        self.emit(Output::Persist(Saved {
            next_id: self.next_id,
            live,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roster::State;
    use dvmlab_proto::placement::MapBy;
    use dvmlab_proto::wire::Stream;

    fn submit(n: u32, map_by: MapBy, hosts: Option<Vec<String>>) -> Submit {
        Submit {
            argv: vec!["hostname".into()],
            env: vec![],
            cwd: None,
            nprocs: Some(n),
            map_by,
            hosts,
            time_limit_ms: Some(500),
            userid: 1000,
            stdin: false,
        }
    }

    fn mgr() -> JobManager {
        JobManager::new(Saved::default()).0
    }

    /// ctl, n01, n02, n03 with `wired` wired in (and the controller, not a compute node).
    fn wired(wired: &[Rank]) -> Roster {
        let hosts = ["ctl", "n01", "n02", "n03"].map(String::from).to_vec();
        let mut r = Roster::from_conf(&hosts, false, 0);
        for w in wired {
            r.set(*w, State::Wired);
        }
        r
    }

    #[test]
    fn jobs_past_a_limit_are_refused_and_the_manager_runs_on() {
        let mut m = mgr();
        for (job, why) in [
            (
                submit(2_000_000, MapBy::Node, None),
                "at most 1048576 processes",
            ),
            (
                submit(MAX_PROCS_PER_NODE * 3 + 1, MapBy::Node, None),
                "processes would run on n01 (rank 1)",
            ),
            (
                Submit {
                    argv: vec!["x".repeat(MAX_JOB_SPEC_BYTES)],
                    ..submit(1, MapBy::Node, None)
                },
                "at most 65536 are accepted",
            ),
        ] {
            let out = m.handle(&wired(&[1, 2, 3]), Input::Submit { link: 1, job });
            assert!(
                matches!(&out[..], [Output::Reply { reply: ToolReply::Error { message }, .. }] if message.contains(why)),
                "{why}: {out:?}"
            );
        }
        for _ in 0..MAX_LIVE_JOBS {
            m.handle(
                &wired(&[1]),
                Input::Submit {
                    link: 1,
                    job: submit(1, MapBy::Node, None),
                },
            );
        }
        let out = m.handle(
            &wired(&[1]),
            Input::Submit {
                link: 1,
                job: submit(1, MapBy::Node, None),
            },
        );
        assert!(
            matches!(&out[..], [Output::Reply { reply: ToolReply::Error { message }, .. }] if message.contains("the most the DVM runs at once")),
            "{out:?}"
        );
    }

    #[test]
    fn only_the_submitting_connection_feeds_a_jobs_stdin_and_hears_its_acknowledgements() {
        let mut m = mgr();
        let job = Submit {
            stdin: true,
            ..submit(2, MapBy::Node, None)
        };
        m.handle(&wired(&[1, 2]), Input::Submit { link: 5, job });
        let stdin = |link| Input::Stdin {
            link,
            id: 1,
            data: b"abc".to_vec(),
            eof: false,
        };
        let out = m.handle(&wired(&[1, 2]), stdin(6));
        assert!(
            matches!(&out[..], [Output::Reply { link: 6, reply: ToolReply::Error { message } }] if message.contains("only its submitter")),
            "{out:?}"
        );
        let out = m.handle(&wired(&[1, 2]), stdin(5));
        assert_eq!(
            out,
            vec![Output::Exec(exec::Input::Stdin {
                id: 1,
                data: b"abc".to_vec(),
                eof: false
            })]
        );
        let out = m.handle(
            &wired(&[1, 2]),
            Input::Event(JobEvent::StdinAck { id: 1, bytes: 3 }),
        );
        assert_eq!(
            out,
            vec![Output::Reply {
                link: 5,
                reply: ToolReply::StdinAck { id: 1, bytes: 3 }
            }]
        );
        m.handle(
            &wired(&[1, 2]),
            Input::Submit {
                link: 5,
                job: submit(1, MapBy::Node, None),
            },
        );
        let out = m.handle(
            &wired(&[1, 2]),
            Input::Stdin {
                link: 5,
                id: 2,
                data: vec![],
                eof: true,
            },
        );
        assert!(
            matches!(&out[..], [Output::Reply { reply: ToolReply::Error { message }, .. }] if message.contains("without stdin")),
            "{out:?}"
        );
    }

    #[test]
    fn a_job_goes_through_its_states_and_its_tool_hears_output_and_the_end() {
        let mut m = mgr();
        let out = m.handle(
            &wired(&[1, 2, 3]),
            Input::Submit {
                link: 5,
                job: submit(3, MapBy::Node, None),
            },
        );
        assert!(out.iter().any(|o| matches!(
            o,
            Output::Reply {
                link: 5,
                reply: ToolReply::Submitted { id: 1, .. }
            }
        )));
        assert!(out
            .iter()
            .any(|o| matches!(o, Output::Exec(exec::Input::Submit { id: 1, .. }))));
        let out = m.handle(&wired(&[]), Input::Event(JobEvent::Started { id: 1 }));
        assert!(out.contains(&Output::SetTimer {
            id: 1,
            delay: Duration::from_millis(500)
        }));
        let out = m.handle(
            &wired(&[]),
            Input::Event(JobEvent::Output {
                id: 1,
                proc: 2,
                stream: Stream::Stdout,
                data: b"n03\n".to_vec(),
            }),
        );
        assert!(matches!(
            &out[0],
            Output::Reply {
                link: 5,
                reply: ToolReply::JobOutput { proc: 2, .. }
            }
        ));
        m.handle(
            &wired(&[]),
            Input::Event(JobEvent::Finished { id: 1, status: 256 }),
        );
        let out = m.handle(
            &wired(&[]),
            Input::Event(JobEvent::Released {
                id: 1,
                ranks: IdSet::range(1, 3),
                last: true,
            }),
        );
        assert!(out.contains(&Output::Reply {
            link: 5,
            reply: ToolReply::JobEnded {
                id: 1,
                status: 256,
                exception: None
            }
        }));
        assert!(
            out.iter()
                .any(|o| matches!(o, Output::Persist(s) if s.live.is_empty())),
            "an ended job is no longer live"
        );
        let out = m.handle(&wired(&[]), Input::Jobs { link: 6 });
        assert!(
            matches!(&out[0], Output::Reply { reply: ToolReply::Job(j), .. } if j.state == "INACTIVE")
        );
        assert_eq!(
            out[1],
            Output::Reply {
                link: 6,
                reply: ToolReply::JobsEnd
            }
        );
    }

    #[test]
    fn bad_submissions_are_refused_with_a_reason() {
        let mut m = mgr();
        for (job, joined, why) in [
            (
                submit(0, MapBy::Node, None),
                vec![1],
                "at least one process",
            ),
            (
                submit(1, MapBy::Node, Some(vec!["zz".into()])),
                vec![1],
                "zz is not in the DVM",
            ),
            (
                submit(1, MapBy::Node, Some(vec!["n02".into()])),
                vec![1],
                "n02 has no joined daemon",
            ),
            (submit(1, MapBy::Node, None), vec![], "no joined daemon"),
        ] {
            let out = m.handle(&wired(&joined), Input::Submit { link: 1, job });
            assert!(
                matches!(&out[..], [Output::Reply { reply: ToolReply::Error { message }, .. }] if message.contains(why)),
                "{why}: {out:?}"
            );
        }
    }

    #[test]
    fn a_time_limit_raises_a_fatal_timeout_exception_only_while_the_job_runs() {
        let mut m = mgr();
        m.handle(
            &wired(&[1]),
            Input::Submit {
                link: 5,
                job: submit(1, MapBy::Node, None),
            },
        );
        m.handle(&wired(&[]), Input::Event(JobEvent::Started { id: 1 }));
        let out = m.handle(&wired(&[]), Input::TimeLimit(1));
        assert!(
            matches!(&out[0], Output::Exec(exec::Input::Raise { severity: 0, kind, .. }) if kind == "timeout")
        );
        m.handle(
            &wired(&[]),
            Input::Event(JobEvent::Finished { id: 1, status: 9 }),
        );
        assert!(m.handle(&wired(&[]), Input::TimeLimit(1)).is_empty());
    }

    #[test]
    fn a_job_that_ends_before_its_time_limit_cancels_the_limit_and_one_without_sets_none() {
        for limit in [Some(500), None] {
            let mut m = mgr();
            let mut job = submit(1, MapBy::Node, None);
            job.time_limit_ms = limit;
            m.handle(&wired(&[1]), Input::Submit { link: 5, job });
            let out = m.handle(&wired(&[]), Input::Event(JobEvent::Started { id: 1 }));
            let set = out
                .iter()
                .any(|o| matches!(o, Output::SetTimer { id: 1, .. }));
            assert_eq!(set, limit.is_some(), "{limit:?}: {out:?}");
            m.handle(
                &wired(&[]),
                Input::Event(JobEvent::Finished { id: 1, status: 0 }),
            );
            let out = m.handle(
                &wired(&[]),
                Input::Event(JobEvent::Released {
                    id: 1,
                    ranks: IdSet::range(1, 1),
                    last: true,
                }),
            );
            assert!(out.iter().any(|o| matches!(o, Output::Ended { id: 1, .. })));
            let cancelled = out.contains(&Output::CancelTimer { id: 1 });
            assert_eq!(cancelled, limit.is_some(), "{limit:?}: {out:?}");
        }
    }

    #[test]
    fn a_restarted_manager_recovers_live_jobs_and_numbers_on() {
        let mut m = mgr();
        let out = m.handle(
            &wired(&[1, 2]),
            Input::Submit {
                link: 5,
                job: submit(2, MapBy::Node, None),
            },
        );
        let Some(Output::Persist(live)) = out
            .iter()
            .find(|o| matches!(o, Output::Persist(_)))
            .cloned()
        else {
            panic!("no persist: {out:?}");
        };
        let (mut m2, first) = JobManager::new(live);
        assert!(matches!(&first[0], Output::Exec(exec::Input::Recovered(list)) if list.len() == 1));
        let out = m2.handle(
            &wired(&[1]),
            Input::Submit {
                link: 7,
                job: submit(1, MapBy::Node, None),
            },
        );
        assert!(out.iter().any(|o| matches!(
            o,
            Output::Reply {
                reply: ToolReply::Submitted { id: 2, .. },
                ..
            }
        )));
    }

    /// A fatal exception is written out at once, and a manager restarted from that record
    /// raises it again right after the recovered list (job-exec then repeats it to every
    /// daemon that says hello); a job with none, or only a non-fatal one, gets nothing.
    #[test]
    fn a_fatal_exception_is_kept_and_raised_again_by_a_restarted_manager() {
        let mut m = mgr();
        let r = wired(&[1, 2]);
        for link in [5, 6] {
            m.handle(
                &r,
                Input::Submit {
                    link,
                    job: submit(1, MapBy::Node, None),
                },
            );
        }
        let exception = |id, severity| {
            Input::Event(JobEvent::Exception {
                id,
                severity,
                kind: "node-failure".into(),
                note: "rank 2 lost".into(),
            })
        };
        let out = m.handle(&r, exception(2, 1));
        assert!(
            !out.iter().any(|o| matches!(o, Output::Persist(_))),
            "{out:?}"
        );
        let out = m.handle(&r, exception(1, 0));
        let Some(Output::Persist(saved)) = out
            .iter()
            .find(|o| matches!(o, Output::Persist(_)))
            .cloned()
        else {
            panic!("a fatal exception was not written out: {out:?}");
        };
        assert_eq!(saved.live.len(), 2, "{saved:?}");
        let (_, first) = JobManager::new(saved);
        assert!(matches!(&first[0], Output::Exec(exec::Input::Recovered(l)) if l.len() == 2));
        assert_eq!(
            first[1..],
            [Output::Exec(exec::Input::Raise {
                id: 1,
                severity: 0,
                kind: "node-failure".into(),
                note: "rank 2 lost".into(),
            })]
        );
    }

    /// Found by the soak: a controller restarted with no job live numbered from 1 again,
    /// so two jobs (and their PMIx namespaces) had the same id.
    #[test]
    fn a_restarted_manager_never_reuses_an_id_even_with_no_job_live() {
        let mut m = mgr();
        let r = wired(&[1, 2]);
        m.handle(&r, Input::Fence(HOLD_ALL));
        let out = m.handle(
            &r,
            Input::Submit {
                link: 5,
                job: submit(1, MapBy::Node, None),
            },
        );
        let Some(Output::Persist(saved)) = out
            .iter()
            .find(|o| matches!(o, Output::Persist(_)))
            .cloned()
        else {
            panic!("a held job's id was not written out: {out:?}");
        };
        assert!(saved.live.is_empty(), "a held job is not recovered");
        let (mut m2, _) = JobManager::new(saved);
        let out = m2.handle(
            &r,
            Input::Submit {
                link: 7,
                job: submit(1, MapBy::Node, None),
            },
        );
        assert!(
            out.iter().any(|o| matches!(
                o,
                Output::Reply {
                    reply: ToolReply::Submitted { id: 2, .. },
                    ..
                }
            )),
            "{out:?}"
        );
    }

    fn submitted(out: &[Output]) -> Vec<JobId> {
        out.iter()
            .filter_map(|o| match o {
                Output::Exec(exec::Input::Submit { id, .. }) => Some(*id),
                _ => None,
            })
            .collect()
    }

    const HOLD_ALL: Fence = Fence {
        map_open: false,
        launch_open: false,
    };
    const HOLD_MAP: Fence = Fence {
        map_open: false,
        launch_open: true,
    };

    #[test]
    fn a_job_submitted_during_a_campaign_waits_unmapped_in_state_17_and_launches_when_it_ends() {
        let mut m = mgr();
        let r = wired(&[1, 2, 3]);
        m.handle(&r, Input::Fence(HOLD_MAP));
        let out = m.handle(
            &r,
            Input::Submit {
                link: 5,
                job: submit(2, MapBy::Node, None),
            },
        );
        assert_eq!(
            out,
            vec![
                Output::State {
                    id: 1,
                    state: WAITING_FOR_DAEMONS,
                    code: 17
                },
                Output::Persist(Saved {
                    next_id: 2,
                    live: vec![]
                })
            ],
            "held: no placement, no launch, no answer yet"
        );
        let out = m.handle(&r, Input::Jobs { link: 6 });
        assert!(
            matches!(&out[0], Output::Reply { reply: ToolReply::Job(j), .. } if j.state == WAITING_FOR_DAEMONS && j.placement.nprocs == 0)
        );
        // The grow brought rank 3 in: the held job is mapped onto the DVM as it is now.
        let out = m.handle(&r, Input::Fence(Fence::OPEN));
        assert_eq!(submitted(&out), vec![1]);
        assert!(out.iter().any(|o| matches!(o, Output::Reply { link: 5, reply: ToolReply::Submitted { id: 1, placement } } if placement.ranks() == IdSet::range(1, 2))));
        assert_eq!(m.busy(), IdSet::range(1, 2));
    }

    /// The soak's checker is shown the `lose-held-jobs` defect: this is what it does.
    #[test]
    fn the_lose_held_jobs_defect_drops_a_held_job_without_a_word_when_the_fence_opens() {
        let mut m = mgr();
        m.set_fault(Some(Fault::LoseHeldJobs));
        let r = wired(&[1, 2, 3]);
        m.handle(&r, Input::Fence(HOLD_MAP));
        m.handle(
            &r,
            Input::Submit {
                link: 5,
                job: submit(2, MapBy::Node, None),
            },
        );
        let out = m.handle(&r, Input::Fence(Fence::OPEN));
        assert!(out.is_empty(), "no launch, no answer: {out:?}");
        assert_eq!(m.states().count(), 0, "the job is gone");
    }

    /// The soak's checker is shown the `launch-on-departing` defect: this is what it does.
    #[test]
    fn the_launch_on_departing_defect_places_a_job_on_a_departing_rank() {
        let mut m = mgr();
        m.set_fault(Some(Fault::LaunchOnDeparting));
        let mut r = wired(&[1, 2, 3]);
        r.set(2, State::Departing);
        let out = m.handle(
            &r,
            Input::Submit {
                link: 5,
                job: submit(3, MapBy::Node, None),
            },
        );
        assert!(out.iter().any(|o| matches!(o, Output::Reply { reply: ToolReply::Submitted { placement, .. }, .. } if placement.ranks() == IdSet::range(1, 3))), "{out:?}");
    }

    #[test]
    fn a_mapped_job_held_at_the_launch_boundary_is_remapped_off_a_departed_rank() {
        let mut m = mgr();
        m.set_max_launching(1);
        let mut r = wired(&[1, 2, 3]);
        let out = m.handle(
            &r,
            Input::Submit {
                link: 5,
                job: submit(1, MapBy::Node, Some(vec!["n01".into()])),
            },
        );
        assert_eq!(submitted(&out), vec![1]);
        let out = m.handle(
            &r,
            Input::Submit {
                link: 5,
                job: submit(3, MapBy::Node, None),
            },
        );
        assert!(
            submitted(&out).is_empty(),
            "its turn comes after job 1 started"
        );
        let out = m.handle(&r, Input::Fence(HOLD_ALL));
        assert_eq!(
            out,
            vec![Output::State {
                id: 2,
                state: WAITING_FOR_DAEMONS,
                code: 17
            }]
        );
        let out = m.handle(&r, Input::Event(JobEvent::Started { id: 1 }));
        assert!(
            submitted(&out).is_empty(),
            "a shrink holds the launch boundary"
        );
        r.set(2, State::Departing);
        r.depart(2);
        let out = m.handle(&r, Input::Fence(Fence::OPEN));
        let ranks = out.iter().find_map(|o| match o {
            Output::Exec(exec::Input::Submit { id: 2, ranks, .. }) => Some(ranks.clone()),
            _ => None,
        });
        assert_eq!(
            ranks,
            Some([1, 3].into_iter().collect()),
            "remapped onto survivors: {out:?}"
        );
    }

    #[test]
    fn a_grow_failure_ends_the_unmapped_jobs_and_leaves_those_held_at_launch() {
        let mut m = mgr();
        m.set_max_launching(1);
        let r = wired(&[1, 2]);
        m.handle(
            &r,
            Input::Submit {
                link: 5,
                job: submit(1, MapBy::Node, None),
            },
        );
        m.handle(
            &r,
            Input::Submit {
                link: 5,
                job: submit(1, MapBy::Node, None),
            },
        );
        m.handle(&r, Input::Fence(HOLD_ALL));
        m.handle(
            &r,
            Input::Submit {
                link: 6,
                job: submit(1, MapBy::Node, None),
            },
        );
        let out = m.handle(
            &r,
            Input::AbortParked {
                launch_too: false,
                cause: "grow-failed: x".into(),
            },
        );
        assert_eq!(
            out,
            vec![
                Output::Reply {
                    link: 6,
                    reply: ToolReply::JobEnded {
                        id: 3,
                        status: 256,
                        exception: Some("grow-failed: x".into())
                    }
                },
                Output::Ended {
                    id: 3,
                    status: 256,
                    exception: Some("grow-failed: x".into())
                },
            ]
        );
        let out = m.handle(
            &r,
            Input::AbortParked {
                launch_too: true,
                cause: "dvm-stopped".into(),
            },
        );
        assert!(out.iter().any(|o| matches!(o, Output::Ended { id: 2, .. })));
        assert!(submitted(&out).is_empty());
        let out = m.handle(&r, Input::Fence(Fence::OPEN));
        assert!(submitted(&out).is_empty(), "an ended job never launches");
    }

    #[test]
    fn a_held_job_is_killed_without_anything_to_signal_and_one_whose_hosts_all_left_ends() {
        let mut m = mgr();
        let mut r = wired(&[1, 2]);
        m.handle(&r, Input::Fence(HOLD_MAP));
        m.handle(
            &r,
            Input::Submit {
                link: 5,
                job: submit(1, MapBy::Node, None),
            },
        );
        m.handle(
            &r,
            Input::Submit {
                link: 5,
                job: submit(1, MapBy::Node, Some(vec!["n02".into()])),
            },
        );
        let out = m.handle(
            &r,
            Input::Kill {
                link: 7,
                id: 1,
                signal: 15,
            },
        );
        assert!(out.iter().any(|o| matches!(o, Output::Ended { id: 1, exception: Some(e), .. } if e.starts_with("cancel"))));
        assert!(!out.iter().any(|o| matches!(o, Output::Exec(_))), "{out:?}");
        r.set(2, State::Departing);
        r.depart(2);
        let out = m.handle(&r, Input::Fence(Fence::OPEN));
        assert!(out.iter().any(|o| matches!(o, Output::Ended { id: 2, exception: Some(e), .. } if e.contains("host n02 is not in the DVM"))), "{out:?}");
        assert!(submitted(&out).is_empty());
    }
}
