//! The elastic controller's model checker: the real campaign core, job manager and roster,
//! composed as the controller composes them ([`dvmlab_core::elastic::step`]), driven through
//! every interleaving of a small world's actions — requests (grows, shrinks, no-ops,
//! rejections), daemons reporting, launches failing, targets and unrelated daemons lost,
//! departures reported twice, timeouts, release answers, jobs submitted, started, ended and
//! killed, a teardown — by a bounded depth-first search with a visited set. The overlay is
//! abstracted into those actions. After every step the safety invariants are checked; from
//! every state at the bound the world is driven to quiescence along the good path and the
//! liveness properties checked there. [`walk`] runs the same world, larger, as a seeded
//! random simulation.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use dvmlab_core::campaign::{self, CampaignId, Campaigns, Config, Kind, Origin, Request};
use dvmlab_core::elastic;
use dvmlab_core::exec::{self, JobEvent, JobId};
use dvmlab_core::jobs::{self, JobManager, WAITING_FOR_DAEMONS};
use dvmlab_core::roster::{Roster, State};
use dvmlab_core::tree::Rank;
use dvmlab_proto::event::{Proc, DVM_IS_READY, ERR_DVM_MOD};
use dvmlab_proto::idset::IdSet;
use dvmlab_proto::placement::MapBy;
use dvmlab_proto::wire::{Directive, Submit, ToolReply};

/// The size of a world and how far to explore it.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// Ranks `prte.conf` lists, the controller included (all wired at the start).
    pub initial: u32,
    /// Hosts a grow may add.
    pub spare: Vec<String>,
    /// Requests made in all (accepted, no-op or rejected).
    pub requests: usize,
    pub jobs: u32,
    /// Daemons lost that no campaign targets.
    pub unrelated_losses: usize,
    /// Release components a finished shrink is offered to.
    pub components: usize,
    /// Whether requests have a requester (else they are pushes).
    pub requester: bool,
    pub depth: usize,
}

/// One thing that can happen next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Submit,
    Start(JobId),
    End(JobId),
    Kill(JobId),
    Grow(Vec<String>),
    /// A grow naming only members: changes nothing.
    GrowNothing,
    Shrink(Rank),
    /// A release of the controller: refused in phase one.
    ShrinkController,
    Report(Rank),
    LaunchFails(Rank),
    LoseTarget(Rank),
    Depart(Rank),
    DepartAgain(Rank),
    LoseUnrelated(Rank),
    Timeout(CampaignId),
    ReleaseDone(CampaignId, usize),
    Teardown,
}

/// The controller's elastic part and what the checker remembers of the run so far.
#[derive(Debug, Clone)]
pub struct World {
    roster: Roster,
    campaigns: Campaigns,
    mgr: JobManager,
    requests: usize,
    /// Requesters of accepted requests that change the DVM: each gets one terminal event.
    expecting: BTreeSet<String>,
    /// Requesters that must get none (rejected, no-op).
    silent: BTreeSet<String>,
    terminals: BTreeMap<String, u32>,
    /// Shrink allocations and the release components that answered for them.
    shrinks: BTreeMap<String, usize>,
    offers: BTreeMap<CampaignId, usize>,
    submitted: u32,
    launched: BTreeSet<JobId>,
    started: BTreeSet<JobId>,
    ended: BTreeSet<JobId>,
    ended_unlaunched: BTreeSet<JobId>,
    exited: BTreeSet<Rank>,
    unrelated: usize,
    torn_down: bool,
    hosts_seen: Vec<String>,
}

