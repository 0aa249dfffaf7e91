//! The elastic DVM's campaigns (the controller's, in elastic mode only): every grow and
//! shrink in progress with its target ranks, requester and allocation ids; the fence that
//! holds jobs at the map-eligible and launch boundaries while any is in progress; the
//! rollback of a failed grow; the release cycle of a finished shrink; and exactly one
//! terminal event per accepted request that has a requester and changes something.
//!
//! Each campaign is accounted for on its own: a daemon loss counts only towards the
//! campaign that targets that rank, a repeated departure counts once, and one campaign's end
//! never releases jobs another still holds. The roster stays the one record of membership:
//! the core changes it (ranks added, departing, departed) and says when the new membership
//! must be sent down the tree.
//!
//! Sans-IO: the shell feeds [`Input`]s (with the roster) and carries out [`Output`]s.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::overlay::LinkId;
use crate::roster::{Roster, State};
use crate::tree::{RadixTree, Rank};
use dvmlab_proto::event::{Proc, Status, DVMLAB_ERR_LAUNCH, ERR_LOST_CONNECTION, ERR_TIMEOUT};
use dvmlab_proto::idset::IdSet;
use dvmlab_proto::wire::{Directive, ToolReply};

/// A campaign's number (also the source of its default allocation id).
pub type CampaignId = u64;

/// Most campaigns in progress at once; a request beyond it is refused in phase one.
pub const MAX_CAMPAIGNS: usize = 64;
/// Most allocations the controller remembers (one with no rank left is forgotten).
pub const MAX_ALLOCATIONS: usize = 4096;
/// Longest allocation or request id accepted.
pub const MAX_ID_BYTES: usize = 256;

/// Whether a campaign adds or removes daemons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Grow,
    Shrink,
}

/// Who asked for a change and where its answers go.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    /// The connection the synchronous answer goes to.
    pub link: LinkId,
    /// The PMIx process that made the request, as its daemon knows it (never its own claim).
    /// Only a request with a requester yields a terminal event.
    pub requester: Option<Proc>,
    /// Whether `link` also hears when the change ends ([`ToolReply::CampaignEnded`]).
    pub wait: bool,
}

/// An elastic request, as a tool or process made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub origin: Origin,
    pub directive: Directive,
    pub hosts: Vec<String>,
    pub alloc_id: Option<String>,
    pub req_id: Option<String>,
    /// Ranks running launched processes: a shrink may not take them (it would fail a job).
    pub busy: IdSet,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Request(Request),
    /// These ranks reported in, in one report: reachable through the tree (a daemon that
    /// reconnects reports its whole subtree at once). `unsettled` are those of them reached
    /// through a daemon that is departing or departed (or one the controller does not
    /// know): they will move again.
    Wired {
        ranks: IdSet,
        unsettled: IdSet,
    },
    /// These ranks' routes are gone: an exit, a crash or a cut link.
    Lost(IdSet),
    /// The launch agent of `rank` exited with this wait status.
    LaunchExited {
        rank: Rank,
        status: i32,
    },
    /// A campaign's time is up (see [`Output::SetTimer`]).
    Timeout(CampaignId),
    /// Release component `component` is done with its share of a finished shrink.
    ReleaseDone {
        campaign: CampaignId,
        component: usize,
    },
    /// The DVM is being torn down: every campaign in progress fails.
    Teardown,
}

/// Which jobs may pass which boundary. The map-eligible boundary is open when no campaign
/// is in progress, the launch boundary when no shrink is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fence {
    pub map_open: bool,
    pub launch_open: bool,
}

impl Fence {
    pub const OPEN: Fence = Fence {
        map_open: true,
        launch_open: true,
    };
}

#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// The synchronous answer to a request.
    Reply { link: LinkId, reply: ToolReply },
    /// Ranks were added or departed: every daemon must get the new membership.
    Membership,
    /// Start a daemon of `rank` on `host` through the launch agent.
    Launch { rank: Rank, host: String },
    /// Stop whatever the launch of `rank` left running (its agent's process group).
    KillLaunch { rank: Rank },
    /// Tell `rank` to leave the DVM.
    Depart { rank: Rank },
    /// `rank` was departed without leaving by itself: close its route for good.
    CutOff { rank: Rank },
    /// The boundaries changed.
    Fence(Fence),
    /// End the jobs held at the map-eligible boundary (and, with `launch_too`, those held at
    /// the launch boundary) without launching them.
    AbortParked { launch_too: bool, cause: String },
    /// Offer release component `component` (`name`) the hosts a finished shrink freed.
    OfferRelease {
        campaign: CampaignId,
        component: usize,
        name: String,
        hosts: Vec<String>,
    },
    /// The terminal event of a request: `PMIX_DVM_IS_READY` or `PMIX_ERR_DVM_MOD` with
    /// `cause`, for `requester` alone.
    Terminal {
        requester: Proc,
        code: Status,
        alloc_id: String,
        req_id: Option<String>,
        cause: Option<Status>,
    },
    /// Call back with `Timeout(campaign)` after `delay`.
    SetTimer {
        campaign: CampaignId,
        delay: Duration,
    },
    /// A line for the controller's log.
    Log(String),
    /// These ranks were lost, and it is nothing to do with a size change: the jobs on them
    /// fail as on any daemon loss. (A survivor cut off while a shrink re-routes the tree is
    /// held back until it reports again or the shrink's time is up.)
    Lost(IdSet),
}

/// A deliberate defect, for showing that the conformance suite and the soak's checker catch
/// it (the test-only parameter `dvmlab_test_elastic_fault`). Never set outside such a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Jobs are never held: the fence is ignored.
    ParkNothing,
    /// A grow counts as complete as soon as its daemons are launched, before they are wired.
    CompleteOnLaunch,
    /// A failed grow departs only the daemons that started: the others stay members.
    PartialRollback,
    /// The fence is ignored and departing daemons still count as places to run jobs; a
    /// departing daemon stays its whole grace and runs what it is sent.
    LaunchOnDeparting,
    /// The jobs held for a campaign are forgotten when it ends: never run, never answered.
    LoseHeldJobs,
    /// A campaign's requester hears its terminal event twice.
    DuplicateTerminal,
}

impl Fault {
    /// Every fault, by the name the parameter takes.
    pub const NAMES: &[(&str, Fault)] = &[
        ("park-nothing", Fault::ParkNothing),
        ("complete-on-launch", Fault::CompleteOnLaunch),
        ("partial-rollback", Fault::PartialRollback),
        ("launch-on-departing", Fault::LaunchOnDeparting),
        ("lose-held-jobs", Fault::LoseHeldJobs),
        ("duplicate-terminal", Fault::DuplicateTerminal),
    ];

    pub fn parse(s: &str) -> Option<Fault> {
        Fault::NAMES.iter().find(|(n, _)| *n == s).map(|(_, f)| *f)
    }

    /// Whether the job manager is never told of the fence.
    pub fn ignores_fence(self) -> bool {
        matches!(self, Fault::ParkNothing | Fault::LaunchOnDeparting)
    }
}

/// How the controller runs campaigns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The routing tree's radix: which survivors a shrink target's departure re-routes.
    pub radix: u32,
    /// How long a new daemon has to report in, and a shrink target to leave.
    pub timeout: Duration,
    /// The resource components a finished shrink is offered to, in order.
    pub components: Vec<String>,
    /// A deliberate defect (tests of the conformance suite only).
    pub fault: Option<Fault>,
}

/// A grow or shrink in progress.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Campaign {
    kind: Kind,
    targets: IdSet,
    /// Grow: targets wired. Shrink: targets departed.
    done: IdSet,
    origin: Origin,
    alloc_id: String,
    req_id: Option<String>,
    /// Shrink: wired survivors whose route ran through a target; the tree is repaired when
    /// each is reachable again (or the campaign's time is up).
    repair: IdSet,
    /// Shrink: the release component offered the campaign's hosts, once every target left.
    releasing: Option<usize>,
    /// Shrink: the targets' hosts, for the release cycle.
    hosts: Vec<String>,
    /// Shrink: survivors lost while the tree re-routes, not yet reported as lost.
    withheld: IdSet,
}

