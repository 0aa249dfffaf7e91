//! The independent checker: it reads a history (nothing of the runtime's, not even its
//! crates) and says, property by property, whether the run kept the promises the specs make.
//! Each violation names the history lines that show it, so the smallest window of history
//! that proves it can be printed with the seed.
//!
//! It judges fairly: an outcome that is not the one a job would have had alone is a
//! violation only when no fault or campaign of the history could explain it, and a
//! delivery is required only of listeners that were ready before, alive after, and saw no
//! fault anywhere in between.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

use crate::history::{
    Campaign, DaemonWhat, Entry, Expect, Fault, ListenerPhase, Op, Record, NEVER_RETURNED,
};

/// A fault's effects (heartbeat timeouts, reconnects, relayed tools closed) outlast it by
/// this much, and a job's outcome may show it that long after.
const FAULT_TAIL_US: u64 = 20_000_000;
/// A grow or shrink request's tool returns once the campaign ended (it waits for the
/// terminal event, or `--wait`); what the campaign did to jobs shows at most this much later.
const CAMPAIGN_TAIL_US: u64 = 2_000_000;
/// How long a notification may take to reach a listener on a quiet DVM.
const DELIVERY_US: u64 = 10_000_000;
/// The soak's own event code (`pevent notify`), and PMIx's job end.
pub const SOAK_CODE: i64 = -3900;
pub const JOB_END: i64 = -145;
pub const DVM_IS_READY: i64 = -195;
pub const DVM_MOD: i64 = -196;
/// prun's exit when it lost or could not reach the DVM (a tool failure, not the job's).
pub const TOOL_FAILED: i32 = 3;

/// One property's verdict.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub property: &'static str,
    pub claim: &'static str,
    /// How many things it looked at (jobs, starts, requests, deliveries).
    pub checked: usize,
    pub violations: Vec<Violation>,
}

/// One broken promise and the history lines (indices) that show it.
#[derive(Debug, Clone)]
pub struct Violation {
    pub what: String,
    pub lines: Vec<usize>,
}

impl Verdict {
    /// `PASS` or `FAIL`.
    pub fn verdict(&self) -> &'static str {
        if self.violations.is_empty() {
            "PASS"
        } else {
            "FAIL"
        }
    }
}

impl Violation {
    fn new(what: String, mut lines: Vec<usize>) -> Violation {
        lines.sort_unstable();
        lines.dedup();
        Violation { what, lines }
    }

    /// The smallest window of history holding every line that shows it.
    pub fn window(&self, h: &[Record]) -> (u64, u64) {
        let ts = self.lines.iter().filter_map(|&i| h.get(i)).map(|r| r.t_us);
        let lo = ts.clone().min().unwrap_or(0);
        (lo, ts.max().unwrap_or(lo))
    }
}

/// The properties, in report order.
pub const PROPERTIES: [(&str, &str); 9] = [
    ("jobs-end-once", "every submitted job ended exactly once, with a definite outcome that is its own or explained by a fault or campaign"),
    ("job-ids-unique", "no job id names two jobs, across controller restarts too"),
    ("no-job-runs-twice", "no process of a job was started twice"),
    ("starts-on-wired-daemons", "no process started on a daemon that had not joined, or was departing"),
    ("no-parked-job", "no job stayed held once every campaign had ended"),
    ("one-terminal-event", "exactly one terminal event per accepted allocation request that changes something, none otherwise"),
    ("no-leftover-process", "no job process was left on any host at the end"),
    ("final-membership", "after the final heal the DVM is formed with the membership the history says it should have"),
    ("event-ranges", "every event reached only listeners in its range, none twice, and every quiet in-range listener"),
];

/// What the checker needs of a history, indexed once.
struct Index<'a> {
    h: &'a [Record],
    controller: String,
    initial: Vec<String>,
    invokes: BTreeMap<u64, usize>,
    completes: BTreeMap<u64, Vec<usize>>,
    /// (start line, end line if undone).
    faults: Vec<(usize, Option<usize>)>,
    jobs_by_tag: HashMap<String, Vec<usize>>,
    jobs_by_id: BTreeMap<u64, Vec<usize>>,
    statuses: Vec<usize>,
    helds: Vec<usize>,
    final_line: Option<usize>,
}