impl World {
    pub fn new(b: &Bounds) -> World {
        let hosts: Vec<String> = (0..b.initial).map(|i| format!("h{i}")).collect();
        let mut roster = Roster::from_conf(&hosts, false, 0);
        for r in 1..b.initial {
            roster.set(r, State::Wired);
        }
        let mut mgr = JobManager::new(dvmlab_core::jobs::Saved::default()).0;
        // One launch at a time: a mapped job waits at the launch boundary, where a shrink
        // that starts meanwhile catches it.
        mgr.set_max_launching(1);
        World {
            roster,
            campaigns: Campaigns::new(Config {
                radix: 2,
                timeout: Duration::from_secs(1),
                components: (0..b.components).map(|i| format!("c{i}")).collect(),
                fault: None,
            }),
            mgr,
            requests: 0,
            expecting: BTreeSet::new(),
            silent: BTreeSet::new(),
            terminals: BTreeMap::new(),
            shrinks: BTreeMap::new(),
            offers: BTreeMap::new(),
            submitted: 0,
            launched: BTreeSet::new(),
            started: BTreeSet::new(),
            ended: BTreeSet::new(),
            ended_unlaunched: BTreeSet::new(),
            exited: BTreeSet::new(),
            unrelated: 0,
            torn_down: false,
            hosts_seen: hosts,
        }
    }

    fn fingerprint(&self) -> u64 {
        let mut h = DefaultHasher::new();
        format!("{self:?}").hash(&mut h);
        h.finish()
    }

    /// The part of the state the elastic cores own (what a no-op must leave alone).
    fn cores(&self) -> String {
        format!("{:?}{:?}{:?}", self.roster, self.campaigns, self.mgr)
    }

    fn targets_of(&self, kind: Kind) -> IdSet {
        self.campaigns
            .in_progress()
            .filter(|c| c.1 == kind)
            .fold(IdSet::new(), |acc, c| acc.union(c.2))
    }

    /// Everything that may happen next.
    pub fn enabled(&self, b: &Bounds) -> Vec<Action> {
        let mut v = Vec::new();
        if !self.torn_down && self.submitted < b.jobs {
            v.push(Action::Submit);
        }
        for id in &self.launched {
            if !self.started.contains(id) {
                v.push(Action::Start(*id));
            } else if !self.ended.contains(id) {
                v.push(Action::End(*id));
            }
        }
        for (id, _, _) in self.mgr.unlaunched() {
            v.push(Action::Kill(id));
        }
        let growing = self.targets_of(Kind::Grow);
        let shrinking = self.targets_of(Kind::Shrink);
        if !self.torn_down && self.requests < b.requests {
            let free: Vec<String> = b
                .spare
                .iter()
                .filter(|h| self.roster.rank_of(h).is_none())
                .cloned()
                .collect();
            if let Some(h) = free.first() {
                v.push(Action::Grow(vec![h.clone()]));
            }
            if free.len() >= 2 {
                v.push(Action::Grow(free[..2].to_vec()));
            }
            v.push(Action::GrowNothing);
            v.push(Action::ShrinkController);
            for (r, m) in self.roster.iter() {
                if r != 0
                    && m.state == State::Wired
                    && m.campaign.is_none()
                    && !shrinking.contains(r)
                {
                    v.push(Action::Shrink(r));
                }
            }
        }
        for r in growing.iter() {
            let s = self.roster.state(r);
            if matches!(s, Some(State::Waiting | State::Joining)) {
                v.push(Action::Report(r));
                if !self.exited.contains(&r) {
                    v.push(Action::LaunchFails(r));
                }
            }
            if !matches!(s, Some(State::Lost | State::Departed)) {
                v.push(Action::LoseTarget(r));
            }
        }
        for (r, m) in self.roster.iter() {
            match m.state {
                State::Departing => v.push(Action::Depart(r)),
                State::Departed if self.shrinks_had(r) => v.push(Action::DepartAgain(r)),
                State::Wired
                    if r != 0
                        && self.unrelated < b.unrelated_losses
                        && !growing.contains(r)
                        && !shrinking.contains(r) =>
                {
                    v.push(Action::LoseUnrelated(r))
                }
                _ => {}
            }
        }
        for (id, ..) in self.campaigns.in_progress() {
            v.push(Action::Timeout(id));
        }
        for (c, comp) in &self.offers {
            v.push(Action::ReleaseDone(*c, *comp));
        }
        if !self.torn_down {
            v.push(Action::Teardown);
        }
        v
    }

