//! One daemon, whole: the overlay ([`Node`]: links, routes, formation, liveness, ping, stop),
//! the job-exec module ([`JobExec`]) and, on the controller, the job manager
//! ([`JobManager`]), composed here and nowhere else. The tokio shell feeds it inputs and
//! carries out its outputs and does nothing else; the simulator drives many of them over an
//! in-memory network.
//!
//! Sans-IO: time comes in as an argument ([`Now`]), effects go out as [`Output`]s.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use crate::campaign::{self, Campaigns};
use crate::event::hub::{self, EventHub};
use crate::event::interest::Up;
use crate::exec::{self, Counters, JobExec, JobId, ShellCommand};
use crate::held_removes::HeldRemoves;
use crate::jobs::{self, JobManager, Saved};
use crate::overlay::{self, Io, LinkId, Node, NodeConfig, Note};
use crate::tree::Rank;
use dvmlab_proto::event::{
    job_nspace, Audience, Event, Info, Level, Travelling, ALLOC_ID, ALLOC_REQ_ID, ERR_PROC_ABORTED,
    EVENT_JOB_END, EVENT_NODE_DOWN, EVENT_PROC_TERMINATED, JOB_TERM_STATUS,
};
use dvmlab_proto::idset::IdSet;
use dvmlab_proto::wire::{
    DaemonMsg, Directive, Frame, ToolReply, ToolRequest, Wireup, EVENT_INTEREST, MIN_VERSION,
};

/// The current time: monotonic for timers and liveness, wall-clock for what is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Now {
    pub mono: Duration,
    pub unix_ms: u64,
}

/// Something that happened to the daemon.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Links, frames, tool requests and the overlay's timers (see [`overlay::Input`]).
    Net(overlay::Input),
    /// The local job shells: started, barrier entered, output, exited, epilog done, failure.
    Shell(exec::Input),
    /// A job's time limit is up.
    JobLimit(JobId),
    /// Controller: the launch agent of new daemon `rank` exited with this wait status.
    LaunchExited { rank: Rank, status: i32 },
    /// Controller: release component `component` finished with a shrink's hosts.
    ReleaseDone {
        campaign: campaign::CampaignId,
        component: usize,
    },
    /// Controller: a campaign's time is up.
    CampaignTimeout(campaign::CampaignId),
    /// Controller: the hosts of grow request `token` were checked; why each that cannot
    /// be reached is unknown (empty: all resolve).
    HostsChecked { token: u64, unknown: Vec<String> },
    /// Controller: the hold on the jobs' `remove`s ran out (see [`HeldRemoves`]).
    RemovesDue,
}

/// Most grow requests whose hosts are being checked at once; more are refused.
pub const MAX_CHECKING: usize = 64;

/// A timer the core asks for; it comes back as an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timer {
    Net(overlay::Timer),
    JobLimit(JobId),
    Campaign(campaign::CampaignId),
    /// The hold on a job's start report (comes back as `exec::Input::StartDue`).
    StartHold(JobId),
    /// Controller: the hold on the `remove`s of jobs that ended (comes back as
    /// [`Input::RemovesDue`]).
    RemoveHold,
}

