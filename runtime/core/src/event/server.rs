//! The events server of one daemon, without IO: the job processes and tools connected on
//! its node, a mirror of each one's registrations, and the events kept for late comers.
//!
//! - A **job event** (one addressed to processes of a job) goes at once to each addressed
//!   local process that is connected and has a matching registration; for the others it is
//!   kept, and a process that connects or registers later still gets it. Once every
//!   addressed local process has it, or the job ends here, it is dropped.
//! - An **environment event** goes at once to every client with a registration for
//!   environment events that matches, and is kept in a ring of the last `ring` such events
//!   (512 unless configured); a full ring drops its oldest. A new registration is checked
//!   against the ring and gets what matches and it has not had yet.
//!
//! Everything is bounded: clients ([`MAX_CLIENTS`]), registrations per client (the
//! registry's limit), kept job events per job ([`MAX_KEPT_PER_JOB`], oldest dropped first).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use dvmlab_proto::event::{Directives, Event, Level, Proc, Status};

use super::registry::{RegId, RegisterError, Registry};

/// Most clients (job processes and tools) one daemon serves at once.
pub const MAX_CLIENTS: usize = 4096;
/// Most job events kept for the late comers of one job on one node.
pub const MAX_KEPT_PER_JOB: usize = 512;
/// The environment ring's size unless configured (OpenPMIx's `pmix_max_events`).
pub const DEFAULT_RING: usize = 512;

/// A connection to the events server.
pub type ClientId = u64;

/// An event to hand to one client.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub client: ClientId,
    pub event: Event,
}

/// Why the server refused something.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerError {
    TooManyClients { limit: usize },
    UnknownClient(ClientId),
    Register(RegisterError),
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerError::TooManyClients { limit } => {
                write!(f, "at most {limit} event clients per daemon")
            }
            ServerError::UnknownClient(c) => write!(f, "no event client {c}"),
            ServerError::Register(e) => e.fmt(f),
        }
    }
}

#[derive(Debug)]
struct Client {
    /// The job process it is; `None` for a tool.
    proc: Option<Proc>,
    regs: Registry,
}

impl Client {
    /// Whether it is a tool holding a registration (what [`LocalServer::tool_registered`]
    /// counts).
    fn registered_tool(&self) -> bool {
        self.proc.is_none() && !self.regs.is_empty()
    }
}

#[derive(Debug)]
struct Kept {
    seq: u64,
    event: Event,
    /// Local processes addressed that have not had it.
    waiting: BTreeSet<u32>,
}

#[derive(Debug)]
struct Ringed {
    event: Event,
    /// Clients that had it (so a second registration does not bring it twice).
    had: BTreeSet<ClientId>,
}

/// One daemon's events server.
#[derive(Debug)]
pub struct LocalServer {
    clients: BTreeMap<ClientId, Client>,
    /// Job events kept, by namespace, oldest first.
    kept: BTreeMap<String, VecDeque<Kept>>,
    ring: VecDeque<Ringed>,
    ring_size: usize,
    seq: u64,
    /// How many clients are tools holding a registration: asked after every input the
    /// daemon's hub takes, so kept rather than counted over up to [`MAX_CLIENTS`] clients.
    registered_tools: usize,
    /// Job events dropped from a full per-job store, for the log and the status.
    pub dropped: u64,
}

impl LocalServer {
    /// A server keeping the last `ring_size` environment events (at least 1).
    pub fn new(ring_size: usize) -> LocalServer {
        LocalServer {
            clients: BTreeMap::new(),
            kept: BTreeMap::new(),
            ring: VecDeque::new(),
            ring_size: ring_size.max(1),
            seq: 0,
            registered_tools: 0,
            dropped: 0,
        }
    }

    /// Keeps [`Self::registered_tools`] as `client` changes from counting `before`.
    fn recount(&mut self, client: ClientId, before: bool) {
        let after = self
            .clients
            .get(&client)
            .is_some_and(Client::registered_tool);
        match (before, after) {
            (false, true) => self.registered_tools += 1,
            (true, false) => self.registered_tools -= 1,
            _ => {}
        }
        debug_assert_eq!(
            self.registered_tools,
            self.clients
                .values()
                .filter(|c| c.registered_tool())
                .count()
        );
    }

