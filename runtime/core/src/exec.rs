//! The job-exec module of one daemon (Flux RFC 33, mapped onto the DVM): it tracks every job
//! running on itself and below it, passes state updates down the links whose subtrees a job
//! touches, runs the local job shell, and reduces what its subtree reports (start, barrier,
//! finish, release) into one message upward per job and event. Exceptions go up at once. On
//! the controller (rank 0) it also plays the RFC 32 side: it turns the reductions into the
//! job manager's events.
//!
//! Sans-IO: the daemon feeds [`Input`]s and carries out [`Output`]s. Links are the daemon's
//! (numbered by the shell); the subtree behind each child link is given as an idset.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use crate::overlay::LinkId;
use crate::tree::{RadixTree, Rank};
use dvmlab_proto::idset::IdSet;
use dvmlab_proto::limits::MAX_EXCEPTION_TEXT;
use dvmlab_proto::wire::Stream;

use dvmlab_proto::exec::{barrier_count, barrier_key, barrier_number};
pub use dvmlab_proto::exec::{
    Counters, ExecDown, ExecUp, JobId, JobSpec, JobTuple, Jobs, UpdateType, ANSWER_MARKED,
};

/// How many terminated strays a daemon remembers (see `JobExec::strays`).
const STRAYS_KEPT: usize = 1024;

/// The userid of the `remove` a daemon sends for job data it dropped as stale: job data
/// carries no userid, and a `remove` is acted on whoever's job it is.
const STALE_USERID: u32 = 0;

/// Output bytes a daemon holds while its new parent has not yet answered its hello; more is
/// dropped (and counted in the log).
const HELD_OUTPUT: usize = 1 << 20;
/// At most this many fatal exceptions of jobs not held here wait for a new parent (one per
/// job, each cut to [`MAX_EXCEPTION_TEXT`], apart from [`HELD_OUTPUT`]).
const HELD_FATAL: usize = 1024;

/// Whether barrier names `a` and `b` are one barrier: the same key, or, where either is a
/// bare number from a daemon older than the keys (count 0), the same number.
fn same_barrier(a: u64, b: u64) -> bool {
    a == b
        || ((barrier_count(a) == 0 || barrier_count(b) == 0)
            && barrier_number(a) == barrier_number(b))
}

/// An exception's type or note as job-exec keeps and passes it on: at most
/// [`MAX_EXCEPTION_TEXT`] bytes, cut at a character with `…` after it.
pub(crate) fn cut(mut text: String) -> String {
    if text.len() > MAX_EXCEPTION_TEXT {
        let mut end = MAX_EXCEPTION_TEXT - '…'.len_utf8();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// What the controller's job manager hears (RFC 32 `start` responses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEvent {
    /// Every shell started.
    Started { id: JobId },
    /// Every shell exited; the greatest wait status.
    Finished { id: JobId, status: i32 },
    Exception {
        id: JobId,
        severity: u32,
        kind: String,
        note: String,
    },
    /// These ranks may be released; `last` once the whole job is.
    Released { id: JobId, ranks: IdSet, last: bool },
    Output {
        id: JobId,
        proc: u32,
        stream: Stream,
        data: Vec<u8>,
    },
    /// Process 0 took this many bytes of its stdin in all.
    StdinAck { id: JobId, bytes: u64 },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// The daemon's child links: each one's child rank and the ranks reachable behind it
    /// (the child included).
    Children(Vec<(LinkId, Rank, IdSet)>),
    /// A new upward link (or none): the hello starts over. `version` is the protocol
    /// version spoken on it (whether the parent marks its answer).
    Uplink {
        link: Option<LinkId>,
        version: u32,
    },
    Down(ExecDown),
    Up {
        link: LinkId,
        req: ExecUp,
    },
    /// Controller: the job manager asks to run a job on `ranks`.
    Submit {
        id: JobId,
        userid: u32,
        ranks: IdSet,
        spec: JobSpec,
    },
    /// Controller: the job manager knows these jobs to be running (after a restart), so the
    /// hello may begin; everything else it starts later.
    Recovered(Vec<(JobId, u32, IdSet, JobSpec)>),
    /// Controller: an exception raised by a tool or the job manager (time limit, kill).
    Raise {
        id: JobId,
        severity: u32,
        kind: String,
        note: String,
    },
    /// Controller: deliver `signal` to every shell of the job.
    Signal {
        id: JobId,
        signal: i32,
    },
    /// Controller: the next bytes of process 0's stdin, from the tool.
    Stdin {
        id: JobId,
        data: Vec<u8>,
        eof: bool,
    },
    /// The local process 0 took this many bytes of its stdin in all.
    ShellStdinAck {
        id: JobId,
        bytes: u64,
    },
    /// The local shell of `id` is running.
    ShellStarted {
        id: JobId,
    },
    ShellBarrier {
        id: JobId,
        seq: u64,
    },
    /// The local shell exited with this wait status.
    ShellExited {
        id: JobId,
        status: i32,
    },
    /// One local process of `id` exited with this wait status. For PMIx events (the daemon
    /// core hands it to its event hub); job-exec itself goes by `ShellExited`.
    ProcExited {
        id: JobId,
        proc: u32,
        status: i32,
    },
    /// The local epilog finished: this rank's resources may go.
    EpilogDone {
        id: JobId,
    },
    /// Something failed locally (launch, prolog): raise a job exception.
    LocalFailure {
        id: JobId,
        note: String,
    },
    /// Bytes from local process `proc`.
    ShellOutput {
        id: JobId,
        proc: u32,
        stream: Stream,
        data: Vec<u8>,
    },
    /// Controller: these ranks became unreachable. Their shells are counted dead (finished
    /// by SIGKILL, released) and every job on them gets a fatal `node-failure` exception.
    Lost(IdSet),
    /// The hold on job `id`'s start report ran out (see [`JobExec::set_start_hold`]).
    StartDue {
        id: JobId,
    },
}

/// What the job shells of this daemon are to do; the daemon core passes these on to the
/// shell as they are.
#[derive(Debug, Clone, PartialEq)]
pub enum ShellCommand {
    /// Run the prolog, then start the job's local processes.
    Launch { id: JobId, spec: JobSpec },
    /// Signal the job's local processes (SIGKILL for a fatal exception).
    Kill { id: JobId, signal: i32 },
    /// Let the local processes leave barrier `seq`.
    BarrierDone { id: JobId, seq: u64 },
    /// Run the local epilog (after the processes exited).
    Epilog { id: JobId },
    /// Write these bytes to the local process 0's stdin (then close it, with `eof`).
    Stdin { id: JobId, data: Vec<u8>, eof: bool },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    SendDown {
        link: LinkId,
        msg: ExecDown,
    },
    SendUp(ExecUp),
    Shell(ShellCommand),
    /// Controller only.
    Event(JobEvent),
    /// Something worth an error line in the log.
    Log(String),
    /// Hand back [`Input::StartDue`] for job `id` after `delay`.
    HoldStart {
        id: JobId,
        delay: Duration,
    },
    /// Job `id`'s start went up (or the job went) before its hold ran out: its
    /// [`Output::HoldStart`] is not needed any more.
    ReleaseHold {
        id: JobId,
    },
}

/// The local shell's lifecycle on this rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shell {
    Launching,
    Running,
    Exited,
    Released,
}

/// One job as this module sees it: itself and its subtree.
#[derive(Debug, Clone)]
struct Job {
    userid: u32,
    ranks: IdSet,
    spec: Option<JobSpec>,
    shell: Option<Shell>,
    started: IdSet,
    finished: IdSet,
    status: i32,
    released: IdSet,
    /// Barrier sequence being gathered and who entered it. Below the controller it is kept
    /// after it went up, until its end comes down: a controller that died with it, or a
    /// parent lost on its way, would otherwise leave every process of the job waiting in
    /// it for good. It goes up again to a new parent.
    barrier: Option<(u64, IdSet)>,
    /// The ranks the barrier being gathered went up for (reset when the upward link changes).
    sent_barrier: IdSet,
    /// The greatest barrier key whose end passed here (see [`barrier_key`]).
    barrier_done: u64,
    /// The greatest barrier key a child said passed it (`ExecUp::Passed`): ended, as
    /// `barrier_done`, and told to every new parent with it.
    passed_below: u64,
    /// The local processes: how many barriers they left, and the number of the one they
    /// wait in, as they wrote it (its end is answered with it).
    passed: u64,
    shell_seq: u64,
    /// The first fatal exception this daemon sent up for the job (raised here or passed on
    /// from below), sent again to each new parent; `fatal_up_sent`: to this one.
    fatal_up: Option<ExecUp>,
    fatal_up_sent: bool,
    /// The local shell was sent SIGKILL for the job's fatal exception while it ran (a kill
    /// while it launches may find no process yet: its start then brings another).
    killed: bool,
    /// What was already sent up (reset when the upward link changes).
    sent_start: IdSet,
    sent_finish: IdSet,
    sent_release: IdSet,
    /// Controller: partial releases already given to the job manager.
    reported_release: IdSet,
    /// The fatal exception that went down for this job, repeated to a child that says hello
    /// later (a restarted controller raises one before its children reconnect).
    fatal: Option<ExecDown>,
    /// The child links its add, a check or a hello answer naming it went down. Its
    /// exceptions and its remove from above follow them as well as the job's ranks: a rank
    /// dropped below a child (frozen, found silent) takes the job out of that child's
    /// subtree, yet the daemons on the old path hold it, and would otherwise hold it forever
    /// and tell the rank, if it came back below them, that the job still runs.
    down: BTreeSet<LinkId>,
    /// The subtree's start may go up on its own: the hold ran out, or there was none.
    start_due: bool,
    /// An [`Output::HoldStart`] for this job is outstanding.
    hold_timer: bool,
}

/// See the module documentation.
#[derive(Debug)]
pub struct JobExec {
    me: Rank,
    controller: bool,
    /// The tree formula: a child speaks only for its descendants by it.
    tree: RadixTree,
    children: Vec<(LinkId, IdSet)>,
    /// This rank and every child's subtree: asked at every report, changed only with the
    /// children, so kept rather than merged again from every child each time.
    subtree: IdSet,
    /// The child rank on each child link.
    child_ranks: BTreeMap<LinkId, Rank>,
    up: Option<LinkId>,
    /// The parent marks the state-update that answers our hello; an older one does not,
    /// and its first state-update is taken for the answer.
    up_marks_answer: bool,
    /// The initial hello response came from upstream (or, on the controller, the job
    /// manager said which jobs run).
    ready: bool,
    /// Children that said hello before we were ready.
    waiting: BTreeSet<LinkId>,
    /// Children whose hello was answered: they hear of jobs that reach their subtree later.
    answered: BTreeSet<LinkId>,
    /// Jobs terminated here as unknown upstream (the most recent [`STRAYS_KEPT`]). A new
    /// parent may learn of such a job after it answered our hello: its later `add` must not
    /// start the job a second time.
    strays: VecDeque<JobId>,
    /// Output waiting for the hello to be answered, its bytes, and the bytes dropped.
    held: VecDeque<ExecUp>,
    held_bytes: usize,
    dropped_bytes: usize,
    jobs: BTreeMap<JobId, Job>,
    infos: BTreeMap<JobId, JobSpec>,
    /// The child links a job's data went down (live ones only, as `Job::down`): its
    /// exceptions and its remove follow them too. A child that got the data and, the
    /// subtrees having changed in between, not the add would otherwise keep the data
    /// forever.
    info_down: BTreeMap<JobId, BTreeSet<LinkId>>,
    /// Data of jobs not added here that came before the upward link last changed: the
    /// hello's answer from a parent of version 5 keeps what it names or the parent sends
    /// again, and drops the rest (jobs that ended while this daemon was cut off, whose
    /// remove it never got). Under an older parent it is kept.
    stale_data: BTreeSet<JobId>,
    /// Removes for the children whose hello waits for this daemon's own answer, by the
    /// child's link (of jobs it terminated as strays, and those its own answer carried): they
    /// go first in that child's answer. The child then ends the job along its own links
    /// (`Job::down`) instead of calling it a stray of its own, and a child under a parent of
    /// version 4, which takes the first state-update it gets for its answer, is not handed
    /// a lone remove for one.
    answer_removes: BTreeMap<LinkId, Vec<JobTuple>>,
    /// Set while this daemon applies its own answer: its checks and removes skip the
    /// children whose hello waits, since their answer, sent right after, repeats every check
    /// and carries the removes (a lone one-job update would be their answer under a parent
    /// of version 4). An add in it (only under a parent of version 4) still goes alone.
    answering: bool,
    /// How long a daemon below the controller may hold a job's start report back, waiting
    /// for its finish to send both in one message (zero: not at all).
    start_hold: Duration,
    pub counters: Counters,
    out: Vec<Output>,
}

impl JobExec {
    pub fn new(me: Rank, controller: bool, tree: RadixTree) -> JobExec {
        JobExec {
            me,
            controller,
            tree,
            children: Vec::new(),
            subtree: IdSet::range(me, me),
            child_ranks: BTreeMap::new(),
            up: None,
            up_marks_answer: true,
            ready: false,
            waiting: BTreeSet::new(),
            answered: BTreeSet::new(),
            strays: VecDeque::new(),
            held: VecDeque::new(),
            held_bytes: 0,
            dropped_bytes: 0,
            jobs: BTreeMap::new(),
            infos: BTreeMap::new(),
            info_down: BTreeMap::new(),
            stale_data: BTreeSet::new(),
            answer_removes: BTreeMap::new(),
            answering: false,
            start_hold: Duration::ZERO,
            counters: Counters::default(),
            out: Vec::new(),
        }
    }

    /// From now on, a daemon below the controller holds each new job's start report for up
    /// to `hold` after the job reached it, unless something else of the job goes up first
    /// (its finish, a barrier, output, an exception): a job whose processes end within
    /// `hold` then reports start and finish upward in one message rather than two, on every
    /// link of the tree, and its `RUN` state is seen at most `hold` late.
    pub fn set_start_hold(&mut self, hold: Duration) {
        if !self.controller {
            self.start_hold = hold;
        }
    }

    /// Jobs this module tracks, with their ranks.
    pub fn jobs(&self) -> impl Iterator<Item = (JobId, &IdSet)> {
        self.jobs.iter().map(|(id, j)| (*id, &j.ranks))
    }

    /// Which of `links` a job's data, add, check or hello answer went down, the job not
    /// having ended here since, or whose hello is not answered yet (its jobs are not known
    /// here yet): someone below them may run a job (its events go there). One pass over
    /// the jobs, however many links are asked about.
    pub fn reaching(&self, links: &[LinkId]) -> BTreeSet<LinkId> {
        let mut found: BTreeSet<LinkId> = links
            .iter()
            .copied()
            .filter(|l| !self.answered.contains(l))
            .collect();
        let downs = self
            .jobs
            .values()
            .map(|j| &j.down)
            .chain(self.info_down.values());
        for down in downs {
            found.extend(links.iter().filter(|l| down.contains(l)));
            if found.len() == links.len() {
                break;
            }
        }
        found
    }