/// Something for the shell to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Connect, send, close, log a note, exit.
    Net(Io),
    /// Start, signal or release the local job processes.
    Shell(ShellCommand),
    SetTimer {
        timer: Timer,
        delay: Duration,
    },
    /// A timer set earlier is not needed any more. Only [`Timer::StartHold`]s (a job's start
    /// usually goes up with its finish, long before the hold runs out, and a wakeup per job
    /// for nothing would cost what the hold saves) and [`Timer::JobLimit`]s (a job that ended
    /// before its limit: the shell would keep an entry per job until each limit passed) are
    /// cancelled.
    CancelTimer(Timer),
    /// Controller: keep this list of live jobs where a restarted controller finds it.
    Persist(Saved),
    /// Worth an error line in the log.
    Log(String),
    /// Controller: job `id` entered `state` (PRRTE's number `code`), for the verbose log.
    JobState {
        id: JobId,
        state: &'static str,
        code: u32,
    },
    /// Controller: start a daemon of `rank` on `host` through the launch agent; it joins
    /// with `membership` (report its agent's exit as [`Input::LaunchExited`]).
    Launch {
        rank: Rank,
        host: String,
        membership: Wireup,
    },
    /// Controller: stop what the launch of `rank` left running.
    KillLaunch {
        rank: Rank,
    },
    /// Controller: offer release component `component` (`name`) the hosts a shrink freed;
    /// answer with [`Input::ReleaseDone`].
    Release {
        campaign: campaign::CampaignId,
        component: usize,
        name: String,
        hosts: Vec<String>,
    },
    /// Worth an informational line in the log.
    Info(String),
    /// Controller: the membership beyond `prte.conf`, to be kept where a restarted
    /// controller finds it ([`crate::roster::Roster::settled`]).
    PersistMembership(Wireup),
    /// Controller: check that the new hosts of grow request `token` resolve here, as the
    /// launch agent will need them to (answer with [`Input::HostsChecked`]). An unknown
    /// host is a phase-one rejection, not a failed launch.
    CheckHosts {
        token: u64,
        hosts: Vec<String>,
    },
}

enum Work {
    Node(overlay::Input),
    Exec(exec::Input),
    Mgr(jobs::Input),
    Event(hub::Input),
    Camp(campaign::Input),
}

/// See the module documentation.
#[derive(Debug)]
pub struct DaemonCore {
    node: Node,
    exec: JobExec,
    mgr: Option<JobManager>,
    /// The controller in elastic mode: grows and shrinks in progress.
    campaigns: Option<Campaigns>,
    /// The settled membership last given to the shell to keep.
    kept_membership: Option<Wireup>,
    /// Controller: grow requests waiting for their hosts' check, by token (at most
    /// [`MAX_CHECKING`]).
    checking: BTreeMap<u64, (LinkId, ToolRequest)>,
    next_check: u64,
    /// PMIx events: the clients of this node, and events over the tree.
    events: EventHub,
    /// The DVM's namespace (jobs' namespaces derive from it).
    nspace: String,
    /// The link job-exec's upward messages go on.
    up: Option<LinkId>,
    formed_at_unix_ms: Option<u64>,
    /// Local jobs this daemon was told to end (KILL or TERM): their processes' deaths are the
    /// runtime's doing, not failures to announce (a killed job of N processes would otherwise
    /// send N events to N processes each).
    signalled: BTreeSet<JobId>,
    /// Controller: the `remove`s of jobs that ended, held to go with the next frame on their
    /// link.
    held: HeldRemoves,
    out: Vec<Output>,
}

impl DaemonCore {
    /// A daemon of `cfg`, keeping the last `event_ring` environment events. The controller
    /// is given the live jobs its previous life kept (`Some(vec![])` on a fresh start);
    /// other daemons `None`.
    pub fn new(cfg: NodeConfig, recovered: Option<Saved>, event_ring: usize) -> DaemonCore {
        let me = cfg.identity.rank;
        let tree = cfg.tree;
        let controller = recovered.is_some();
        let nspace = cfg.identity.nspace.clone();
        let mut core = DaemonCore {
            events: EventHub::new(me, event_ring),
            nspace,
            node: Node::new(cfg),
            exec: JobExec::new(me, controller, tree),
            mgr: None,
            campaigns: None,
            kept_membership: None,
            checking: BTreeMap::new(),
            next_check: 0,
            up: None,
            formed_at_unix_ms: None,
            signalled: BTreeSet::new(),
            held: HeldRemoves::default(),
            out: Vec::new(),
        };
        if let Some(live) = recovered {
            let (mgr, first) = JobManager::new(live);
            core.mgr = Some(mgr);
            let mut work = VecDeque::new();
            for o in first {
                core.mgr_output(o, &mut work);
            }
            core.run(Now::default(), work);
        }
        core
    }

    pub fn rank(&self) -> Rank {
        self.node.rank()
    }