    fn counted(&self, client: ClientId) -> bool {
        self.clients
            .get(&client)
            .is_some_and(Client::registered_tool)
    }

    /// A client connected: job process `proc`, or a tool. Kept job events wait for its
    /// registrations.
    pub fn connect(&mut self, client: ClientId, proc: Option<Proc>) -> Result<(), ServerError> {
        if !self.clients.contains_key(&client) && self.clients.len() >= MAX_CLIENTS {
            return Err(ServerError::TooManyClients { limit: MAX_CLIENTS });
        }
        let before = self.counted(client);
        self.clients.insert(
            client,
            Client {
                proc,
                regs: Registry::new(),
            },
        );
        self.recount(client, before);
        Ok(())
    }

    /// Whether a tool connected here holds a registration: its daemon then needs every
    /// event that could be for it (see `interest`).
    pub fn tool_registered(&self) -> bool {
        self.registered_tools > 0
    }

    /// Whether `client` is connected as a tool.
    pub fn is_tool(&self, client: ClientId) -> bool {
        self.clients.get(&client).is_some_and(|c| c.proc.is_none())
    }

    /// A client went away (its registrations with it).
    pub fn disconnect(&mut self, client: ClientId) {
        let before = self.counted(client);
        self.clients.remove(&client);
        self.recount(client, before);
        for r in &mut self.ring {
            r.had.remove(&client);
        }
    }

    /// `client` registered for `codes` with `directives`; its id, and the kept and ringed
    /// events that match it and it has not had.
    pub fn register(
        &mut self,
        client: ClientId,
        codes: Vec<Status>,
        directives: Directives,
    ) -> Result<(RegId, Vec<Delivery>), ServerError> {
        let before = self.counted(client);
        let c = self
            .clients
            .get_mut(&client)
            .ok_or(ServerError::UnknownClient(client))?;
        let id = c
            .regs
            .register(codes, directives)
            .map_err(ServerError::Register)?;
        let mut out = Vec::new();
        if let Some(p) = c.proc.clone() {
            if let Some(list) = self.kept.get_mut(&p.nspace) {
                for k in list.iter_mut() {
                    if k.waiting.contains(&p.rank) && c.regs.wants(k.event.code, k.event.level) {
                        k.waiting.remove(&p.rank);
                        out.push(Delivery {
                            client,
                            event: k.event.clone(),
                        });
                    }
                }
                list.retain(|k| !k.waiting.is_empty());
                if list.is_empty() {
                    self.kept.remove(&p.nspace);
                }
            }
        }
        for r in &mut self.ring {
            if !r.had.contains(&client) && c.regs.wants(r.event.code, Level::Environment) {
                r.had.insert(client);
                out.push(Delivery {
                    client,
                    event: r.event.clone(),
                });
            }
        }
        self.recount(client, before);
        Ok((id, out))
    }

    /// `client` removed registration `reg`; whether it had it.
    pub fn deregister(&mut self, client: ClientId, reg: RegId) -> bool {
        let before = self.counted(client);
        let had = self
            .clients
            .get_mut(&client)
            .is_some_and(|c| c.regs.deregister(reg));
        self.recount(client, before);
        had
    }

    /// A job event for the local processes `ranks` of job `event`'s namespace `nspace`:
    /// delivered now where it can be, kept for the others.
    pub fn job_event(
        &mut self,
        nspace: &str,
        ranks: &BTreeSet<u32>,
        event: Event,
    ) -> Vec<Delivery> {
        let mut out = Vec::new();
        let mut waiting = ranks.clone();
        for (id, c) in &self.clients {
            let Some(p) = &c.proc else { continue };
            if p.nspace == nspace
                && waiting.contains(&p.rank)
                && c.regs.wants(event.code, event.level)
            {
                waiting.remove(&p.rank);
                out.push(Delivery {
                    client: *id,
                    event: event.clone(),
                });
            }
        }
        if !waiting.is_empty() {
            self.seq += 1;
            let list = self.kept.entry(nspace.to_string()).or_default();
            if list.len() >= MAX_KEPT_PER_JOB {
                list.pop_front();
                self.dropped += 1;
            }
            list.push_back(Kept {
                seq: self.seq,
                event,
                waiting,
            });
        }
        out
    }