/// See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Campaigns {
    radix: u32,
    timeout: Duration,
    components: Vec<String>,
    next: CampaignId,
    campaigns: BTreeMap<CampaignId, Campaign>,
    /// Allocation id → its ranks still in the DVM.
    allocations: BTreeMap<String, IdSet>,
    fence: Fence,
    torn_down: bool,
    fault: Option<Fault>,
    /// Departing shrink targets lost with a survivor above them that a shrink re-routes,
    /// and that survivor: whether the target is still there shows when the survivor
    /// reports back with its subtree.
    unresolved: BTreeMap<Rank, Rank>,
    /// Ranks last reported through a daemon that is departing, departed or unknown: not
    /// re-routed for good yet (at most every rank of the DVM).
    unsettled: IdSet,
}

impl Campaigns {
    pub fn new(cfg: Config) -> Campaigns {
        Campaigns {
            radix: cfg.radix,
            timeout: cfg.timeout,
            components: cfg.components,
            next: 1,
            campaigns: BTreeMap::new(),
            allocations: BTreeMap::new(),
            fence: Fence::OPEN,
            torn_down: false,
            fault: cfg.fault,
            unresolved: BTreeMap::new(),
            unsettled: IdSet::new(),
        }
    }

    /// The deliberate defect this controller was given, if any.
    pub fn fault(&self) -> Option<Fault> {
        self.fault
    }

    /// The boundaries as they stand.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// The campaigns in progress: id, kind, targets, targets done, allocation id.
    pub fn in_progress(&self) -> impl Iterator<Item = (CampaignId, Kind, &IdSet, &IdSet, &str)> {
        self.campaigns
            .iter()
            .map(|(id, c)| (*id, c.kind, &c.targets, &c.done, c.alloc_id.as_str()))
    }

    /// Every rank some campaign in progress targets.
    pub fn targets(&self) -> IdSet {
        self.campaigns
            .values()
            .fold(IdSet::new(), |acc, c| acc.union(&c.targets))
    }

    /// Every rank some campaign of `kind` in progress targets.
    fn targets_of(&self, kind: Kind) -> IdSet {
        self.campaigns
            .values()
            .filter(|c| c.kind == kind)
            .fold(IdSet::new(), |acc, c| acc.union(&c.targets))
    }

    /// Feeds one input; `roster` is the controller's membership, which the core changes.
    pub fn handle(&mut self, roster: &mut Roster, input: Input) -> Vec<Output> {
        let mut out = Vec::new();
        match input {
            Input::Request(r) => self.request(roster, r, &mut out),
            Input::Wired { ranks, unsettled } => {
                self.unsettled = self.unsettled.difference(&ranks).union(&unsettled);
                self.wired(roster, &ranks, &mut out)
            }
            Input::Lost(ranks) => self.lost(roster, &ranks, &mut out),
            Input::LaunchExited { rank, status } => {
                // An agent that exits 0 may have handed the daemon on (detached); only a
                // failed agent, or the daemon's own exit, fails the grow before it reports.
                if status != 0 {
                    if let Some(id) = self.pending_grow_of(rank) {
                        let cause = format!(
                            "the launch of rank {rank} ({}) failed with wait status {status}",
                            roster.host(rank)
                        );
                        self.fail_grow(roster, id, DVMLAB_ERR_LAUNCH, cause, &mut out);
                    }
                }
            }
            Input::Timeout(id) => self.timeout(roster, id, &mut out),
            Input::ReleaseDone {
                campaign,
                component,
            } => {
                let expected = self
                    .campaigns
                    .get(&campaign)
                    .is_some_and(|c| c.releasing == Some(component));
                if expected {
                    self.release_next(roster, campaign, component + 1, &mut out);
                }
            }
            Input::Teardown => self.teardown(&mut out),
        }
        // Any input may have moved a shrink on: one target's departure can be the last
        // survivor another shrink waits to see re-routed (it will never report again).
        let shrinks: Vec<CampaignId> = self
            .campaigns
            .iter()
            .filter(|(_, c)| c.kind == Kind::Shrink && c.releasing.is_none())
            .map(|(id, _)| *id)
            .collect();
        for id in shrinks {
            self.shrink_progress(roster, id, &mut out);
        }
        self.update_fence(&mut out);
        self.check(roster);
        out
    }

    fn request(&mut self, roster: &mut Roster, r: Request, out: &mut Vec<Output>) {
        let link = r.origin.link;
        match self.validate(roster, &r) {
            Err(message) => out.push(Output::Reply {
                link,
                reply: ToolReply::Error { message },
            }),
            Ok(Plan::Nothing { alloc_id }) => out.push(Output::Reply {
                link,
                reply: ToolReply::Allocated {
                    alloc_id,
                    status: 0,
                    ranks: IdSet::new(),
                    changed: false,
                },
            }),
            Ok(Plan::Grow { hosts, alloc_id }) => self.start_grow(roster, r, hosts, alloc_id, out),
            Ok(Plan::Shrink { ranks, alloc_id }) => {
                self.start_shrink(roster, r, ranks, alloc_id, out)
            }
        }
    }