    fn shrinks_had(&self, r: Rank) -> bool {
        // A departed rank of the initial DVM can only have left by a shrink (or be a
        // rolled-back grow's, which the overlay would never report twice either way).
        (r as usize) < self.hosts_seen.len()
    }

    fn request(&mut self, directive: Directive, hosts: Vec<String>, b: &Bounds) -> campaign::Input {
        self.requests += 1;
        let link = 100 + self.requests as u64;
        campaign::Input::Request(Request {
            origin: Origin {
                link,
                requester: b.requester.then(|| Proc {
                    nspace: format!("tool@0.{link}"),
                    rank: 0,
                }),
                wait: false,
            },
            directive,
            hosts,
            alloc_id: None,
            req_id: None,
            busy: IdSet::new(),
        })
    }

    /// Carries out `a`; checks every safety invariant on the step. `Err` says which broke.
    pub fn apply(&mut self, a: &Action, b: &Bounds) -> Result<(), String> {
        let before = self.clone();
        let mut jobs_out = Vec::new();
        let mut camp_out = Vec::new();
        let camp = |w: &mut World, input: campaign::Input| {
            elastic::step(&mut w.campaigns, &mut w.roster, &mut w.mgr, input)
        };
        let step = match a {
            Action::Submit => {
                self.submitted += 1;
                let job = Submit {
                    argv: vec!["true".into()],
                    env: vec![],
                    cwd: None,
                    nprocs: None,
                    map_by: MapBy::Node,
                    hosts: None,
                    time_limit_ms: None,
                    userid: 0,
                    stdin: false,
                };
                let jobs = self
                    .mgr
                    .handle(&self.roster, jobs::Input::Submit { link: 1, job });
                elastic::Step {
                    jobs,
                    ..Default::default()
                }
            }
            Action::Start(id) => {
                self.started.insert(*id);
                let jobs = self.mgr.handle(
                    &self.roster,
                    jobs::Input::Event(JobEvent::Started { id: *id }),
                );
                elastic::Step {
                    jobs,
                    ..Default::default()
                }
            }
            Action::End(id) => {
                self.ended.insert(*id);
                let mut out = self.mgr.handle(
                    &self.roster,
                    jobs::Input::Event(JobEvent::Finished { id: *id, status: 0 }),
                );
                out.extend(self.mgr.handle(
                    &self.roster,
                    jobs::Input::Event(JobEvent::Released {
                        id: *id,
                        ranks: IdSet::new(),
                        last: true,
                    }),
                ));
                elastic::Step {
                    jobs: out,
                    ..Default::default()
                }
            }
            Action::Kill(id) => {
                let jobs = self.mgr.handle(
                    &self.roster,
                    jobs::Input::Kill {
                        link: 1,
                        id: *id,
                        signal: 9,
                    },
                );
                elastic::Step {
                    jobs,
                    ..Default::default()
                }
            }
            Action::Grow(hosts) => {
                let i = self.request(Directive::New, hosts.clone(), b);
                camp(self, i)
            }
            Action::GrowNothing => {
                let i = self.request(Directive::Extend, vec!["h1".into()], b);
                camp(self, i)
            }
            Action::ShrinkController => {
                let i = self.request(Directive::Release, vec!["h0".into()], b);
                camp(self, i)
            }
            Action::Shrink(r) => {
                let host = self.roster.host(*r).to_string();
                let i = self.request(Directive::Release, vec![host], b);
                camp(self, i)
            }
            Action::Report(r) => {
                self.roster.set(*r, State::Wired);
                camp(
                    self,
                    campaign::Input::Wired {
                        ranks: [*r].into_iter().collect(),
                        unsettled: IdSet::new(),
                    },
                )
            }
            Action::LaunchFails(r) => {
                self.exited.insert(*r);
                camp(
                    self,
                    campaign::Input::LaunchExited {
                        rank: *r,
                        status: 256,
                    },
                )
            }
            Action::LoseTarget(r)
            | Action::LoseUnrelated(r)
            | Action::Depart(r)
            | Action::DepartAgain(r) => {
                if matches!(a, Action::LoseUnrelated(_)) {
                    self.unrelated += 1;
                }
                // As the overlay does: a lost route marks the rank lost (a departing or
                // departed rank keeps its state) and the campaign core hears of it.
                self.roster.set(*r, State::Lost);
                camp(self, campaign::Input::Lost([*r].into_iter().collect()))
            }
            Action::Timeout(c) => camp(self, campaign::Input::Timeout(*c)),
            Action::ReleaseDone(c, comp) => {
                self.offers.remove(c);
                let alloc = self
                    .campaigns
                    .in_progress()
                    .find(|x| x.0 == *c)
                    .map(|x| x.4.to_string());
                if let Some(alloc) = alloc {
                    *self.shrinks.entry(alloc).or_default() += 1;
                }
                camp(
                    self,
                    campaign::Input::ReleaseDone {
                        campaign: *c,
                        component: *comp,
                    },
                )
            }
            Action::Teardown => {
                self.torn_down = true;
                camp(self, campaign::Input::Teardown)
            }
        };
        camp_out.extend(step.campaign);
        jobs_out.extend(step.jobs);
        self.observe(&before, a, camp_out, jobs_out, b)
    }