    /// Controller: makes the DVM elastic (`Some`: how campaigns run) and limits how many
    /// jobs launch at once. Without elastic mode, grow and shrink requests are refused.
    pub fn configure_controller(
        &mut self,
        elastic: Option<campaign::Config>,
        max_launching: Option<usize>,
    ) {
        if let Some(m) = self.mgr.as_mut() {
            if let Some(n) = max_launching {
                m.set_max_launching(n);
            }
            m.set_fault(elastic.as_ref().and_then(|c| c.fault));
            self.campaigns = elastic.map(Campaigns::new);
        }
    }

    /// How long a daemon below the controller may hold a job's start report back (see
    /// [`JobExec::set_start_hold`]).
    pub fn set_start_hold(&mut self, hold: Duration) {
        self.exec.set_start_hold(hold);
    }

    /// Controller: how long a job's `remove` may wait for the next frame on its link (see
    /// [`HeldRemoves`]; zero: not at all).
    pub fn set_remove_hold(&mut self, hold: Duration) {
        if self.mgr.is_some() {
            self.held = HeldRemoves::new(hold);
        }
    }

    /// The overlay (membership, routes, formation), for status and invariants.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Job ids job-exec tracks on this daemon, with their ranks.
    pub fn jobs(&self) -> impl Iterator<Item = (JobId, &dvmlab_proto::idset::IdSet)> {
        self.exec.jobs()
    }