    /// An event for the tools connected here that registered for it (tools are no job's
    /// processes: nothing is kept for them).
    pub fn tools_event(&mut self, event: Event) -> Vec<Delivery> {
        self.clients
            .iter()
            .filter(|(_, c)| c.proc.is_none() && c.regs.wants(event.code, event.level))
            .map(|(id, _)| Delivery {
                client: *id,
                event: event.clone(),
            })
            .collect()
    }

    /// An event for the one client on connection `client` (a tool, or a job process that
    /// made a request as one), if it registered for it (nothing is kept).
    pub fn tool_event(&mut self, client: ClientId, event: Event) -> Vec<Delivery> {
        match self.clients.get(&client) {
            Some(c) if c.regs.wants(event.code, event.level) => {
                vec![Delivery { client, event }]
            }
            _ => Vec::new(),
        }
    }

    /// The processes of job `nspace` connected here.
    pub fn connected_ranks(&self, nspace: &str) -> BTreeSet<u32> {
        self.clients
            .values()
            .filter_map(|c| c.proc.as_ref())
            .filter(|p| p.nspace == nspace)
            .map(|p| p.rank)
            .collect()
    }

    /// Process `rank` of job `nspace` exited: nothing waits for it any more.
    pub fn proc_gone(&mut self, nspace: &str, rank: u32) {
        if let Some(list) = self.kept.get_mut(nspace) {
            for k in list.iter_mut() {
                k.waiting.remove(&rank);
            }
            list.retain(|k| !k.waiting.is_empty());
            if list.is_empty() {
                self.kept.remove(nspace);
            }
        }
    }

    /// Every local process of job `nspace` is gone: nothing is kept for it any more.
    pub fn job_ended(&mut self, nspace: &str) {
        self.kept.remove(nspace);
    }

    /// An environment event: to every client whose registrations want it, and into the ring.
    pub fn environment_event(&mut self, event: Event) -> Vec<Delivery> {
        let mut had = BTreeSet::new();
        let mut out = Vec::new();
        for (id, c) in &self.clients {
            if c.regs.wants(event.code, Level::Environment) {
                had.insert(*id);
                out.push(Delivery {
                    client: *id,
                    event: event.clone(),
                });
            }
        }
        if self.ring.len() >= self.ring_size {
            self.ring.pop_front();
        }
        self.ring.push_back(Ringed { event, had });
        out
    }

    /// Environment events in the ring, oldest first.
    pub fn ringed(&self) -> impl Iterator<Item = &Event> {
        self.ring.iter().map(|r| &r.event)
    }