    /// Takes in a step's outputs and checks the invariants I1–I10 on it.
    fn observe(
        &mut self,
        before: &World,
        a: &Action,
        camp_out: Vec<campaign::Output>,
        jobs_out: Vec<jobs::Output>,
        b: &Bounds,
    ) -> Result<(), String> {
        let requester = format!("tool@0.{}", 100 + self.requests);
        for o in &camp_out {
            match o {
                campaign::Output::Reply { reply, .. } => match reply {
                    ToolReply::Allocated {
                        changed: true,
                        ranks,
                        alloc_id,
                        ..
                    } => {
                        if b.requester {
                            self.expecting.insert(requester.clone());
                        }
                        if matches!(a, Action::Shrink(_)) {
                            self.shrinks.insert(alloc_id.clone(), 0);
                        }
                        if ranks.is_empty() {
                            return Err("I10: a change accepted with no rank".into());
                        }
                    }
                    ToolReply::Allocated { changed: false, .. } | ToolReply::Error { .. } => {
                        self.silent.insert(requester.clone());
                    }
                    _ => {}
                },
                campaign::Output::Terminal {
                    requester,
                    code,
                    alloc_id,
                    ..
                } => {
                    let who = &requester.nspace;
                    if self.silent.contains(who) || !self.expecting.contains(who) {
                        return Err(format!("I10: a terminal event for {who}, whose request changed nothing or was refused"));
                    }
                    let n = self.terminals.entry(who.clone()).or_default();
                    *n += 1;
                    if *n > 1 {
                        return Err(format!("I10: a second terminal event for {who}"));
                    }
                    if *code == DVM_IS_READY {
                        if let Some(done) = self.shrinks.get(alloc_id) {
                            if *done < b.components {
                                return Err(format!(
                                    "I10: {alloc_id} ready after {done} of {} release components",
                                    b.components
                                ));
                            }
                        }
                    } else if *code != ERR_DVM_MOD {
                        return Err(format!("I10: terminal event code {code}"));
                    }
                }
                campaign::Output::OfferRelease {
                    campaign,
                    component,
                    ..
                } => {
                    self.offers.insert(*campaign, *component);
                }
                _ => {}
            }
        }
        // Worked out here from each member, not asked of the roster: the invariant must not
        // share the code it checks.
        let compute: IdSet = self
            .roster
            .iter()
            .filter(|(r, m)| *r != 0 && m.state == State::Wired && m.campaign.is_none())
            .map(|(r, _)| r)
            .collect();
        let fence = self.campaigns.fence();
        for o in &jobs_out {
            match o {
                jobs::Output::Exec(exec::Input::Submit { id, ranks, .. }) => {
                    if !ranks.difference(&compute).is_empty() {
                        return Err(format!(
                            "I1/I2: job {id} launched onto ranks {ranks}, but only {compute} may run jobs"
                        ));
                    }
                    if !fence.launch_open {
                        return Err(format!(
                            "I4: job {id} launched through a closed boundary ({fence:?})"
                        ));
                    }
                    if !self.launched.insert(*id) || self.ended_unlaunched.contains(id) {
                        return Err(format!("I5: job {id} launched twice or after it ended"));
                    }
                }
                jobs::Output::Ended { id, .. } if !self.launched.contains(id) => {
                    self.ended_unlaunched.insert(*id);
                }
                _ => {}
            }
        }
        // I4: while any campaign is in progress no job is mapped (submitted or held).
        let mapped = |w: &World| -> BTreeSet<JobId> {
            w.mgr
                .unlaunched()
                .filter(|(_, unmapped, _)| !*unmapped)
                .map(|(id, ..)| id)
                .chain(w.launched.iter().copied())
                .collect()
        };
        if !fence.map_open {
            if let Some(id) = mapped(self).difference(&mapped(before)).next() {
                return Err(format!(
                    "I4: job {id} was mapped while a campaign is in progress"
                ));
            }
        }
        // I3: a job is shown waiting exactly while a campaign holds it.
        let unlaunched: BTreeMap<JobId, bool> = self
            .mgr
            .unlaunched()
            .map(|(id, unmapped, _)| (id, unmapped))
            .collect();
        for (id, state) in self.mgr.states() {
            let held = match unlaunched.get(&id) {
                Some(true) => true,
                Some(false) => !fence.launch_open,
                None => false,
            };
            if held != (state == WAITING_FOR_DAEMONS) {
                return Err(format!(
                    "I3: job {id} is {state} (held: {held}, fence {fence:?})"
                ));
            }
            if held && self.launched.contains(&id) {
                return Err(format!("I3: job {id} is held but was launched"));
            }
        }
        // I6: a loss nobody targets changes no campaign and no held job.
        if matches!(a, Action::LoseUnrelated(_)) {
            let c = |w: &World| format!("{:?}", w.campaigns.in_progress().collect::<Vec<_>>());
            let u = |w: &World| format!("{:?}", w.mgr.unlaunched().collect::<Vec<_>>());
            if c(before) != c(self) || u(before) != u(self) {
                return Err("I6: an unrelated loss changed a campaign or a held job".into());
            }
        }
        // I7: a repeated departure changes nothing.
        if matches!(a, Action::DepartAgain(_)) && before.cores() != self.cores() {
            return Err("I7: a repeated departure changed the state".into());
        }
        // I8: a grow that failed is undone exactly, and touched nothing else.
        if !matches!(a, Action::Teardown) {
            for (id, kind, targets, ..) in before.campaigns.in_progress() {
                let gone = !self.campaigns.in_progress().any(|c| c.0 == id);
                let failed = targets
                    .iter()
                    .any(|r| self.roster.state(r) == Some(State::Departed));
                if kind == Kind::Grow && gone && failed {
                    if let Some(r) = targets
                        .iter()
                        .find(|r| self.roster.state(*r) != Some(State::Departed))
                    {
                        return Err(format!("I8: grow {id} failed but its rank {r} stays"));
                    }
                    for (r, m) in before.roster.iter() {
                        let now = self.roster.get(r).map(|n| (n.state, n.host.clone()));
                        if !targets.contains(r) && now != Some((m.state, m.host.clone())) {
                            return Err(format!("I8: grow {id}'s rollback changed rank {r}"));
                        }
                    }
                }
            }
        }
        // I9: ranks are never reused or renamed.
        if self.roster.len() < before.roster.len()
            || before
                .roster
                .iter()
                .any(|(r, m)| self.roster.host(r) != m.host)
        {
            return Err("I9: a rank was dropped or renamed".into());
        }
        // No job stays held once no campaign is in progress.
        if self.campaigns.in_progress().next().is_none() {
            if let Some((id, _)) = self.mgr.states().find(|(_, s)| *s == WAITING_FOR_DAEMONS) {
                return Err(format!("no campaign in progress, yet job {id} is held"));
            }
        }
        Ok(())
    }