impl<'a> Index<'a> {
    fn new(h: &'a [Record]) -> Index<'a> {
        let mut ix = Index {
            h,
            controller: String::new(),
            initial: Vec::new(),
            invokes: BTreeMap::new(),
            completes: BTreeMap::new(),
            faults: Vec::new(),
            jobs_by_tag: HashMap::new(),
            jobs_by_id: BTreeMap::new(),
            statuses: Vec::new(),
            helds: Vec::new(),
            final_line: None,
        };
        let mut open: HashMap<u64, usize> = HashMap::new();
        for (i, r) in h.iter().enumerate() {
            match &r.entry {
                Entry::Meta {
                    controller,
                    initial,
                    ..
                } => {
                    ix.controller = controller.clone();
                    ix.initial = initial.clone();
                }
                Entry::Invoke { op, .. } => {
                    ix.invokes.insert(*op, i);
                }
                Entry::Complete { op, .. } => ix.completes.entry(*op).or_default().push(i),
                Entry::Fault {
                    id, start: true, ..
                } => {
                    open.insert(*id, ix.faults.len());
                    ix.faults.push((i, None));
                }
                Entry::Fault {
                    id, start: false, ..
                } => {
                    if let Some(k) = open.remove(id) {
                        ix.faults[k].1 = Some(i);
                    }
                }
                Entry::Job { id, tag, .. } => {
                    ix.jobs_by_id.entry(*id).or_default().push(i);
                    if let Some(t) = tag {
                        ix.jobs_by_tag.entry(t.clone()).or_default().push(i);
                    }
                }
                Entry::Status { .. } => ix.statuses.push(i),
                Entry::Held { .. } => ix.helds.push(i),
                Entry::Final { .. } => ix.final_line = Some(i),
                _ => {}
            }
        }
        ix
    }

    fn t(&self, i: usize) -> u64 {
        self.h[i].t_us
    }

    /// The span of operation `op`: invoked, completed (or the end of the history).
    fn span(&self, op: u64) -> (u64, u64) {
        let lo = self.invokes.get(&op).map(|&i| self.t(i)).unwrap_or(0);
        let hi = self
            .completes
            .get(&op)
            .and_then(|c| c.first())
            .map(|&i| self.t(i))
            .unwrap_or(u64::MAX);
        (lo, hi)
    }

    /// A fault in effect (or just undone) at some time in `[lo, hi]`: its start line.
    fn fault_during(&self, lo: u64, hi: u64) -> Option<usize> {
        self.faults.iter().find_map(|&(s, e)| {
            let end = e.map(|e| self.t(e).saturating_add(FAULT_TAIL_US));
            (self.t(s) <= hi && end.is_none_or(|end| end >= lo)).then_some(s)
        })
    }

    /// A grow or shrink operation in progress at some time in `[lo, hi]`.
    fn campaign_op_during(&self, lo: u64, hi: u64) -> Option<usize> {
        self.invokes.iter().find_map(|(&op, &i)| {
            let Entry::Invoke { what, .. } = &self.h[i].entry else {
                return None;
            };
            if !matches!(what, Op::Grow { .. } | Op::Shrink { .. }) {
                return None;
            }
            let (a, b) = self.span(op);
            (a <= hi && b.saturating_add(CAMPAIGN_TAIL_US) >= lo).then_some(i)
        })
    }

    /// The latest status line before `t`, if any.
    fn status_before(&self, t: u64) -> Option<usize> {
        self.statuses.iter().rev().copied().find(|&i| self.t(i) < t)
    }
}

fn lines(v: &[String]) -> Vec<Value> {
    v.iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

/// Checks every property of `h`.
pub fn check(h: &[Record]) -> Vec<Verdict> {
    let ix = Index::new(h);
    let mut out = Vec::new();
    let mut add = |k: usize, checked: usize, violations: Vec<Violation>| {
        out.push(Verdict {
            property: PROPERTIES[k].0,
            claim: PROPERTIES[k].1,
            checked,
            violations,
        })
    };
    let (n, v) = jobs_end_once(&ix);
    add(0, n, v);
    let (n, v) = job_ids_unique(&ix);
    add(1, n, v);
    let (n, v) = no_job_runs_twice(&ix);
    add(2, n, v);
    let (n, v) = starts_on_wired_daemons(&ix);
    add(3, n, v);
    let (n, v) = no_parked_job(&ix);
    add(4, n, v);
    let (n, v) = one_terminal_event(&ix);
    add(5, n, v);
    let (n, v) = no_leftover_process(&ix);
    add(6, n, v);
    let (n, v) = final_membership(&ix);
    add(7, n, v);
    let (n, v) = event_ranges(&ix);
    add(8, n, v);
    out
}

/// The exit code a wait status gives prun (128 + signal, or the exit code).
fn exit_of(status: i32) -> i32 {
    if status & 0x7f != 0 {
        128 + (status & 0x7f)
    } else {
        (status >> 8) & 0xff
    }
}

fn jobs_end_once(ix: &Index) -> (usize, Vec<Violation>) {
    let mut v = Vec::new();
    let mut n = 0;
    let unended: BTreeSet<u64> = match ix.final_line.map(|i| &ix.h[i].entry) {
        Some(Entry::Final { unended, .. }) => unended.iter().copied().collect(),
        _ => BTreeSet::new(),
    };
    for (&op, &inv) in &ix.invokes {
        let Entry::Invoke {
            what: Op::Job { tag, expect, .. },
            ..
        } = &ix.h[inv].entry
        else {
            continue;
        };
        n += 1;
        let completes = ix.completes.get(&op).cloned().unwrap_or_default();
        if completes.len() != 1 {
            let mut l = vec![inv];
            l.extend(&completes);
            v.push(Violation::new(
                format!(
                    "job {tag} (op {op}): prun completed {} times",
                    completes.len()
                ),
                l,
            ));
            continue;
        }
        let done = completes[0];
        let Entry::Complete { exit, err, .. } = &ix.h[done].entry else {
            continue;
        };
        let records = ix.jobs_by_tag.get(tag).cloned().unwrap_or_default();
        // No fault the nemesis makes lasts anywhere near an operation's deadline (minutes),
        // and a controller or daemon going ends its tools' connections: a prun still
        // waiting then was never answered, whatever else happened.
        if err.last().is_some_and(|l| l == NEVER_RETURNED) {
            let mut l = vec![inv, done];
            l.extend(records.last());
            v.push(Violation::new(
                format!("job {tag} (op {op}): prun never heard how its job ended; killed at the soak's deadline"),
                l,
            ));
            continue;
        }
        // Ended once: a record after the job was INACTIVE must not show it live again.
        let mut ended_at = None;
        for &r in &records {
            if let Entry::Job { state, .. } = &ix.h[r].entry {
                match (ended_at, state.as_str()) {
                    (None, "INACTIVE") => ended_at = Some(r),
                    (Some(e), s) if s != "INACTIVE" => v.push(Violation::new(
                        format!("job {tag}: shown {s} after it had ended"),
                        vec![inv, e, r],
                    )),
                    _ => {}
                }
            }
        }
        let last = records.last().map(|&r| &ix.h[r].entry);
        let (last_id, last_status, exception) = match last {
            Some(Entry::Job {
                id,
                status,
                exception,
                ..
            }) => (Some(*id), *status, exception.clone()),
            _ => (None, None, None),
        };
        if let Some(id) = last_id {
            if unended.contains(&id) {
                let mut l = vec![inv, done];
                l.extend(ix.final_line);
                v.push(Violation::new(
                    format!("job {tag} (id {id}) had not ended after the final heal"),
                    l,
                ));
                continue;
            }
        }
        let (lo, hi) = ix.span(op);
        let explained = ix
            .fault_during(lo, hi)
            .or_else(|| ix.campaign_op_during(lo, hi));
        if !records.is_empty() && ended_at.is_none() {
            // Seen accepted, never seen ending: lost, unless a controller restart may have
            // taken its end from view.
            let restart = ix.faults.iter().find(|&&(s, _)| {
                matches!(
                    &ix.h[s].entry,
                    Entry::Fault {
                        fault: Fault::ControllerRestart { .. },
                        ..
                    }
                ) && ix.t(s) >= lo
            });
            if restart.is_none() {
                let mut l = vec![inv, done];
                l.extend(records.last());
                v.push(Violation::new(
                    format!("job {tag} was accepted but never seen ending: lost"),
                    l,
                ));
                continue;
            }
        }
        let own = match (exit, expect) {
            (Some(e), Expect::Exit(k)) => e == k,
            (Some(e), Expect::Killed) => {
                *e == 137
                    || exception
                        .as_deref()
                        .is_some_and(|x| x.starts_with("cancel"))
            }
            (Some(_), Expect::TimedOut) => exception
                .as_deref()
                .is_some_and(|x| x.starts_with("timeout")),
            (None, _) => false,
        };
        // prun's exit must be what pctl says the job's status was.
        if let (Some(e), Some(s), Some(_)) = (exit, last_status, ended_at) {
            if *e != TOOL_FAILED && *e != exit_of(s) {
                v.push(Violation::new(
                    format!(
                        "job {tag}: prun exited {e} but the DVM says its status was {s} (exit {})",
                        exit_of(s)
                    ),
                    vec![inv, done, ended_at.unwrap_or(done)],
                ));
                continue;
            }
        }
        if !own && explained.is_none() {
            let mut l = vec![inv, done];
            l.extend(records.last());
            v.push(Violation::new(
                format!(
                    "job {tag}: ended with exit {exit:?}{} where {expect:?} was due, with no fault or campaign to explain it ({})",
                    exception.map(|e| format!(", exception {e:?}")).unwrap_or_default(),
                    err.last().cloned().unwrap_or_default()
                ),
                l,
            ));
        }
    }
    (n, v)
}

fn job_ids_unique(ix: &Index) -> (usize, Vec<Violation>) {
    let mut v = Vec::new();
    for (id, recs) in &ix.jobs_by_id {
        let mut tags: BTreeMap<&str, usize> = BTreeMap::new();
        for &r in recs {
            if let Entry::Job { tag: Some(t), .. } = &ix.h[r].entry {
                tags.entry(t.as_str()).or_insert(r);
            }
        }
        if tags.len() > 1 {
            v.push(Violation::new(
                format!(
                    "job id {id} named {} different jobs: {}",
                    tags.len(),
                    tags.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
                tags.values().copied().collect(),
            ));
        }
    }
    (ix.jobs_by_id.len(), v)
}

/// The tag job `id` had at time `t`: the last one it was shown with before `t` (the first
/// ever, if none before).
fn tag_of(ix: &Index, id: u64, t: u64) -> Option<String> {
    let recs = ix.jobs_by_id.get(&id)?;
    let pick = recs
        .iter()
        .rev()
        .find(|&&r| ix.t(r) <= t)
        .or(recs.first())?;
    match &ix.h[*pick].entry {
        Entry::Job { tag, .. } => tag.clone(),
        _ => None,
    }
}

fn no_job_runs_twice(ix: &Index) -> (usize, Vec<Violation>) {
    let mut seen: HashMap<(String, u32), usize> = HashMap::new();
    let mut v = Vec::new();
    let mut n = 0;
    for (i, r) in ix.h.iter().enumerate() {
        if let Entry::ProcStart { job, proc, .. } = &r.entry {
            n += 1;
            let who = tag_of(ix, *job, r.t_us).unwrap_or_else(|| format!("id {job}"));
            if let Some(&first) = seen.get(&(who.clone(), *proc)) {
                v.push(Violation::new(
                    format!("process {proc} of job {who} was started twice"),
                    vec![first, i],
                ));
            } else {
                seen.insert((who, *proc), i);
            }
        }
    }
    (n, v)
}

fn starts_on_wired_daemons(ix: &Index) -> (usize, Vec<Violation>) {
    let mut v = Vec::new();
    let mut n = 0;
    let mut by_host: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, r) in ix.h.iter().enumerate() {
        if let Entry::Daemon { host, .. } = &r.entry {
            by_host.entry(host.as_str()).or_default().push(i);
        }
    }
    for lines in by_host.values_mut() {
        lines.sort_by_key(|&i| ix.t(i));
    }
    for (i, r) in ix.h.iter().enumerate() {
        let Entry::ProcStart {
            host,
            rank,
            job,
            proc,
            ..
        } = &r.entry
        else {
            continue;
        };
        n += 1;
        let t = r.t_us;
        let life: Vec<usize> = by_host
            .get(host.as_str())
            .map(|ls| {
                let before: Vec<usize> = ls.iter().copied().filter(|&l| ix.t(l) <= t).collect();
                let start = before.iter().rposition(|&l| {
                    matches!(&ix.h[l].entry, Entry::Daemon { what: DaemonWhat::Started, rank: rr, .. } if rr == rank)
                });
                start.map(|s| before[s..].to_vec()).unwrap_or_default()
            })
            .unwrap_or_default();
        let what = |w: DaemonWhat| {
            life.iter()
                .copied()
                .find(|&l| matches!(&ix.h[l].entry, Entry::Daemon { what, .. } if *what == w))
        };
        let who = format!("process {proc} of job {job} on {host} (rank {rank})");
        if life.is_empty() {
            v.push(Violation::new(
                format!("{who}: no daemon of that rank had started there"),
                vec![i],
            ));
        } else if what(DaemonWhat::Joined).is_none() {
            v.push(Violation::new(
                format!("{who}: started before its daemon had joined the DVM"),
                vec![life[0], i],
            ));
        } else if let Some(d) = what(DaemonWhat::Departing) {
            v.push(Violation::new(
                format!("{who}: started after its daemon was told to depart"),
                vec![d, i],
            ));
        }
        // The controller's side: the job was submitted after the DVM said the rank was on
        // its way out, so it cannot have been placed there legitimately.
        if let Some(tag) = tag_of(ix, *job, t) {
            let inv = ix.invokes.values().copied().find(|&k| {
                matches!(&ix.h[k].entry, Entry::Invoke { what: Op::Job { tag: tg, .. }, .. } if *tg == tag)
            });
            if let Some(inv) = inv {
                if let Some(s) = ix.status_before(ix.t(inv)) {
                    if let Entry::Status { members, .. } = &ix.h[s].entry {
                        if members.iter().any(|m| {
                            m.rank == *rank && (m.state == "departing" || m.state == "departed")
                        }) {
                            v.push(Violation::new(
                                format!("{who}: the job was submitted after the DVM showed rank {rank} leaving"),
                                vec![s, inv, i],
                            ));
                        }
                    }
                }
            }
        }
    }
    (n, v)
}

fn campaigns_of(e: &Entry) -> Option<&Vec<Campaign>> {
    match e {
        Entry::Status { campaigns, .. } => Some(campaigns),
        _ => None,
    }
}

fn no_parked_job(ix: &Index) -> (usize, Vec<Violation>) {
    let mut v = Vec::new();
    // Held intervals per job, from the changes of the held set.
    let mut since: BTreeMap<u64, usize> = BTreeMap::new();
    let mut intervals: Vec<(u64, usize, Option<usize>)> = Vec::new();
    for &i in &ix.helds {
        let Entry::Held { ids } = &ix.h[i].entry else {
            continue;
        };
        let now: BTreeSet<u64> = ids.iter().copied().collect();
        for id in &now {
            since.entry(*id).or_insert(i);
        }
        let gone: Vec<u64> = since.keys().filter(|k| !now.contains(k)).copied().collect();
        for id in gone {
            if let Some(s) = since.remove(&id) {
                intervals.push((id, s, Some(i)));
            }
        }
    }
    intervals.extend(since.into_iter().map(|(id, s)| (id, s, None)));
    // Every held interval, and the final state.
    let n = intervals.len() + 1;
    for (id, from, to) in intervals {
        let (a, b) = (ix.t(from), to.map(|t| ix.t(t)).unwrap_or(u64::MAX));
        // Two status reads in a row inside the interval, both with no campaign, and no
        // grow or shrink of the workload in flight around them: parked for nothing.
        let inside: Vec<usize> = ix
            .statuses
            .iter()
            .copied()
            .filter(|&s| ix.t(s) > a && ix.t(s) < b)
            .collect();
        let parked = inside.windows(2).find(|w| {
            w.iter()
                .all(|&s| campaigns_of(&ix.h[s].entry).is_some_and(|c| c.is_empty()))
                && ix
                    .campaign_op_during(ix.t(w[0]).saturating_sub(2_000_000), ix.t(w[1]))
                    .is_none()
        });
        if let Some(w) = parked {
            let mut l = vec![from, w[0], w[1]];
            l.extend(to);
            v.push(Violation::new(
                format!("job id {id} stayed held while no campaign ran"),
                l,
            ));
        }
    }
    if let Some(f) = ix.final_line {
        if let Entry::Final { held, .. } = &ix.h[f].entry {
            if !held.is_empty() {
                v.push(Violation::new(
                    format!("jobs {held:?} still held after every campaign ended"),
                    vec![f],
                ));
            }
        }
    }
    (n, v)
}

/// What a grow or shrink request came to, from its tool's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Done,
    Failed,
    /// Rejected at once, or accepted with nothing to change.
    Nothing,
    /// The tool lost the DVM before it knew.
    Unknown,
}

fn change_of(requester: bool, out: &[String]) -> (Change, usize) {
    let ls = lines(out);
    let phase = |p: &'static str| ls.iter().filter(move |l| l["phase"] == p);
    let events: Vec<&Value> = phase("event").collect();
    let rejected = phase("rejected").next().is_some();
    let unchanged = phase("accepted").any(|l| l["changed"] == false);
    let c = if rejected || unchanged {
        Change::Nothing
    } else if requester {
        match events.first().map(|e| e["code"].as_i64()) {
            Some(Some(DVM_IS_READY)) => Change::Done,
            Some(Some(DVM_MOD)) => Change::Failed,
            _ => Change::Unknown,
        }
    } else {
        match phase("ended").next().map(|l| l["ok"].as_bool()) {
            Some(Some(true)) => Change::Done,
            Some(Some(false)) => Change::Failed,
            _ => Change::Unknown,
        }
    };
    (c, events.len())
}

fn one_terminal_event(ix: &Index) -> (usize, Vec<Violation>) {
    let mut v = Vec::new();
    let mut n = 0;
    for (&op, &inv) in &ix.invokes {
        let requester = match &ix.h[inv].entry {
            Entry::Invoke {
                what: Op::Grow { requester, .. } | Op::Shrink { requester, .. },
                ..
            } => *requester,
            _ => continue,
        };
        if !requester {
            continue;
        }
        n += 1;
        let Some(&done) = ix.completes.get(&op).and_then(|c| c.first()) else {
            continue;
        };
        let Entry::Complete { exit, out, .. } = &ix.h[done].entry else {
            continue;
        };
        let (c, events) = change_of(true, out);
        let accepted = lines(out).iter().any(|l| l["phase"] == "accepted");
        let lost = *exit == Some(TOOL_FAILED) || exit.is_none();
        let bad = match c {
            Change::Nothing => events != 0,
            _ if events > 1 => true,
            _ if accepted && events == 0 && !lost => true,
            _ => false,
        };
        if bad {
            v.push(Violation::new(
                format!(
                    "request of op {op} ({c:?}, palloc exit {exit:?}) got {events} terminal events"
                ),
                vec![inv, done],
            ));
        }
    }
    (n, v)
}

fn no_leftover_process(ix: &Index) -> (usize, Vec<Violation>) {
    let v: Vec<Violation> =
        ix.h.iter()
            .enumerate()
            .filter_map(|(i, r)| match &r.entry {
                Entry::Leftover { pid, job, cmdline } => Some(Violation::new(
                    format!("job process {pid} (job {job:?}, {cmdline}) outlived its job"),
                    vec![i],
                )),
                _ => None,
            })
            .collect();
    (1, v)
}

fn final_membership(ix: &Index) -> (usize, Vec<Violation>) {
    let mut v = Vec::new();
    let Some(f) = ix.final_line else {
        v.push(Violation::new(
            "the history has no final status: the run did not heal".into(),
            vec![],
        ));
        return (0, v);
    };
    let Entry::Final {
        formed, members, ..
    } = &ix.h[f].entry
    else {
        return (0, v);
    };
    if !formed {
        v.push(Violation::new(
            "the DVM was not formed after the final heal".into(),
            vec![f],
        ));
    }
    // What the history says: the first membership, then every grow and shrink whose
    // outcome is known, in the order they completed; an unknown outcome leaves either.
    let mut want: BTreeMap<String, Option<bool>> =
        ix.initial.iter().map(|h| (h.clone(), Some(true))).collect();
    let mut done: Vec<(u64, usize, usize)> = Vec::new();
    for (&op, &inv) in &ix.invokes {
        if let Some(&c) = ix.completes.get(&op).and_then(|c| c.first()) {
            done.push((ix.t(c), inv, c));
        }
    }
    done.sort_unstable();
    let mut why: BTreeMap<String, usize> = BTreeMap::new();
    for (_, inv, c) in done {
        let (hosts, requester, grow) = match &ix.h[inv].entry {
            Entry::Invoke {
                what: Op::Grow { hosts, requester },
                ..
            } => (hosts, *requester, true),
            Entry::Invoke {
                what: Op::Shrink { hosts, requester },
                ..
            } => (hosts, *requester, false),
            _ => continue,
        };
        let Entry::Complete { out, .. } = &ix.h[c].entry else {
            continue;
        };
        let (change, _) = change_of(requester, out);
        for h in hosts {
            match change {
                Change::Done => {
                    want.insert(h.clone(), Some(grow));
                }
                Change::Unknown => {
                    want.insert(h.clone(), None);
                }
                Change::Failed | Change::Nothing => {}
            }
            why.insert(h.clone(), c);
        }
    }
    let mut live: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for m in members {
        if m.host == ix.controller {
            continue;
        }
        if m.state != "departed" {
            live.entry(m.host.as_str())
                .or_default()
                .push(m.state.as_str());
        }
    }
    for (h, states) in &live {
        if states.len() > 1 || states.iter().any(|s| *s != "joined") {
            v.push(Violation::new(
                format!("{h} is in the final membership as {states:?}"),
                vec![f],
            ));
        }
    }
    for (h, w) in &want {
        let here = live.contains_key(h.as_str());
        if let Some(w) = w {
            if *w != here {
                let mut l = vec![f];
                l.extend(why.get(h));
                v.push(Violation::new(
                    format!(
                        "{h} should {}be a member after the final heal, and is {}",
                        if *w { "" } else { "not " },
                        if here { "" } else { "not" }
                    ),
                    l,
                ));
            }
        }
    }
    for h in live.keys() {
        if !want.contains_key(*h) {
            v.push(Violation::new(
                format!("{h} is a member though no grow of it succeeded"),
                vec![f],
            ));
        }
    }
    (want.len(), v)
}

/// The soak tag an event carries (`soak.tag` in its info), if any.
fn tag_in(line: &Value) -> Option<String> {
    line["info"].as_array()?.iter().find_map(|i| {
        (i["key"] == "soak.tag").then(|| match &i["value"] {
            Value::String(s) => s.clone(),
            other => other.to_string().trim_matches('"').to_string(),
        })
    })
}

/// The namespace a job-end event is about.
fn affected(line: &Value) -> Option<String> {
    line["info"].as_array()?.iter().find_map(|i| {
        (i["key"] == "pmix.evaffected")
            .then(|| i["value"]["nspace"].as_str().map(str::to_string))?
    })
}

fn event_ranges(ix: &Index) -> (usize, Vec<Violation>) {
    let mut v = Vec::new();
    let mut n = 0;
    // The notifications: tag → (op, range, host).
    let mut notes: HashMap<String, (u64, String, String)> = HashMap::new();
    for (&op, &inv) in &ix.invokes {
        if let Entry::Invoke {
            host,
            what: Op::Notify { range, tag },
            ..
        } = &ix.h[inv].entry
        {
            notes.insert(tag.clone(), (op, range.clone(), host.clone()));
        }
    }
    // Each listener's host, ready and end lines, and what it heard.
    struct L {
        host: String,
        ready: Option<usize>,
        ended: Option<usize>,
        heard: HashMap<String, usize>,
    }
    let mut ls: BTreeMap<u64, L> = BTreeMap::new();
    for (i, r) in ix.h.iter().enumerate() {
        let Entry::Listener {
            listener,
            host,
            phase,
            line,
        } = &r.entry
        else {
            continue;
        };
        let l = ls.entry(*listener).or_insert(L {
            host: host.clone(),
            ready: None,
            ended: None,
            heard: HashMap::new(),
        });
        match phase {
            ListenerPhase::Ready => l.ready = Some(i),
            ListenerPhase::Ended => l.ended = Some(i),
            ListenerPhase::Started => {}
            ListenerPhase::Event => {
                let Some(line) = line else { continue };
                n += 1;
                let code = line["code"].as_i64();
                let key = match code {
                    Some(SOAK_CODE) => tag_in(line).map(|t| format!("tag {t}")),
                    Some(JOB_END) => affected(line).map(|ns| format!("job end of {ns}")),
                    _ => None,
                };
                let Some(key) = key else { continue };
                if let Some(&first) = l.heard.get(&key) {
                    v.push(Violation::new(
                        format!("listener {listener} on {host} heard the {key} twice"),
                        vec![first, i],
                    ));
                    continue;
                }
                l.heard.insert(key.clone(), i);
                if code == Some(SOAK_CODE) {
                    let tag = tag_in(line).unwrap_or_default();
                    match notes.get(&tag) {
                        None => v.push(Violation::new(
                            format!(
                                "listener {listener} on {host} heard {tag}, which nobody notified"
                            ),
                            vec![i],
                        )),
                        Some((op, range, from)) if range == "LOCAL" && from != host => {
                            let mut lines = vec![i];
                            lines.extend(ix.invokes.get(op));
                            v.push(Violation::new(
                                format!("listener {listener} on {host} heard {tag}, notified with range LOCAL on {from}"),
                                lines,
                            ))
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    // Every quiet in-range listener heard every notification the DVM accepted.
    for (tag, (op, range, from)) in &notes {
        let Some(&c) = ix.completes.get(op).and_then(|c| c.first()) else {
            continue;
        };
        if !matches!(&ix.h[c].entry, Entry::Complete { exit: Some(0), .. }) {
            continue;
        }
        let (lo, hi) = ix.span(*op);
        for (id, l) in &ls {
            let in_range = range != "LOCAL" || l.host == *from;
            let Some(ready) = l.ready else { continue };
            if !in_range
                || ix.t(ready) >= lo
                || l.ended.is_some_and(|e| ix.t(e) < hi + DELIVERY_US)
                || ix.fault_during(ix.t(ready), hi + DELIVERY_US).is_some()
            {
                continue;
            }
            n += 1;
            if !l.heard.contains_key(&format!("tag {tag}")) {
                let mut lines = vec![ready, c];
                lines.extend(ix.invokes.get(op));
                v.push(Violation::new(
                    format!(
                        "listener {id} on {} never heard {tag} ({range} from {from}), with no fault anywhere",
                        l.host
                    ),
                    lines,
                ));
            }
        }
    }
    (n, v)
}