    /// Jobs whose data (what they run) this daemon holds, added here or not.
    pub fn job_data(&self) -> impl Iterator<Item = JobId> + '_ {
        self.exec.job_data()
    }

    /// Upward job-exec messages this daemon received, by kind.
    pub fn counters(&self) -> Counters {
        self.exec.counters.clone()
    }

    /// Feeds one input at `now`; returns what to do.
    pub fn handle(&mut self, now: Now, input: Input) -> Vec<Output> {
        let first = match input {
            Input::Net(i) => Work::Node(i),
            Input::Shell(exec::Input::ProcExited { id, proc, status }) => {
                self.proc_exited(now, id, proc, status);
                return self.finish();
            }
            Input::Shell(i) => Work::Exec(i),
            Input::JobLimit(id) => Work::Mgr(jobs::Input::TimeLimit(id)),
            Input::LaunchExited { rank, status } => {
                Work::Camp(campaign::Input::LaunchExited { rank, status })
            }
            Input::ReleaseDone {
                campaign,
                component,
            } => Work::Camp(campaign::Input::ReleaseDone {
                campaign,
                component,
            }),
            Input::CampaignTimeout(id) => Work::Camp(campaign::Input::Timeout(id)),
            // Sent as they are: `finish` would hold them again.
            Input::RemovesDue => return self.held.due(),
            Input::HostsChecked { token, unknown } => {
                let Some((link, req)) = self.checking.remove(&token) else {
                    return Vec::new();
                };
                let mut work = VecDeque::new();
                if unknown.is_empty() {
                    self.elastic_accept(link, req, &mut work);
                } else {
                    let reply = ToolReply::Error {
                        message: format!("unknown host: {}", unknown.join("; ")),
                    };
                    work.push_back(Work::Node(overlay::Input::Reply { link, reply }));
                }
                self.run(now, work);
                return self.finish();
            }
        };
        self.run(now, VecDeque::from([first]));
        self.finish()
    }

    /// What the input led to, with the `remove`s held or sent as their hold says.
    fn finish(&mut self) -> Vec<Output> {
        let out = std::mem::take(&mut self.out);
        self.held.pass(out)
    }

    /// The controller's status: the overlay's view, when it formed, and the job counters.
    pub fn status(&self) -> dvmlab_proto::contract::StatusReport {
        let mut s = self.node.status();
        s.formed_at_unix_ms = self.formed_at_unix_ms;
        s.job_messages = Some(self.counters());
        if let Some(c) = &self.campaigns {
            s.elastic = true;
            s.campaigns = c
                .in_progress()
                .map(
                    |(id, kind, targets, done, alloc)| dvmlab_proto::contract::CampaignStatus {
                        id,
                        kind: match kind {
                            campaign::Kind::Grow => "grow".into(),
                            campaign::Kind::Shrink => "shrink".into(),
                        },
                        targets: targets.iter().collect(),
                        done: done.iter().collect(),
                        alloc_id: alloc.to_string(),
                    },
                )
                .collect();
        }
        s
    }

    /// Runs `work` and everything it leads to, in order, to quiescence.
    fn run(&mut self, now: Now, mut work: VecDeque<Work>) {
        while let Some(w) = work.pop_front() {
            match w {
                Work::Node(i) => {
                    for o in self.node.handle(now.mono, i) {
                        self.node_output(now, o, &mut work);
                    }
                }
                Work::Exec(i) => {
                    if let exec::Input::Uplink { link, .. } = &i {
                        self.up = *link;
                    }
                    for o in self.exec.handle(i) {
                        self.exec_output(now, o, &mut work);
                    }
                }
                Work::Mgr(i) => {
                    let Some(m) = self.mgr.as_mut() else { continue };
                    for o in m.handle(self.node.roster(), i) {
                        self.mgr_output(o, &mut work);
                    }
                }
                Work::Event(i) => {
                    for o in self.events.handle(i) {
                        self.event_output(o);
                    }
                }
                Work::Camp(i) => {
                    let (Some(c), Some(m)) = (self.campaigns.as_mut(), self.mgr.as_mut()) else {
                        continue;
                    };
                    let step = crate::elastic::step(c, self.node.roster_mut(), m, i);
                    if self.node.roster().formed() != self.node.formed() {
                        work.push_back(Work::Node(overlay::Input::RosterChanged));
                    }
                    let settled = self.node.roster().settled();
                    if self.kept_membership.as_ref() != Some(&settled) {
                        self.kept_membership = Some(settled.clone());
                        self.out.push(Output::PersistMembership(settled));
                    }
                    for o in step.jobs {
                        self.mgr_output(o, &mut work);
                    }
                    for o in step.campaign {
                        self.camp_output(o, &mut work);
                    }
                }
            }
        }
    }

    fn node_output(&mut self, now: Now, o: overlay::Output, work: &mut VecDeque<Work>) {
        let out = match o {
            overlay::Output::Io(io) => {
                match &io {
                    Io::Note(Note::DvmReady { .. }) => self.formed_at_unix_ms = Some(now.unix_ms),
                    Io::Note(Note::DvmIncomplete { .. }) => self.formed_at_unix_ms = None,
                    // The controller began to stop the DVM: every size change in progress
                    // fails and every held job ends.
                    Io::Note(Note::JobState {
                        state: "TERMINATING",
                    }) if self.campaigns.is_some() => {
                        work.push_back(Work::Camp(campaign::Input::Teardown))
                    }
                    _ => {}
                }
                Output::Net(io)
            }
            overlay::Output::SetTimer { timer, delay } => Output::SetTimer {
                timer: Timer::Net(timer),
                delay,
            },
            overlay::Output::Exec(exec::Input::Lost(ranks)) if self.campaigns.is_some() => {
                // The campaign core tells a departure or a failed launch from a daemon loss.
                return work.push_back(Work::Camp(campaign::Input::Lost(ranks)));
            }
            overlay::Output::Exec(i) => {
                match &i {
                    exec::Input::Lost(ranks) => self.nodes_down(ranks, work),
                    exec::Input::Uplink { link, version } => {
                        let up = match link {
                            None => Up::Gone,
                            Some(_) if *version >= EVENT_INTEREST => Up::Reads,
                            Some(_) => Up::Older,
                        };
                        work.push_back(Work::Event(hub::Input::Uplink(up)));
                    }
                    exec::Input::Children(c) => {
                        let live: BTreeSet<LinkId> = c.iter().map(|(link, _, _)| *link).collect();
                        let older = live
                            .iter()
                            .copied()
                            .filter(|l| {
                                self.node
                                    .link_version(*l)
                                    .is_none_or(|v| v < EVENT_INTEREST)
                            })
                            .collect();
                        work.push_back(Work::Event(hub::Input::Children { live, older }));
                    }
                    _ => {}
                }
                return work.push_back(Work::Exec(i));
            }
            overlay::Output::Wired { ranks, unsettled } => {
                if self.campaigns.is_some() {
                    work.push_back(Work::Camp(campaign::Input::Wired { ranks, unsettled }));
                }
                return;
            }
            overlay::Output::JobTool { link, req } => return self.job_tool(link, req, work),
            overlay::Output::StatusFor { link } => {
                let reply = ToolReply::Status(self.status());
                return work.push_back(Work::Node(overlay::Input::Reply { link, reply }));
            }
            overlay::Output::ToolGone { link } => {
                return work.push_back(Work::Mgr(jobs::Input::ToolGone { link }))
            }
            overlay::Output::EventClient { link, proc } => {
                return work.push_back(Work::Event(hub::Input::Connected { link, proc }))
            }
            overlay::Output::EventFromClient { link, up } => {
                return work.push_back(Work::Event(hub::Input::FromClient { link, up }))
            }
            overlay::Output::EventClientGone { link } => {
                return work.push_back(Work::Event(hub::Input::Gone { link }))
            }
            overlay::Output::EventFromBelow(t) => {
                return work.push_back(Work::Event(hub::Input::FromBelow(t)))
            }
            overlay::Output::EventFromAbove(t) => {
                return work.push_back(Work::Event(hub::Input::FromAbove(t)))
            }
            overlay::Output::EventInterest { link, on, seq } => {
                return work.push_back(Work::Event(hub::Input::ChildInterest {
                    child: link,
                    on,
                    seq,
                }))
            }
            overlay::Output::EventInterestSeen { seq } => {
                return work.push_back(Work::Event(hub::Input::InterestSeen { seq }))
            }
            overlay::Output::EventInterestAgain => {
                return work.push_back(Work::Event(hub::Input::InterestAgain))
            }
        };
        self.out.push(out);
    }

    fn job_tool(&mut self, link: LinkId, req: ToolRequest, work: &mut VecDeque<Work>) {
        if self.mgr.is_none() {
            let reply = ToolReply::Error {
                message: "jobs are submitted to the controller".into(),
            };
            return work.push_back(Work::Node(overlay::Input::Reply { link, reply }));
        }
        let input = match req {
            ToolRequest::Submit { job } => jobs::Input::Submit { link, job },
            ToolRequest::Jobs => jobs::Input::Jobs { link },
            ToolRequest::Kill { id, signal } => jobs::Input::Kill { link, id, signal },
            ToolRequest::Stdin { id, data, eof } => jobs::Input::Stdin {
                link,
                id,
                data,
                eof,
            },
            ToolRequest::Alloc { .. } | ToolRequest::Grow { .. } | ToolRequest::Shrink { .. } => {
                return self.elastic_request(link, req, work)
            }
            other => {
                return self
                    .out
                    .push(Output::Log(format!("not a job request: {other:?}")))
            }
        };
        work.push_back(Work::Mgr(input));
    }

    /// Controller: a grow, shrink or allocation request. A fixed-size DVM refuses it.
    fn elastic_request(&mut self, link: LinkId, req: ToolRequest, work: &mut VecDeque<Work>) {
        if self.campaigns.is_none() {
            let reply = ToolReply::Error {
                message: "this DVM is fixed-size: it grows and shrinks only in elastic mode (prte_elastic_mode)".into(),
            };
            return work.push_back(Work::Node(overlay::Input::Reply { link, reply }));
        }
        let named = match &req {
            ToolRequest::Alloc {
                directive: Directive::New | Directive::Extend,
                hosts,
                ..
            }
            | ToolRequest::Grow { hosts, .. } => hosts.as_slice(),
            _ => &[],
        };
        // Hosts already in the DVM need no check; malformed names the campaign core refuses.
        let new: Vec<String> = named
            .iter()
            .filter(|h| crate::hostname::is_valid(h) && self.node.roster().rank_of(h).is_none())
            .cloned()
            .collect();
        if new.is_empty() {
            return self.elastic_accept(link, req, work);
        }
        if self.checking.len() >= MAX_CHECKING {
            let reply = ToolReply::Error {
                message: format!(
                    "{MAX_CHECKING} grow requests are already having their hosts checked; ask again"
                ),
            };
            return work.push_back(Work::Node(overlay::Input::Reply { link, reply }));
        }
        let token = self.next_check;
        self.next_check += 1;
        self.checking.insert(token, (link, req));
        self.out.push(Output::CheckHosts { token, hosts: new });
    }

    /// Controller, elastic: the request goes to the campaign core.
    fn elastic_accept(&mut self, link: LinkId, req: ToolRequest, work: &mut VecDeque<Work>) {
        let origin = |requester, wait| campaign::Origin {
            link,
            requester,
            wait,
        };
        let request = match req {
            ToolRequest::Alloc {
                directive,
                hosts,
                alloc_id,
                req_id,
            } => campaign::Request {
                origin: origin(Some(self.node.tool_proc(link)), false),
                directive,
                hosts,
                alloc_id,
                req_id,
                busy: IdSet::new(),
            },
            ToolRequest::Grow { hosts, wait } => campaign::Request {
                origin: origin(None, wait),
                directive: Directive::New,
                hosts,
                alloc_id: None,
                req_id: None,
                busy: IdSet::new(),
            },
            ToolRequest::Shrink { hosts, wait } => campaign::Request {
                origin: origin(None, wait),
                directive: Directive::Release,
                hosts,
                alloc_id: None,
                req_id: None,
                busy: IdSet::new(),
            },
            _ => return,
        };
        work.push_back(Work::Camp(campaign::Input::Request(request)));
    }

    fn camp_output(&mut self, o: campaign::Output, work: &mut VecDeque<Work>) {
        let out = match o {
            campaign::Output::Reply { link, reply } => {
                return work.push_back(Work::Node(overlay::Input::Reply { link, reply }))
            }
            campaign::Output::Membership => {
                return work.push_back(Work::Node(overlay::Input::Membership))
            }
            campaign::Output::Depart { rank } => {
                return work.push_back(Work::Node(overlay::Input::Depart(rank)))
            }
            campaign::Output::CutOff { rank } => {
                return work.push_back(Work::Node(overlay::Input::CutOff(rank)))
            }
            campaign::Output::Lost(ranks) => {
                self.nodes_down(&ranks, work);
                return work.push_back(Work::Exec(exec::Input::Lost(ranks)));
            }
            campaign::Output::Terminal {
                requester,
                code,
                alloc_id,
                req_id,
                cause,
            } => {
                let mut info = vec![Info {
                    key: ALLOC_ID.into(),
                    value: serde_json::json!(alloc_id),
                }];
                if let Some(r) = req_id {
                    info.push(Info {
                        key: ALLOC_REQ_ID.into(),
                        value: serde_json::json!(r),
                    });
                }
                if let Some(c) = cause {
                    info.push(Info {
                        key: JOB_TERM_STATUS.into(),
                        value: serde_json::json!(c),
                    });
                }
                return work.push_back(Work::Event(hub::Input::Raise(Travelling {
                    audience: Audience::Procs {
                        procs: vec![requester],
                    },
                    event: Event {
                        code,
                        source: None,
                        info,
                        level: Level::Job,
                    },
                })));
            }
            campaign::Output::Launch { rank, host } => Output::Launch {
                rank,
                host,
                membership: self.node.roster().wireup(),
            },
            campaign::Output::KillLaunch { rank } => Output::KillLaunch { rank },
            campaign::Output::OfferRelease {
                campaign,
                component,
                name,
                hosts,
            } => Output::Release {
                campaign,
                component,
                name,
                hosts,
            },
            campaign::Output::SetTimer { campaign, delay } => Output::SetTimer {
                timer: Timer::Campaign(campaign),
                delay,
            },
            campaign::Output::Log(l) => Output::Info(l),
            // Composed in `elastic::step`, before anything else of the step.
            campaign::Output::Fence(_) | campaign::Output::AbortParked { .. } => return,
        };
        self.out.push(out);
    }

    fn exec_output(&mut self, now: Now, o: exec::Output, work: &mut VecDeque<Work>) {
        let out = match o {
            // Each in the protocol version of its link (job-exec speaks the newest); for a
            // link gone from the overlay, what every version reads.
            exec::Output::SendDown { link, msg } => {
                let version = self.node.link_version(link).unwrap_or(MIN_VERSION);
                Output::Net(Io::Send {
                    link,
                    frame: Frame::Daemon(DaemonMsg::ExecDown {
                        msg: msg.for_version(version),
                    }),
                })
            }
            // Without an upward link the message is dropped: job-exec sends again what
            // matters after its next hello.
            exec::Output::SendUp(req) => match self.up {
                Some(link) => {
                    let version = self.node.link_version(link).unwrap_or(MIN_VERSION);
                    let Some(req) = req.for_version(version) else {
                        return;
                    };
                    Output::Net(Io::Send {
                        link,
                        frame: Frame::Daemon(DaemonMsg::ExecUp { req }),
                    })
                }
                None => return,
            },
            exec::Output::Shell(c) => {
                match &c {
                    ShellCommand::Launch { id, spec } => {
                        work.push_back(Work::Event(hub::Input::LocalProcs {
                            nspace: job_nspace(&self.nspace, *id),
                            ranks: spec.placement.procs_on(self.rank()),
                        }))
                    }
                    // A job ended (KILL: a fatal exception, a stray, `pctl kill … KILL`) or
                    // asked to end (TERM); any other signal leaves its processes' deaths
                    // news for the rest of the job.
                    ShellCommand::Kill { id, signal: 9 | 15 } => {
                        self.signalled.insert(*id);
                    }
                    ShellCommand::Epilog { id } => {
                        self.signalled.remove(id);
                        work.push_back(Work::Event(hub::Input::JobGone {
                            nspace: job_nspace(&self.nspace, *id),
                        }))
                    }
                    _ => {}
                }
                Output::Shell(c)
            }
            // A job's news reaches the job manager, and so its tool, before the rest of what
            // job-exec said goes out: at a job's end that rest is the `remove` to every
            // child, and a `JobEnded` queued behind it waited for every child link to be
            // written and, on a busy node, for the children each write woke.
            exec::Output::Event(e) => {
                return self.run(now, VecDeque::from([Work::Mgr(jobs::Input::Event(e))]))
            }
            exec::Output::Log(l) => Output::Log(l),
            exec::Output::HoldStart { id, delay } => Output::SetTimer {
                timer: Timer::StartHold(id),
                delay,
            },
            exec::Output::ReleaseHold { id } => Output::CancelTimer(Timer::StartHold(id)),
        };
        self.out.push(out);
    }

    /// A local job process exited: nothing waits for it any more, and if it died by a
    /// signal (`PMIX_ERR_PROC_ABORTED`) or exited non-zero (`PMIX_EVENT_PROC_TERMINATED`)
    /// the other processes of its job hear of it, wherever they run, unless the runtime
    /// itself was ending the job.
    fn proc_exited(&mut self, now: Now, id: JobId, proc: u32, status: i32) {
        let nspace = job_nspace(&self.nspace, id);
        let mut work = VecDeque::from([Work::Event(hub::Input::ProcGone {
            nspace: nspace.clone(),
            rank: proc,
        })]);
        let signal = status & 0x7f;
        let code = if self.signalled.contains(&id) {
            None
        } else if signal != 0 {
            Some(ERR_PROC_ABORTED)
        } else if (status >> 8) & 0xff != 0 {
            Some(EVENT_PROC_TERMINATED)
        } else {
            None
        };
        if let Some(code) = code {
            let info = vec![
                Info {
                    key: "pmix.evaffected".into(),
                    value: serde_json::json!({"nspace": nspace, "rank": proc}),
                },
                Info {
                    key: "pmix.exit.status".into(),
                    value: serde_json::json!(status),
                },
            ];
            work.push_back(Work::Event(hub::Input::Raise(Travelling {
                audience: Audience::Job { nspace },
                event: Event {
                    code,
                    source: None,
                    info,
                    level: Level::Job,
                },
            })));
        }
        self.run(now, work);
    }

    /// Controller: daemons were lost. Every node hears it as an environment event
    /// (`PMIX_EVENT_NODE_DOWN`), one per rank.
    fn nodes_down(&self, ranks: &dvmlab_proto::idset::IdSet, work: &mut VecDeque<Work>) {
        for r in ranks.iter() {
            let info = vec![
                Info {
                    key: "pmix.rank".into(),
                    value: serde_json::json!(r),
                },
                Info {
                    key: "pmix.hname".into(),
                    value: serde_json::json!(self.node.roster().host(r)),
                },
            ];
            work.push_back(Work::Event(hub::Input::Raise(Travelling {
                audience: Audience::Everyone,
                event: Event {
                    code: EVENT_NODE_DOWN,
                    source: None,
                    info,
                    level: Level::Environment,
                },
            })));
        }
    }

    /// Controller: job `id` ended. Every tool and job process registered for it hears
    /// `PMIX_EVENT_JOB_END`, with the job's namespace, status and exception.
    fn job_end(&self, id: JobId, status: i32, exception: Option<String>) -> hub::Input {
        let mut info = vec![
            Info {
                key: "pmix.evaffected".into(),
                // PMIx's wildcard rank: the whole job.
                value: serde_json::json!({"nspace": job_nspace(&self.nspace, id), "rank": u32::MAX - 1}),
            },
            Info {
                key: "pmix.job.term.status".into(),
                value: serde_json::json!(status),
            },
        ];
        if let Some(e) = exception {
            info.push(Info {
                key: "pmix.job.exception".into(),
                value: serde_json::json!(e),
            });
        }
        hub::Input::Raise(Travelling {
            audience: Audience::Everyone,
            event: Event {
                code: EVENT_JOB_END,
                source: None,
                info,
                level: Level::Job,
            },
        })
    }

    fn event_output(&mut self, o: hub::Output) {
        match o {
            hub::Output::ToClient { link, down } => self.out.push(Output::Net(Io::Send {
                link,
                frame: Frame::EventDown(down),
            })),
            // Without an upward link the event is lost, as PMIx allows for events in flight
            // when a daemon fails; the log says so.
            hub::Output::ToParent(ev) => match self.node.uplink() {
                Some(link) => self.out.push(Output::Net(Io::Send {
                    link,
                    frame: Frame::Daemon(DaemonMsg::Event { ev }),
                })),
                None => self.out.push(Output::Log(format!(
                    "event {} dropped: no upward link",
                    ev.event.code
                ))),
            },
            hub::Output::ToChildren(ev) => {
                let links = self.node.child_links();
                let jobs = self.exec.reaching(&links);
                for link in links {
                    let says = self
                        .node
                        .link_version(link)
                        .is_some_and(|v| v >= EVENT_INTEREST);
                    if self.events.goes_down(&ev, link, jobs.contains(&link), says) {
                        self.out.push(Output::Net(Io::Send {
                            link,
                            frame: Frame::Daemon(DaemonMsg::Event { ev: ev.clone() }),
                        }));
                    }
                }
            }
            hub::Output::InterestUp { on, seq } => {
                if let Some(link) = self.node.uplink() {
                    self.out.push(Output::Net(Io::Send {
                        link,
                        frame: Frame::Daemon(DaemonMsg::Interest { on, seq }),
                    }));
                }
            }
            hub::Output::InterestSeen { child, seq } => self.out.push(Output::Net(Io::Send {
                link: child,
                frame: Frame::Daemon(DaemonMsg::InterestSeen { seq }),
            })),
            hub::Output::InterestAgain { child } => self.out.push(Output::Net(Io::Send {
                link: child,
                frame: Frame::Daemon(DaemonMsg::InterestAgain),
            })),
            hub::Output::Log(l) => self.out.push(Output::Log(l)),
        }
    }

    fn mgr_output(&mut self, o: jobs::Output, work: &mut VecDeque<Work>) {
        let out = match o {
            jobs::Output::Exec(i) => return work.push_back(Work::Exec(i)),
            jobs::Output::Reply { link, reply } => {
                return work.push_back(Work::Node(overlay::Input::Reply { link, reply }))
            }
            jobs::Output::SetTimer { id, delay } => Output::SetTimer {
                timer: Timer::JobLimit(id),
                delay,
            },
            jobs::Output::CancelTimer { id } => Output::CancelTimer(Timer::JobLimit(id)),
            jobs::Output::Persist(live) => Output::Persist(live),
            jobs::Output::State { id, state, code } => Output::JobState { id, state, code },
            jobs::Output::Ended {
                id,
                status,
                exception,
            } => return work.push_back(Work::Event(self.job_end(id, status, exception))),
        };
        self.out.push(out);
    }
}