    /// Drives the world along the good path (daemons report, targets depart, components
    /// answer, jobs start and end; timeouts last) to quiescence and checks liveness there.
    pub fn drain(&mut self, b: &Bounds) -> Result<(), String> {
        for _ in 0..200 {
            let acts = self.enabled(b);
            let good = acts
                .iter()
                .find(|a| {
                    matches!(
                        a,
                        Action::Report(_)
                            | Action::Depart(_)
                            | Action::ReleaseDone(..)
                            | Action::Start(_)
                            | Action::End(_)
                    )
                })
                .or_else(|| acts.iter().find(|a| matches!(a, Action::Timeout(_))))
                .cloned();
            let Some(a) = good else {
                break;
            };
            self.apply(&a, b)?;
        }
        if let Some(c) = self.campaigns.in_progress().next() {
            return Err(format!("liveness: campaign {} never ends", c.0));
        }
        if let Some((id, ..)) = self.mgr.unlaunched().next() {
            return Err(format!("liveness: job {id} is never launched nor ended"));
        }
        for who in &self.expecting {
            if self.terminals.get(who) != Some(&1) {
                return Err(format!("liveness: {who} never hears its terminal event"));
            }
        }
        Ok(())
    }
}

/// What an exhaustive run covered.
#[derive(Debug, Default)]
pub struct Coverage {
    pub states: usize,
    pub transitions: usize,
    pub drained: usize,
    /// How often each kind of action was taken.
    pub actions: BTreeMap<String, usize>,
}