    /// Jobs whose data this daemon holds, added here or not.
    pub fn job_data(&self) -> impl Iterator<Item = JobId> + '_ {
        self.infos.keys().copied()
    }

    pub fn handle(&mut self, input: Input) -> Vec<Output> {
        match input {
            Input::Children(c) => self.on_children(c),
            Input::Uplink { link, version } => self.on_uplink(link, version),
            Input::Down(msg) => self.on_down(msg),
            Input::Up { link, req } => self.on_up(link, req),
            Input::Submit {
                id,
                userid,
                ranks,
                spec,
            } => {
                if self.controller {
                    self.ready = true;
                    self.on_down(ExecDown::JobInfo {
                        idset: ranks.clone(),
                        id,
                        spec,
                    });
                    self.on_down(ExecDown::StateUpdate {
                        idset: ranks.clone(),
                        data: Jobs {
                            jobs: vec![JobTuple(id, userid, UpdateType::Add, ranks)],
                        },
                        answer: false,
                    });
                }
            }
            Input::Recovered(list) => self.on_recovered(list),
            Input::Raise {
                id,
                severity,
                kind,
                note,
            } => self.on_exception(id, severity, kind, note),
            Input::Signal { id, signal } => {
                if let Some(j) = self.jobs.get(&id) {
                    let idset = j.ranks.clone();
                    self.on_down(ExecDown::Signal { idset, id, signal });
                }
            }
            Input::Stdin { id, data, eof } => {
                let rank = self
                    .infos
                    .get(&id)
                    .filter(|s| s.stdin && s.placement.nprocs > 0)
                    .map(|s| s.placement.rank_of(0));
                match rank {
                    Some(r) if self.controller => self.on_down(ExecDown::Stdin {
                        idset: IdSet::range(r, r),
                        id,
                        data,
                        eof,
                    }),
                    _ => self.emit(Output::Log(format!(
                        "stdin for job {id}, which takes none here; dropped"
                    ))),
                }
            }
            Input::ShellStdinAck { id, bytes } => self.stdin_ack_up(id, bytes),
            Input::ShellStarted { id } => {
                self.local(id, |j, me| {
                    j.shell = Some(Shell::Running);
                    j.started.insert(me);
                });
                self.kill_fatal(id);
            }
            Input::ShellBarrier { id, seq } => self.local(id, |j, me| {
                j.shell_seq = seq;
                let key = barrier_key(j.passed + 1, seq);
                j.enter(key, &IdSet::range(me, me))
            }),
            Input::ProcExited { .. } => {}
            Input::ShellExited { id, status } => {
                self.local(id, |j, me| {
                    j.shell = Some(Shell::Exited);
                    j.finished.insert(me);
                    j.status = j.status.max(status);
                });
                if self.jobs.contains_key(&id) {
                    self.emit(Output::Shell(ShellCommand::Epilog { id }));
                }
            }
            Input::EpilogDone { id } => self.local(id, |j, me| {
                j.shell = Some(Shell::Released);
                j.released.insert(me);
            }),
            Input::LocalFailure { id, note } => self.raise_up(id, 0, "exec".into(), note),
            Input::ShellOutput {
                id,
                proc,
                stream,
                data,
            } => self.output_up(id, proc, stream, data),
            Input::Lost(ranks) => self.on_lost(ranks),
            Input::StartDue { id } => {
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.hold_timer = false;
                }
                self.start_now(id);
            }
        }
        std::mem::take(&mut self.out)
    }

    fn emit(&mut self, o: Output) {
        self.out.push(o);
    }

    /// The ranks of this module and everything below it.
    fn subtree_of(me: Rank, children: &[(LinkId, IdSet)]) -> IdSet {
        children
            .iter()
            .fold(IdSet::range(me, me), |s, (_, ids)| s.union(ids))
    }

    /// Sends `msg` to every child whose subtree intersects `idset`; the links it went to.
    fn fan_out(&mut self, idset: &IdSet, msg: &ExecDown) -> Vec<LinkId> {
        let targets = self.targets(idset);
        self.send_down(&targets, msg);
        targets
    }

    /// The children whose subtrees intersect `idset`.
    fn targets(&self, idset: &IdSet) -> Vec<LinkId> {
        self.children
            .iter()
            .filter(|(_, ids)| ids.intersects(idset))
            .map(|(l, _)| *l)
            .collect()
    }

    fn send_down(&mut self, links: &[LinkId], msg: &ExecDown) {
        for &link in links {
            self.emit(Output::SendDown {
                link,
                msg: msg.clone(),
            });
        }
    }

    /// Sends job `id`'s `msg` to every child whose subtree intersects `idset` and along
    /// every link the job (or only its data) went down (see `Job::down` and `info_down`,
    /// which hold only live child links).
    fn fan_out_job(&mut self, id: JobId, idset: &IdSet, msg: &ExecDown) {
        let targets = self.job_targets(id, idset);
        self.send_down(&targets, msg);
    }

    /// The links job `id`'s end goes down (see [`JobExec::fan_out_job`]).
    fn job_targets(&self, id: JobId, idset: &IdSet) -> Vec<LinkId> {
        let mut targets: BTreeSet<LinkId> = self.targets(idset).into_iter().collect();
        if let Some(j) = self.jobs.get(&id) {
            targets.extend(&j.down);
        }
        targets.extend(self.info_down.get(&id).into_iter().flatten());
        targets.into_iter().collect()
    }

    /// Of `links`, those whose child's hello waits for this daemon's answer get `remove` in
    /// their own answer (`answer_removes`); the others are returned, to be sent it now.
    fn hold_for_waiting(&mut self, links: Vec<LinkId>, remove: &JobTuple) -> Vec<LinkId> {
        let (waiting, now): (Vec<LinkId>, Vec<LinkId>) =
            links.into_iter().partition(|l| self.waiting.contains(l));
        for link in waiting {
            self.answer_removes
                .entry(link)
                .or_default()
                .push(remove.clone());
        }
        now
    }

    /// Job `id`'s data went down `links`: its end is to follow them (see `info_down`).
    fn went_down(&mut self, id: JobId, links: Vec<LinkId>) {
        if !links.is_empty() {
            self.info_down.entry(id).or_default().extend(links);
        }
    }

    fn on_uplink(&mut self, link: Option<LinkId>, version: u32) {
        self.up = link;
        self.up_marks_answer = version >= ANSWER_MARKED;
        if self.controller {
            return;
        }
        // A new parent knows nothing of what we sent the old one.
        self.ready = false;
        self.stale_data = self
            .infos
            .keys()
            .filter(|id| !self.jobs.contains_key(id))
            .copied()
            .collect();
        for j in self.jobs.values_mut() {
            j.sent_start = IdSet::new();
            j.sent_finish = IdSet::new();
            j.sent_release = IdSet::new();
            j.sent_barrier = IdSet::new();
            j.fatal_up_sent = false;
        }
        if link.is_some() {
            self.emit(Output::SendUp(ExecUp::Hello));
        }
    }

    fn on_recovered(&mut self, list: Vec<(JobId, u32, IdSet, JobSpec)>) {
        let mut ids = Vec::new();
        for (id, userid, ranks, spec) in list {
            self.infos.insert(id, spec.clone());
            self.jobs
                .entry(id)
                .or_insert_with(|| Job::new(userid, ranks, Some(spec)));
            ids.push(id);
        }
        // A controller that is also a compute node lost its own shells with its earlier life.
        for id in ids {
            self.lost_if_absent(id);
            self.progress(id);
        }
        self.become_ready();
    }

    /// A job that should have a shell here has none (it died with an earlier life of this
    /// daemon): raise an exception, and count the shell ended, killed, so the job can end.
    fn lost_if_absent(&mut self, id: JobId) {
        let me = self.me;
        self.absent(id, format!("job {id} is not running on rank {me}"));
    }

    /// Job `id` has no shell here and will have none (`note` says why): raises a fatal
    /// exception and counts the shell ended, killed, so the job can end. Nothing if the job
    /// does not run here or has a shell.
    fn absent(&mut self, id: JobId, note: String) {
        let me = self.me;
        let absent = self
            .jobs
            .get(&id)
            .is_some_and(|j| j.ranks.contains(me) && j.shell.is_none());
        if !absent {
            return;
        }
        self.raise_up(id, 0, "exec".into(), note);
        if let Some(j) = self.jobs.get_mut(&id) {
            j.shell = Some(Shell::Released);
            j.started.insert(me);
            j.finished.insert(me);
            j.released.insert(me);
            j.status = j.status.max(9);
        }
    }

    /// The first hello response arrived (or the controller's job manager spoke): children
    /// that asked may now get theirs.
    fn become_ready(&mut self) {
        self.ready = true;
        for link in std::mem::take(&mut self.waiting) {
            self.answer_hello(link);
        }
        // Nothing went up before the new parent knew the jobs: now it does, in the order it
        // happened here: each job's start, the output held meanwhile, then what completed
        // (a finish ahead of its job's output would end the job before the output arrived).
        let ids: Vec<JobId> = self.jobs.keys().copied().collect();
        for &id in &ids {
            self.report(id, true);
        }
        if self.dropped_bytes > 0 {
            self.emit(Output::Log(format!(
                "{} bytes of job output dropped while reconnecting (at most {HELD_OUTPUT} are held)",
                self.dropped_bytes
            )));
            self.dropped_bytes = 0;
        }
        self.held_bytes = 0;
        for req in std::mem::take(&mut self.held) {
            self.emit(Output::SendUp(req));
        }
        for &id in &ids {
            self.send_fatal_up(id);
        }
        // What passed here goes first: a parent that never saw an end (restarted, or new on
        // the job's path) lets go the ranks it gathers in that barrier, and answers a report
        // of it with its end.
        if !self.controller {
            for (&id, j) in &self.jobs {
                let seq = j.barrier_done.max(j.passed_below);
                if barrier_count(seq) > 0 {
                    self.out.push(Output::SendUp(ExecUp::Passed { id, seq }));
                }
            }
        }
        for id in ids {
            self.progress(id);
        }
    }

    /// The initial `state-update` for a child: a `check` for every job running there.
    fn answer_hello(&mut self, link: LinkId) {
        let Some(mut ids) = self
            .children
            .iter()
            .find(|(l, _)| *l == link)
            .map(|(_, ids)| ids.clone())
        else {
            return;
        };
        // A job's ranks that no link reaches now, that lie below the child by the tree
        // formula and that were not given up (released) are on their way to it (they
        // re-home past a departed daemon, and the child itself re-linked first): it holds
        // their jobs and must keep them.
        if let Some(&child) = self.child_ranks.get(&link) {
            for j in self.jobs.values() {
                let on_the_way = j.ranks.difference(&self.subtree).difference(&j.released);
                for r in on_the_way.iter() {
                    if self.tree.is_ancestor_or_self(child, r) {
                        ids.insert(r);
                    }
                }
            }
        }
        self.answered.insert(link);
        self.tell_child(link, &ids, true);
    }

    /// The child links changed. A child whose subtree grew after its hello was answered (a
    /// daemon rejoined below it) is told of the jobs that reach the ranks it gained: nobody
    /// else will tell them, and its parent would wait for them forever.
    fn on_children(&mut self, children: Vec<(LinkId, Rank, IdSet)>) {
        self.child_ranks = children.iter().map(|(l, r, _)| (*l, *r)).collect();
        let children = children.into_iter().map(|(l, _, ids)| (l, ids)).collect();
        let before = std::mem::replace(&mut self.children, children);
        self.subtree = JobExec::subtree_of(self.me, &self.children);
        let links: BTreeSet<LinkId> = self.children.iter().map(|(l, _)| *l).collect();
        self.answered.retain(|l| links.contains(l));
        self.waiting.retain(|l| links.contains(l));
        self.answer_removes.retain(|l, _| links.contains(l));
        for j in self.jobs.values_mut() {
            j.down.retain(|l| links.contains(l));
        }
        for down in self.info_down.values_mut() {
            down.retain(|l| links.contains(l));
        }
        self.info_down.retain(|_, down| !down.is_empty());
        let grown: Vec<(LinkId, IdSet)> = self
            .children
            .iter()
            .filter(|(l, _)| self.answered.contains(l))
            .map(|(l, ids)| {
                let old = before.iter().find(|(b, _)| b == l).map(|(_, i)| i);
                (*l, old.map_or(ids.clone(), |o| ids.difference(o)))
            })
            .filter(|(_, added)| !added.is_empty())
            .collect();
        for (link, added) in grown {
            self.tell_child(link, &added, false);
        }
        // A subtree that shrank (a daemon below left it) may have completed what was still
        // waiting for the ranks that left: those report through their new parent.
        let ids: Vec<JobId> = self.jobs.keys().copied().collect();
        for id in ids {
            self.progress(id);
        }
    }

    /// Sends `link` the data, a `check` and any fatal exception of every job that reaches
    /// `ids`; as the hello response (`always`) even when there is none.
    fn tell_child(&mut self, link: LinkId, ids: &IdSet, always: bool) {
        let reach: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.ranks.intersects(ids))
            .map(|(id, _)| *id)
            .collect();
        // Jobs whose data came and whose add has not: a child that joins in between must get
        // the data now, or the add that follows reaches it without any.
        let pending: Vec<(JobId, IdSet, JobSpec)> = self
            .infos
            .iter()
            .filter(|(id, _)| !self.jobs.contains_key(id))
            .map(|(id, spec)| (*id, spec.placement.ranks(), spec.clone()))
            .filter(|(_, ranks, _)| ranks.intersects(ids))
            .collect();
        if reach.is_empty() && pending.is_empty() && !always {
            return;
        }
        for (id, idset, spec) in pending {
            self.went_down(id, vec![link]);
            self.emit(Output::SendDown {
                link,
                msg: ExecDown::JobInfo { idset, id, spec },
            });
        }
        // Job data first, so a restarted child can still run what it is later told to add.
        let mut jobs = if always {
            self.answer_removes.remove(&link).unwrap_or_default()
        } else {
            Vec::new()
        };
        let mut fatal = Vec::new();
        for id in reach {
            let Some(j) = self.jobs.get_mut(&id) else {
                continue;
            };
            j.down.insert(link);
            let j = &*j;
            jobs.push(JobTuple(id, j.userid, UpdateType::Check, j.ranks.clone()));
            fatal.extend(j.fatal.clone());
            if let Some(spec) = j.spec.clone() {
                let idset = j.ranks.clone();
                self.emit(Output::SendDown {
                    link,
                    msg: ExecDown::JobInfo { idset, id, spec },
                });
            }
        }
        self.emit(Output::SendDown {
            link,
            msg: ExecDown::StateUpdate {
                idset: ids.clone(),
                data: Jobs { jobs },
                answer: always,
            },
        });
        for msg in fatal {
            self.emit(Output::SendDown { link, msg });
        }
    }

    fn on_down(&mut self, msg: ExecDown) {
        match msg {
            // Each tuple carries its own idset; the response's says only who it is for.
            ExecDown::StateUpdate {
                idset: _,
                data: Jobs { jobs },
                answer,
            } => {
                // What comes before the answer (an add that passed the parent while our
                // hello travelled, a check it passed on from its own answer) is applied as
                // it comes: taken for the answer, it would make strays of every job it
                // does not name.
                let initial = !self.ready && (answer || !self.up_marks_answer);
                let removes = if initial {
                    self.initial_check(&jobs)
                } else {
                    Vec::new()
                };
                self.answering = initial;
                for t in jobs {
                    self.apply(t);
                }
                self.answering = false;
                if initial {
                    self.become_ready();
                }
                // After the answers to the children that waited for this one: a child of
                // version 4 takes the first state-update it gets for its answer.
                for (links, remove) in removes {
                    self.send_down(&links, &remove);
                }
            }
            ExecDown::JobInfo { idset, id, spec } => {
                let m = ExecDown::JobInfo {
                    idset: idset.clone(),
                    id,
                    spec: spec.clone(),
                };
                let down = self.fan_out(&idset, &m);
                self.went_down(id, down);
                self.infos.insert(id, spec);
                self.stale_data.remove(&id);
            }
            ExecDown::BarrierDone { idset, id, seq } => {
                // The barrier ended for every rank of the job: those gathered here in it are
                // released too, whoever the end was sent again for (see `ExecUp::Barrier`).
                // It goes on by its key where either side knows it; a bare number that
                // matches nothing here goes on bare (the children match it by number).
                let gathered = self
                    .jobs
                    .get(&id)
                    .and_then(|j| j.barrier.as_ref())
                    .filter(|(s, _)| same_barrier(*s, seq))
                    .cloned();
                let seq = gathered.as_ref().map_or(seq, |(s, _)| (*s).max(seq));
                let idset = gathered.map_or(idset.clone(), |(_, g)| idset.union(&g));
                let m = ExecDown::BarrierDone {
                    idset: idset.clone(),
                    id,
                    seq,
                };
                self.fan_out(&idset, &m);
                let me = self.me;
                let Some(j) = self.jobs.get_mut(&id) else {
                    return;
                };
                if barrier_count(seq) > 0 {
                    j.barrier_done = j.barrier_done.max(seq);
                }
                // Only the end of the barrier the local processes wait in, once: the shell
                // answers every local process, so any other end would release the wrong one.
                let Some((_, entered)) = j.barrier.take_if(|(s, _)| same_barrier(*s, seq)) else {
                    return;
                };
                j.sent_barrier = IdSet::new();
                if entered.contains(me) {
                    j.passed += 1;
                    let seq = j.shell_seq;
                    self.emit(Output::Shell(ShellCommand::BarrierDone { id, seq }));
                }
            }
            ExecDown::Exception {
                idset,
                id,
                severity,
                kind,
                note,
            } => {
                let mut m = ExecDown::Exception {
                    idset: idset.clone(),
                    id,
                    severity,
                    kind: cut(kind),
                    note: cut(note),
                };
                self.fan_out_job(id, &idset, &m);
                if severity == 0 {
                    // Kept for every rank of the job, whichever it named: a repeat (to a
                    // shell that started late, see `ExecUp::Start`) names a few only.
                    if let Some(j) = self.jobs.get_mut(&id) {
                        if j.fatal.is_none() {
                            if let ExecDown::Exception { idset, .. } = &mut m {
                                *idset = j.ranks.clone();
                            }
                            j.fatal = Some(m);
                        }
                    }
                    self.kill_fatal(id);
                }
            }
            ExecDown::Signal { idset, id, signal } => {
                let m = ExecDown::Signal {
                    idset: idset.clone(),
                    id,
                    signal,
                };
                self.fan_out(&idset, &m);
                if idset.contains(self.me) {
                    self.kill_local(id, signal);
                }
            }
            ExecDown::Stdin {
                idset,
                id,
                data,
                eof,
            } => {
                if idset.contains(self.me) {
                    if self.jobs.contains_key(&id) {
                        self.emit(Output::Shell(ShellCommand::Stdin { id, data, eof }));
                    }
                } else {
                    let m = ExecDown::Stdin {
                        idset: idset.clone(),
                        id,
                        data,
                        eof,
                    };
                    self.fan_out(&idset, &m);
                }
            }
        }
    }

    /// The job has had a fatal exception: its local shell gets SIGKILL, once it runs (and
    /// while it launches, which may find no process yet), and once only: the exception
    /// comes again with every hello answer.
    fn kill_fatal(&mut self, id: JobId) {
        let me = self.me;
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        if j.fatal.is_none() || !j.ranks.contains(me) || j.killed {
            return;
        }
        match j.shell {
            Some(Shell::Running) => j.killed = true,
            Some(Shell::Launching) => {}
            _ => return,
        }
        self.emit(Output::Shell(ShellCommand::Kill { id, signal: 9 }));
    }

    fn kill_local(&mut self, id: JobId, signal: i32) {
        let running = self
            .jobs
            .get(&id)
            .is_some_and(|j| matches!(j.shell, Some(Shell::Launching | Shell::Running)));
        if running {
            self.emit(Output::Shell(ShellCommand::Kill { id, signal }));
        }
    }

    /// Before the first check list is applied: local jobs it does not name are strays, and
    /// data from before the new parent that it neither names nor sent again is dropped. The
    /// daemons below that got such data from here are to get the job's remove: returned,
    /// with the links, for the caller to send once the children waiting are answered.
    fn initial_check(&mut self, jobs: &[JobTuple]) -> Vec<(Vec<LinkId>, ExecDown)> {
        let named: BTreeSet<JobId> = jobs.iter().map(|t| t.0).collect();
        let strays: Vec<JobId> = self
            .jobs
            .keys()
            .copied()
            .filter(|id| !named.contains(id))
            .collect();
        for id in strays {
            self.stray(id);
        }
        // Only a parent of version 5 sends data again before its answer (an older one may
        // not at all), and only its answer is surely the answer, not another job's add.
        let stale = std::mem::take(&mut self.stale_data);
        let mut removes = Vec::new();
        if !self.up_marks_answer {
            return removes;
        }
        for id in stale {
            if named.contains(&id) || self.jobs.contains_key(&id) {
                continue;
            }
            let Some(spec) = self.infos.remove(&id) else {
                continue;
            };
            // The children this daemon passed the data to stayed below it and hear of the
            // job from nobody else: its end goes to them as the job's remove would have.
            let links: Vec<LinkId> = self.info_down.remove(&id).into_iter().flatten().collect();
            if !links.is_empty() {
                let ranks = spec.placement.ranks();
                let remove = JobTuple(id, STALE_USERID, UpdateType::Remove, ranks.clone());
                let m = ExecDown::StateUpdate {
                    idset: ranks,
                    data: Jobs { jobs: vec![remove] },
                    answer: false,
                };
                removes.push((links, m));
            }
        }
        removes
    }

    fn stray(&mut self, id: JobId) {
        self.emit(Output::Log(format!(
            "job {id} runs here but upstream does not know it: terminating it"
        )));
        self.emit(Output::Shell(ShellCommand::Kill { id, signal: 9 }));
        if self.strays.len() == STRAYS_KEPT {
            self.strays.pop_front();
        }
        self.strays.push_back(id);
        // The subtree below forgets it too, or it would hold the job forever: nobody above
        // will ever send its remove. From here only by the job's ranks, not along the links
        // it went down (the daemons below follow their own, as for any end from above): a
        // new parent's answer may be older than what a child below knows (a rank that
        // re-homed to it since), and a job only this daemon's view calls a stray must not
        // be killed there. A child whose hello waits gets the remove in its answer.
        if let Some(j) = self.forget(id) {
            let kill = ExecDown::Exception {
                idset: j.ranks.clone(),
                id,
                severity: 0,
                kind: "exec".into(),
                note: format!("job {id} is unknown upstream"),
            };
            self.fan_out(&j.ranks, &kill);
            let tuple = JobTuple(id, j.userid, UpdateType::Remove, j.ranks.clone());
            let targets = self.targets(&j.ranks);
            let now = self.hold_for_waiting(targets, &tuple);
            let remove = ExecDown::StateUpdate {
                idset: j.ranks.clone(),
                data: Jobs { jobs: vec![tuple] },
                answer: false,
            };
            self.send_down(&now, &remove);
        }
        self.infos.remove(&id);
        self.info_down.remove(&id);
    }

    /// Applies one `state-update` tuple (RFC 33, "add", "remove", "check").
    fn apply(&mut self, JobTuple(id, userid, kind, idset): JobTuple) {
        let fwd = ExecDown::StateUpdate {
            idset: idset.clone(),
            data: Jobs {
                jobs: vec![JobTuple(id, userid, kind, idset.clone())],
            },
            answer: false,
        };
        match kind {
            // A job this daemon already terminated as a stray is not started again: it is
            // checked instead, which counts its shell here as killed.
            UpdateType::Add if self.strays.contains(&id) => {
                self.apply(JobTuple(id, userid, UpdateType::Check, idset))
            }
            UpdateType::Add => {
                if self.jobs.contains_key(&id) {
                    return;
                }
                let down = self.fan_out(&idset, &fwd);
                let spec = self.infos.get(&id).cloned();
                let mut job = Job::new(userid, idset.clone(), spec.clone());
                job.down.extend(down);
                if !self.start_hold.is_zero() && spec.is_some() {
                    job.start_due = false;
                    job.hold_timer = true;
                    self.emit(Output::HoldStart {
                        id,
                        delay: self.start_hold,
                    });
                }
                if idset.contains(self.me) {
                    match spec {
                        Some(spec) => {
                            job.shell = Some(Shell::Launching);
                            self.emit(Output::Shell(ShellCommand::Launch { id, spec }));
                        }
                        None => {
                            self.jobs.insert(id, job);
                            let me = self.me;
                            self.absent(id, format!("no job data for an add on rank {me}"));
                            self.progress(id);
                            return;
                        }
                    }
                }
                self.jobs.insert(id, job);
            }
            UpdateType::Remove => {
                let targets = self.job_targets(id, &idset);
                let now = if self.answering {
                    let tuple = JobTuple(id, userid, UpdateType::Remove, idset.clone());
                    self.hold_for_waiting(targets, &tuple)
                } else {
                    targets
                };
                self.send_down(&now, &fwd);
                self.forget(id);
                self.infos.remove(&id);
                self.info_down.remove(&id);
            }
            UpdateType::Check => {
                let mut down = self.targets(&idset);
                if self.answering {
                    down.retain(|l| !self.waiting.contains(l));
                }
                self.send_down(&down, &fwd);
                let spec = self.infos.get(&id).cloned();
                self.jobs
                    .entry(id)
                    .or_insert_with(|| Job::new(userid, idset.clone(), spec))
                    .down
                    .extend(down);
                self.lost_if_absent(id);
                // Whatever we knew before the new parent, it needs again.
                self.progress(id);
            }
        }
    }

    /// Updates the local shell's part of job `id` and reports what became complete.
    fn local(&mut self, id: JobId, f: impl FnOnce(&mut Job, Rank)) {
        let me = self.me;
        let Some(j) = self.jobs.get_mut(&id) else {
            self.emit(Output::Log(format!("event for unknown job {id} ignored")));
            return;
        };
        f(j, me);
        self.progress(id);
    }

    /// Drops job `id` from the jobs tracked here; what it was.
    fn forget(&mut self, id: JobId) -> Option<Job> {
        let j = self.jobs.remove(&id)?;
        if j.hold_timer {
            self.emit(Output::ReleaseHold { id });
        }
        Some(j)
    }

    /// Something else of job `id` is about to go up, or its hold ran out: a start held
    /// back goes first: within this daemon's subtree every report of a job follows its
    /// start (another subtree's may still be held, so the controller can see a job's
    /// output before it knows the job started, for up to the hold).
    fn start_now(&mut self, id: JobId) {
        if let Some(j) = self.jobs.get_mut(&id) {
            if !j.start_due {
                j.start_due = true;
                self.progress(id);
            }
        }
    }

    fn on_up(&mut self, link: LinkId, req: ExecUp) {
        let Some(child) = self.child_ranks.get(&link).copied() else {
            return self.emit(Output::Log(format!(
                "job-exec request on link {link}, which is not a child's; ignored"
            )));
        };
        let req = match req {
            ExecUp::Hello => {
                if self.ready {
                    self.answer_hello(link);
                } else {
                    self.waiting.insert(link);
                }
                return;
            }
            ExecUp::Output {
                id,
                proc,
                stream,
                data,
            } => {
                // Only output of a process placed inside the sender's subtree.
                let placed = self
                    .infos
                    .get(&id)
                    .map(|s| &s.placement)
                    .filter(|p| proc < p.nprocs)
                    .map(|p| p.rank_of(proc));
                if !placed.is_some_and(|r| self.tree.is_ancestor_or_self(child, r)) {
                    return self.emit(Output::Log(format!(
                        "output of job {id} process {proc} from rank {child}'s subtree, where it does not run; dropped"
                    )));
                }
                return self.output_up(id, proc, stream, data);
            }
            ExecUp::StdinAck { id, bytes } => {
                // Only from the subtree process 0 runs in.
                let placed = self
                    .infos
                    .get(&id)
                    .filter(|s| s.stdin && s.placement.nprocs > 0)
                    .map(|s| s.placement.rank_of(0));
                if !placed.is_some_and(|r| self.tree.is_ancestor_or_self(child, r)) {
                    return self.emit(Output::Log(format!(
                        "stdin acknowledgement of job {id} from rank {child}'s subtree, where its process 0 does not run; dropped"
                    )));
                }
                return self.stdin_ack_up(id, bytes);
            }
            ExecUp::Passed { id, seq } => return self.on_passed(child, id, seq),
            other => other,
        };
        // A daemon speaks only for its own subtree: ranks outside it are not taken.
        let req = match req {
            ExecUp::Start { id, ranks } => ExecUp::Start {
                id,
                ranks: self.within(child, id, ranks),
            },
            ExecUp::Barrier { id, ranks, seq } => ExecUp::Barrier {
                id,
                ranks: self.within(child, id, ranks),
                seq,
            },
            ExecUp::Finish { id, ranks, status } => ExecUp::Finish {
                id,
                ranks: self.within(child, id, ranks),
                status,
            },
            ExecUp::Release { id, ranks } => ExecUp::Release {
                id,
                ranks: self.within(child, id, ranks),
            },
            other => other,
        };
        match &req {
            ExecUp::Hello
            | ExecUp::Output { .. }
            | ExecUp::StdinAck { .. }
            | ExecUp::Passed { .. } => {}
            ExecUp::Start { .. } => self.counters.start += 1,
            ExecUp::Barrier { .. } => self.counters.barrier += 1,
            ExecUp::Finish { .. } => self.counters.finish += 1,
            ExecUp::Exception { .. } => self.counters.exception += 1,
            ExecUp::Release { .. } => self.counters.release += 1,
        }
        match req {
            ExecUp::Hello
            | ExecUp::Output { .. }
            | ExecUp::StdinAck { .. }
            | ExecUp::Passed { .. } => {}
            ExecUp::Start { id, ranks } => {
                let mut again = None;
                if let Some(j) = self.jobs.get_mut(&id) {
                    let late = ranks.difference(&j.started);
                    j.started = j.started.union(&ranks);
                    // A shell that started after its job's fatal exception went down was not
                    // there to be killed (its add came late, or by another way than the
                    // exception): the exception goes to it again.
                    if self.controller && !late.is_empty() {
                        again = j.fatal.clone().map(|mut m| {
                            if let ExecDown::Exception { idset, .. } = &mut m {
                                *idset = late;
                            }
                            m
                        });
                    }
                }
                if let Some(m) = again {
                    self.on_down(m);
                }
                self.progress(id);
            }
            ExecUp::Barrier { id, ranks, seq } => {
                let Some(j) = self.jobs.get_mut(&id) else {
                    return;
                };
                // Barrier keys grow: a report of one whose end already passed here, or older
                // than one being gathered here (some rank left it to enter the next), comes
                // from below a link that end was lost on (broken as it passed): the end goes
                // down again. A gathered one older than the report ended too. A bare number
                // from a daemon older than the keys says nothing of the order: it only joins
                // the barrier gathered of that number, or starts one (`same_barrier`).
                let count = barrier_count;
                let gathering = j.barrier.as_ref().map(|(s, _)| *s);
                if count(seq) > 0 {
                    let stale = seq <= j.barrier_done.max(j.passed_below)
                        || gathering.is_some_and(|g| count(g) > count(seq));
                    // Answered to the reporter alone: a barrier gathered here, even a bare
                    // number that matches the stale one's, is not the stale one.
                    if stale {
                        if !ranks.is_empty() {
                            let m = ExecDown::BarrierDone {
                                idset: ranks.clone(),
                                id,
                                seq,
                            };
                            self.fan_out(&ranks, &m);
                        }
                        return;
                    }
                    if let Some(g) = gathering.filter(|&g| count(g) > 0 && count(g) < count(seq)) {
                        self.on_down(ExecDown::BarrierDone {
                            idset: IdSet::new(),
                            id,
                            seq: g,
                        });
                    }
                }
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.enter(seq, &ranks);
                }
                self.progress(id);
            }
            ExecUp::Finish { id, ranks, status } => {
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.finished = j.finished.union(&ranks);
                    j.status = j.status.max(status);
                }
                self.progress(id);
            }
            ExecUp::Exception {
                id,
                severity,
                kind,
                note,
            } => self.raise_up(id, severity, kind, note),
            ExecUp::Release { id, ranks } => {
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.released = j.released.union(&ranks);
                }
                self.progress(id);
            }
        }
    }

    /// Child `child` says the end of job `id`'s barrier `seq` passed it. A daemon that never
    /// saw that end (restarted, a restarted controller, which keeps no barrier, or one new
    /// on the job's path) takes the barrier for ended: the ranks gathered in it here (their
    /// end was lost on the way) are let go, a report of it is stale from now on, and below
    /// the controller it goes up. A daemon that saw the end knows it already. Only from a
    /// child whose subtree, by the tree formula, holds ranks of the job.
    fn on_passed(&mut self, child: Rank, id: JobId, seq: u64) {
        let (controller, ready, tree) = (self.controller, self.ready, self.tree);
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        if !j.ranks.iter().any(|r| tree.is_ancestor_or_self(child, r)) {
            return self.emit(Output::Log(format!(
                "job {id}: rank {child}, whose subtree runs none of it, said a barrier passed; ignored"
            )));
        }
        if barrier_count(seq) == 0 || seq <= j.barrier_done.max(j.passed_below) {
            return;
        }
        j.passed_below = seq;
        // A bare number gathered (from daemons older than the keys) may be this barrier or
        // the next: it is left to its own end.
        let ended = |g: u64| barrier_count(g) > 0 && g <= seq;
        let gathered = j.barrier.as_ref().map(|(g, _)| *g).filter(|&g| ended(g));
        if !controller && ready {
            self.emit(Output::SendUp(ExecUp::Passed { id, seq }));
        }
        if let Some(g) = gathered {
            self.on_down(ExecDown::BarrierDone {
                idset: IdSet::new(),
                id,
                seq: g,
            });
        }
    }

    /// `ranks` restricted to the job's ranks and then to the subtree of `child` by the tree
    /// formula (not to the ranks reachable through it now: a rank that re-homed keeps its
    /// earlier reports valid); what was outside is logged. The job's ranks come first, so a
    /// forged huge idset costs no more than the job's own.
    fn within(&mut self, child: Rank, id: JobId, ranks: IdSet) -> IdSet {
        let Some(ranks) = self.jobs.get(&id).map(|j| ranks.intersection(&j.ranks)) else {
            return IdSet::new();
        };
        let (inside, outside): (Vec<Rank>, Vec<Rank>) = ranks
            .iter()
            .partition(|r| self.tree.is_ancestor_or_self(child, *r));
        if !outside.is_empty() {
            let outside: IdSet = outside.into_iter().collect();
            self.emit(Output::Log(format!(
                "job {id}: rank {child} spoke for ranks {outside} outside its subtree; ignored"
            )));
        }
        inside.into_iter().collect()
    }

    fn on_lost(&mut self, lost: IdSet) {
        if !self.controller {
            return;
        }
        let hit: Vec<(JobId, IdSet)> = self
            .jobs
            .iter()
            .map(|(id, j)| (*id, j.ranks.intersection(&lost).difference(&j.released)))
            .filter(|(_, gone)| !gone.is_empty())
            .collect();
        for (id, gone) in hit {
            self.on_exception(
                id,
                0,
                "node-failure".into(),
                format!("rank(s) {gone} lost while the job ran"),
            );
            if let Some(j) = self.jobs.get_mut(&id) {
                j.started = j.started.union(&gone);
                j.finished = j.finished.union(&gone);
                j.status = j.status.max(9);
                j.released = j.released.union(&gone);
            }
            self.progress(id);
        }
    }

    fn output_up(&mut self, id: JobId, proc: u32, stream: Stream, data: Vec<u8>) {
        if self.controller {
            return self.emit(Output::Event(JobEvent::Output {
                id,
                proc,
                stream,
                data,
            }));
        }
        self.start_now(id);
        let len = data.len();
        let req = ExecUp::Output {
            id,
            proc,
            stream,
            data,
        };
        if self.ready {
            self.emit(Output::SendUp(req));
        } else if self.held_bytes + len <= HELD_OUTPUT {
            // The parent may not know the job yet; it will once it answered the hello.
            self.held_bytes += len;
            self.held.push_back(req);
        } else {
            self.dropped_bytes += len;
        }
    }

    /// Acknowledgements are cumulative, so one held back while the parent has not answered
    /// the hello is replaced by the next, never lost.
    fn stdin_ack_up(&mut self, id: JobId, bytes: u64) {
        if self.controller {
            return self.emit(Output::Event(JobEvent::StdinAck { id, bytes }));
        }
        self.start_now(id);
        let req = ExecUp::StdinAck { id, bytes };
        if self.ready {
            self.emit(Output::SendUp(req));
        } else {
            self.held
                .retain(|h| !matches!(h, ExecUp::StdinAck { id: held, .. } if *held == id));
            self.held.push_back(req);
        }
    }

    /// An exception goes up at once; the controller tells the job manager and, for a fatal
    /// one, every rank of the job.
    fn raise_up(&mut self, id: JobId, severity: u32, kind: String, note: String) {
        let (kind, note) = (cut(kind), cut(note));
        if !self.controller {
            self.start_now(id);
            let len = kind.len() + note.len();
            let req = ExecUp::Exception {
                id,
                severity,
                kind,
                note,
            };
            // A job's first fatal exception is kept with the job and goes up again to every new
            // parent until the job ends here: lost with a link up that died (it may take a
            // while to be found dead), it leaves the job's other shells running, in a
            // barrier for good.
            if let Some(j) = self.jobs.get_mut(&id).filter(|_| severity == 0) {
                if j.fatal_up.is_none() {
                    j.fatal_up = Some(req);
                    j.fatal_up_sent = false;
                    return self.send_fatal_up(id);
                }
            }
            if self.ready {
                return self.emit(Output::SendUp(req));
            }
            // No parent to take it (the link up is gone, or the new one has not answered):
            // it waits with the output; a fatal one of a job not held here always, once.
            let fatal_held = |h: &ExecUp| matches!(h, ExecUp::Exception { severity: 0, .. });
            let (mine, fatal) =
                self.held
                    .iter()
                    .filter(|h| fatal_held(h))
                    .fold((false, 0), |(mine, n), h| {
                        let m = matches!(h, ExecUp::Exception { id: i, .. } if *i == id);
                        (mine || m, n + 1)
                    });
            if severity == 0 && (mine || fatal >= HELD_FATAL) {
                return;
            }
            // Held fatal exceptions have a budget of their own (their count, each cut to
            // size): they never take the output's room.
            if severity == 0 {
                self.held.push_back(req);
            } else if self.held_bytes + len <= HELD_OUTPUT {
                self.held_bytes += len;
                self.held.push_back(req);
            } else {
                self.dropped_bytes += len;
            }
            return;
        }
        self.on_exception(id, severity, kind, note);
    }

    /// Sends job `id`'s kept fatal exception up, if it has not gone to this parent yet and
    /// the parent has answered the hello.
    fn send_fatal_up(&mut self, id: JobId) {
        if !self.ready {
            return;
        }
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        if let (Some(req), false) = (&j.fatal_up, j.fatal_up_sent) {
            j.fatal_up_sent = true;
            let req = req.clone();
            self.emit(Output::SendUp(req));
        }
    }

    fn on_exception(&mut self, id: JobId, severity: u32, kind: String, note: String) {
        if !self.controller {
            return;
        }
        // The job manager's too (one it kept may come from a build that did not cut).
        let (kind, note) = (cut(kind), cut(note));
        let Some(j) = self.jobs.get(&id) else {
            self.emit(Output::Log(format!(
                "exception for unknown job {id} ignored"
            )));
            return;
        };
        // Another fatal one (or the same again: each daemon sends its own again to every
        // new parent) is told to the job manager only: the first already went down, and
        // goes with every hello answer.
        let again = severity == 0 && j.fatal.is_some();
        let ranks = j.ranks.clone();
        self.emit(Output::Event(JobEvent::Exception {
            id,
            severity,
            kind: kind.clone(),
            note: note.clone(),
        }));
        if again {
            return;
        }
        self.on_down(ExecDown::Exception {
            idset: ranks,
            id,
            severity,
            kind,
            note,
        });
    }

    /// Reports upward (or to the job manager) whatever the subtree's part of job `id` has
    /// completed: one message per job and event, never one per rank.
    fn progress(&mut self, id: JobId) {
        self.report(id, false);
    }

    /// [`JobExec::progress`], or with `only_start` its start alone.
    fn report(&mut self, id: JobId, only_start: bool) {
        // A new parent that has not answered the hello may not know the job: what completed
        // goes up once it has (see the initial state-update).
        if !self.controller && !self.ready {
            return;
        }
        let controller = self.controller;
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        let expect = if controller {
            j.ranks.clone()
        } else {
            j.ranks.intersection(&self.subtree)
        };
        if expect.is_empty() {
            return;
        }
        let mut out = Vec::new();
        let all = |got: &IdSet| expect.difference(got).is_empty();
        // The subtree can grow after a report went up (a child rejoins late): then the
        // newly complete ranks go up too. In steady state it is one message per event.
        let unsent_start = expect.difference(&j.sent_start);
        let unsent_finish = expect.difference(&j.sent_finish);
        let finish_ready = !unsent_finish.is_empty() && all(&j.finished);
        let barrier_ready = j.barrier.as_ref().is_some_and(|(_, entered)| all(entered));
        let held = !j.start_due && !finish_ready && !barrier_ready;
        if !unsent_start.is_empty() && all(&j.started) && !held {
            let first = j.sent_start.is_empty();
            j.sent_start = expect.clone();
            // Once a start went up, it is never held again: sent again to a new parent after
            // a re-hello (its timer is gone by then), it goes at once.
            j.start_due = true;
            if j.hold_timer {
                j.hold_timer = false;
                out.push(Output::ReleaseHold { id });
            }
            if controller {
                if first {
                    out.push(Output::Event(JobEvent::Started { id }));
                }
            } else {
                out.push(Output::SendUp(ExecUp::Start {
                    id,
                    ranks: unsent_start,
                }));
            }
        }
        if only_start {
            return self.out.extend(out);
        }
        if let Some((seq, entered)) = j.barrier.clone() {
            if all(&entered) {
                if controller {
                    let idset = j.ranks.clone();
                    self.out.extend(out);
                    self.on_down(ExecDown::BarrierDone { idset, id, seq });
                    return self.progress(id);
                }
                if !expect.difference(&j.sent_barrier).is_empty() {
                    j.sent_barrier = expect.clone();
                    out.push(Output::SendUp(ExecUp::Barrier {
                        id,
                        ranks: expect.clone(),
                        seq,
                    }));
                }
            }
        }
        if finish_ready {
            let first = j.sent_finish.is_empty();
            j.sent_finish = expect.clone();
            if controller {
                if first {
                    out.push(Output::Event(JobEvent::Finished {
                        id,
                        status: j.status,
                    }));
                }
            } else {
                out.push(Output::SendUp(ExecUp::Finish {
                    id,
                    ranks: unsent_finish,
                    status: j.status,
                }));
            }
        }
        if controller {
            let fresh = j.released.difference(&j.reported_release);
            if !fresh.is_empty() {
                j.reported_release = j.reported_release.union(&fresh);
                let last = all(&j.reported_release);
                out.push(Output::Event(JobEvent::Released {
                    id,
                    ranks: fresh,
                    last,
                }));
                if last {
                    let (userid, ranks) = (j.userid, j.ranks.clone());
                    self.out.extend(out);
                    self.on_down(ExecDown::StateUpdate {
                        idset: ranks.clone(),
                        data: Jobs {
                            jobs: vec![JobTuple(id, userid, UpdateType::Remove, ranks)],
                        },
                        answer: false,
                    });
                    return;
                }
            }
        } else {
            let unsent = expect.difference(&j.sent_release);
            if !unsent.is_empty() && all(&j.released) {
                j.sent_release = expect.clone();
                out.push(Output::SendUp(ExecUp::Release { id, ranks: unsent }));
            }
        }
        self.out.extend(out);
    }
}