    /// Job events kept for late comers, by namespace: (order kept, code, processes waiting).
    pub fn kept(&self) -> Vec<(String, u64, Status, Vec<u32>)> {
        self.kept
            .iter()
            .flat_map(|(ns, l)| {
                l.iter().map(move |k| {
                    (
                        ns.clone(),
                        k.seq,
                        k.event.code,
                        k.waiting.iter().copied().collect(),
                    )
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(ns: &str, rank: u32) -> Option<Proc> {
        Some(Proc {
            nspace: ns.into(),
            rank,
        })
    }

    fn ev(code: Status, level: Level) -> Event {
        Event {
            code,
            source: None,
            info: vec![],
            level,
        }
    }

    fn env_dirs() -> Directives {
        Directives {
            enviro_level: Some(true),
            ..Directives::default()
        }
    }

    fn ranks(r: &[u32]) -> BTreeSet<u32> {
        r.iter().copied().collect()
    }

    #[test]
    fn a_job_event_reaches_a_process_that_registers_later_then_is_dropped() {
        let mut s = LocalServer::new(DEFAULT_RING);
        s.connect(1, proc("job", 0)).unwrap();
        s.register(1, vec![-7], Directives::default()).unwrap();
        let now = s.job_event("job", &ranks(&[0, 1]), ev(-7, Level::Job));
        assert_eq!(now.len(), 1, "rank 0 registered: delivered at once");
        assert_eq!(s.kept().len(), 1, "kept for rank 1");
        s.connect(2, proc("job", 1)).unwrap();
        let (_, late) = s.register(2, vec![], Directives::default()).unwrap();
        assert_eq!(late.len(), 1);
        assert_eq!(late[0].client, 2);
        assert!(
            s.kept().is_empty(),
            "every addressed process had it: dropped"
        );
        let (_, again) = s.register(2, vec![-7], Directives::default()).unwrap();
        assert!(again.is_empty(), "never twice");
    }

    #[test]
    fn a_kept_job_event_waits_for_a_matching_registration_and_goes_with_the_job() {
        let mut s = LocalServer::new(DEFAULT_RING);
        s.connect(1, proc("job", 0)).unwrap();
        s.job_event("job", &ranks(&[0]), ev(-7, Level::Job));
        let (_, got) = s.register(1, vec![-231], Directives::default()).unwrap();
        assert!(
            got.is_empty(),
            "a registration for another code does not take it"
        );
        assert_eq!(s.kept().len(), 1);
        s.job_ended("job");
        assert!(s.kept().is_empty());
    }

    #[test]
    fn environment_events_reach_only_environment_registrations_and_the_ring_drops_the_oldest() {
        let mut s = LocalServer::new(3);
        s.connect(1, None).unwrap();
        s.register(1, vec![], Directives::default()).unwrap();
        s.connect(2, None).unwrap();
        s.register(2, vec![], env_dirs()).unwrap();
        for code in [-231, -232, -233, -234] {
            let d = s.environment_event(ev(code, Level::Environment));
            assert_eq!(d.iter().map(|d| d.client).collect::<Vec<_>>(), [2]);
        }
        assert_eq!(
            s.ringed().map(|e| e.code).collect::<Vec<_>>(),
            [-232, -233, -234]
        );
        s.connect(3, None).unwrap();
        let (_, cached) = s.register(3, vec![-233, -231], env_dirs()).unwrap();
        assert_eq!(
            cached.iter().map(|d| d.event.code).collect::<Vec<_>>(),
            [-233]
        );
        let (_, again) = s.register(3, vec![], env_dirs()).unwrap();
        assert_eq!(
            again.iter().map(|d| d.event.code).collect::<Vec<_>>(),
            [-232, -234]
        );
    }

    #[test]
    fn a_tool_counts_as_registered_from_its_first_registration_to_its_last_or_its_going() {
        let mut s = LocalServer::new(DEFAULT_RING);
        let job = proc("job", 0);
        s.connect(1, job.clone()).unwrap();
        s.register(1, vec![], Directives::default()).unwrap();
        assert!(!s.tool_registered(), "a job process is not a tool");
        s.connect(2, None).unwrap();
        assert!(!s.tool_registered(), "a tool with no registration");
        let (a, _) = s.register(2, vec![-7], Directives::default()).unwrap();
        let (b, _) = s.register(2, vec![-8], Directives::default()).unwrap();
        assert!(s.tool_registered());
        assert!(s.deregister(2, a));
        assert!(s.tool_registered(), "one registration left");
        assert!(s.deregister(2, b));
        assert!(!s.tool_registered());
        s.register(2, vec![], Directives::default()).unwrap();
        s.connect(3, None).unwrap();
        s.register(3, vec![], Directives::default()).unwrap();
        s.disconnect(2);
        assert!(s.tool_registered(), "tool 3 is still there");
        // The same id connecting again is a new client, without the old one's registrations.
        s.connect(3, None).unwrap();
        assert!(!s.tool_registered());
        s.register(3, vec![], Directives::default()).unwrap();
        s.connect(3, job).unwrap();
        assert!(!s.tool_registered(), "connected again as a job process");
    }

    #[test]
    fn kept_job_events_and_clients_are_bounded() {
        let mut s = LocalServer::new(DEFAULT_RING);
        for _ in 0..MAX_KEPT_PER_JOB + 10 {
            s.job_event("job", &ranks(&[0]), ev(-7, Level::Job));
        }
        assert_eq!(s.kept().len(), MAX_KEPT_PER_JOB);
        assert_eq!(s.dropped, 10);
        for c in 0..MAX_CLIENTS as u64 {
            s.connect(c, None).unwrap();
        }
        assert_eq!(
            s.connect(u64::MAX, None),
            Err(ServerError::TooManyClients { limit: MAX_CLIENTS })
        );
    }
}