/// Explores every interleaving of `b`'s world to its depth; the first broken invariant
/// comes back with the actions that led to it.
pub fn explore(b: &Bounds) -> Result<Coverage, String> {
    let mut seen = HashSet::new();
    let mut cov = Coverage::default();
    let start = World::new(b);
    seen.insert(start.fingerprint());
    let mut stack = vec![(start, Vec::<Action>::new())];
    while let Some((w, path)) = stack.pop() {
        cov.states += 1;
        let acts = w.enabled(b);
        if path.len() >= b.depth || acts.is_empty() {
            cov.drained += 1;
            let mut d = w.clone();
            d.drain(b)
                .map_err(|e| format!("{e}\n  after {path:?} and the good path"))?;
            continue;
        }
        for a in acts {
            let mut next = w.clone();
            let kind = format!("{a:?}")
                .split(['(', ' '])
                .next()
                .unwrap_or("")
                .to_string();
            *cov.actions.entry(kind).or_default() += 1;
            cov.transitions += 1;
            let mut p = path.clone();
            p.push(a.clone());
            next.apply(&a, b)
                .map_err(|e| format!("{e}\n  after {p:?}"))?;
            if seen.insert(next.fingerprint()) {
                stack.push((next, p));
            }
        }
    }
    Ok(cov)
}

/// A seeded random walk of `steps` actions through `b`'s world, drained at the end.
pub fn walk(b: &Bounds, seed: u64, steps: usize) -> Result<(), String> {
    let mut w = World::new(b);
    let mut x = seed | 1;
    let mut path = Vec::new();
    for _ in 0..steps {
        let acts = w.enabled(b);
        if acts.is_empty() {
            break;
        }
        // xorshift64: reproducible from the seed alone.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let a = acts[(x % acts.len() as u64) as usize].clone();
        path.push(a.clone());
        w.apply(&a, b)
            .map_err(|e| format!("seed {seed}: {e}\n  after {path:?}"))?;
    }
    w.drain(b)
        .map_err(|e| format!("seed {seed}: {e}\n  after {path:?}"))
}