impl Job {
    fn new(userid: u32, ranks: IdSet, spec: Option<JobSpec>) -> Job {
        Job {
            userid,
            ranks,
            spec,
            shell: None,
            started: IdSet::new(),
            finished: IdSet::new(),
            status: 0,
            released: IdSet::new(),
            barrier: None,
            sent_barrier: IdSet::new(),
            barrier_done: 0,
            passed_below: 0,
            passed: 0,
            shell_seq: 0,
            killed: false,
            fatal_up: None,
            fatal_up_sent: false,
            sent_start: IdSet::new(),
            sent_finish: IdSet::new(),
            sent_release: IdSet::new(),
            reported_release: IdSet::new(),
            fatal: None,
            down: BTreeSet::new(),
            start_due: true,
            hold_timer: false,
        }
    }

    /// `ranks` entered barrier `seq`: one the barrier being gathered joins (named by the
    /// key, if either knows it), any other starts over (every process of a job goes through
    /// the same barriers in turn).
    fn enter(&mut self, seq: u64, ranks: &IdSet) {
        match &mut self.barrier {
            Some((s, entered)) if same_barrier(*s, seq) => {
                *entered = entered.union(ranks);
                *s = (*s).max(seq);
            }
            _ => {
                self.barrier = Some((seq, ranks.clone()));
                self.sent_barrier = IdSet::new();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::RadixTree;
    use dvmlab_proto::exec::BARRIER_KEYS;
    use dvmlab_proto::placement::{MapBy, Placement};
    use std::collections::VecDeque;

    /// A tree of job-exec modules wired in memory: link ids are the child's rank downward;
    /// the shells' effects are recorded and fed back by the tests.
    struct Sim {
        tree: RadixTree,
        mods: Vec<JobExec>,
        queue: VecDeque<(Rank, Input)>,
        launched: Vec<(Rank, JobId)>,
        killed: Vec<(Rank, JobId, i32)>,
        epilogs: Vec<(Rank, JobId)>,
        barrier_done: Vec<(Rank, JobId, u64)>,
        /// Ranks whose link up is gone (`Input::Uplink` with none).
        no_uplink: BTreeSet<Rank>,
        stdin: Vec<(Rank, JobId, Vec<u8>, bool)>,
        events: Vec<JobEvent>,
        logs: Vec<(Rank, String)>,
        /// Per handling that sent anything up: the rank and what it sent, in order.
        up: Vec<(Rank, Vec<&'static str>)>,
        /// Start holds asked for, and given back, by rank and job.
        holds: Vec<(Rank, JobId)>,
        released_holds: Vec<(Rank, JobId)>,
    }

    /// A new upward link to a parent of this build.
    fn uplink(link: Option<LinkId>) -> Input {
        Input::Uplink {
            link,
            version: dvmlab_proto::wire::VERSION,
        }
    }

    fn spec() -> JobSpec {
        JobSpec {
            argv: vec!["true".into()],
            env: vec![],
            cwd: None,
            placement: Placement::new(14, (1..15).collect(), MapBy::Node),
            stdin: false,
        }
    }

    impl Sim {
        fn new(size: u32, radix: u32) -> Sim {
            let tree = RadixTree::new(radix, size);
            let mut s = Sim {
                mods: (0..size).map(|r| JobExec::new(r, r == 0, tree)).collect(),
                tree,
                queue: VecDeque::new(),
                launched: vec![],
                killed: vec![],
                epilogs: vec![],
                barrier_done: vec![],
                no_uplink: BTreeSet::new(),
                stdin: vec![],
                events: vec![],
                logs: vec![],
                up: vec![],
                holds: vec![],
                released_holds: vec![],
            };
            for r in 0..size {
                let kids = s
                    .tree
                    .children(r)
                    .into_iter()
                    .map(|c| (c as LinkId, c, s.subtree(c)))
                    .collect();
                s.push(r, Input::Children(kids));
            }
            s.push(0, Input::Recovered(vec![]));
            for r in 1..size {
                s.push(r, uplink(s.tree.parent(r).map(LinkId::from)));
            }
            s.run();
            s
        }

        fn subtree(&self, r: Rank) -> IdSet {
            (0..self.tree.size())
                .filter(|x| self.tree.is_ancestor_or_self(r, *x))
                .collect()
        }

        fn push(&mut self, r: Rank, i: Input) {
            self.queue.push_back((r, i));
        }

        fn run(&mut self) {
            while self.step() {}
        }

        /// Runs to quiescence, every barrier end on its way to rank `lost` lost (its link
        /// broke as the end passed).
        fn run_losing_barrier_ends_to(&mut self, lost: Rank) {
            while let Some((r, input)) = self.queue.pop_front() {
                if r != lost || !matches!(input, Input::Down(ExecDown::BarrierDone { .. })) {
                    self.deliver(r, input);
                }
            }
        }

        /// Handles the next queued input; false when there was none.
        fn step(&mut self) -> bool {
            let Some((r, input)) = self.queue.pop_front() else {
                return false;
            };
            self.deliver(r, input);
            true
        }

        /// Rank `r` handles `input` now, ahead of the queue; what it sends is queued.
        fn deliver(&mut self, r: Rank, input: Input) {
            if let Input::Uplink { link, .. } = &input {
                if link.is_some() {
                    self.no_uplink.remove(&r);
                } else {
                    self.no_uplink.insert(r);
                }
            }
            let mut sent_up = vec![];
            for o in self.mods[r as usize].handle(input) {
                match o {
                    Output::SendDown { link, msg } => self.push(link as Rank, Input::Down(msg)),
                    Output::SendUp(req) => {
                        sent_up.push(match req {
                            ExecUp::Hello => "hello",
                            ExecUp::Start { .. } => "start",
                            ExecUp::Barrier { .. } => "barrier",
                            ExecUp::Finish { .. } => "finish",
                            ExecUp::Exception { .. } => "exception",
                            ExecUp::Release { .. } => "release",
                            ExecUp::Output { .. } => "output",
                            ExecUp::StdinAck { .. } => "stdin-ack",
                            ExecUp::Passed { .. } => "passed",
                        });
                        // A daemon with no link up sends nothing (the daemon core drops it).
                        if let Some(p) =
                            self.tree.parent(r).filter(|_| !self.no_uplink.contains(&r))
                        {
                            self.push(
                                p,
                                Input::Up {
                                    link: r.into(),
                                    req,
                                },
                            );
                        }
                    }
                    Output::Shell(ShellCommand::Launch { id, .. }) => self.launched.push((r, id)),
                    Output::Shell(ShellCommand::Kill { id, signal }) => {
                        self.killed.push((r, id, signal))
                    }
                    Output::Shell(ShellCommand::BarrierDone { id, seq }) => {
                        self.barrier_done.push((r, id, seq))
                    }
                    Output::Shell(ShellCommand::Epilog { id }) => self.epilogs.push((r, id)),
                    Output::Shell(ShellCommand::Stdin { id, data, eof }) => {
                        self.stdin.push((r, id, data, eof))
                    }
                    Output::Event(e) => self.events.push(e),
                    Output::Log(l) => self.logs.push((r, l)),
                    Output::HoldStart { id, .. } => self.holds.push((r, id)),
                    Output::ReleaseHold { id } => self.released_holds.push((r, id)),
                }
            }
            if !sent_up.is_empty() {
                self.up.push((r, sent_up));
            }
        }

        /// A tree of `size` (radix 2) whose daemons below the controller hold starts back
        /// (the controller never does), running job `id` on `ranks`, every shell started.
        fn started_with_held_starts(size: u32, id: JobId, ranks: &IdSet) -> Sim {
            let mut s = Sim::new(size, 2);
            for m in &mut s.mods {
                m.set_start_hold(Duration::from_millis(50));
            }
            s.submit(id, ranks.clone());
            s.each(ranks, |_| Input::ShellStarted { id });
            s
        }

        /// The controller dies; a new one recovers the job list the job manager kept, and
        /// its two children (radix 2) say hello again. Its events start afresh.
        fn restart_controller(&mut self, recovered: Vec<(JobId, u32, IdSet, JobSpec)>) {
            self.restart_controller_raising(recovered, vec![]);
        }

        /// [`Sim::restart_controller`], the job manager raising `raise` (the fatal
        /// exceptions it kept) right after the recovered list.
        fn restart_controller_raising(
            &mut self,
            recovered: Vec<(JobId, u32, IdSet, JobSpec)>,
            raise: Vec<Input>,
        ) {
            self.mods[0] = JobExec::new(0, true, self.tree);
            self.events.clear();
            let kids = vec![(1, 1, self.subtree(1)), (2, 2, self.subtree(2))];
            self.push(0, Input::Children(kids));
            self.push(0, Input::Recovered(recovered));
            for r in raise {
                self.push(0, r);
            }
            self.push(1, uplink(Some(0)));
            self.push(2, uplink(Some(0)));
            self.run();
        }

        /// What rank `r` sent up about jobs, one entry per handling.
        fn sent_up(&self, r: Rank) -> Vec<Vec<&'static str>> {
            self.up
                .iter()
                .filter(|(at, _)| *at == r)
                .map(|(_, kinds)| kinds.iter().copied().filter(|k| *k != "hello").collect())
                .filter(|kinds: &Vec<&str>| !kinds.is_empty())
                .collect()
        }

        fn submit(&mut self, id: JobId, ranks: IdSet) {
            self.push(
                0,
                Input::Submit {
                    id,
                    userid: 1000,
                    ranks,
                    spec: spec(),
                },
            );
            self.run();
        }

        fn each(&mut self, ranks: &IdSet, f: impl Fn(Rank) -> Input) {
            for r in ranks.iter() {
                self.push(r, f(r));
            }
            self.run();
        }
    }

    /// A child whose hello is not answered yet may run jobs this daemon does not know of
    /// yet (a controller that restarted, a parent new to it): events go down to it until
    /// its hello is answered, and only where jobs run after that.
    #[test]
    fn a_child_counts_as_running_jobs_until_its_hello_is_answered() {
        let mut x = JobExec::new(0, true, RadixTree::new(2, 4));
        x.handle(Input::Children(vec![(7, 1, [1, 3].into_iter().collect())]));
        assert_eq!(x.reaching(&[7]), BTreeSet::from([7]));
        x.handle(Input::Recovered(vec![]));
        x.handle(Input::Up {
            link: 7,
            req: ExecUp::Hello,
        });
        assert!(x.reaching(&[7]).is_empty());
    }

    #[test]
    fn stdin_goes_down_to_the_rank_of_process_0_alone_and_only_its_subtree_acknowledges_it() {
        let mut s = Sim::new(15, 2);
        // Process 0 on rank 9, three hops below the controller.
        let mut sp = spec();
        sp.placement = Placement::new(3, vec![9, 2, 3], MapBy::Node);
        sp.stdin = true;
        let ranks: IdSet = [2, 3, 9].into_iter().collect();
        s.push(
            0,
            Input::Submit {
                id: 5,
                userid: 1000,
                ranks,
                spec: sp,
            },
        );
        s.run();
        s.push(
            0,
            Input::Stdin {
                id: 5,
                data: vec![0, 255, 10],
                eof: true,
            },
        );
        s.run();
        assert_eq!(s.stdin, vec![(9, 5, vec![0, 255, 10], true)]);
        s.push(9, Input::ShellStdinAck { id: 5, bytes: 3 });
        s.run();
        assert_eq!(s.events, vec![JobEvent::StdinAck { id: 5, bytes: 3 }]);
        // Rank 2 is not on rank 9's path: an acknowledgement from it is not taken.
        s.push(2, Input::ShellStdinAck { id: 5, bytes: 99 });
        s.run();
        assert_eq!(s.events.len(), 1, "{:?}", s.events);
        assert!(s
            .logs
            .iter()
            .any(|(_, l)| l.contains("does not run; dropped")));
    }

    #[test]
    fn a_job_runs_everywhere_and_the_controller_hears_one_message_per_child_per_event() {
        let mut s = Sim::new(15, 2);
        let ranks = IdSet::range(1, 14);
        s.submit(7, ranks.clone());
        let mut launched: Vec<Rank> = s.launched.iter().map(|l| l.0).collect();
        launched.sort();
        assert_eq!(launched, (1..15).collect::<Vec<_>>());
        s.each(&ranks, |_| Input::ShellStarted { id: 7 });
        assert_eq!(s.events, vec![JobEvent::Started { id: 7 }]);
        assert_eq!(
            s.mods[0].counters.start, 2,
            "one start per child of the controller"
        );
        s.each(&ranks, |r| Input::ShellExited {
            id: 7,
            status: if r == 9 { 256 } else { 0 },
        });
        assert_eq!(s.events[1], JobEvent::Finished { id: 7, status: 256 });
        assert_eq!(s.mods[0].counters.finish, 2);
        assert_eq!(s.epilogs.len(), 14);
        s.each(&ranks, |_| Input::EpilogDone { id: 7 });
        let released: Vec<&JobEvent> = s.events[2..].iter().collect();
        assert_eq!(
            released.len(),
            2,
            "one release chunk per child: {released:?}"
        );
        assert!(matches!(released[1], JobEvent::Released { last: true, .. }));
        for m in &s.mods {
            assert_eq!(
                m.jobs().count(),
                0,
                "rank {}: the final release removes the job",
                m.me
            );
        }
    }

    /// A job whose processes end within the hold: every daemon sends its start up together
    /// with its finish (one handling, so one write on its link) and no start on its own,
    /// the controller still hears start before finish, and every hold asked for is given
    /// back so no wakeup follows.
    #[test]
    fn a_short_jobs_start_goes_up_with_its_finish_in_one_message_per_link() {
        let ranks = IdSet::range(1, 14);
        let mut s = Sim::started_with_held_starts(15, 7, &ranks);
        assert!(s.events.is_empty(), "held: {:?}", s.events);
        assert_eq!(s.mods[0].counters.start, 0);
        s.each(&ranks, |_| Input::ShellExited { id: 7, status: 0 });
        s.each(&ranks, |_| Input::EpilogDone { id: 7 });
        assert_eq!(
            s.events[..2],
            [
                JobEvent::Started { id: 7 },
                JobEvent::Finished { id: 7, status: 0 }
            ]
        );
        assert!(matches!(
            s.events.last(),
            Some(JobEvent::Released { last: true, .. })
        ));
        for r in ranks.iter() {
            let up = s.sent_up(r);
            let starts: Vec<&Vec<&str>> = up.iter().filter(|k| k.contains(&"start")).collect();
            assert_eq!(starts.len(), 1, "rank {r}: {up:?}");
            assert_eq!(starts[0][..2], ["start", "finish"], "rank {r}: {up:?}");
        }
        assert_eq!(
            (s.mods[0].counters.start, s.mods[0].counters.finish),
            (2, 2)
        );
        let mut asked = s.holds.clone();
        let mut given_back = s.released_holds.clone();
        asked.sort();
        given_back.sort();
        assert_eq!(
            asked.len(),
            14,
            "every daemon below the controller held: {asked:?}"
        );
        assert_eq!(asked, given_back);
    }

    /// A job that outlives the hold: nothing goes up until each daemon's hold runs out,
    /// then the starts go up and the controller hears the job started; a hold that runs out
    /// after its start went up (or its job went) changes nothing.
    #[test]
    fn a_held_start_goes_up_when_the_hold_runs_out() {
        let ranks = IdSet::range(1, 6);
        let mut s = Sim::started_with_held_starts(7, 3, &ranks);
        assert!(s.events.is_empty());
        // The leaves' holds run out first: their parents still hold theirs.
        s.each(&IdSet::range(3, 6), |_| Input::StartDue { id: 3 });
        assert!(s.events.is_empty());
        assert_eq!(s.mods[1].counters.start, 2);
        s.each(&IdSet::range(1, 2), |_| Input::StartDue { id: 3 });
        assert_eq!(s.events, vec![JobEvent::Started { id: 3 }]);
        s.each(&ranks, |_| Input::StartDue { id: 3 });
        s.each(&ranks, |_| Input::ShellExited { id: 3, status: 0 });
        s.each(&ranks, |_| Input::EpilogDone { id: 3 });
        s.each(&ranks, |_| Input::StartDue { id: 3 });
        assert_eq!(s.events[1], JobEvent::Finished { id: 3, status: 0 });
        assert_eq!(s.mods[0].counters.start, 2, "one start per child, no more");
        assert!(s.logs.is_empty(), "{:?}", s.logs);
    }

    /// Output (or an exception, a barrier) of a job whose start is held goes up behind the
    /// start, never ahead of it.
    #[test]
    fn output_of_a_job_whose_start_is_held_goes_up_behind_its_start() {
        let ranks = IdSet::range(1, 2);
        let mut s = Sim::started_with_held_starts(3, 5, &ranks);
        s.push(
            2,
            Input::ShellOutput {
                id: 5,
                proc: 1,
                stream: Stream::Stdout,
                data: b"hi\n".to_vec(),
            },
        );
        s.run();
        assert_eq!(s.sent_up(2), vec![vec!["start", "output"]]);
        assert!(s.sent_up(1).is_empty(), "rank 1's own start is still held");
    }

    /// A start that went up early with a barrier is sent again, at once, to a restarted
    /// controller: its hold is long gone, and the new job manager must hear the job started.
    #[test]
    fn a_start_that_went_up_with_a_barrier_goes_up_again_to_a_restarted_controller() {
        let ranks = IdSet::range(1, 2);
        let mut s = Sim::started_with_held_starts(3, 5, &ranks);
        s.each(&ranks, |_| Input::ShellBarrier { id: 5, seq: 1 });
        assert_eq!(s.events, vec![JobEvent::Started { id: 5 }]);
        assert_eq!(s.sent_up(1), vec![vec!["start", "barrier"]]);
        s.restart_controller(vec![(5, 1000, ranks.clone(), spec())]);
        assert_eq!(s.events, vec![JobEvent::Started { id: 5 }]);
    }

    /// Output held while a daemon's new parent has not answered its hello goes up behind
    /// the job's start, which was still held when the link changed, and ahead of its finish
    /// and release, which came after it: the job does not end before its output arrives.
    #[test]
    fn output_held_across_a_re_hello_goes_up_between_the_held_start_and_the_finish() {
        let ranks = IdSet::range(1, 2);
        let mut s = Sim::started_with_held_starts(3, 6, &ranks);
        // Rank 2's upward link changes; its process writes before the answer comes.
        s.deliver(2, uplink(Some(0)));
        s.deliver(
            2,
            Input::ShellOutput {
                id: 6,
                proc: 1,
                stream: Stream::Stdout,
                data: b"early\n".to_vec(),
            },
        );
        s.deliver(2, Input::ShellExited { id: 6, status: 0 });
        s.deliver(2, Input::EpilogDone { id: 6 });
        s.run();
        assert_eq!(
            s.sent_up(2),
            vec![vec!["start", "output", "finish", "release"]]
        );
        assert!(s
            .events
            .iter()
            .all(|e| !matches!(e, JobEvent::Started { .. })));
    }

    #[test]
    fn partial_releases_reach_the_job_manager_in_chunks() {
        let mut s = Sim::new(7, 2);
        let ranks = IdSet::range(1, 6);
        s.submit(1, ranks.clone());
        s.each(&ranks, |_| Input::ShellStarted { id: 1 });
        s.each(&ranks, |_| Input::ShellExited { id: 1, status: 0 });
        // Rank 1's subtree (1, 3, 5) finishes its epilogs first.
        s.each(&"1,3,5".parse().unwrap(), |_| Input::EpilogDone { id: 1 });
        assert_eq!(
            s.events.last(),
            Some(&JobEvent::Released {
                id: 1,
                ranks: "1,3,5".parse().unwrap(),
                last: false
            })
        );
        s.each(&"2,4,6".parse().unwrap(), |_| Input::EpilogDone { id: 1 });
        assert_eq!(
            s.events.last(),
            Some(&JobEvent::Released {
                id: 1,
                ranks: "2,4,6".parse().unwrap(),
                last: true
            })
        );
    }

    #[test]
    fn a_barrier_completes_only_when_every_shell_entered_the_same_sequence() {
        let mut s = Sim::new(7, 2);
        let ranks = IdSet::range(1, 6);
        s.submit(3, ranks.clone());
        s.each(&ranks, |_| Input::ShellStarted { id: 3 });
        s.each(&"1-5".parse().unwrap(), |_| Input::ShellBarrier {
            id: 3,
            seq: 1,
        });
        assert!(s.barrier_done.is_empty(), "rank 6 has not entered");
        s.each(&"6".parse().unwrap(), |_| Input::ShellBarrier {
            id: 3,
            seq: 1,
        });
        let mut done: Vec<Rank> = s.barrier_done.iter().map(|b| b.0).collect();
        done.sort();
        assert_eq!(done, vec![1, 2, 3, 4, 5, 6]);
        assert!(s.barrier_done.iter().all(|b| b.1 == 3 && b.2 == 1));
    }

    /// Found by the soak (a barrier job that never ended after it lost a rank): a shell
    /// whose add reaches its daemon after the job's fatal exception passed by, and not along
    /// the exception's way, starts with nothing left to kill it. When its start reaches the
    /// controller, the exception goes to it again.
    #[test]
    fn a_shell_that_starts_after_its_jobs_fatal_exception_is_killed() {
        let mut s = Sim::new(7, 2);
        let ranks = IdSet::range(1, 6);
        s.push(
            0,
            Input::Submit {
                id: 8,
                userid: 1000,
                ranks: ranks.clone(),
                spec: spec(),
            },
        );
        let mut late_add = None;
        while let Some((r, input)) = s.queue.pop_front() {
            match input {
                Input::Down(ExecDown::StateUpdate { .. }) if r == 6 && late_add.is_none() => {
                    late_add = Some(input)
                }
                input => s.deliver(r, input),
            }
        }
        s.each(&IdSet::range(1, 5), |_| Input::ShellStarted { id: 8 });
        s.push(
            0,
            Input::Raise {
                id: 8,
                severity: 0,
                kind: "test".into(),
                note: "fatal".into(),
            },
        );
        s.run();
        assert!(!s.launched.contains(&(6, 8)));
        s.push(6, late_add.expect("rank 6's add"));
        s.run();
        assert!(s.launched.contains(&(6, 8)), "{:?}", s.launched);
        s.each(&IdSet::range(6, 6), |_| Input::ShellStarted { id: 8 });
        assert!(
            s.killed.contains(&(6, 8, 9)),
            "rank 6's late shell was not killed: {:?}",
            s.killed
        );
    }

    /// Found by the simulator (a barrier job and a restarted controller): a daemon that
    /// found it had no shell for a job (its add was lost) raised a fatal exception while its
    /// link up was gone, and it was dropped; the job's other shells waited in the barrier
    /// for good. An exception raised with no parent to take it waits for the new parent's
    /// answer, as output does.
    #[test]
    fn an_exception_raised_while_the_link_up_is_gone_goes_up_once_the_new_parent_answers() {
        let (mut s, _) = job_8_running();
        s.deliver(3, uplink(None));
        s.deliver(
            3,
            Input::LocalFailure {
                id: 8,
                note: "lost".into(),
            },
        );
        s.run();
        let raised = |s: &Sim| {
            s.events
                .iter()
                .filter(|e| matches!(e, JobEvent::Exception { id: 8, note, .. } if note == "lost"))
                .count()
        };
        assert_eq!(raised(&s), 0);
        s.push(3, uplink(Some(1)));
        s.run();
        assert_eq!(raised(&s), 1, "{:?}", s.events);
    }

    /// A fatal exception that comes while the shells launch may find no process to kill
    /// (the real shell signals only the process groups it started): each shell is killed
    /// again as it starts, and then never again, however often the exception comes. A
    /// repeat that names other ranks kills a shell of the job all the same.
    #[test]
    fn a_shell_the_fatal_exception_met_launching_is_killed_as_it_starts_and_only_then() {
        let mut s = Sim::new(7, 2);
        let ranks = IdSet::range(1, 6);
        s.submit(8, ranks.clone());
        let fatal = |idset: IdSet| {
            Input::Down(ExecDown::Exception {
                idset,
                id: 8,
                severity: 0,
                kind: "test".into(),
                note: "fatal".into(),
            })
        };
        s.push(0, fatal(ranks.clone()));
        s.run();
        assert_eq!(
            s.killed.len(),
            6,
            "one kill per launching shell: {:?}",
            s.killed
        );
        // At once, by the daemon itself (the controller would send the exception again
        // only once the start reached it).
        for r in ranks.iter() {
            s.deliver(r, Input::ShellStarted { id: 8 });
        }
        let mut started: Vec<Rank> = s.killed[6..].iter().map(|k| k.0).collect();
        started.sort();
        assert_eq!(started, [1, 2, 3, 4, 5, 6], "{:?}", s.killed);
        s.run();
        s.push(0, fatal(ranks.clone()));
        s.push(2, fatal(IdSet::range(6, 6)));
        s.run();
        assert_eq!(s.killed.len(), 12, "killed again: {:?}", s.killed);

        let mut s = Sim::new(7, 2);
        s.submit(9, ranks.clone());
        s.each(&ranks, |_| Input::ShellStarted { id: 9 });
        s.push(
            2,
            Input::Down(ExecDown::Exception {
                idset: IdSet::range(6, 6),
                id: 9,
                severity: 0,
                kind: "test".into(),
                note: "fatal".into(),
            }),
        );
        s.run();
        assert!(
            s.killed.iter().any(|k| k.0 == 2) && s.killed.iter().any(|k| k.0 == 6),
            "rank 2's first fatal exception named rank 6 alone: {:?}",
            s.killed
        );
    }

    /// A fatal exception lost on its way to rank 6 (its link broke as it passed), and the
    /// controller restarted: the job manager raises the exception it kept again, and it
    /// goes down with the hello answers, so rank 6's shell is killed and the job can end.
    #[test]
    fn a_fatal_exception_kept_across_a_controller_restart_reaches_a_shell_it_missed() {
        let (mut s, ranks) = job_8_running();
        let raise = || Input::Raise {
            id: 8,
            severity: 0,
            kind: "test".into(),
            note: "fatal".into(),
        };
        s.push(0, raise());
        while let Some((r, input)) = s.queue.pop_front() {
            if !(r == 6 && matches!(input, Input::Down(ExecDown::Exception { .. }))) {
                s.deliver(r, input);
            }
        }
        assert!(!s.killed.iter().any(|k| k.0 == 6), "{:?}", s.killed);
        s.restart_controller_raising(vec![(8, 1000, ranks.clone(), spec())], vec![raise()]);
        assert!(s.killed.contains(&(6, 8, 9)), "{:?}", s.killed);
    }

    /// Job 8 running on ranks 1-6 of 7 (radix 2), every shell started.
    fn job_8_running() -> (Sim, IdSet) {
        let mut s = Sim::new(7, 2);
        let ranks = IdSet::range(1, 6);
        s.submit(8, ranks.clone());
        s.each(&ranks, |_| Input::ShellStarted { id: 8 });
        (s, ranks)
    }

    /// Job 3 running on ranks 1-6 of 7 (radix 2), each of whose shells is about to enter
    /// barrier 1 (queued, not handled yet).
    /// Child `child`'s report that its rank entered job 3's barrier `seq`.
    fn barrier_report(child: Rank, seq: u64) -> Input {
        Input::Up {
            link: child.into(),
            req: ExecUp::Barrier {
                id: 3,
                ranks: IdSet::range(child, child),
                seq,
            },
        }
    }

    /// The ranks whose shells left a barrier so far, in order.
    fn left_barrier(s: &Sim) -> Vec<Rank> {
        let mut r: Vec<Rank> = s.barrier_done.iter().map(|b| b.0).collect();
        r.sort();
        r
    }

    fn job_3_entering_barrier_1() -> (Sim, IdSet) {
        let mut s = Sim::new(7, 2);
        let ranks = IdSet::range(1, 6);
        s.submit(3, ranks.clone());
        s.each(&ranks, |_| Input::ShellStarted { id: 3 });
        for r in ranks.iter() {
            s.push(r, Input::ShellBarrier { id: 3, seq: 1 });
        }
        (s, ranks)
    }

    /// Found by the soak (a barrier job that never ended): every shell of a job entered
    /// barrier 1 and the controller died before it handled the reports. The daemons below it
    /// keep a barrier they sent up until its end comes down, and send it again to the new
    /// controller, which completes it: each shell leaves the barrier once.
    #[test]
    fn a_barrier_the_controller_died_gathering_completes_under_the_restarted_one() {
        let (mut s, ranks) = job_3_entering_barrier_1();
        // Everything runs but what reaches the controller: it dies with those reports.
        while let Some(i) = s.queue.iter().position(|(r, _)| *r != 0) {
            let (r, input) = s.queue.remove(i).expect("queued");
            s.deliver(r, input);
        }
        s.queue.clear();
        assert!(s.barrier_done.is_empty(), "{:?}", s.barrier_done);
        s.restart_controller(vec![(3, 1000, ranks.clone(), spec())]);
        let mut done: Vec<Rank> = s.barrier_done.iter().map(|b| b.0).collect();
        done.sort();
        assert_eq!(done, vec![1, 2, 3, 4, 5, 6], "{:?}", s.barrier_done);
        assert!(s.barrier_done.iter().all(|b| b.1 == 3 && b.2 == 1));
    }

    /// The shell answers every local process whatever barrier it waits in: an end reaches
    /// it only for the barrier its processes entered, and once, and a barrier number used
    /// again is a new barrier (its key counts the barriers passed).
    #[test]
    fn a_barrier_end_reaches_a_shell_once_and_only_for_the_barrier_it_waits_in() {
        let (mut s, ranks) = job_3_entering_barrier_1();
        s.run();
        assert_eq!(s.barrier_done.len(), 6, "{:?}", s.barrier_done);
        s.push(
            4,
            Input::Down(ExecDown::BarrierDone {
                idset: IdSet::range(1, 6),
                id: 3,
                seq: barrier_key(1, 1),
            }),
        );
        s.run();
        assert_eq!(
            s.barrier_done.len(),
            6,
            "a second end released rank 4 again"
        );
        let enter_1 = |_| Input::ShellBarrier { id: 3, seq: 1 };
        s.each(&IdSet::range(1, 5), enter_1);
        assert_eq!(
            s.barrier_done.len(),
            6,
            "barrier 1 again ended before rank 6 entered"
        );
        s.each(&IdSet::range(6, 6), enter_1);
        let again: Vec<Rank> = s.barrier_done[6..].iter().map(|b| b.0).collect();
        assert_eq!(
            again.len(),
            6,
            "barrier 1 used again completes again: {again:?}"
        );
        assert!(ranks.iter().all(|r| again.contains(&r)));
        assert!(
            s.barrier_done.iter().all(|b| b.2 == 1),
            "{:?}",
            s.barrier_done
        );
    }

    /// Fatal exceptions held while a daemon has no parent (one per job, at most
    /// `HELD_FATAL`, each cut to `MAX_EXCEPTION_TEXT` at a character) leave the held output
    /// its whole room, and all of it goes up to the next parent.
    #[test]
    fn held_fatal_exceptions_are_cut_to_size_and_leave_the_held_output_its_room() {
        let mut m = JobExec::new(3, false, RadixTree::new(2, 7));
        for id in 0..HELD_FATAL as u64 + 10 {
            m.handle(Input::LocalFailure {
                id,
                note: "é".repeat(MAX_EXCEPTION_TEXT),
            });
        }
        m.handle(Input::ShellOutput {
            id: 99_999,
            proc: 0,
            stream: Stream::Stdout,
            data: vec![b'o'; HELD_OUTPUT],
        });
        m.handle(Input::Uplink {
            link: Some(1),
            version: dvmlab_proto::wire::VERSION,
        });
        let out = m.handle(Input::Down(ExecDown::StateUpdate {
            idset: IdSet::range(3, 3),
            data: Jobs { jobs: vec![] },
            answer: true,
        }));
        let notes: Vec<&String> = out
            .iter()
            .filter_map(|o| match o {
                Output::SendUp(ExecUp::Exception { note, .. }) => Some(note),
                _ => None,
            })
            .collect();
        assert_eq!(notes.len(), HELD_FATAL);
        assert!(notes
            .iter()
            .all(|n| n.len() <= MAX_EXCEPTION_TEXT && n.ends_with("éé…")));
        let output: usize = out
            .iter()
            .filter_map(|o| match o {
                Output::SendUp(ExecUp::Output { data, .. }) => Some(data.len()),
                _ => None,
            })
            .sum();
        assert_eq!(output, HELD_OUTPUT);
    }

    /// An exception from above is cut to size too before it is passed on or kept.
    #[test]
    fn an_exception_from_a_parent_is_passed_on_cut_to_size() {
        let mut s = Sim::new(7, 2);
        let ranks = IdSet::range(1, 6);
        s.submit(3, ranks.clone());
        s.queue.clear();
        s.deliver(
            1,
            Input::Down(ExecDown::Exception {
                idset: ranks,
                id: 3,
                severity: 0,
                kind: "k".repeat(3 * MAX_EXCEPTION_TEXT),
                note: "n".repeat(3 * MAX_EXCEPTION_TEXT),
            }),
        );
        let passed: Vec<(usize, usize)> = s
            .queue
            .iter()
            .filter_map(|(_, i)| match i {
                Input::Down(ExecDown::Exception { kind, note, .. }) => {
                    Some((kind.len(), note.len()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(passed.len(), 2, "to ranks 3 and 5: {:?}", s.queue);
        assert!(passed
            .iter()
            .all(|&(k, n)| k <= MAX_EXCEPTION_TEXT && n <= MAX_EXCEPTION_TEXT));
    }

    /// Found by reading: a barrier's end reached rank 1's subtree and was lost on its way
    /// to rank 2's, then the controller restarted. Rank 1's processes left the barrier and
    /// ended; rank 2 sends the barrier again to the new controller, which kept none. Rank 1
    /// tells it what passed there, and the controller lets rank 2's subtree go.
    #[test]
    fn a_barrier_end_lost_before_a_controller_restart_reaches_the_ranks_still_waiting() {
        let (mut s, ranks) = job_3_entering_barrier_1();
        s.run_losing_barrier_ends_to(2);
        assert_eq!(left_barrier(&s), [1, 3, 5], "rank 2's subtree lost the end");
        s.each(&IdSet::from_iter([1, 3, 5]), |_| Input::ShellExited {
            id: 3,
            status: 0,
        });
        s.restart_controller(vec![(3, 1000, ranks, spec())]);
        assert_eq!(left_barrier(&s), [1, 2, 3, 4, 5, 6], "{:?}", s.barrier_done);
        assert!(s.barrier_done.iter().all(|b| b.1 == 3 && b.2 == 1));
    }

    /// Found in review: a daemon with no ranks of the job passed a barrier's end to one
    /// child and died before the other got it. Restarted, it learns of the job from its
    /// hello's answer with no barrier passed; the child that missed the end sends the
    /// barrier again, the other says it passed it, and the restarted daemon lets the first
    /// go without waiting for the second, which left the barrier long ago.
    #[test]
    fn a_daemon_restarted_between_a_barriers_end_and_a_child_lets_the_waiting_child_go() {
        let ranks = IdSet::from_iter([3, 5]);
        // Either child may say hello first: the barrier is let go as it is gathered, or its
        // report is taken for stale.
        for first in [3, 5] {
            let mut s = Sim::new(7, 2);
            s.submit(3, ranks.clone());
            s.each(&ranks, |_| Input::ShellStarted { id: 3 });
            s.push(3, Input::ShellBarrier { id: 3, seq: 1 });
            s.push(5, Input::ShellBarrier { id: 3, seq: 1 });
            s.run_losing_barrier_ends_to(5);
            assert_eq!(left_barrier(&s), [3], "rank 5's end was lost");
            s.each(&IdSet::range(3, 3), |_| Input::ShellExited {
                id: 3,
                status: 0,
            });
            s.mods[1] = JobExec::new(1, false, s.tree);
            s.push(
                1,
                Input::Children(vec![(3, 3, s.subtree(3)), (5, 5, s.subtree(5))]),
            );
            s.push(1, uplink(Some(0)));
            s.run();
            s.push(first, uplink(Some(1)));
            s.run();
            s.push(8 - first, uplink(Some(1)));
            s.run();
            assert_eq!(
                left_barrier(&s),
                [3, 5],
                "rank {first} first: {:?}",
                s.barrier_done
            );
        }
    }

    /// Found in review: a report of a barrier that already ended here is answered to its
    /// sender alone. A bare number gathered here (from a daemon older than the keys) that
    /// happens to match it is the next barrier, and is not let go.
    #[test]
    fn a_stale_report_is_answered_to_its_sender_and_leaves_a_bare_gather_of_its_number() {
        let (mut s, _) = job_3_entering_barrier_1();
        s.run();
        s.deliver(1, barrier_report(3, 1));
        s.deliver(1, barrier_report(5, barrier_key(1, 1)));
        let ends: Vec<Rank> = s
            .queue
            .iter()
            .filter(|(_, i)| matches!(i, Input::Down(ExecDown::BarrierDone { .. })))
            .map(|(r, _)| *r)
            .collect();
        assert_eq!(ends, [5], "{:?}", s.queue);
    }

    /// A link to a daemon older than the barrier keys (protocol version 5) carries the
    /// numbers as the processes wrote them, both ways: the new side gives them their keys
    /// again, so a barrier gathered across that link completes, and so does the next one of
    /// the same number; each rank leaves each once.
    #[test]
    fn barriers_complete_across_a_link_to_a_daemon_older_than_the_keys() {
        let (mut s, ranks) = job_3_entering_barrier_1();
        let old = BARRIER_KEYS - 1;
        let across = |s: &mut Sim| {
            while let Some((r, input)) = s.queue.pop_front() {
                let input = match input {
                    Input::Up { link: 3, req } if r == 1 => match req.for_version(old) {
                        Some(req) => Input::Up { link: 3, req },
                        None => continue,
                    },
                    Input::Down(msg) if r == 3 => Input::Down(msg.for_version(old)),
                    other => other,
                };
                s.deliver(r, input);
            }
        };
        let left = |s: &Sim, r: Rank| s.barrier_done.iter().filter(|b| b.0 == r).count();
        across(&mut s);
        for r in ranks.iter() {
            assert_eq!(left(&s, r), 1, "rank {r}: {:?}", s.barrier_done);
        }
        for r in ranks.iter() {
            s.push(r, Input::ShellBarrier { id: 3, seq: 1 });
        }
        across(&mut s);
        for r in ranks.iter() {
            assert_eq!(left(&s, r), 2, "rank {r}: {:?}", s.barrier_done);
        }
        assert!(s.barrier_done.iter().all(|b| b.1 == 3 && b.2 == 1));
    }

    /// A child reporting the next barrier proves the one gathered here ended everywhere (its
    /// end was lost on the way here): the local processes leave it, and the next one is
    /// gathered. An older barrier reported while a newer one is gathered is answered with
    /// its end, even by a daemon that never saw that end.
    #[test]
    fn a_report_of_the_next_barrier_ends_the_one_a_daemon_still_gathers() {
        let started = || {
            let mut s = Sim::new(7, 2);
            let ranks = IdSet::range(1, 6);
            s.submit(3, ranks.clone());
            s.each(&ranks, |_| Input::ShellStarted { id: 3 });
            s
        };
        let kids = Sim::new(7, 2).tree.children(1);
        let mut s = started();
        s.deliver(1, Input::ShellBarrier { id: 3, seq: 1 });
        s.deliver(1, barrier_report(kids[0], barrier_key(2, 1)));
        assert_eq!(s.barrier_done, [(1, 3, 1)], "rank 1 left barrier 1");

        let mut s = started();
        s.deliver(1, barrier_report(kids[0], barrier_key(2, 1)));
        s.queue.clear();
        s.deliver(1, barrier_report(kids[1], barrier_key(1, 1)));
        assert!(
            s.queue.iter().any(|(r, i)| *r == kids[1]
                && matches!(i, Input::Down(ExecDown::BarrierDone { seq, .. }) if *seq == barrier_key(1, 1))),
            "{:?}",
            s.queue
        );
    }

    /// Found by the simulator (freezes and a controller restart): a barrier's end was lost
    /// on its way down (rank 3's link to rank 1 broke as it passed). Rank 3, back below rank
    /// 1, sends the barrier again, and rank 1, which passed that end on, answers it at once.
    #[test]
    fn a_barrier_end_lost_below_a_daemon_comes_again_when_its_child_re_links() {
        let (mut s, _) = job_3_entering_barrier_1();
        s.run_losing_barrier_ends_to(3);
        assert_eq!(left_barrier(&s), [1, 2, 4, 5, 6], "rank 3's end was lost");
        s.push(3, uplink(Some(1)));
        s.run();
        assert_eq!(left_barrier(&s), [1, 2, 3, 4, 5, 6], "{:?}", s.barrier_done);
    }

    #[test]
    fn a_fatal_exception_reaches_the_job_manager_at_once_and_kills_every_shell() {
        let mut s = Sim::new(7, 2);
        let ranks = IdSet::range(1, 6);
        s.submit(4, ranks.clone());
        s.each(&ranks, |_| Input::ShellStarted { id: 4 });
        s.push(
            5,
            Input::LocalFailure {
                id: 4,
                note: "boom".into(),
            },
        );
        s.run();
        assert!(
            matches!(&s.events[1], JobEvent::Exception { id: 4, severity: 0, note, .. } if note == "boom")
        );
        let mut killed: Vec<Rank> = s.killed.iter().map(|k| k.0).collect();
        killed.sort();
        assert_eq!(killed, vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(s.mods[0].counters.exception, 1);
    }

    #[test]
    fn a_check_for_a_job_missing_locally_raises_an_exception() {
        let mut s = Sim::new(3, 2);
        s.push(
            0,
            Input::Recovered(vec![(9, 1000, IdSet::range(1, 2), spec())]),
        );
        // Both children say hello again, as after a controller restart; neither runs job 9.
        s.push(1, uplink(Some(0)));
        s.push(2, uplink(Some(0)));
        s.run();
        let exceptions = s
            .events
            .iter()
            .filter(|e| matches!(e, JobEvent::Exception { id: 9, .. }))
            .count();
        assert_eq!(exceptions, 2, "{:?}", s.events);
        assert!(s.launched.is_empty(), "a check never starts a job");
    }

    #[test]
    fn a_local_job_missing_from_the_initial_check_list_is_terminated_and_logged() {
        let mut s = Sim::new(3, 2);
        s.submit(5, IdSet::range(1, 2));
        s.each(&IdSet::range(1, 2), |_| Input::ShellStarted { id: 5 });
        // Rank 2 re-homes to a parent that never heard of job 5.
        s.mods[0] = JobExec::new(0, true, s.tree);
        let kids = vec![(1, 1, IdSet::range(1, 1)), (2, 2, IdSet::range(2, 2))];
        s.push(0, Input::Children(kids));
        s.push(0, Input::Recovered(vec![]));
        s.push(2, uplink(Some(0)));
        s.run();
        assert!(s.killed.contains(&(2, 5, 9)), "{:?}", s.killed);
        assert!(s.logs.iter().any(|(r, l)| *r == 2 && l.contains("job 5")));
    }

    #[test]
    fn a_restarted_controller_recovers_running_jobs_none_lost_none_run_twice() {
        let mut s = Sim::new(7, 2);
        let ranks = IdSet::range(1, 6);
        s.submit(11, ranks.clone());
        s.each(&ranks, |_| Input::ShellStarted { id: 11 });
        s.each(&"1,3".parse().unwrap(), |_| Input::ShellExited {
            id: 11,
            status: 0,
        });
        s.restart_controller(vec![(11, 1000, ranks.clone(), spec())]);
        assert_eq!(s.launched.len(), 6, "nothing launched again");
        assert_eq!(
            s.events,
            vec![JobEvent::Started { id: 11 }],
            "the start is known again"
        );
        s.each(&"2,4,5,6".parse().unwrap(), |_| Input::ShellExited {
            id: 11,
            status: 0,
        });
        assert_eq!(s.events[1], JobEvent::Finished { id: 11, status: 0 });
        s.each(&ranks, |_| Input::EpilogDone { id: 11 });
        assert!(matches!(
            s.events.last(),
            Some(JobEvent::Released { last: true, .. })
        ));
    }

    #[test]
    fn a_restarted_controller_that_ran_part_of_a_job_raises_an_exception_for_its_lost_shell() {
        let mut s = Sim::new(4, 2);
        let ranks = IdSet::range(0, 3);
        s.submit(12, ranks.clone());
        s.each(&ranks, |_| Input::ShellStarted { id: 12 });
        // The controller dies, and its job process with it; the others keep running.
        s.mods[0] = JobExec::new(0, true, s.tree);
        s.events.clear();
        // It recovers (and raises) before any child is back, as a real restart does.
        s.push(0, Input::Recovered(vec![(12, 1000, ranks.clone(), spec())]));
        let kids = vec![(1, 1, s.subtree(1)), (2, 2, s.subtree(2))];
        s.push(0, Input::Children(kids));
        s.push(1, uplink(Some(0)));
        s.push(2, uplink(Some(0)));
        s.run();
        assert!(
            s.events.iter().any(|e| matches!(
                e,
                JobEvent::Exception { id: 12, severity: 0, note, .. } if note.contains("rank 0")
            )),
            "{:?}",
            s.events
        );
        // The fatal exception reaches the surviving shells once their daemons reconnect.
        let mut killed: Vec<Rank> = s.killed.iter().map(|(r, _, _)| *r).collect();
        killed.sort();
        assert_eq!(killed, [1, 2, 3]);
        s.each(&IdSet::range(1, 3), |_| Input::ShellExited {
            id: 12,
            status: 9,
        });
        s.each(&IdSet::range(1, 3), |_| Input::EpilogDone { id: 12 });
        assert!(
            s.events
                .iter()
                .any(|e| matches!(e, JobEvent::Finished { id: 12, status: 9 })),
            "{:?}",
            s.events
        );
        assert!(matches!(
            s.events.last(),
            Some(JobEvent::Released { last: true, .. })
        ));
    }

    #[test]
    fn hello_responses_wait_for_the_upstream_hello() {
        let mut m = JobExec::new(1, false, RadixTree::new(2, 4));
        m.handle(Input::Children(vec![(3, 3, IdSet::range(3, 3))]));
        m.handle(uplink(Some(0)));
        let out = m.handle(Input::Up {
            link: 3,
            req: ExecUp::Hello,
        });
        assert!(
            out.is_empty(),
            "no answer before our own hello is answered: {out:?}"
        );
        let out = m.handle(Input::Down(ExecDown::StateUpdate {
            idset: IdSet::range(1, 3),
            data: Jobs { jobs: vec![] },
            answer: true,
        }));
        assert!(
            out.iter().any(|o| matches!(
                o,
                Output::SendDown {
                    link: 3,
                    msg: ExecDown::StateUpdate { answer: true, .. }
                }
            )),
            "{out:?}"
        );
    }

    #[test]
    fn a_child_speaks_only_for_its_own_subtree() {
        let mut s = Sim::new(7, 2);
        let ranks = IdSet::range(1, 6);
        s.submit(8, ranks.clone());
        // Rank 1 (subtree 1, 3, 5) claims every rank started, and output of process 1,
        // which runs on rank 2.
        s.push(
            0,
            Input::Up {
                link: 1,
                req: ExecUp::Start {
                    id: 8,
                    ranks: ranks.clone(),
                },
            },
        );
        s.push(
            0,
            Input::Up {
                link: 1,
                req: ExecUp::Output {
                    id: 8,
                    proc: 1,
                    stream: Stream::Stdout,
                    data: b"forged\n".to_vec(),
                },
            },
        );
        // And an idset of every possible rank costs no more than the job's own ranks.
        s.push(
            0,
            Input::Up {
                link: 1,
                req: ExecUp::Finish {
                    id: 8,
                    ranks: IdSet::range(0, u32::MAX),
                    status: 0,
                },
            },
        );
        s.run();
        assert!(s.events.is_empty(), "nothing taken: {:?}", s.events);
        assert_eq!(s.logs.len(), 3, "{:?}", s.logs);
        s.each(&"2,4,6".parse().unwrap(), |_| Input::ShellStarted { id: 8 });
        assert_eq!(
            s.events,
            vec![JobEvent::Started { id: 8 }],
            "1, 3, 5 did count"
        );
    }

    #[test]
    fn a_job_whose_shell_died_with_a_restarted_daemon_still_ends_after_a_controller_restart() {
        let mut s = Sim::new(7, 3);
        let ranks = IdSet::range(1, 6);
        s.submit(2, ranks.clone());
        s.each(&ranks, |_| Input::ShellStarted { id: 2 });
        // The controller and rank 2 (parent of rank 5) die and come back.
        s.mods[0] = JobExec::new(0, true, s.tree);
        s.mods[2] = JobExec::new(2, false, s.tree);
        s.events.clear();
        let kids0 = vec![
            (1, 1, s.subtree(1)),
            (2, 2, s.subtree(2)),
            (3, 3, s.subtree(3)),
        ];
        s.push(0, Input::Children(kids0));
        s.push(0, Input::Recovered(vec![(2, 1000, ranks.clone(), spec())]));
        s.push(2, Input::Children(vec![(5, 5, s.subtree(5))]));
        for r in [1, 2, 3] {
            s.push(r, uplink(Some(0)));
        }
        s.push(5, uplink(Some(2)));
        s.run();
        assert!(
            s.events
                .iter()
                .any(|e| matches!(e, JobEvent::Exception { id: 2, .. })),
            "{:?}",
            s.events
        );
        // The fatal exception killed every live shell; they exit and release.
        let live: IdSet = "1,3-6".parse().unwrap();
        s.each(&live, |_| Input::ShellExited { id: 2, status: 9 });
        s.each(&live, |_| Input::EpilogDone { id: 2 });
        job_ended(&s);
    }

    #[test]
    fn a_child_that_rejoins_after_its_parent_reported_is_still_counted() {
        let mut s = Sim::new(7, 3);
        let ranks = IdSet::range(1, 6);
        s.submit(3, ranks.clone());
        s.each(&ranks, |_| Input::ShellStarted { id: 3 });
        // Rank 2 restarts with no children yet; rank 5 (its child) comes back later.
        s.mods[2] = JobExec::new(2, false, s.tree);
        s.push(2, uplink(Some(0)));
        s.run();
        s.push(2, Input::Children(vec![(5, 5, s.subtree(5))]));
        s.push(5, uplink(Some(2)));
        s.run();
        let live: IdSet = "1,3-6".parse().unwrap();
        s.each(&live, |_| Input::ShellExited { id: 3, status: 0 });
        assert!(
            s.events
                .iter()
                .any(|e| matches!(e, JobEvent::Finished { id: 3, .. })),
            "{:?}",
            s.events
        );
        s.each(&live, |_| Input::EpilogDone { id: 3 });
        job_ended(&s);
    }

    /// 0 -> 1, 2; 1 -> 3, 5; 3 -> 7: job 4 runs on rank 7 alone.
    fn job_on_rank_7() -> Sim {
        let mut s = Sim::new(8, 2);
        let on7 = IdSet::range(7, 7);
        s.submit(4, on7.clone());
        s.each(&on7, |_| Input::ShellStarted { id: 4 });
        s
    }

    /// Rank 3 finds rank 7 silent and drops it; the subtrees above shrink to match.
    fn rank_7_cut_off(s: &mut Sim) {
        s.push(3, Input::Children(vec![]));
        let kids = vec![(3, 3, IdSet::range(3, 3)), (5, 5, s.subtree(5))];
        s.push(1, Input::Children(kids));
        let kids = vec![(1, 1, "1,3,5".parse().unwrap()), (2, 2, s.subtree(2))];
        s.push(0, Input::Children(kids));
    }

    /// Rank 7 is cut off, and the controller hears it lost.
    fn rank_7_lost(s: &mut Sim) {
        rank_7_cut_off(s);
        s.push(0, Input::Lost(IdSet::range(7, 7)));
        s.run();
    }

    /// Found end to end (two shrinks at once, one below the other): rank 3 re-links while
    /// rank 7 below it is still on its way to it, re-homing past a daemon that left. The
    /// answer to rank 3's hello names job 4, which runs on rank 7, though no link reaches 7
    /// now: rank 3 keeps the job, and so does rank 7 when it arrives.
    #[test]
    fn a_daemon_that_re_links_ahead_of_a_rank_on_its_way_to_it_keeps_that_ranks_job() {
        let mut s = job_on_rank_7();
        rank_7_cut_off(&mut s);
        s.push(3, uplink(None));
        s.push(3, uplink(Some(1)));
        s.run();
        assert!(s.mods[3].jobs().any(|(id, _)| id == 4), "{:?}", s.logs);
        s.push(3, Input::Children(vec![(7, 7, IdSet::range(7, 7))]));
        s.push(7, uplink(None));
        s.push(7, uplink(Some(3)));
        s.run();
        assert!(s.killed.is_empty(), "{:?} {:?}", s.killed, s.logs);
        no_exception(&s);
        assert!(s.mods[7].jobs().any(|(id, _)| id == 4));
    }

    /// The job manager heard no exception.
    fn no_exception(s: &Sim) {
        assert!(
            !s.events
                .iter()
                .any(|e| matches!(e, JobEvent::Exception { .. })),
            "{:?}",
            s.events
        );
    }

    /// The job manager heard the job's last release.
    fn job_ended(s: &Sim) {
        assert!(
            matches!(s.events.last(), Some(JobEvent::Released { last: true, .. })),
            "{:?}",
            s.events
        );
    }

    /// The job ended and no daemon still connected holds it.
    fn held_nowhere(s: &Sim) {
        job_ended(s);
        // Rank 7 is cut off: what it holds is settled when it says hello again.
        for (r, m) in s.mods.iter().enumerate().filter(|(r, _)| *r != 7) {
            let held: Vec<JobId> = m.jobs().map(|(id, _)| id).collect();
            assert!(
                held.is_empty(),
                "rank {r} still holds {held:?}: {:?}",
                s.logs
            );
        }
    }

    #[test]
    fn the_end_of_a_job_follows_the_links_its_add_went_down_after_its_rank_left_them() {
        let mut s = job_on_rank_7();
        rank_7_lost(&mut s);
        held_nowhere(&s);
    }

    #[test]
    fn the_end_of_a_job_follows_the_links_its_check_went_down() {
        let mut s = job_on_rank_7();
        // Rank 1 restarts: it learns of the job only from its hello's check list, and
        // passes the check on to rank 3.
        s.mods[1] = JobExec::new(1, false, s.tree);
        s.push(
            1,
            Input::Children(vec![(3, 3, s.subtree(3)), (5, 5, s.subtree(5))]),
        );
        s.push(1, uplink(Some(0)));
        s.run();
        rank_7_lost(&mut s);
        held_nowhere(&s);
    }

    #[test]
    fn the_end_of_a_job_follows_a_link_that_heard_of_it_in_a_hello_answer() {
        let mut s = job_on_rank_7();
        // Rank 3's link to rank 1 breaks and comes back: rank 1 names the job in its answer.
        s.push(1, Input::Children(vec![(5, 5, s.subtree(5))]));
        s.run();
        s.push(
            1,
            Input::Children(vec![(3, 3, s.subtree(3)), (5, 5, s.subtree(5))]),
        );
        s.push(3, uplink(Some(1)));
        s.run();
        rank_7_lost(&mut s);
        held_nowhere(&s);
    }

    /// 0 -> 1, 2; 1 -> 3, 5. Job 4 runs on rank 3, whose link to rank 1 breaks and comes
    /// back (as when it re-homes in a shrink, its jobs kept): the link is there, its hello
    /// not yet sent.
    fn rank_3_relinked_with_job_4() -> Sim {
        let mut s = Sim::new(7, 2);
        let on3 = IdSet::range(3, 3);
        s.submit(4, on3.clone());
        s.each(&on3, |_| Input::ShellStarted { id: 4 });
        s.push(1, Input::Children(vec![(5, 5, s.subtree(5))]));
        s.run();
        s.push(
            1,
            Input::Children(vec![(3, 3, s.subtree(3)), (5, 5, s.subtree(5))]),
        );
        s.run();
        s
    }

    #[test]
    fn an_add_that_meets_a_childs_hello_on_the_way_runs_and_kills_nothing() {
        let mut s = rank_3_relinked_with_job_4();
        let hello = s.mods[3].handle(uplink(Some(1)));
        assert_eq!(hello, vec![Output::SendUp(ExecUp::Hello)]);
        // Job 6's add passes rank 1 while the hello travels.
        let on3 = IdSet::range(3, 3);
        s.submit(6, on3.clone());
        assert!(s.launched.contains(&(3, 6)), "{:?}", s.launched);
        s.push(
            1,
            Input::Up {
                link: 3,
                req: ExecUp::Hello,
            },
        );
        s.run();
        s.each(&on3, |_| Input::ShellStarted { id: 6 });
        none_killed_and_each_ends_well(&mut s, &on3, [4, 6]);
        assert_eq!(s.launched.len(), 2, "{:?}", s.launched);
    }

    /// Nothing was killed or logged, and each of `jobs` (running on `ranks`) finishes with
    /// status 0 and no exception once its shells exit.
    fn none_killed_and_each_ends_well(s: &mut Sim, ranks: &IdSet, jobs: [JobId; 2]) {
        assert!(s.killed.is_empty(), "{:?} {:?}", s.killed, s.logs);
        assert!(s.logs.is_empty(), "{:?}", s.logs);
        for id in jobs {
            s.each(ranks, |_| Input::ShellExited { id, status: 0 });
            s.each(ranks, |_| Input::EpilogDone { id });
            assert!(
                s.events.contains(&JobEvent::Finished { id, status: 0 }),
                "{:?}",
                s.events
            );
        }
        no_exception(s);
    }

    #[test]
    fn a_child_takes_an_unmarked_state_update_for_the_answer_only_under_an_older_parent() {
        let unmarked = || {
            Input::Down(ExecDown::StateUpdate {
                idset: IdSet::range(3, 3),
                data: Jobs {
                    jobs: vec![JobTuple(4, 1000, UpdateType::Check, IdSet::range(3, 3))],
                },
                answer: false,
            })
        };
        // The check of job 4 is the whole answer: rank 3 tells its new parent job 4 started.
        let started = Output::SendUp(ExecUp::Start {
            id: 4,
            ranks: IdSet::range(3, 3),
        });
        let mut s = rank_3_relinked_with_job_4();
        let old = Input::Uplink {
            link: Some(1),
            version: ANSWER_MARKED - 1,
        };
        s.mods[3].handle(old);
        assert_eq!(s.mods[3].handle(unmarked()), vec![started.clone()]);

        let mut s = rank_3_relinked_with_job_4();
        s.mods[3].handle(uplink(Some(1)));
        assert_eq!(s.mods[3].handle(unmarked()), vec![]);
    }

    #[test]
    fn checks_a_waiting_parent_passes_on_from_its_answer_make_no_strays_below() {
        // 0 -> 1, 2; 1 -> 3, 5. Jobs 10 and 11 run on rank 3.
        let mut s = Sim::new(7, 2);
        let on3 = IdSet::range(3, 3);
        for id in [10, 11] {
            s.submit(id, on3.clone());
            s.each(&on3, |_| Input::ShellStarted { id });
        }
        // Ranks 1 and 3 both re-link, rank 1's answer on its way before rank 3's hello: rank
        // 1 passes its checks on one job at a time, and they reach rank 3 before its answer.
        s.push(1, uplink(Some(0)));
        s.step();
        s.step();
        s.deliver(3, uplink(Some(1)));
        s.run();
        none_killed_and_each_ends_well(&mut s, &on3, [10, 11]);
    }

    /// 0 -> 1, 2; 1 -> 3, 5; 3 -> 7: job 4, for rank 7 alone, is submitted and the first
    /// `steps` inputs that follow are handled.
    fn job_4_for_rank_7_after(steps: usize) -> Sim {
        let mut s = Sim::new(8, 2);
        s.push(
            0,
            Input::Submit {
                id: 4,
                userid: 1000,
                ranks: IdSet::range(7, 7),
                spec: spec(),
            },
        );
        for _ in 0..steps {
            s.step();
        }
        s
    }

    #[test]
    fn the_end_of_a_job_follows_the_links_only_its_data_went_down() {
        // The controller sends the job's data and its add; rank 1 passes the data on to
        // rank 3.
        let mut s = job_4_for_rank_7_after(2);
        let on7 = IdSet::range(7, 7);
        // Rank 3 finds rank 7 silent before it reads the data and before rank 1 reads the
        // add, which then reaches no child: rank 3 holds the data of a job it never hears
        // of.
        s.deliver(3, Input::Children(vec![]));
        let kids = vec![(3, 3, IdSet::range(3, 3)), (5, 5, s.subtree(5))];
        s.deliver(1, Input::Children(kids));
        s.run();
        assert!(s.mods[3].infos.contains_key(&4));
        assert!(!s.mods[3].jobs.contains_key(&4));
        s.push(0, Input::Lost(on7));
        s.run();
        job_ended(&s);
        for (r, m) in s.mods.iter().enumerate() {
            assert!(m.jobs.is_empty() && m.infos.is_empty(), "rank {r}");
            assert!(m.info_down.is_empty(), "rank {r}: {:?}", m.info_down);
        }
    }

    #[test]
    fn an_add_without_its_data_fails_the_job_and_the_job_still_ends() {
        // 0 -> 1, 2. Job 9 is for rank 2 alone, whose copy of the job's data is lost.
        let mut s = Sim::new(3, 2);
        s.push(
            0,
            Input::Submit {
                id: 9,
                userid: 1000,
                ranks: IdSet::range(2, 2),
                spec: spec(),
            },
        );
        s.step();
        assert!(matches!(
            s.queue.pop_front(),
            Some((2, Input::Down(ExecDown::JobInfo { .. })))
        ));
        s.run();
        assert!(s.launched.is_empty(), "{:?}", s.launched);
        assert!(
            s.events.iter().any(|e| matches!(
                e,
                JobEvent::Exception { note, .. } if note.contains("no job data")
            )),
            "{:?}",
            s.events
        );
        job_ended(&s);
    }

    #[test]
    fn a_daemon_cut_off_with_only_a_jobs_data_drops_it_when_it_rejoins() {
        // The data and the add reach rank 3, which passes the data on to rank 7 and then
        // finds rank 7 silent before it reads the add.
        let mut s = job_4_for_rank_7_after(4);
        s.deliver(3, Input::Children(vec![]));
        s.run();
        assert!(s.mods[7].infos.contains_key(&4));
        rank_7_lost(&mut s);
        held_nowhere(&s);
        // Rank 7 comes back below rank 3: the answer to its hello no longer names job 4.
        s.deliver(3, Input::Children(vec![(7, 7, IdSet::range(7, 7))]));
        s.deliver(7, uplink(Some(3)));
        s.run();
        assert!(s.mods[7].infos.is_empty(), "{:?}", s.mods[7].infos.keys());
        assert!(s.mods[7].stale_data.is_empty());
    }

    #[test]
    fn a_daemon_below_one_that_rejoins_drops_the_data_of_a_job_that_ended_meanwhile() {
        // Rank 3 passed job 4's data on to rank 7, then was cut off from rank 1 before the
        // add reached it (the add is lost with the link); rank 7 stays below rank 3.
        let mut s = job_4_for_rank_7_after(4);
        let add = s.queue.pop_front();
        assert!(matches!(
            add,
            Some((3, Input::Down(ExecDown::StateUpdate { .. })))
        ));
        s.deliver(1, Input::Children(vec![(5, 5, s.subtree(5))]));
        s.deliver(3, uplink(None));
        s.run();
        assert!(s.mods[7].infos.contains_key(&4));
        // The controller hears ranks 3 and 7 lost: the job ends without them.
        s.push(0, Input::Lost("3,7".parse().unwrap()));
        s.run();
        job_ended(&s);
        // Rank 3 is back below rank 1: the answer to its hello no longer names job 4, so it
        // drops the data, and so must rank 7, which got it from rank 3 and hears of the
        // job from nobody else.
        let kids = vec![(3, 3, s.subtree(3)), (5, 5, s.subtree(5))];
        s.deliver(1, Input::Children(kids));
        s.deliver(3, uplink(Some(1)));
        s.run();
        for r in [3, 7] {
            let m = &s.mods[r];
            assert!(m.infos.is_empty(), "rank {r}: {:?}", m.infos.keys());
            assert!(m.info_down.is_empty(), "rank {r}: {:?}", m.info_down);
        }
        assert!(s.killed.is_empty(), "{:?}", s.killed);
    }

    #[test]
    fn a_child_waiting_for_its_answer_gets_it_before_the_remove_of_stale_data() {
        // As above, but rank 7's hello to rank 3 waits for rank 3's own answer: rank 7 must
        // be answered before it hears the remove (a child of version 4 takes the first
        // state-update it gets for its answer, and would kill every job it runs).
        let mut s = job_4_for_rank_7_after(4);
        let add = s.queue.pop_front();
        assert!(matches!(
            add,
            Some((3, Input::Down(ExecDown::StateUpdate { .. })))
        ));
        s.deliver(1, Input::Children(vec![(5, 5, s.subtree(5))]));
        s.deliver(3, uplink(None));
        s.push(0, Input::Lost("3,7".parse().unwrap()));
        s.run();
        job_ended(&s);
        s.deliver(7, uplink(Some(3)));
        s.run();
        let kids = vec![(3, 3, s.subtree(3)), (5, 5, s.subtree(5))];
        s.deliver(1, Input::Children(kids));
        s.deliver(3, uplink(Some(1)));
        let mut to_7 = vec![];
        while let Some((r, input)) = s.queue.pop_front() {
            match (r, input) {
                (7, Input::Down(ExecDown::StateUpdate { data, answer, .. })) => {
                    to_7.push((answer, data.jobs.iter().any(|t| t.2 == UpdateType::Remove)))
                }
                (r, input) => s.deliver(r, input),
            }
        }
        assert_eq!(to_7, [(true, false), (false, true)], "answer, then remove");
    }

    #[test]
    fn a_strays_end_follows_the_links_of_a_child_whose_hello_waited() {
        // 0 -> 1, 2; 1 -> 3, 5; 3 -> 7, 11; 7 -> 15: job 4 runs on ranks 11 and 15. Rank 7
        // finds rank 15 silent (rank 3 still sent the job down to rank 7). Rank 1 loses its
        // link up, rank 3's hello to it waits, and the job ends without ranks 1 to 15. Back,
        // rank 1 terminates it as a stray: the end must reach rank 7 through rank 3.
        let mut s = Sim::new(16, 2);
        let ranks: IdSet = "11,15".parse().unwrap();
        s.submit(4, ranks.clone());
        s.each(&ranks, |_| Input::ShellStarted { id: 4 });
        s.deliver(7, Input::Children(vec![]));
        let kids = vec![(7, 7, IdSet::range(7, 7)), (11, 11, IdSet::range(11, 11))];
        s.deliver(3, Input::Children(kids));
        s.deliver(0, Input::Children(vec![(2, 2, s.subtree(2))]));
        s.deliver(1, uplink(None));
        s.deliver(3, uplink(None));
        s.deliver(3, uplink(Some(1)));
        s.run();
        s.push(0, Input::Lost("1,3,5,7,11,15".parse().unwrap()));
        s.run();
        job_ended(&s);
        let kids = vec![(1, 1, s.subtree(1)), (2, 2, s.subtree(2))];
        s.deliver(0, Input::Children(kids));
        s.deliver(1, uplink(Some(0)));
        s.run();
        for r in [1, 3, 7, 11] {
            let held: Vec<JobId> = s.mods[r].jobs().map(|(id, _)| id).collect();
            assert!(
                held.is_empty(),
                "rank {r} still holds {held:?}: {:?}",
                s.logs
            );
        }
    }

    /// Rank 1 re-links to the controller and everything settles: `rank` still runs `jobs`,
    /// none of them killed.
    fn rank_1_back_and_rank_keeps(s: &mut Sim, rank: Rank, jobs: [JobId; 2]) {
        let kids = vec![(1, 1, s.subtree(1)), (2, 2, s.subtree(2))];
        s.deliver(0, Input::Children(kids));
        s.deliver(1, uplink(Some(0)));
        s.run();
        for id in jobs {
            let killed = s.killed.iter().any(|(r, j, _)| (*r, *j) == (rank, id));
            assert!(!killed, "job {id} killed on rank {rank}: {:?}", s.logs);
            let held = s.mods[rank as usize].jobs().any(|(j, _)| j == id);
            assert!(held, "rank {rank} lost job {id}: {:?}", s.logs);
        }
    }

    #[test]
    fn a_waiting_child_under_a_version_4_parent_gets_its_answer_first_and_keeps_its_jobs() {
        // 0 -> 1, 2; 1 -> 3, 5; 3 -> 7: job 4 runs on rank 7, jobs 6 and 8 on rank 3. Rank
        // 1 loses its link up; rank 3 re-links to it over a link of version 4 (it takes the
        // first state-update it gets for its answer), and its hello waits. Job 4 ends
        // without rank 7; back, rank 1 terminates it as a stray and applies its answer
        // (checks of jobs 6 and 8): jobs 6 and 8 must live on at rank 3, whatever rank 1
        // passes on of its own answer.
        let mut s = Sim::new(8, 2);
        s.submit(4, IdSet::range(7, 7));
        s.submit(6, IdSet::range(3, 3));
        s.submit(8, IdSet::range(3, 3));
        s.run();
        s.each(&IdSet::range(7, 7), |_| Input::ShellStarted { id: 4 });
        s.each(&IdSet::range(3, 3), |_| Input::ShellStarted { id: 6 });
        s.each(&IdSet::range(3, 3), |_| Input::ShellStarted { id: 8 });
        s.deliver(0, Input::Children(vec![(2, 2, s.subtree(2))]));
        s.deliver(1, uplink(None));
        s.deliver(3, uplink(None));
        let old = Input::Uplink {
            link: Some(1),
            version: ANSWER_MARKED - 1,
        };
        s.deliver(3, old);
        s.run();
        s.push(0, Input::Lost(IdSet::range(7, 7)));
        s.run();
        rank_1_back_and_rank_keeps(&mut s, 3, [6, 8]);
        assert!(
            s.killed.iter().any(|(r, id, _)| (*r, *id) == (7, 4)),
            "{:?}",
            s.killed
        );
    }

    #[test]
    fn a_remove_in_an_answer_reaches_a_waiting_child_inside_its_own_answer() {
        // 0 -> 1, 2; 1 -> 3, 5; 3 -> 7, 11; 7 -> 15. Job 4 runs on rank 15, jobs 10 and 12
        // on rank 7. Rank 1 loses its link up, and job 4 ends without rank 15. Ranks 3 and 7
        // re-link, rank 7 to rank 3 over a link of version 4, each hello waiting for the
        // answer above it. Back, rank 1 terminates job 4 as a stray: rank 3's answer carries
        // its remove, which rank 3 must not pass on to rank 7 alone ahead of rank 7's answer.
        let mut s = Sim::new(16, 2);
        s.submit(4, IdSet::range(15, 15));
        s.each(&IdSet::range(15, 15), |_| Input::ShellStarted { id: 4 });
        let on7 = IdSet::range(7, 7);
        for id in [10, 12] {
            s.submit(id, on7.clone());
            s.each(&on7, |_| Input::ShellStarted { id });
        }
        s.deliver(0, Input::Children(vec![(2, 2, s.subtree(2))]));
        s.deliver(1, uplink(None));
        s.push(0, Input::Lost(IdSet::range(15, 15)));
        s.run();
        s.deliver(3, uplink(None));
        s.deliver(3, uplink(Some(1)));
        s.deliver(7, uplink(None));
        let old = Input::Uplink {
            link: Some(3),
            version: ANSWER_MARKED - 1,
        };
        s.deliver(7, old);
        s.run();
        rank_1_back_and_rank_keeps(&mut s, 7, [10, 12]);
        for r in [1, 3, 7] {
            assert!(
                !s.mods[r].jobs().any(|(id, _)| id == 4),
                "rank {r}: {:?}",
                s.logs
            );
        }
    }

    #[test]
    fn data_a_new_parent_sends_again_before_its_answer_is_kept() {
        let mut s = job_4_for_rank_7_after(4);
        // Rank 3 has the data, its add waits; rank 7 reads the data, then its link to
        // rank 3 comes back. Rank 3 sends the data again with its answer.
        let add = s.queue.pop_front();
        assert!(matches!(
            add,
            Some((3, Input::Down(ExecDown::StateUpdate { .. })))
        ));
        s.step();
        s.deliver(7, uplink(Some(3)));
        s.run();
        assert!(s.mods[7].infos.contains_key(&4));
        let (r, input) = add.expect("rank 3's add was queued");
        s.deliver(r, input);
        s.run();
        launched_on_7_and_nothing_failed(&s);
    }

    /// Job 4 started on rank 7, and the job manager heard nothing (no exception).
    fn launched_on_7_and_nothing_failed(s: &Sim) {
        assert!(
            s.launched.contains(&(7, 4)),
            "{:?} {:?}",
            s.launched,
            s.events
        );
        assert!(s.events.is_empty(), "{:?}", s.events);
    }

    #[test]
    fn under_an_older_parent_a_rejoining_daemon_keeps_the_data_it_had() {
        let mut s = job_4_for_rank_7_after(4);
        // Rank 3 has job 4's data, its add waits; rank 7 reads the data, then its link to
        // rank 3, now of version 4, comes back. Job 6's data and add pass rank 3 before
        // rank 7's hello: under that parent, the add is taken for the answer.
        let add = s.queue.pop_front().expect("rank 3's add was queued");
        s.step();
        let old = Input::Uplink {
            link: Some(3),
            version: ANSWER_MARKED - 1,
        };
        s.deliver(7, old);
        let hello = s.queue.pop_back().expect("rank 7's hello was queued");
        s.submit(6, IdSet::range(7, 7));
        s.deliver(add.0, add.1);
        s.deliver(hello.0, hello.1);
        s.run();
        launched_on_7_and_nothing_failed(&s);
    }
}