    /// Phase one: what the request would do, or why it is refused.
    fn validate(&self, roster: &Roster, r: &Request) -> Result<Plan, String> {
        if self.torn_down {
            return Err("the DVM is stopping".into());
        }
        for id in [&r.alloc_id, &r.req_id].into_iter().flatten() {
            if id.is_empty() || id.len() > MAX_ID_BYTES {
                return Err(format!(
                    "an allocation or request id must have 1 to {MAX_ID_BYTES} bytes (got {})",
                    id.len()
                ));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for h in &r.hosts {
            if !crate::hostname::is_valid(h) {
                return Err(format!("{h:?} is not a host name"));
            }
            if !seen.insert(h.as_str()) {
                return Err(format!("host {h} is named twice"));
            }
        }
        let known_alloc = |id: &str| -> Result<(), String> {
            if self.allocations.contains_key(id) {
                Ok(())
            } else {
                Err(format!("no allocation {id} in this DVM"))
            }
        };
        match r.directive {
            Directive::New | Directive::Extend => {
                if r.hosts.is_empty() {
                    return Err(
                        "a grow needs the hosts to add (no resource manager offers any)".into(),
                    );
                }
                let alloc_id = match (r.directive, &r.alloc_id) {
                    (Directive::New, Some(id)) => {
                        return Err(format!(
                            "a new allocation gets its id from the DVM; {id} was given"
                        ))
                    }
                    (Directive::Extend, Some(id)) => {
                        known_alloc(id)?;
                        Some(id.clone())
                    }
                    _ => None,
                };
                let changing = self.targets();
                for h in &r.hosts {
                    if let Some(rank) = roster.rank_of(h).filter(|rank| changing.contains(*rank)) {
                        return Err(format!(
                            "host {h} (rank {rank}) is joining or leaving in a size change in progress; ask again when it ends"
                        ));
                    }
                }
                let new: Vec<String> = r
                    .hosts
                    .iter()
                    .filter(|h| roster.rank_of(h).is_none())
                    .cloned()
                    .collect();
                if new.is_empty() {
                    return Ok(Plan::Nothing {
                        alloc_id: alloc_id.unwrap_or_default(),
                    });
                }
                self.room_for_a_campaign()?;
                let live = roster.len() as usize;
                if live + new.len() > dvmlab_proto::limits::MAX_NODES {
                    return Err(format!(
                        "adding {} hosts would take the DVM past {} ranks",
                        new.len(),
                        dvmlab_proto::limits::MAX_NODES
                    ));
                }
                // Grows in flight become allocations when they complete.
                let coming = self
                    .campaigns
                    .values()
                    .filter(|c| c.kind == Kind::Grow)
                    .count();
                if alloc_id.is_none() && self.allocations.len() + coming >= MAX_ALLOCATIONS {
                    return Err(format!(
                        "the DVM remembers {MAX_ALLOCATIONS} allocations, the most it keeps; release one first"
                    ));
                }
                Ok(Plan::Grow {
                    hosts: new,
                    alloc_id,
                })
            }
            Directive::Release => {
                let mut ranks = IdSet::new();
                if let Some(id) = &r.alloc_id {
                    known_alloc(id)?;
                    ranks = self.allocations[id].clone();
                }
                for h in &r.hosts {
                    match roster.rank_of(h) {
                        Some(rank) => ranks.insert(rank),
                        None => return Err(format!("host {h} is not in the DVM")),
                    }
                }
                if r.hosts.is_empty() && r.alloc_id.is_none() {
                    return Err("a release names hosts or an allocation".into());
                }
                if ranks.contains(0) {
                    return Err(format!(
                        "host {} runs the controller (rank 0), which cannot leave its own DVM",
                        roster.host(0)
                    ));
                }
                let targets = self.targets();
                for rank in ranks.iter() {
                    if let Some((id, c)) = self
                        .campaigns
                        .iter()
                        .find(|(_, c)| c.targets.contains(rank))
                    {
                        if c.kind == Kind::Grow {
                            return Err(format!(
                                "host {} (rank {rank}) is still joining (grow {id} is in progress)",
                                roster.host(rank)
                            ));
                        }
                    }
                    if r.busy.contains(rank) {
                        return Err(format!(
                            "host {} (rank {rank}) runs job processes; a release would fail their job",
                            roster.host(rank)
                        ));
                    }
                }
                // Ranks another shrink already takes out change nothing more.
                let ranks = ranks.difference(&targets);
                if ranks.is_empty() {
                    return Ok(Plan::Nothing {
                        alloc_id: r.alloc_id.clone().unwrap_or_default(),
                    });
                }
                self.room_for_a_campaign()?;
                Ok(Plan::Shrink {
                    ranks,
                    alloc_id: r.alloc_id.clone(),
                })
            }
        }
    }

    fn room_for_a_campaign(&self) -> Result<(), String> {
        if self.campaigns.len() >= MAX_CAMPAIGNS {
            return Err(format!(
                "{MAX_CAMPAIGNS} size changes are in progress, the most the DVM runs at once; try again when one ends"
            ));
        }
        Ok(())
    }

    fn start_grow(
        &mut self,
        roster: &mut Roster,
        r: Request,
        hosts: Vec<String>,
        alloc_id: Option<String>,
        out: &mut Vec<Output>,
    ) {
        let id = self.take_id();
        let alloc_id = alloc_id.unwrap_or_else(|| format!("alloc.{id}"));
        let mut targets = IdSet::new();
        let mut launches = Vec::new();
        for h in hosts {
            match roster.add(&h, id) {
                Ok(rank) => {
                    targets.insert(rank);
                    launches.push(Output::Launch { rank, host: h });
                }
                // Validation checked membership and room; a refusal here is a bug.
                Err(e) => out.push(Output::Log(format!("grow {id}: {e}"))),
            }
        }
        out.push(Output::Reply {
            link: r.origin.link,
            reply: ToolReply::Allocated {
                alloc_id: alloc_id.clone(),
                status: 0,
                ranks: targets.clone(),
                changed: true,
            },
        });
        // The membership goes down the tree before any daemon starts: its parent knows it
        // by the time it says hello.
        out.push(Output::Membership);
        out.extend(launches);
        out.push(Output::SetTimer {
            campaign: id,
            delay: self.timeout,
        });
        out.push(Output::Log(format!(
            "grow {id} ({alloc_id}): ranks {targets} launching"
        )));
        self.campaigns.insert(
            id,
            Campaign {
                kind: Kind::Grow,
                targets,
                done: IdSet::new(),
                origin: r.origin,
                alloc_id,
                req_id: r.req_id,
                repair: IdSet::new(),
                releasing: None,
                hosts: Vec::new(),
                withheld: IdSet::new(),
            },
        );
        if self.fault == Some(Fault::CompleteOnLaunch) {
            self.grow_done(roster, id, out);
        }
    }

    fn start_shrink(
        &mut self,
        roster: &mut Roster,
        r: Request,
        ranks: IdSet,
        alloc_id: Option<String>,
        out: &mut Vec<Output>,
    ) {
        let id = self.take_id();
        let alloc_id = alloc_id.unwrap_or_else(|| format!("alloc.{id}"));
        out.push(Output::Reply {
            link: r.origin.link,
            reply: ToolReply::Allocated {
                alloc_id: alloc_id.clone(),
                status: 0,
                ranks: ranks.clone(),
                changed: true,
            },
        });
        let tree = RadixTree::new(self.radix, roster.len());
        // Ranks lost while another shrink re-routes the tree are on their way back, not
        // gone: a target among them is to be told to leave once back, and a survivor among
        // them below a target will move again when that target leaves.
        let rerouting = self
            .campaigns
            .values()
            .filter(|c| c.kind == Kind::Shrink)
            .fold(IdSet::new(), |acc, c| acc.union(&c.withheld));
        let repair: IdSet = roster
            .iter()
            .filter(|(rank, m)| {
                (m.state == State::Wired || rerouting.contains(*rank))
                    && !ranks.contains(*rank)
                    && tree.ancestors(*rank).iter().any(|a| ranks.contains(*a))
            })
            .map(|(rank, _)| rank)
            .collect();
        let mut done = IdSet::new();
        for rank in ranks.iter() {
            if roster.state(rank) == Some(State::Wired) || rerouting.contains(rank) {
                roster.set(rank, State::Departing);
                out.push(Output::Depart { rank });
            } else {
                // Not reachable now: it has left already, as far as this DVM can tell.
                roster.depart(rank);
                done.insert(rank);
                out.push(Output::CutOff { rank });
            }
        }
        if !done.is_empty() {
            out.push(Output::Membership);
        }
        out.push(Output::SetTimer {
            campaign: id,
            delay: self.timeout,
        });
        out.push(Output::Log(format!(
            "shrink {id} ({alloc_id}): ranks {ranks} departing"
        )));
        let hosts = ranks.iter().map(|r| roster.host(r).to_string()).collect();
        self.campaigns.insert(
            id,
            Campaign {
                kind: Kind::Shrink,
                targets: ranks,
                done,
                origin: r.origin,
                alloc_id,
                req_id: r.req_id,
                repair,
                releasing: None,
                hosts,
                withheld: IdSet::new(),
            },
        );
        self.shrink_progress(roster, id, out);
    }

    fn take_id(&mut self) -> CampaignId {
        let id = self.next;
        self.next += 1;
        id
    }

    /// The grow in progress that targets `rank` and has not completed.
    fn pending_grow_of(&self, rank: Rank) -> Option<CampaignId> {
        self.campaigns
            .iter()
            .find(|(_, c)| c.kind == Kind::Grow && c.targets.contains(rank))
            .map(|(id, _)| *id)
    }

    fn wired(&mut self, roster: &mut Roster, ranks: &IdSet, out: &mut Vec<Output>) {
        // A survivor reports back with its whole subtree: a target below it that is not in
        // the report left while cut off (its own loss went nowhere); one that is stays
        // departing, and is told again to leave.
        let back: Vec<(Rank, Rank)> = self
            .unresolved
            .iter()
            .filter(|(_, s)| ranks.contains(**s))
            .map(|(t, s)| (*t, *s))
            .collect();
        for (target, _) in back {
            self.unresolved.remove(&target);
            if !ranks.contains(target) {
                self.departed(roster, target, out);
            }
        }
        let ids: Vec<CampaignId> = self.campaigns.keys().copied().collect();
        for id in ids {
            let Some(c) = self.campaigns.get_mut(&id) else {
                continue;
            };
            match c.kind {
                Kind::Grow => {
                    let mine = ranks.intersection(&c.targets);
                    if mine.is_empty() {
                        continue;
                    }
                    c.done = c.done.union(&mine);
                    if c.done == c.targets {
                        self.grow_done(roster, id, out);
                    }
                }
                Kind::Shrink => {
                    c.withheld = c.withheld.difference(ranks);
                    if c.releasing.is_none() && ranks.intersects(&c.repair) {
                        self.shrink_progress(roster, id, out);
                    }
                }
            }
        }
    }

    fn lost(&mut self, roster: &mut Roster, ranks: &IdSet, out: &mut Vec<Output>) {
        self.unsettled = self.unsettled.difference(ranks);
        let mut ordinary = IdSet::new();
        // A shrink target lost together with a survivor above it that a shrink re-routes
        // (whose parent left) was cut off with that survivor: its route went, not
        // necessarily its daemon. It may still be there, to be told to leave once re-routed,
        // and only then may the ranks below it move for good. Its own loss, the survivor's
        // report without it, or the timeout is its departure. (Below a survivor that
        // crashed, the ranks cut off are lost anyway: the target's loss counts.)
        let tree = RadixTree::new(self.radix, roster.len());
        let shrinking = self.targets_of(Kind::Shrink);
        let rerouting = self
            .campaigns
            .values()
            .filter(|c| c.kind == Kind::Shrink && c.releasing.is_none())
            .fold(IdSet::new(), |acc, c| acc.union(&c.repair));
        let cut_off_with = |rank: Rank| {
            tree.ancestors(rank)
                .into_iter()
                .find(|&a| a != 0 && ranks.contains(a) && !shrinking.contains(a))
                .filter(|a| rerouting.contains(*a))
        };
        for rank in ranks.iter() {
            if let Some(id) = self.pending_grow_of(rank) {
                let cause = format!(
                    "new daemon rank {rank} ({}) was lost before the grow completed",
                    roster.host(rank)
                );
                self.fail_grow(roster, id, ERR_LOST_CONNECTION, cause, out);
                continue;
            }
            let shrink = self
                .campaigns
                .iter()
                .find(|(_, c)| c.kind == Kind::Shrink && c.targets.contains(rank))
                .map(|(id, _)| *id);
            if shrink.is_some() {
                if roster.state(rank) == Some(State::Departing) {
                    if let Some(survivor) = cut_off_with(rank) {
                        self.unresolved.insert(rank, survivor);
                        continue;
                    }
                }
                self.departed(roster, rank, out);
                continue;
            }
            // Any other loss concerns no campaign: it neither completes nor fails one. A rank
            // that departed is no loss at all (its route going is old news).
            if roster.state(rank) == Some(State::Departed) {
                continue;
            }
            let repairing = self.campaigns.values_mut().find(|c| {
                c.kind == Kind::Shrink && c.releasing.is_none() && c.repair.contains(rank)
            });
            match repairing {
                Some(c) => c.withheld.insert(rank),
                None => ordinary.insert(rank),
            }
        }
        if !ordinary.is_empty() {
            out.push(Output::Lost(ordinary));
        }
    }

    /// Shrink target `rank` has left: its actual departure, clean or not (a second report
    /// finds it departed).
    fn departed(&mut self, roster: &mut Roster, rank: Rank, out: &mut Vec<Output>) {
        self.unresolved.remove(&rank);
        if roster.depart(rank) {
            out.push(Output::Membership);
        }
        let mut mine = None;
        for (id, c) in self.campaigns.iter_mut() {
            c.withheld.remove(rank);
            if c.kind == Kind::Shrink && c.targets.contains(rank) {
                c.done.insert(rank);
                mine = Some(*id);
            }
        }
        if let Some(id) = mine {
            self.shrink_progress(roster, id, out);
        }
    }

    fn timeout(&mut self, roster: &mut Roster, id: CampaignId, out: &mut Vec<Output>) {
        let Some(c) = self.campaigns.get(&id) else {
            return;
        };
        match c.kind {
            Kind::Grow => {
                let missing = c.targets.difference(&c.done);
                let cause = format!(
                    "ranks {missing} did not report in within {:?}",
                    self.timeout
                );
                self.fail_grow(roster, id, ERR_TIMEOUT, cause, out);
            }
            Kind::Shrink if c.releasing.is_some() => {}
            Kind::Shrink => {
                let stay = c.targets.difference(&c.done);
                let unrepaired = c.repair.clone();
                for rank in stay.iter() {
                    out.push(Output::Log(format!(
                        "shrink {id}: rank {rank} did not leave within {:?}; cut off",
                        self.timeout
                    )));
                    roster.depart(rank);
                    self.unresolved.remove(&rank);
                    out.push(Output::CutOff { rank });
                }
                if !stay.is_empty() {
                    out.push(Output::Membership);
                }
                if let Some(c) = self.campaigns.get_mut(&id) {
                    c.done = c.targets.clone();
                    // Survivors still unreachable are ordinary losses now, not this
                    // campaign's to wait for, nor any other's.
                    c.repair = IdSet::new();
                    let withheld: IdSet = std::mem::take(&mut c.withheld)
                        .iter()
                        .filter(|r| roster.state(*r) == Some(State::Lost))
                        .collect();
                    for other in self.campaigns.values_mut() {
                        other.repair = other.repair.difference(&withheld);
                        other.withheld = other.withheld.difference(&withheld);
                    }
                    if !withheld.is_empty() {
                        out.push(Output::Lost(withheld));
                    }
                }
                if !unrepaired.is_empty() {
                    out.push(Output::Log(format!(
                        "shrink {id}: not waiting any longer for ranks {unrepaired} to re-route"
                    )));
                }
                self.shrink_progress(roster, id, out);
            }
        }
    }

    /// A shrink whose targets have all left and whose survivors are all reachable again
    /// starts its release cycle.
    fn shrink_progress(&mut self, roster: &Roster, id: CampaignId, out: &mut Vec<Output>) {
        let Some(c) = self.campaigns.get_mut(&id) else {
            return;
        };
        if c.releasing.is_some() || c.done != c.targets {
            return;
        }
        // Wired through daemons that stay, or gone for good.
        let unsettled = &self.unsettled;
        c.repair = c
            .repair
            .iter()
            .filter(|r| match roster.state(*r) {
                Some(State::Wired) => unsettled.contains(*r),
                Some(State::Departed) => false,
                _ => true,
            })
            .collect();
        if !c.repair.is_empty() {
            return;
        }
        self.release_next(roster, id, 0, out);
    }

    /// Offers the freed hosts to release component `component`, or, past the last, ends
    /// the shrink.
    fn release_next(
        &mut self,
        roster: &Roster,
        id: CampaignId,
        component: usize,
        out: &mut Vec<Output>,
    ) {
        let Some(c) = self.campaigns.get_mut(&id) else {
            return;
        };
        if let Some(name) = self.components.get(component) {
            c.releasing = Some(component);
            out.push(Output::OfferRelease {
                campaign: id,
                component,
                name: name.clone(),
                hosts: c.hosts.clone(),
            });
            return;
        }
        let Some(c) = self.campaigns.remove(&id) else {
            return;
        };
        for ranks in self.allocations.values_mut() {
            *ranks = ranks.difference(&c.targets);
        }
        self.allocations.retain(|_, r| !r.is_empty());
        out.push(Output::Log(format!(
            "shrink {id} ({}): ranks {} left; the DVM has {} daemons",
            c.alloc_id,
            c.targets,
            roster.expected()
        )));
        self.end(c, None, out);
    }

    fn grow_done(&mut self, roster: &mut Roster, id: CampaignId, out: &mut Vec<Output>) {
        let Some(c) = self.campaigns.remove(&id) else {
            return;
        };
        for rank in c.targets.iter() {
            roster.admit(rank);
        }
        let alloc = self.allocations.entry(c.alloc_id.clone()).or_default();
        *alloc = alloc.union(&c.targets);
        out.push(Output::Log(format!(
            "grow {id} ({}): ranks {} wired; the DVM has {} daemons",
            c.alloc_id,
            c.targets,
            roster.expected()
        )));
        self.end(c, None, out);
    }

    /// Undoes grow `id` exactly: its daemons are told to leave and their launches stopped,
    /// its ranks depart (the hosts leave the DVM), the jobs held for it end, and its
    /// requester hears why. Nothing else changes.
    fn fail_grow(
        &mut self,
        roster: &mut Roster,
        id: CampaignId,
        cause: Status,
        why: String,
        out: &mut Vec<Output>,
    ) {
        let Some(c) = self.campaigns.remove(&id) else {
            return;
        };
        out.push(Output::Log(format!(
            "grow {id} ({}) failed: {why}; rolled back",
            c.alloc_id
        )));
        for rank in c.targets.iter() {
            let started = matches!(roster.state(rank), Some(State::Wired | State::Joining));
            if started {
                out.push(Output::Depart { rank });
            }
            out.push(Output::KillLaunch { rank });
            if started || self.fault != Some(Fault::PartialRollback) {
                roster.depart(rank);
                out.push(Output::CutOff { rank });
            } else {
                roster.admit(rank);
            }
        }
        out.push(Output::Membership);
        out.push(Output::AbortParked {
            launch_too: false,
            cause: format!("grow-failed: {why}"),
        });
        self.end(c, Some(cause), out);
    }

    /// Every campaign fails: the DVM goes away, so nothing is rolled back but the launches
    /// still running, and every held job ends.
    fn teardown(&mut self, out: &mut Vec<Output>) {
        self.torn_down = true;
        self.unresolved.clear();
        self.unsettled = IdSet::new();
        let campaigns = std::mem::take(&mut self.campaigns);
        let any = !campaigns.is_empty();
        for (_, c) in campaigns {
            if c.kind == Kind::Grow {
                for rank in c.targets.difference(&c.done).iter() {
                    out.push(Output::KillLaunch { rank });
                }
            }
            self.end(c, Some(ERR_LOST_CONNECTION), out);
        }
        if any {
            out.push(Output::AbortParked {
                launch_too: true,
                cause: "dvm-stopped: the DVM stopped during a size change".into(),
            });
        }
    }

    /// The end of a campaign: the requester's one terminal event and the waiting tool's
    /// answer. `cause` is `None` for success.
    fn end(&mut self, c: Campaign, cause: Option<Status>, out: &mut Vec<Output>) {
        if let Some(requester) = c.origin.requester {
            let terminal = Output::Terminal {
                requester,
                code: if cause.is_none() {
                    dvmlab_proto::event::DVM_IS_READY
                } else {
                    dvmlab_proto::event::ERR_DVM_MOD
                },
                alloc_id: c.alloc_id.clone(),
                req_id: c.req_id.clone(),
                cause,
            };
            if self.fault == Some(Fault::DuplicateTerminal) {
                out.push(terminal.clone());
            }
            out.push(terminal);
        }
        if c.origin.wait {
            out.push(Output::Reply {
                link: c.origin.link,
                reply: ToolReply::CampaignEnded {
                    alloc_id: c.alloc_id,
                    ok: cause.is_none(),
                    cause,
                },
            });
        }
    }

    fn update_fence(&mut self, out: &mut Vec<Output>) {
        let fence = Fence {
            map_open: self.campaigns.is_empty(),
            launch_open: !self.campaigns.values().any(|c| c.kind == Kind::Shrink),
        };
        if fence != self.fence {
            self.fence = fence;
            out.push(Output::Fence(fence));
        }
    }

    /// The core's own invariants, checked in debug builds after every input.
    fn check(&self, roster: &Roster) {
        debug_assert!(self.campaigns.len() <= MAX_CAMPAIGNS);
        debug_assert!(self.allocations.len() <= MAX_ALLOCATIONS);
        let mut all = IdSet::new();
        for c in self.campaigns.values() {
            debug_assert!(!all.intersects(&c.targets), "a rank in two campaigns");
            all = all.union(&c.targets);
            debug_assert!(c.done.difference(&c.targets).is_empty());
            debug_assert!(c.withheld.difference(&c.repair).is_empty());
            for r in c.targets.iter() {
                let s = roster.state(r);
                match c.kind {
                    Kind::Grow => debug_assert!(
                        roster.get(r).is_some_and(|m| m.campaign.is_some()),
                        "grow target {r} untagged"
                    ),
                    Kind::Shrink => debug_assert!(
                        matches!(s, Some(State::Departing | State::Departed)),
                        "shrink target {r} is {s:?}"
                    ),
                }
            }
        }
        debug_assert_eq!(self.fence.map_open, self.campaigns.is_empty());
        for t in self.unresolved.keys() {
            debug_assert!(
                all.contains(*t) && roster.state(*t) == Some(State::Departing),
                "unresolved rank {t} is no departing target"
            );
        }
    }
}

/// What an accepted request does.
enum Plan {
    Nothing {
        alloc_id: String,
    },
    Grow {
        hosts: Vec<String>,
        alloc_id: Option<String>,
    },
    Shrink {
        ranks: IdSet,
        alloc_id: Option<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use dvmlab_proto::event::{DVM_IS_READY, ERR_DVM_MOD};

    /// A controller (rank 0) and three wired daemons on h1..h3, radix 2 (1 is 3's parent).
    fn dvm() -> (Campaigns, Roster) {
        let hosts: Vec<String> = (0..4).map(|i| format!("h{i}")).collect();
        let mut roster = Roster::from_conf(&hosts, false, 0);
        for r in 1..4 {
            roster.set(r, State::Wired);
        }
        let c = Campaigns::new(Config {
            radix: 2,
            timeout: Duration::from_secs(5),
            components: vec!["pool".into(), "alloc".into()],
            fault: None,
        });
        (c, roster)
    }

    /// A controller and `n - 1` wired daemons, radix 2 (7 below 3 below 1), with no
    /// release component.
    fn dvm_of(n: u32) -> (Campaigns, Roster, RadixTree) {
        let hosts: Vec<String> = (0..n).map(|i| format!("h{i}")).collect();
        let mut roster = Roster::from_conf(&hosts, false, 0);
        for r in 1..n {
            roster.set(r, State::Wired);
        }
        let c = Campaigns::new(Config {
            radix: 2,
            timeout: Duration::from_secs(5),
            components: vec![],
            fault: None,
        });
        let tree = RadixTree::new(2, n);
        assert_eq!(
            tree.ancestors(7),
            vec![3, 1, 0],
            "the tree these tests assume"
        );
        (c, roster, tree)
    }

    /// Rank `top` leaves and the ranks below it (but `skip`) lose their route with it, as
    /// the controller hears it: all in one loss. Returns those ranks and the outputs.
    fn lose_subtree(
        c: &mut Campaigns,
        roster: &mut Roster,
        tree: &RadixTree,
        top: Rank,
        skip: &[Rank],
    ) -> (Vec<Rank>, Vec<Output>) {
        let below: Vec<Rank> = (1..roster.len())
            .filter(|r| !skip.contains(r) && tree.ancestors(*r).contains(&top))
            .collect();
        for &r in &below {
            roster.set(r, State::Lost);
        }
        let cut: IdSet = below.iter().copied().chain([top]).collect();
        let out = c.handle(roster, Input::Lost(cut));
        (below, out)
    }

    /// `ranks` report in, `unsettled` of them through a daemon that is leaving, as the
    /// controller hears it: wired in the roster, then one input.
    fn report(
        c: &mut Campaigns,
        roster: &mut Roster,
        ranks: &[Rank],
        unsettled: &[Rank],
    ) -> Vec<Output> {
        for &r in ranks {
            roster.set(r, State::Wired);
        }
        let input = Input::Wired {
            ranks: ids(ranks),
            unsettled: ids(unsettled),
        };
        c.handle(roster, input)
    }

    fn tool(link: LinkId) -> Proc {
        Proc {
            nspace: format!("tool@0.{link}"),
            rank: 0,
        }
    }

    fn req(link: LinkId, directive: Directive, hosts: &[&str], requester: bool) -> Input {
        Input::Request(Request {
            origin: Origin {
                link,
                requester: requester.then(|| tool(link)),
                wait: false,
            },
            directive,
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            alloc_id: None,
            req_id: Some(format!("req-{link}")),
            busy: IdSet::new(),
        })
    }

    fn ids(v: &[Rank]) -> IdSet {
        v.iter().copied().collect()
    }

    fn terminals(out: &[Output]) -> Vec<(Status, Option<Status>, String)> {
        out.iter()
            .filter_map(|o| match o {
                Output::Terminal {
                    code,
                    cause,
                    requester,
                    ..
                } => Some((*code, *cause, requester.nspace.clone())),
                _ => None,
            })
            .collect()
    }

    fn error(out: &[Output]) -> Option<String> {
        out.iter().find_map(|o| match o {
            Output::Reply {
                reply: ToolReply::Error { message },
                ..
            } => Some(message.clone()),
            _ => None,
        })
    }

    fn members(roster: &Roster) -> Vec<(Rank, String, State)> {
        roster
            .iter()
            .filter(|(_, m)| m.state != State::Departed)
            .map(|(r, m)| (r, m.host.clone(), m.state))
            .collect()
    }

    #[test]
    fn a_grow_is_answered_at_once_and_ends_in_one_ready_event_once_every_daemon_is_wired() {
        let (mut c, mut roster) = dvm();
        let out = c.handle(&mut roster, req(7, Directive::New, &["n4", "n5"], true));
        assert!(
            matches!(&out[0], Output::Reply { link: 7, reply: ToolReply::Allocated { changed: true, ranks, .. } } if *ranks == ids(&[4, 5])),
            "{out:?}"
        );
        let pos = |p: fn(&Output) -> bool| out.iter().position(p).unwrap();
        assert!(
            pos(|o| matches!(o, Output::Membership)) < pos(|o| matches!(o, Output::Launch { .. })),
            "the membership goes out before any launch: {out:?}"
        );
        assert!(out.contains(&Output::Fence(Fence {
            map_open: false,
            launch_open: true
        })));
        assert!(terminals(&out).is_empty(), "phase one claims nothing");
        let out = report(&mut c, &mut roster, &[4], &[]);
        assert!(terminals(&out).is_empty(), "one of two wired is not done");
        assert_eq!(
            roster.compute_ranks(),
            vec![1, 2, 3],
            "a wired rank of a pending grow runs nothing"
        );
        let out = report(&mut c, &mut roster, &[5], &[]);
        assert_eq!(
            terminals(&out),
            vec![(DVM_IS_READY, None, "tool@0.7".into())]
        );
        assert!(out.contains(&Output::Fence(Fence::OPEN)));
        assert_eq!(roster.compute_ranks(), vec![1, 2, 3, 4, 5]);
        let out = report(&mut c, &mut roster, &[4, 5], &[]);
        assert!(terminals(&out).is_empty(), "exactly one terminal event");
    }

    /// The soak's checker is shown the `duplicate-terminal` defect: this is what it does.
    #[test]
    fn the_duplicate_terminal_defect_sends_the_ready_event_twice() {
        let (_, mut roster) = dvm();
        let mut c = Campaigns::new(Config {
            radix: 2,
            timeout: Duration::from_secs(5),
            components: vec![],
            fault: Some(Fault::DuplicateTerminal),
        });
        c.handle(&mut roster, req(7, Directive::New, &["n4"], true));
        let out = report(&mut c, &mut roster, &[4], &[]);
        assert_eq!(
            terminals(&out),
            vec![(DVM_IS_READY, None, "tool@0.7".into()); 2]
        );
    }

    #[test]
    fn a_request_that_changes_nothing_or_has_no_requester_sends_no_event() {
        let (mut c, mut roster) = dvm();
        let out = c.handle(&mut roster, req(7, Directive::New, &["h1", "h2"], true));
        assert!(matches!(
            &out[0],
            Output::Reply {
                reply: ToolReply::Allocated { changed: false, .. },
                ..
            }
        ));
        assert_eq!(out.len(), 1, "no change, no campaign, no event: {out:?}");
        let mut push = req(8, Directive::Extend, &["n4"], false);
        if let Input::Request(r) = &mut push {
            r.origin.wait = true;
        }
        c.handle(&mut roster, push);
        let out = report(&mut c, &mut roster, &[4], &[]);
        assert!(terminals(&out).is_empty(), "a push has no requester");
        assert!(out.iter().any(|o| matches!(
            o,
            Output::Reply {
                link: 8,
                reply: ToolReply::CampaignEnded { ok: true, .. }
            }
        )));
    }

    #[test]
    fn a_failed_launch_rolls_the_grow_back_to_the_exact_membership_before_it() {
        let (mut c, mut roster) = dvm();
        let before = members(&roster);
        c.handle(&mut roster, req(7, Directive::New, &["n4", "n5"], true));
        report(&mut c, &mut roster, &[4], &[]);
        let out = c.handle(
            &mut roster,
            Input::LaunchExited {
                rank: 5,
                status: 256,
            },
        );
        assert_eq!(
            terminals(&out),
            vec![(ERR_DVM_MOD, Some(DVMLAB_ERR_LAUNCH), "tool@0.7".into())]
        );
        assert!(
            out.contains(&Output::Depart { rank: 4 }),
            "the started daemon is told to leave"
        );
        assert!(out.contains(&Output::KillLaunch { rank: 5 }));
        assert!(out.iter().any(|o| matches!(
            o,
            Output::AbortParked {
                launch_too: false,
                ..
            }
        )));
        let abort = out
            .iter()
            .position(|o| matches!(o, Output::AbortParked { .. }))
            .unwrap();
        let open = out
            .iter()
            .position(|o| matches!(o, Output::Fence(_)))
            .unwrap();
        assert!(
            abort < open,
            "held jobs end before the fence opens: {out:?}"
        );
        assert_eq!(members(&roster), before);
        assert_eq!(roster.rank_of("n4"), None, "the host left the DVM");
        let out = c.handle(&mut roster, Input::Lost(ids(&[4, 5])));
        assert!(
            out.is_empty(),
            "a rolled-back rank's loss is nobody's: {out:?}"
        );
    }

    #[test]
    fn an_agent_that_exits_cleanly_before_its_daemon_reports_fails_nothing() {
        let (mut c, mut roster) = dvm();
        c.handle(&mut roster, req(7, Directive::New, &["n4"], true));
        let out = c.handle(&mut roster, Input::LaunchExited { rank: 4, status: 0 });
        assert!(terminals(&out).is_empty());
        let out = report(&mut c, &mut roster, &[4], &[]);
        assert_eq!(terminals(&out).len(), 1);
    }

    #[test]
    fn of_two_concurrent_grows_one_fails_and_the_other_completes_untouched() {
        let (mut c, mut roster) = dvm();
        c.handle(&mut roster, req(7, Directive::New, &["n4"], true));
        c.handle(&mut roster, req(8, Directive::New, &["n5"], true));
        let out = c.handle(&mut roster, Input::Lost(ids(&[5])));
        assert_eq!(
            terminals(&out),
            vec![(ERR_DVM_MOD, Some(ERR_LOST_CONNECTION), "tool@0.8".into())]
        );
        assert!(
            !out.iter().any(|o| matches!(o, Output::Fence(_))),
            "the other grow still holds"
        );
        assert_eq!(roster.state(4), Some(State::Waiting));
        let out = report(&mut c, &mut roster, &[4], &[]);
        assert_eq!(
            terminals(&out),
            vec![(DVM_IS_READY, None, "tool@0.7".into())]
        );
        assert_eq!(roster.compute_ranks(), vec![1, 2, 3, 4]);
    }

    #[test]
    fn an_unrelated_daemon_loss_neither_completes_nor_fails_a_campaign() {
        let (mut c, mut roster) = dvm();
        c.handle(&mut roster, req(7, Directive::New, &["n4"], true));
        c.handle(&mut roster, req(8, Directive::Release, &["h3"], true));
        roster.set(2, State::Lost);
        let out = c.handle(&mut roster, Input::Lost(ids(&[2])));
        assert_eq!(
            out,
            vec![Output::Lost(ids(&[2]))],
            "an ordinary loss, for the jobs on it"
        );
        assert_eq!(c.in_progress().count(), 2);
    }

    #[test]
    fn a_grow_whose_daemon_never_reports_times_out_and_rolls_back() {
        let (mut c, mut roster) = dvm();
        let out = c.handle(&mut roster, req(7, Directive::New, &["n4"], true));
        assert!(out.contains(&Output::SetTimer {
            campaign: 1,
            delay: Duration::from_secs(5)
        }));
        let out = c.handle(&mut roster, Input::Timeout(1));
        assert_eq!(
            terminals(&out),
            vec![(ERR_DVM_MOD, Some(ERR_TIMEOUT), "tool@0.7".into())]
        );
        assert_eq!(roster.state(4), Some(State::Departed));
        assert!(
            c.handle(&mut roster, Input::Timeout(1)).is_empty(),
            "a stale timer"
        );
    }

    #[test]
    fn a_shrink_completes_on_actual_departure_counted_once_and_releases_in_order_before_its_event()
    {
        let (mut c, mut roster) = dvm();
        let out = c.handle(&mut roster, req(7, Directive::Release, &["h2"], true));
        assert!(out.contains(&Output::Depart { rank: 2 }));
        assert!(out.contains(&Output::Fence(Fence {
            map_open: false,
            launch_open: false
        })));
        assert_eq!(roster.state(2), Some(State::Departing));
        assert_eq!(roster.compute_ranks(), vec![1, 3]);
        // A report while departing changes nothing: only the departure counts.
        assert!(!roster.set(2, State::Wired));
        let out = c.handle(&mut roster, Input::Lost(ids(&[2])));
        assert_eq!(roster.state(2), Some(State::Departed));
        assert!(out.contains(&Output::Membership));
        assert!(
            matches!(&out[..], [.., Output::OfferRelease { component: 0, name, .. }] if name == "pool"),
            "{out:?}"
        );
        assert!(terminals(&out).is_empty(), "the release cycle comes first");
        let out = c.handle(&mut roster, Input::Lost(ids(&[2])));
        assert!(out.is_empty(), "a repeated departure counts once: {out:?}");
        let out = c.handle(
            &mut roster,
            Input::ReleaseDone {
                campaign: 1,
                component: 1,
            },
        );
        assert!(out.is_empty(), "out of turn");
        let out = c.handle(
            &mut roster,
            Input::ReleaseDone {
                campaign: 1,
                component: 0,
            },
        );
        assert!(
            matches!(&out[..], [Output::OfferRelease { component: 1, hosts, .. }] if hosts == &["h2"])
        );
        let out = c.handle(
            &mut roster,
            Input::ReleaseDone {
                campaign: 1,
                component: 1,
            },
        );
        assert_eq!(
            terminals(&out),
            vec![(DVM_IS_READY, None, "tool@0.7".into())]
        );
        assert!(out.contains(&Output::Fence(Fence::OPEN)));
    }

    #[test]
    fn a_shrink_of_an_interior_daemon_waits_until_the_ranks_below_it_are_reachable_again() {
        let (mut c, mut roster) = dvm();
        c.handle(&mut roster, req(7, Directive::Release, &["h1"], true));
        // Rank 1's departure cut rank 3 (its child) off as well.
        roster.set(3, State::Lost);
        let out = c.handle(&mut roster, Input::Lost(ids(&[1, 3])));
        assert!(
            !out.iter().any(|o| matches!(o, Output::OfferRelease { .. })),
            "{out:?}"
        );
        assert!(
            !out.iter().any(|o| matches!(o, Output::Lost(_))),
            "re-routing is not a loss: the jobs on rank 3 go on: {out:?}"
        );
        let out = report(&mut c, &mut roster, &[3], &[]);
        assert!(
            out.iter()
                .any(|o| matches!(o, Output::OfferRelease { component: 0, .. })),
            "{out:?}"
        );
    }

    /// Found by the model checker: a shrink of rank 1 waited for rank 3 (its child) to
    /// re-route, but rank 3 left in a shrink of its own, so it never would; only a repeated
    /// departure report then moved the first shrink on.
    #[test]
    fn a_shrink_waiting_for_a_survivor_to_reroute_goes_on_when_that_survivor_departs_instead() {
        let (mut c, mut roster) = dvm();
        c.handle(&mut roster, req(7, Directive::Release, &["h1"], true));
        c.handle(&mut roster, req(8, Directive::Release, &["h3"], true));
        c.handle(&mut roster, Input::Lost(ids(&[1])));
        let out = c.handle(&mut roster, Input::Lost(ids(&[3])));
        let offered: Vec<CampaignId> = out
            .iter()
            .filter_map(|o| match o {
                Output::OfferRelease { campaign, .. } => Some(*campaign),
                _ => None,
            })
            .collect();
        assert_eq!(offered, vec![2, 1], "{out:?}");
    }

    /// Found by the shrink property with random seeds: rank 3 shrinks, and rank 1 above it
    /// 28 ms later, while 3's child 7 is on its way back. 7 was lost then, so the shrink of 1
    /// did not count it among the ranks it re-routes: 7 came back through 1, the shrink of 3
    /// ended, and when 1 left a moment later 7's loss failed its job.
    #[test]
    fn a_shrink_waits_for_the_ranks_below_it_that_another_shrink_re_routes() {
        let (mut c, mut roster, tree) = dvm_of(16);
        c.handle(&mut roster, req(7, Directive::Release, &["h3"], true));
        let (below_3, _) = lose_subtree(&mut c, &mut roster, &tree, 3, &[]);
        let out = c.handle(&mut roster, req(8, Directive::Release, &["h1"], true));
        assert!(
            !out.iter().any(|o| matches!(o, Output::CutOff { .. })),
            "{out:?}"
        );
        // 7 and the rest come back through rank 1: the shrink of 3 is over.
        let out = report(&mut c, &mut roster, &below_3, &[]);
        assert_eq!(terminals(&out).len(), 1, "{out:?}");
        // Rank 1 leaves, and cuts them off again: they re-route, and are no job's failure.
        let (_, out) = lose_subtree(&mut c, &mut roster, &tree, 1, &[3]);
        assert!(!out.iter().any(|o| matches!(o, Output::Lost(_))), "{out:?}");
        assert!(terminals(&out).is_empty(), "{out:?}");
    }

    /// A target lost while another shrink re-routes the tree is on its way back: it is told
    /// to leave, not taken for gone (its children would move after its shrink ended).
    #[test]
    fn a_target_on_its_way_back_from_another_shrink_is_told_to_leave_not_cut_off() {
        let (mut c, mut roster, tree) = dvm_of(16);
        c.handle(&mut roster, req(7, Directive::Release, &["h1"], true));
        lose_subtree(&mut c, &mut roster, &tree, 1, &[]);
        let out = c.handle(&mut roster, req(8, Directive::Release, &["h3"], true));
        assert!(out.contains(&Output::Depart { rank: 3 }), "{out:?}");
        assert!(!out.contains(&Output::CutOff { rank: 3 }), "{out:?}");
        assert_eq!(roster.state(3), Some(State::Departing));
    }

    /// Found by the shrink property with random seeds: ranks 1 and 7 shrink at once, 7
    /// below 1 through rank 3. Rank 1's departure cut 3 off, and 7 with it, before 7 was
    /// even told to leave: that loss was taken for 7's departure, the shrink of 7 ended, and
    /// the jobs on 7's children failed when they moved once 7 really left.
    #[test]
    fn a_target_cut_off_with_a_survivor_above_it_has_not_departed_until_its_own_loss() {
        let (mut c, mut roster, tree) = dvm_of(16);
        c.handle(&mut roster, req(7, Directive::Release, &["h1"], true));
        c.handle(&mut roster, req(8, Directive::Release, &["h7"], true));
        let (below_1, out) = lose_subtree(&mut c, &mut roster, &tree, 1, &[]);
        assert_eq!(roster.state(7), Some(State::Departing), "{out:?}");
        assert!(terminals(&out).is_empty(), "{out:?}");
        // Rank 3 re-routes, and reports 7 and its children with it; then 7 leaves for good.
        let out = report(&mut c, &mut roster, &below_1, &[]);
        assert_eq!(roster.state(7), Some(State::Departing), "{out:?}");
        assert!(terminals(&out).is_empty(), "{out:?}");
        let out = c.handle(&mut roster, Input::Lost(ids(&[7])));
        assert_eq!(roster.state(7), Some(State::Departed), "{out:?}");
        // Both end now: the shrink of 1 waited for 7 to re-route or leave.
        assert_eq!(terminals(&out).len(), 2, "{out:?}");
    }

    /// Found by review: rank 7 got its order to leave and left while rank 3 (above it)
    /// re-routed, so its loss reached no one; then 1 left and took 3, and the loss of 7
    /// that the controller saw was only the cut. Rank 3's report back without 7 is 7's
    /// departure (it used to wait for the timeout).
    #[test]
    fn a_target_missing_from_the_report_of_the_survivor_it_was_cut_off_with_has_departed() {
        let (mut c, mut roster, tree) = dvm_of(16);
        c.handle(&mut roster, req(8, Directive::Release, &["h7"], true));
        c.handle(&mut roster, req(7, Directive::Release, &["h1"], true));
        let (below_1, _) = lose_subtree(&mut c, &mut roster, &tree, 1, &[]);
        assert_eq!(roster.state(7), Some(State::Departing));
        let back: Vec<Rank> = below_1.into_iter().filter(|&r| r != 7).collect();
        let out = report(&mut c, &mut roster, &back, &[]);
        assert_eq!(roster.state(7), Some(State::Departed), "{out:?}");
        assert_eq!(terminals(&out).len(), 2, "{out:?}");
    }

    /// Found by review: ranks 3 and 7 (below 3) shrink together; 3 leaves first and 7's loss
    /// with it counts, but 7 was still there, on its way, and rank 15 came back through it.
    /// Reached through a daemon that is leaving, 15 will move again: the shrink waits until
    /// 15 reports along daemons that stay.
    #[test]
    fn a_survivor_reported_through_a_leaving_daemon_is_not_re_routed_yet() {
        let (mut c, mut roster, tree) = dvm_of(16);
        c.handle(&mut roster, req(7, Directive::Release, &["h3", "h7"], true));
        lose_subtree(&mut c, &mut roster, &tree, 3, &[]);
        assert_eq!(roster.state(7), Some(State::Departed));
        let below_3: Vec<Rank> = (4..16)
            .filter(|&r| r != 7 && tree.ancestors(r).contains(&3))
            .collect();
        let out = report(&mut c, &mut roster, &below_3, &[15]);
        assert!(terminals(&out).is_empty(), "{out:?}");
        roster.set(15, State::Lost);
        let out = c.handle(&mut roster, Input::Lost(ids(&[15])));
        assert!(!out.iter().any(|o| matches!(o, Output::Lost(_))), "{out:?}");
        let out = report(&mut c, &mut roster, &[15], &[]);
        assert_eq!(terminals(&out).len(), 1, "{out:?}");
    }

    /// Found by review: a rank reported through a leaving daemon may be reported again, along
    /// daemons that stay, before any loss of it reaches the controller (its new path's
    /// report can overtake its old route's end): that report alone settles it.
    #[test]
    fn a_report_along_daemons_that_stay_settles_a_rank_without_a_loss_first() {
        let (mut c, mut roster, tree) = dvm_of(16);
        c.handle(&mut roster, req(7, Directive::Release, &["h3", "h7"], true));
        lose_subtree(&mut c, &mut roster, &tree, 3, &[]);
        report(&mut c, &mut roster, &[11, 15], &[15]);
        let out = report(&mut c, &mut roster, &[15], &[]);
        assert_eq!(terminals(&out).len(), 1, "{out:?}");
    }

    /// Found by review: below a survivor that crashed, everything cut off is lost anyway
    /// (no shrink re-routes it): a target's loss there is its departure, at once.
    #[test]
    fn a_target_cut_off_by_a_crash_above_it_has_departed() {
        let (mut c, mut roster, tree) = dvm_of(16);
        c.handle(&mut roster, req(8, Directive::Release, &["h7"], true));
        let (_, out) = lose_subtree(&mut c, &mut roster, &tree, 3, &[]);
        assert_eq!(roster.state(7), Some(State::Departed), "{out:?}");
        // What remains is 7's child re-routing, as in any shrink.
        let out = report(&mut c, &mut roster, &[15], &[]);
        assert_eq!(terminals(&out).len(), 1, "{out:?}");
    }

    #[test]
    fn a_shrink_target_that_never_leaves_is_cut_off_at_the_timeout() {
        let (mut c, mut roster) = dvm();
        c.handle(&mut roster, req(7, Directive::Release, &["h2"], true));
        let out = c.handle(&mut roster, Input::Timeout(1));
        assert!(out.contains(&Output::CutOff { rank: 2 }));
        assert_eq!(roster.state(2), Some(State::Departed));
        assert!(out.iter().any(|o| matches!(o, Output::OfferRelease { .. })));
    }

    #[test]
    fn phase_one_rejections_answer_with_an_error_that_names_the_problem_and_change_nothing() {
        let (mut c, mut roster) = dvm();
        let mut busy = req(7, Directive::Release, &["h2"], true);
        if let Input::Request(r) = &mut busy {
            r.busy = ids(&[2]);
        }
        let mut long = req(7, Directive::New, &["n4"], true);
        if let Input::Request(r) = &mut long {
            r.req_id = Some("x".repeat(MAX_ID_BYTES + 1));
        }
        let mut given = req(7, Directive::New, &["n4"], true);
        if let Input::Request(r) = &mut given {
            r.alloc_id = Some("mine".into());
        }
        let mut unknown = req(7, Directive::Release, &[], true);
        if let Input::Request(r) = &mut unknown {
            r.alloc_id = Some("alloc.99".into());
        }
        let cases = [
            (
                req(7, Directive::Release, &["nowhere"], true),
                "host nowhere is not in the DVM",
            ),
            (
                req(7, Directive::Release, &["h0"], true),
                "runs the controller",
            ),
            (busy, "runs job processes"),
            (req(7, Directive::New, &[], true), "needs the hosts"),
            (req(7, Directive::New, &["n4", "n4"], true), "named twice"),
            (
                req(7, Directive::New, &["bad host"], true),
                "not a host name",
            ),
            (long, "1 to 256 bytes"),
            (given, "gets its id from the DVM"),
            (unknown, "no allocation alloc.99"),
            (
                req(7, Directive::Release, &[], true),
                "names hosts or an allocation",
            ),
        ];
        let before = members(&roster);
        for (input, want) in cases {
            let out = c.handle(&mut roster, input);
            let e = error(&out).unwrap_or_else(|| panic!("no error for {want}: {out:?}"));
            assert!(e.contains(want), "{e:?} does not say {want:?}");
            assert_eq!(out.len(), 1, "a rejection is only the answer: {out:?}");
        }
        assert_eq!(members(&roster), before);
        c.handle(&mut roster, req(7, Directive::New, &["n4"], true));
        let out = c.handle(&mut roster, req(8, Directive::Release, &["n4"], true));
        assert!(error(&out).unwrap().contains("still joining"));
        // Nor is a host of a grow in flight "nothing to change": that grow may yet fail.
        let out = c.handle(&mut roster, req(9, Directive::Extend, &["n4"], true));
        assert!(
            error(&out).unwrap().contains("joining or leaving"),
            "{out:?}"
        );
    }

    #[test]
    fn teardown_fails_every_campaign_once_and_ends_every_held_job() {
        let (mut c, mut roster) = dvm();
        c.handle(&mut roster, req(7, Directive::New, &["n4"], true));
        c.handle(&mut roster, req(8, Directive::Release, &["h2"], true));
        let out = c.handle(&mut roster, Input::Teardown);
        let mut t = terminals(&out);
        t.sort();
        assert_eq!(
            t,
            vec![
                (ERR_DVM_MOD, Some(ERR_LOST_CONNECTION), "tool@0.7".into()),
                (ERR_DVM_MOD, Some(ERR_LOST_CONNECTION), "tool@0.8".into())
            ]
        );
        assert!(out.contains(&Output::KillLaunch { rank: 4 }));
        assert!(out.iter().any(|o| matches!(
            o,
            Output::AbortParked {
                launch_too: true,
                ..
            }
        )));
        assert!(out.contains(&Output::Fence(Fence::OPEN)));
        let out = c.handle(&mut roster, req(9, Directive::New, &["n6"], true));
        assert!(error(&out).unwrap().contains("stopping"));
    }

    #[test]
    fn an_allocation_extends_and_releases_by_its_id() {
        let (mut c, mut roster) = dvm();
        c.handle(&mut roster, req(7, Directive::New, &["n4"], true));
        report(&mut c, &mut roster, &[4], &[]);
        let mut ext = req(7, Directive::Extend, &["n5"], true);
        if let Input::Request(r) = &mut ext {
            r.alloc_id = Some("alloc.1".into());
        }
        let out = c.handle(&mut roster, ext);
        assert!(
            matches!(&out[0], Output::Reply { reply: ToolReply::Allocated { alloc_id, .. }, .. } if alloc_id == "alloc.1")
        );
        report(&mut c, &mut roster, &[5], &[]);
        let mut rel = req(7, Directive::Release, &[], true);
        if let Input::Request(r) = &mut rel {
            r.alloc_id = Some("alloc.1".into());
        }
        let out = c.handle(&mut roster, rel);
        assert!(
            out.contains(&Output::Depart { rank: 4 }) && out.contains(&Output::Depart { rank: 5 }),
            "{out:?}"
        );
    }
}
