//! The `prted` shell: sockets, timers, signals, job processes and the jobs file around
//! [`DaemonCore`], which it feeds inputs and whose outputs it carries out, and nothing else.
//!
//! One task owns the core and feeds it inputs from a channel; every connection has a reader
//! task that turns frames into inputs and a writer task that drains an outgoing queue.

pub mod cli;
mod jobs_file;
mod launch;
mod logging;
mod reaper;
mod session;
mod shell;
mod spawn;
mod timers;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use std::os::fd::{AsRawFd, RawFd};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use dvmlab_core::conf::settings::expand_template;
use dvmlab_core::daemon_core::{DaemonCore, Input, Now, Output, Timer};
use dvmlab_core::exec::{Input as ExecInput, ShellCommand};
use dvmlab_core::identity::Role;
use dvmlab_core::overlay::{self, Io, LinkId, NodeConfig, Note, MISSED_HEARTBEATS};
use dvmlab_core::tree::Rank;
use dvmlab_core::uplink::Policy;
use dvmlab_host::bootstrap::{Ancestors, Prepared};
use dvmlab_proto::codec::{initiate, respond};
use dvmlab_proto::limits::{
    EVENT_QUEUE, MAX_CONNECTIONS, MAX_LINK_QUEUE, MAX_PENDING_HANDSHAKES, OUTPUT_LOW_WATER,
};
use dvmlab_proto::secure::{DvmKey, Sealer};
use dvmlab_proto::wire::{encode_frame, Frame, FrameCodec, Hello, Peer};

pub use logging::init as init_logging;
pub use reaper::Reaper;
pub use shell::BarrierSlot;

/// How long a connect attempt may take; the hello exchange gets as long as a link may stay
/// silent (`MISSED_HEARTBEATS` intervals), since a peer that accepts but never answers (a
/// frozen daemon's kernel still completes the TCP handshake) is as good as dead.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A write that makes no progress for this long means a peer that does not read (or is
/// gone without a word): the link is dropped, and its queue with it.
const WRITE_STALL: Duration = Duration::from_secs(10);

/// The log file this daemon writes besides stderr, if `prte.conf` names one.
pub fn log_path(p: &Prepared) -> Option<PathBuf> {
    let s = &p.settings;
    let t = match p.identity.role {
        Role::Controller => s.controller_log_path.as_ref(),
        Role::Daemon => s.prted_log_path.as_ref(),
    }?;
    Some(PathBuf::from(expand_template(
        t,
        &p.identity.host,
        p.identity.rank,
        &p.identity.nspace,
    )))
}

/// Which state notes to log, from the `*LogJobState` / `*LogProcState` keys.
struct StateLogging {
    job: bool,
    proc: bool,
    /// `state_base_verbose` ≥ 1: every job state the controller enters.
    jobs: bool,
}

/// Messages into the core's task.
enum Event {
    Input(Input),
    /// A connection's writer is ready; frames for `link` go to `tx`.
    Register {
        link: LinkId,
        handle: LinkHandle,
        writer: JoinHandle<()>,
    },
}

/// An overlay input, as the connection tasks send it.
/// Blocks every signal in the calling thread, which must be one of the daemon's helper
/// threads (the runtime's blocking pool, the jobs-file writer). The kernel runs a process's
/// signal handler on any thread that does not block the signal: a SIGCHLD for every job
/// process that exits then woke an idle helper, an extra context switch per process on a
/// busy node, when the daemon's own thread wakes for the exit anyway.
pub(crate) fn helper_thread_ignores_signals() {
    let _ = nix::sys::signal::SigSet::all().thread_block();
}

/// The daemon's runtime: one thread for the event loop, and a blocking pool whose threads
/// ignore signals (see [`helper_thread_ignores_signals`]).
pub(crate) fn daemon_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_start(helper_thread_ignores_signals)
        .build()
}

fn net(i: overlay::Input) -> Event {
    Event::Input(Input::Net(i))
}

/// Why a frame could not be queued on a link.
enum SendError {
    /// The link is to be dropped, for this reason.
    Drop(String),
    /// The peer closed: the frame is moot, and the link's reader reports the close.
    PeerClosed,
}

/// The shell's handle on one connection: its outgoing queue of encoded frames (bounded by
/// the bytes in it, [`MAX_LINK_QUEUE`]), and what stops its reader.
struct LinkHandle {
    tx: mpsc::UnboundedSender<Bytes>,
    /// Bytes queued and not yet written; the writer takes off what it wrote.
    queued: Arc<AtomicUsize>,
    reading: CancellationToken,
    /// Ends the writer at once, discarding what is queued (a peer that does not read).
    writer: tokio::task::AbortHandle,
}

impl LinkHandle {
    /// Queues `frame`, or says why it cannot: too large to encode, or a peer that leaves
    /// [`MAX_LINK_QUEUE`] bytes unread (the link is to be dropped), or a writer that
    /// stopped because the peer closed (its reader reports the close once it has read
    /// everything the peer sent).
    fn send(&self, bytes: Result<Bytes, String>) -> Result<(), SendError> {
        let bytes = bytes.map_err(SendError::Drop)?;
        let queued = self.queued.load(Ordering::Relaxed);
        if queued + bytes.len() > MAX_LINK_QUEUE {
            return Err(SendError::Drop(format!(
                "the peer leaves {queued} bytes unread (at most {MAX_LINK_QUEUE} are queued)"
            )));
        }
        let len = bytes.len();
        self.queued.fetch_add(len, Ordering::Relaxed);
        self.tx.send(bytes).map_err(|_| {
            // Saturating: the writer may have zeroed the count as it stopped.
            let _ = self
                .queued
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| {
                    Some(q.saturating_sub(len))
                });
            SendError::PeerClosed
        })
    }

    fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }
}

/// Shared by the tasks that create connections.
struct Ctx {
    events: mpsc::Sender<Event>,
    handshake: Duration,
    next_link: AtomicU64,
    nspace: String,
    me: Peer,
    /// One permit per open connection ([`MAX_CONNECTIONS`]).
    connections: Arc<Semaphore>,
    /// Connections refused for want of a permit, for a log line now and then.
    refused: AtomicU64,
    /// Signalled when a writer's queue drains below [`OUTPUT_LOW_WATER`].
    drained: Arc<Notify>,
    /// The DVM key: with it, every connection proves it holds the key and is sealed before
    /// any frame is read. Without it, links are in the clear (the spec's bootstrap DVM).
    key: Option<DvmKey>,
    /// The DVM owner: this daemon's user. Only its tools, and root's, get in locally.
    owner: u32,
    /// Who each live local job process is, by process group (kept by the job shells).
    procs: shell::ProcTable,
    /// Pokes of children in flight ([`MAX_POKES`]).
    pokes: Semaphore,
    /// Wakes a connect up that is waiting out its back-off (the core's `Io::Hurry`).
    hurry: Notify,
    /// `DVMPort`, where every daemon listens.
    port: u16,
}

/// Runs the daemon until the DVM stops or a signal ends it.
/// `key` is the DVM key from `DVMKeyFile`, already loaded and checked.
pub async fn run(
    p: Prepared,
    key: Option<DvmKey>,
    reaper: Reaper,
    slot: BarrierSlot,
) -> std::io::Result<()> {
    let s = &p.settings;
    match &s.key_file {
        Some((path, _)) => info!(
            "DVM key {}: every link and tool proves it holds the key, and all traffic is encrypted",
            path.display()
        ),
        None => warn!(
            "no DVMKeyFile: the DVM is UNAUTHENTICATED (anyone who reaches DVMPort can join, run jobs or stop it)"
        ),
    }
    let own = SocketAddr::new(p.own.addr, s.port);
    let listener = listen(own).map_err(|e| {
        std::io::Error::new(e.kind(), format!("cannot listen on {own} (DVMPort): {e}"))
    })?;
    let mut signals = Signals::new()?;
    let uri = p.uri_of(p.identity.rank, p.own).to_string();
    let session_dir = s.session_dir(&p.identity.host, p.identity.rank);
    let session = session::Session::create(&session_dir, &uri).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "cannot create session directory {}: {e}",
                session_dir.display()
            ),
        )
    })?;
    let role = p.identity.role;
    let states = match role {
        Role::Controller => StateLogging {
            job: s.controller_log_job_state,
            proc: s.controller_log_proc_state,
            jobs: s.state_verbose >= 1 || s.controller_log_job_state,
        },
        Role::Daemon => StateLogging {
            job: s.prted_log_job_state,
            proc: s.prted_log_proc_state,
            jobs: s.state_verbose >= 1,
        },
    };
    info!(
        "prted {} rank {} ({:?}) on {} listening at {}, session {}",
        p.identity.nspace,
        p.identity.rank,
        role,
        p.identity.host,
        uri,
        session.dir().display()
    );
    // A controller that grew or shrank the DVM in a previous life takes up that membership.
    let membership_path = session.dir().join("membership.json");
    let mut roster = p.roster();
    if role == Role::Controller {
        if let Ok(text) = std::fs::read_to_string(&membership_path) {
            match serde_json::from_str(&text)
                .map_err(|e| e.to_string())
                .and_then(|w| roster.apply(&w))
            {
                Ok(_) => info!(
                    "took up the membership a previous controller kept ({})",
                    membership_path.display()
                ),
                Err(e) => warn!(
                    "{}: not a membership ({e}); starting from prte.conf",
                    membership_path.display()
                ),
            }
        }
    }
    let cfg = NodeConfig {
        identity: p.identity.clone(),
        roster,
        tree: p.tree,
        policy: Policy {
            initial: s.retry_initial_delay,
            max: s.retry_max_delay,
            heal_after: s.connect_max_time,
        },
        heartbeat: s.heartbeat,
        incarnation: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0),
        controller_uri: p.controller_uri().to_string(),
        uri: uri.to_string(),
        authenticated: key.is_some(),
        depart_lingers: s.elastic_fault == Some(dvmlab_core::campaign::Fault::LaunchOnDeparting),
    };
    let (tx, mut rx) = mpsc::channel(EVENT_QUEUE);
    let ctx = Arc::new(Ctx {
        events: tx,
        handshake: s.heartbeat * MISSED_HEARTBEATS,
        // Link ids (which name this daemon's tools to the controller) count up from the
        // daemon's start time, so a restarted daemon never reuses one the controller may
        // still remember; they stay far below the relayed-tool bit.
        next_link: AtomicU64::new(cfg.incarnation.max(1)),
        nspace: p.identity.nspace.clone(),
        me: Peer::Daemon {
            rank: p.identity.rank,
            host: p.identity.host.clone(),
        },
        connections: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        refused: AtomicU64::new(0),
        drained: Arc::new(Notify::new()),
        key,
        owner: nix::unistd::geteuid().as_raw(),
        procs: shell::ProcTable::default(),
        pokes: Semaphore::new(MAX_POKES),
        hurry: Notify::new(),
        port: s.port,
    });
    let accept = tokio::spawn(accept_loop(listener, ctx.clone()));
    let tool_socket = s.tool_socket(&p.identity.host, p.identity.rank);
    let local = listen_local(&tool_socket).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot serve tools at {}: {e}", tool_socket.display()),
        )
    })?;
    let accept_local = tokio::spawn(local_accept_loop(local, ctx.clone()));
    let addrs: HashMap<Rank, SocketAddr> = p
        .ancestors
        .iter()
        .map(|(r, c)| (*r, SocketAddr::new(c.addr, s.port)))
        .collect();
    let redial = Arc::new(p.ancestors_by_name());

    let start = Instant::now();
    let now = || Now {
        mono: start.elapsed(),
        unix_ms: unix_ms(),
    };
    let mut links: HashMap<LinkId, LinkHandle> = HashMap::new();
    let mut writers: Vec<JoinHandle<()>> = Vec::new();
    // The stopping controller's pokes of members its stop could not reach: made before it
    // exits, or they would die with it.
    let mut stop_pokes: Vec<JoinHandle<()>> = Vec::new();
    let (shell_tx, mut shell_rx) = mpsc::channel(EVENT_QUEUE);
    let runner = shell::Runner::new(
        p.identity.rank,
        s.job_prolog.clone(),
        s.job_epilog.clone(),
        shell_tx,
        reaper,
        slot,
    )
    .log_starts(s.odls_verbose >= 1)
    .spawn_clone(s.spawn_clone)
    .with_events(
        p.identity.nspace.clone(),
        tool_socket.clone(),
        ctx.procs.clone(),
    );
    let jobs_path = session.dir().join("jobs.json");
    let (recovered, jobs_file) = match role {
        Role::Controller => (
            Some(jobs_file::read(&jobs_path)),
            Some(jobs_file::JobsFile::start(jobs_path)),
        ),
        Role::Daemon => (None, None),
    };
    let mut core = DaemonCore::new(cfg, recovered, s.event_ring);
    core.configure_controller(
        s.elastic.then(|| dvmlab_core::campaign::Config {
            radix: s.radix,
            timeout: s.launch_timeout,
            components: vec!["pool".into(), "alloc".into()],
            fault: s.elastic_fault,
        }),
        s.max_launching,
    );
    core.set_start_hold(s.start_hold);
    core.set_remove_hold(s.remove_hold);
    if role == Role::Controller && s.elastic {
        info!(
            "elastic mode: the DVM grows and shrinks on request; new daemons start through {:?}",
            s.launch_agent.join(" ")
        );
    }
    let (launch_tx, mut launch_rx) = mpsc::channel(EVENT_QUEUE);
    let mut launcher = launch::Launcher::new(
        s.launch_agent.clone(),
        &p.cli,
        s.release_command.clone(),
        s.launch_timeout,
        launch_tx,
        dvmlab_host::hosts::Resolver::from_settings(s)
            .map_err(|d| std::io::Error::other(d.to_string()))?,
    );
    let mut pending = core.handle(now(), Input::Net(overlay::Input::Start));
    // Inputs the shell itself produces (a link it had to drop, an epilog with nothing to
    // run), handled before new events.
    let mut inbox: VecDeque<Input> = VecDeque::new();
    // Every timer the core set and not yet due; those it may cancel (start holds, job
    // limits: at most one of each per job this daemon tracks) by what they are.
    let mut timers: timers::Timers<Input> = timers::Timers::new()?;
    let mut cancellable: HashMap<Timer, timers::TimerId> = HashMap::new();

    // Made once: a signal future made anew on every turn of the loop cost a leaf daemon
    // about 1 % of its CPU per job (perf).
    let signal = signals.recv();
    tokio::pin!(signal);
    let mut exiting = false;
    'main: loop {
        let mut outs = std::mem::take(&mut pending).into_iter().peekable();
        // A frame sent on several links in a row (an event or a job message to every child)
        // is encoded once.
        let mut encoded: Option<Result<Bytes, String>> = None;
        while let Some(out) = outs.next() {
            match out {
                Output::Net(Io::Connect { rank, delay }) => match addrs.get(&rank) {
                    Some(&addr) => {
                        tokio::spawn(connect(ctx.clone(), rank, addr, delay, redial.clone()));
                    }
                    None => warn!("no address for rank {rank}; cannot connect"),
                },
                Output::Net(Io::Send { link, frame }) => {
                    let bytes = encoded.take().unwrap_or_else(|| encode_frame(&frame));
                    if matches!(outs.peek(), Some(Output::Net(Io::Send { frame: next, .. })) if *next == frame)
                    {
                        encoded = Some(bytes.clone());
                    }
                    send_on(&mut links, link, bytes, &mut inbox)
                }
                Output::Net(Io::Close { link }) => {
                    if let Some(h) = links.remove(&link) {
                        h.reading.cancel();
                    }
                }
                Output::Net(Io::Note(n)) => log_note(&n, &states),
                Output::Net(Io::Exit) => break 'main,
                Output::Net(Io::Poke { rank, host, stop }) => {
                    let task = tokio::spawn(poke(ctx.clone(), rank, host, stop));
                    if stop {
                        stop_pokes.push(task);
                    }
                }
                Output::Net(Io::Hurry) => ctx.hurry.notify_waiters(),
                Output::SetTimer { timer, delay } => {
                    let input = match timer {
                        Timer::Net(t) => Input::Net(overlay::Input::Timer(t)),
                        Timer::JobLimit(id) => Input::JobLimit(id),
                        Timer::Campaign(id) => Input::CampaignTimeout(id),
                        Timer::StartHold(id) => Input::Shell(ExecInput::StartDue { id }),
                        Timer::RemoveHold => Input::RemovesDue,
                    };
                    let set = timers.set(delay, input);
                    if matches!(timer, Timer::StartHold(_) | Timer::JobLimit(_)) {
                        if let Some(old) = cancellable.insert(timer, set) {
                            timers.cancel(old);
                        }
                    }
                }
                Output::CancelTimer(timer) => match cancellable.remove(&timer) {
                    Some(set) => timers.cancel(set),
                    // Already fired (its input is on its way to the core), or never set.
                    None => debug!("timer {timer:?}: nothing to cancel"),
                },
                Output::Shell(ShellCommand::Launch { id, spec }) => runner.launch(id, spec),
                Output::Shell(ShellCommand::Kill { id, signal }) => runner.kill(id, signal),
                Output::Shell(ShellCommand::BarrierDone { id, seq }) => {
                    runner.barrier_done(id, seq)
                }
                Output::Shell(ShellCommand::Epilog { id }) => {
                    inbox.extend(runner.epilog(id).map(Input::Shell));
                }
                Output::Shell(ShellCommand::Stdin { id, data, eof }) => runner.stdin(id, data, eof),
                Output::Persist(live) => {
                    if let Some(f) = &jobs_file {
                        f.write(live);
                    }
                }
                Output::Log(l) => warn!("{l}"),
                Output::Launch {
                    rank,
                    host,
                    membership,
                } => launcher.launch(rank, &host, &membership),
                Output::KillLaunch { rank } => launcher.kill(rank),
                Output::Release {
                    campaign,
                    component,
                    name,
                    hosts,
                } => launcher.release(campaign, component, &name, &hosts),
                Output::CheckHosts { token, hosts } => launcher.check_hosts(token, hosts),
                Output::Info(l) => info!("{l}"),
                // Rare (a grow or shrink), so written here: a restarted controller must not
                // miss it.
                Output::PersistMembership(w) => {
                    if let Err(e) =
                        jobs_file::replace_json(&membership_path, serde_json::to_vec(&w))
                    {
                        warn!(
                            "cannot keep the membership in {}: {e}",
                            membership_path.display()
                        );
                    }
                }
                Output::JobState { id, state, code } => {
                    if states.jobs {
                        info!("job {id} state {state} ({code})");
                    }
                }
            }
        }
        if exiting {
            break 'main;
        }
        // Local job output is taken in only while every link has room for it; the job
        // shells wait (and their processes block in write) meanwhile.
        let room = links.values().all(|h| h.queued() < OUTPUT_LOW_WATER);
        let input = if let Some(i) = inbox.pop_front() {
            i
        } else {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some(Event::Input(i)) => i,
                    Some(Event::Register { link, handle, writer }) => {
                        register_link(&mut links, &mut writers, link, handle, writer);
                        continue;
                    }
                    None => break 'main,
                },
                Some(ji) = shell_rx.recv(), if room => Input::Shell(ji),
                Some(li) = launch_rx.recv() => {
                    if let Input::LaunchExited { rank, .. } = &li {
                        launcher.exited(*rank);
                    }
                    li
                }
                _ = ctx.drained.notified(), if !room => continue,
                _ = timers.expired() => {
                    // What reached the event channel before the timers fired goes first, as
                    // it did when each timer was a task sending on that channel: a heartbeat
                    // must not count as silence the frames that are already here.
                    for _ in 0..rx.len() {
                        match rx.try_recv() {
                            Ok(Event::Input(i)) => inbox.push_back(i),
                            Ok(Event::Register { link, handle, writer }) => {
                                register_link(&mut links, &mut writers, link, handle, writer)
                            }
                            Err(_) => break,
                        }
                    }
                    inbox.extend(timers.take_due());
                    continue;
                }
                sig = &mut signal => {
                    info!("received {sig}; rank {} exiting", core.rank());
                    // The jobs' `remove`s the controller still holds go out first (into
                    // the writers, which get their time below): daemons that stay up for a
                    // restarted controller must not take those jobs for strays.
                    pending = core.handle(now(), Input::RemovesDue);
                    exiting = true;
                    continue;
                }
            }
        };
        match &input {
            Input::Shell(ExecInput::StartDue { id }) => {
                cancellable.remove(&Timer::StartHold(*id));
            }
            Input::JobLimit(id) => {
                cancellable.remove(&Timer::JobLimit(*id));
            }
            _ => {}
        }
        if let Input::Net(overlay::Input::Closed { link }) = &input {
            if let Some(h) = links.remove(link) {
                h.reading.cancel();
            }
        }
        pending = core.handle(now(), input);
    }
    runner.kill_all();
    drop(timers);
    // Nothing more is taken in (the port is free again for a DVM started next) while the
    // stop's last pokes are made.
    accept.abort();
    accept_local.abort();
    let told_by = tokio::time::Instant::now() + STOP_POKES_WITHIN;
    for p in stop_pokes {
        let _ = tokio::time::timeout_at(told_by, p).await;
    }
    drop(links);
    for w in writers {
        let _ = tokio::time::timeout(Duration::from_secs(2), w).await;
    }
    drop(jobs_file);
    session.remove();
    info!("rank {} exited", core.rank());
    Ok(())
}

/// Takes a new connection's handle from its task; forgets the writers that ended.
fn register_link(
    links: &mut HashMap<LinkId, LinkHandle>,
    writers: &mut Vec<JoinHandle<()>>,
    link: LinkId,
    handle: LinkHandle,
    writer: JoinHandle<()>,
) {
    links.insert(link, handle);
    writers.retain(|w| !w.is_finished());
    writers.push(writer);
}

/// Queues `frame` on `link`; a link that cannot take it (see [`LinkHandle::send`]) is
/// dropped at once and the core told, rather than left to fail its heartbeats.
fn send_on(
    links: &mut HashMap<LinkId, LinkHandle>,
    link: LinkId,
    bytes: Result<Bytes, String>,
    inbox: &mut VecDeque<Input>,
) {
    let Some(h) = links.get(&link) else {
        return;
    };
    match h.send(bytes) {
        Ok(()) => {}
        // What the peer sent before it closed (a stopping child's `Stopped`) may still be
        // unread: the reader reads it, then reports the close.
        Err(SendError::PeerClosed) => debug!("link {link}: the peer closed; frame dropped"),
        Err(SendError::Drop(why)) => {
            warn!("link {link}: cannot send: {why}; dropping the link");
            if let Some(h) = links.remove(&link) {
                h.reading.cancel();
                h.writer.abort();
            }
            inbox.push_back(Input::Net(overlay::Input::Closed { link }));
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn log_note(n: &Note, states: &StateLogging) {
    match n {
        Note::DvmReady { nspace, daemons } => {
            info!("DVM ready: namespace {nspace}, {daemons} daemons")
        }
        Note::DvmIncomplete { joined, expected } => {
            warn!("DVM no longer formed: {joined} of {expected} daemons joined")
        }
        Note::Joined {
            parent,
            tree_parent,
        } if parent == tree_parent => info!("joined the DVM through parent rank {parent}"),
        Note::Joined {
            parent,
            tree_parent,
        } => info!(
            "joined the DVM through ancestor rank {parent} (healed past tree parent {tree_parent})"
        ),
        Note::Healing { from, to } => {
            warn!("parent rank {from} unreachable for DVMConnectMaxTime; healing up to rank {to}")
        }
        Note::ConnectFailed {
            rank,
            reason,
            retry_in,
        } => debug!("connect to rank {rank} failed ({reason}); retry in {retry_in:?}"),
        Note::UplinkLost { rank } => warn!("lost connection to rank {rank}; reconnecting"),
        Note::LinkDead { rank } => {
            warn!("link to rank {rank} silent for {MISSED_HEARTBEATS} heartbeats; dropped")
        }
        Note::Replaced { rank } => {
            info!("rank {rank} reconnected; its previous link is dropped")
        }
        Note::Refused { link, reason } => warn!("link {link}: {reason}"),
        Note::Unroutable { dst } => warn!("no route to rank {dst}; message dropped"),
        Note::Unsupported { link, what } => {
            warn!("link {link}: the peer did not understand {what}")
        }
        Note::StopIncomplete { ranks } => {
            warn!("stop: no exit confirmation from ranks {ranks:?}")
        }
        Note::Poked { rank } => debug!("rank {rank} is up: connecting up now"),
        Note::ToldToStop => warn!(
            "the controller says the DVM stops (its stop could not reach this daemon through the tree); stopping"
        ),
        Note::StopUnacknowledged { ranks } => warn!(
            "stop: the confirmation that ranks {ranks:?} stopped was not acknowledged within {:?}; exiting",
            overlay::STOP_GRACE
        ),
        Note::JobState { state } if states.job => info!("DVM job state {state}"),
        Note::ProcState { rank, state } if states.proc => {
            info!("daemon rank {rank} state {state}")
        }
        Note::JobState { .. } | Note::ProcState { .. } => {}
    }
}

fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let sock = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    sock.set_reuseaddr(true)?;
    sock.bind(addr)?;
    sock.listen(1024)
}

/// SIGTERM and SIGINT.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Accepts connections while fewer than [`MAX_PENDING_HANDSHAKES`] are still in their key
/// handshake or hello (the rest wait in the kernel's backlog), and closes at once any that would make
/// more than [`MAX_CONNECTIONS`]: a flood of idle or slow clients cannot starve real peers
/// or grow the daemon.
async fn accept_loop(listener: tokio::net::TcpListener, ctx: Arc<Ctx>) {
    let handshakes = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
    loop {
        let Ok(handshake) = handshakes.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, peer)) => {
                if let Some(conn) = admit(&ctx, &peer) {
                    tokio::spawn(serve_inbound(ctx.clone(), stream, peer, handshake, conn));
                }
            }
            Err(e) => {
                warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A permit for one more connection, or `None` (the connection is then closed at once)
/// when [`MAX_CONNECTIONS`] are open.
fn admit(ctx: &Ctx, peer: &dyn std::fmt::Display) -> Option<OwnedSemaphorePermit> {
    let conn = ctx.connections.clone().try_acquire_owned().ok();
    if conn.is_none() {
        let n = ctx.refused.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            warn!("{peer}: {MAX_CONNECTIONS} connections already open; closed ({n} so far)");
        }
    }
    conn
}

/// The tools socket: any local user may connect (its owner check is on the peer's
/// credentials, so a refused tool hears why); a stale one from a crashed daemon goes.
fn listen_local(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    let l = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(l)
}

/// Accepts the tools of this node, within the same limits as [`accept_loop`].
async fn local_accept_loop(listener: tokio::net::UnixListener, ctx: Arc<Ctx>) {
    let handshakes = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
    loop {
        let Ok(handshake) = handshakes.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, _)) => {
                if let Some(conn) = admit(&ctx, &"a local tool") {
                    tokio::spawn(serve_local(ctx.clone(), stream, handshake, conn));
                }
            }
            Err(e) => {
                warn!("accept on the tools socket failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A tool of this node: its user is checked before a byte of it is read (the DVM owner's
/// uid, or root); then its hello, as on any connection, but only as a tool.
async fn serve_local(
    ctx: Arc<Ctx>,
    mut stream: tokio::net::UnixStream,
    handshake: OwnedSemaphorePermit,
    _connection: OwnedSemaphorePermit,
) {
    let window = tokio::time::Instant::now() + ctx.handshake;
    let cred = match stream.peer_cred() {
        Ok(c) => c,
        Err(e) => return warn!("a local tool: cannot learn its user ({e}); dropped"),
    };
    let uid = cred.uid();
    let peer = match cred.pid() {
        Some(pid) => format!("local tool of uid {uid} (pid {pid})"),
        None => format!("local tool of uid {uid}"),
    };
    if uid != ctx.owner && uid != 0 {
        warn!(
            "{peer}: refused before any frame: only the DVM owner (uid {}) and root may use this daemon's tools",
            ctx.owner
        );
        let reason = format!(
            "uid {uid} may not use this DVM: it belongs to uid {}",
            ctx.owner
        );
        if let Ok(bytes) = wire_bytes(&Frame::Refuse { reason }, None) {
            let _ = tokio::time::timeout_at(window, stream.write_all(&bytes)).await;
        }
        return;
    }
    let fd = stream.as_raw_fd();
    let (read, write) = stream.into_split();
    let frames = FramedRead::new(read, FrameCodec::default());
    let local = Connection {
        frames,
        write,
        fd,
        sealer: None,
        window,
        peer,
        tools_only: true,
        pid: cred.pid(),
    };
    serve_hello(&ctx, local, handshake).await;
}

/// Starts the writer task of a connection and hands its queue to the core's task; returns the
/// token that stops the connection's reader. A write that fails is reported to the core at
/// once (as the link's close), so it drops the link without waiting for heartbeats.
async fn register<W>(
    ctx: &Ctx,
    link: LinkId,
    mut write: W,
    fd: RawFd,
    mut sealer: Option<Sealer>,
    peer: String,
) -> CancellationToken
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    let queued = Arc::new(AtomicUsize::new(0));
    let (events, left, drained) = (ctx.events.clone(), queued.clone(), ctx.drained.clone());
    let writer = tokio::spawn(async move {
        // Frames queued together go out in one write (sealed together, with a key).
        let mut batch = BytesMut::new();
        let mut records = BytesMut::new();
        while let Some(first) = rx.recv().await {
            batch.extend_from_slice(&first);
            while batch.len() < 256 << 10 {
                match rx.try_recv() {
                    Ok(more) => batch.extend_from_slice(&more),
                    Err(_) => break,
                }
            }
            let out = match &mut sealer {
                None => &batch,
                Some(s) => {
                    records.clear();
                    if let Err(e) = s.seal(&batch, &mut records) {
                        warn!("{peer}: {e}; dropping the link");
                        let _ = events.send(net(overlay::Input::Closed { link })).await;
                        return;
                    }
                    &records
                }
            };
            let failed = match tokio::time::timeout(WRITE_STALL, write.write_all(out)).await {
                Ok(Ok(())) => None,
                // The peer closed: its last frames may still wait in our receive queue, and
                // the reader reports the close once it has read them.
                Ok(Err(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                    ) =>
                {
                    debug!("{peer}: write failed: {e}; the peer closed");
                    // Nothing queued here will be written: it must not hold job output
                    // back (the room check) while the reader drains.
                    rx.close();
                    left.store(0, Ordering::Relaxed);
                    drained.notify_one();
                    return;
                }
                Ok(Err(e)) => Some(format!("write failed: {e}")),
                Err(_) => Some(format!("no write went through for {WRITE_STALL:?}")),
            };
            if let Some(why) = failed {
                warn!("{peer}: {why}; dropping the link");
                let _ = events.send(net(overlay::Input::Closed { link })).await;
                return;
            }
            let before = left.fetch_sub(batch.len(), Ordering::Relaxed);
            if before >= OUTPUT_LOW_WATER && before - batch.len() < OUTPUT_LOW_WATER {
                drained.notify_one();
            }
            batch.clear();
        }
        let _ = write.shutdown().await;
        until_acknowledged(fd).await;
        drop(write);
    });
    let reading = CancellationToken::new();
    let handle = LinkHandle {
        tx,
        queued,
        reading: reading.clone(),
        writer: writer.abort_handle(),
    };
    let _ = ctx
        .events
        .send(Event::Register {
            link,
            handle,
            writer,
        })
        .await;
    reading
}

/// Waits (at most 2 s) until the peer acknowledged everything sent on `w`. A process that
/// exits with unread data in a socket makes the kernel answer with a reset, which discards
/// what is still unacknowledged: on a lossy link, the last frame of an exiting daemon (its
/// stop confirmation) would be lost.
///
/// `fd` is the connection's socket, open while its write half lives.
async fn until_acknowledged(fd: RawFd) {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let mut unacked: nix::libc::c_int = 0;
        // SAFETY: TIOCOUTQ writes one int through the pointer; `fd` is open while the
        // write half (owned by the caller) lives.
        let r = unsafe { nix::libc::ioctl(fd, nix::libc::TIOCOUTQ, &mut unacked) };
        // The kernel has no event for "all acknowledged": poll it.
        if r != 0 || unacked == 0 || tokio::time::Instant::now() >= give_up {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The key handshake (with a key) and the hello of a connection from below or from a tool,
/// together within the hello window; then its frames until it closes.
async fn serve_inbound(
    ctx: Arc<Ctx>,
    mut stream: TcpStream,
    peer: SocketAddr,
    handshake: OwnedSemaphorePermit,
    _connection: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let window = tokio::time::Instant::now() + ctx.handshake;
    let channel = match &ctx.key {
        None => None,
        Some(key) => match tokio::time::timeout_at(window, respond(&mut stream, key)).await {
            Ok(Ok(c)) => Some(c),
            Ok(Err(e)) => return warn!("{peer}: refused before any frame: {e}; dropped"),
            Err(_) => {
                return warn!(
                    "{peer}: refused before any frame: no key handshake within {:?}; dropped",
                    ctx.handshake
                )
            }
        },
    };
    let (sealer, opener) = match channel {
        Some(c) => {
            let (s, o) = c.split();
            (Some(s), Some(o))
        }
        None => (None, None),
    };
    let fd = stream.as_raw_fd();
    let (read, write) = stream.into_split();
    let conn = Connection {
        frames: FramedRead::new(read, FrameCodec::reading(opener)),
        write,
        fd,
        sealer,
        window,
        peer: peer.to_string(),
        tools_only: false,
        pid: None,
    };
    serve_hello(&ctx, conn, handshake).await;
}

/// A connection past its key handshake (if any), before its hello.
struct Connection<R, W> {
    frames: FramedRead<R, FrameCodec>,
    write: W,
    /// The socket, for [`until_acknowledged`].
    fd: RawFd,
    sealer: Option<Sealer>,
    /// When the hello must have arrived.
    window: tokio::time::Instant,
    /// Who it is, for the log.
    peer: String,
    /// The local tools socket: only tools say hello there.
    tools_only: bool,
    /// A local peer's process id, from its credentials.
    pid: Option<i32>,
}

/// Reads the hello within the window, refuses one that does not fit, and feeds the core
/// the connection's frames until it closes.
async fn serve_hello<R, W>(ctx: &Ctx, c: Connection<R, W>, handshake: OwnedSemaphorePermit)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let Connection {
        mut frames,
        mut write,
        fd,
        mut sealer,
        window,
        peer,
        tools_only,
        pid,
    } = c;
    let hello = match tokio::time::timeout_at(window, frames.next()).await {
        Ok(Some(Ok(Frame::Hello(h)))) => h,
        Ok(Some(Ok(_))) => return warn!("{peer}: first frame was not a hello; dropped"),
        Ok(Some(Err(e))) => return warn!("{peer}: {e}; dropped"),
        Ok(None) => return debug!("{peer}: closed before hello"),
        Err(_) => return warn!("{peer}: no hello within {:?}; dropped", ctx.handshake),
    };
    drop(handshake);
    debug_assert!(ctx.next_link.load(Ordering::Relaxed) < dvmlab_core::overlay::RELAYED);
    let refusal = match hello.mismatch(&ctx.nspace) {
        Some(reason) => Some(reason),
        None if tools_only && !matches!(hello.peer, Peer::Tool | Peer::Process { .. }) => {
            Some("only tools and job processes connect to a daemon's tools socket".to_string())
        }
        // Job processes are local: they reach their daemon through its tools socket, whose
        // peer credential check lets only the DVM's owner in, and whose process group must
        // be the job process it says it is.
        None if !tools_only && matches!(hello.peer, Peer::Process { .. }) => {
            Some("job processes connect to their daemon's tools socket".to_string())
        }
        None => match &hello.peer {
            Peer::Process { nspace, rank } => not_that_process(ctx, pid, nspace, *rank),
            _ => None,
        },
    };
    if let Some(reason) = refusal {
        warn!("{peer}: refused: {reason}");
        if let Ok(bytes) = wire_bytes(&Frame::Refuse { reason }, sealer.as_mut()) {
            let _ = tokio::time::timeout(Duration::from_secs(1), write.write_all(&bytes)).await;
        }
        return;
    }
    frames.decoder_mut().accepted();
    let link = ctx.next_link.fetch_add(1, Ordering::Relaxed);
    let reading = register(ctx, link, write, fd, sealer, peer.clone()).await;
    let _ = ctx
        .events
        .send(net(overlay::Input::Hello {
            link,
            version: hello
                .common_version()
                .unwrap_or(dvmlab_proto::wire::MIN_VERSION),
            peer: hello.peer,
            stopping: hello.stopping,
        }))
        .await;
    read_frames(ctx, link, frames, reading, &peer).await;
}

/// Why a local peer saying it is process `rank` of job `nspace` is not believed: its
/// process group is no live job process of this node, or another one's, or it joined that
/// group without descending from the process (any process of the daemon's session may
/// move into any group of it).
fn not_that_process(ctx: &Ctx, pid: Option<i32>, nspace: &str, rank: u32) -> Option<String> {
    let Some(pid) = pid.filter(|p| *p > 0) else {
        return Some("a job process whose process id cannot be learned".into());
    };
    let group = match nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid))) {
        Ok(g) => g.as_raw(),
        Err(e) => return Some(format!("pid {pid}: no process group ({e})")),
    };
    let is = match ctx.procs.lock() {
        Ok(table) => table.get(&group).cloned(),
        Err(_) => return Some("the table of this node's job processes is unavailable".into()),
    };
    match is {
        Some((ns, r)) if ns == nspace && r == rank => (!descends_from(pid, group)).then(|| {
            format!("pid {pid} is in {ns}:{r}'s process group but is not that process or one it started")
        }),
        Some((ns, r)) => Some(format!(
            "pid {pid} says it is {nspace}:{rank} but belongs to {ns}:{r}"
        )),
        None => Some(format!(
            "pid {pid} says it is {nspace}:{rank} but is no job process of this node (its process group {group} is none of theirs)"
        )),
    }
}

/// Whether `pid` is `ancestor` or descends from it, by the parents `/proc` shows (at most
/// 64 generations up).
fn descends_from(mut pid: i32, ancestor: i32) -> bool {
    for _ in 0..64 {
        if pid == ancestor {
            return true;
        }
        if pid <= 1 {
            return false;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        // The parent is the second field after the command, which is in parentheses and may
        // hold spaces and parentheses itself.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok());
        match parent {
            Some(p) => pid = p,
            None => return false,
        }
    }
    false
}

/// One frame's bytes on the wire: sealed with `sealer`, or in the clear without one.
fn wire_bytes(frame: &Frame, sealer: Option<&mut Sealer>) -> Result<BytesMut, String> {
    let plain = encode_frame(frame)?;
    match sealer {
        None => Ok(BytesMut::from(&plain[..])),
        Some(s) => {
            let mut out = BytesMut::with_capacity(plain.len() + 64);
            s.seal(&plain, &mut out)?;
            Ok(out)
        }
    }
}

/// Turns a connection's frames into inputs until it closes, sends garbage, or the core
/// closes it.
async fn read_frames<R: AsyncRead + Unpin>(
    ctx: &Ctx,
    link: LinkId,
    mut frames: FramedRead<R, FrameCodec>,
    reading: CancellationToken,
    peer: &str,
) {
    loop {
        let item = tokio::select! {
            item = frames.next() => match item {
                Some(item) => item,
                None => break,
            },
            _ = reading.cancelled() => break,
        };
        let input = match item {
            Ok(Frame::Daemon(msg)) => overlay::Input::Frame { link, msg },
            Ok(Frame::Tool(req)) => overlay::Input::Tool { link, req },
            Ok(Frame::Event(up)) => overlay::Input::Event { link, up },
            Ok(other) => {
                let mut what = format!("{other:?}");
                what.truncate(200);
                warn!("{peer}: unexpected frame {what}; dropping the link");
                break;
            }
            Err(e) => {
                warn!("{peer}: {e}; dropping the link");
                break;
            }
        };
        if ctx.events.send(net(input)).await.is_err() {
            return;
        }
    }
    let _ = ctx.events.send(net(overlay::Input::Closed { link })).await;
}

/// Waits `delay`, or not at all when it is zero: tokio rounds every timer up to its next
/// millisecond tick, which a daemon's first connect to its parent would pay for nothing
/// (a whole millisecond of formation, traced with strace).
async fn after(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

async fn connect(
    ctx: Arc<Ctx>,
    rank: Rank,
    booted: SocketAddr,
    delay: Duration,
    redial: Arc<Ancestors>,
) {
    tokio::select! {
        _ = after(delay) => {}
        _ = ctx.hurry.notified() => {}
    }
    let addr = redial_address(&redial, rank, booted).await;
    match try_connect(&ctx, addr, false).await {
        Ok((stream, sealer, frames, version)) => {
            let link = ctx.next_link.fetch_add(1, Ordering::Relaxed);
            let what = format!("rank {rank} at {addr}");
            let fd = stream.as_ref().as_raw_fd();
            let reading = register(&ctx, link, stream, fd, sealer, what.clone()).await;
            let _ = ctx
                .events
                .send(net(overlay::Input::UplinkUp {
                    link,
                    rank,
                    version,
                }))
                .await;
            read_frames(&ctx, link, frames, reading, &what).await;
        }
        Err(reason) => {
            let _ = ctx
                .events
                .send(net(overlay::Input::UplinkFailed { rank, reason }))
                .await;
        }
    }
}

/// Pokes of children in flight at once: a parent of many children (the controller of a flat
/// tree) spreads their connects and handshakes out.
const MAX_POKES: usize = 16;

/// How long a stopping controller waits, before it exits, for its pokes of the members its
/// stop could not reach: a refused connect or a welcome takes a round trip; a frozen or
/// cut-off host cannot be told anyway.
const STOP_POKES_WITHIN: Duration = Duration::from_secs(3);

/// Tells child `rank` on `host` that this daemon is up: the connect, key handshake and
/// hello of any link up, which the child declines; with `stop`, that the DVM is stopping
/// (see `Io::Poke`). Whatever happens is only logged: a child not started yet, or one that
/// has connected meanwhile, is no failure.
async fn poke(ctx: Arc<Ctx>, rank: Rank, host: String, stop: bool) {
    let Ok(_permit) = ctx.pokes.acquire().await else {
        return;
    };
    let lookup = tokio::net::lookup_host((host.as_str(), ctx.port));
    let addr = match tokio::time::timeout(REDIAL_LOOKUP, lookup).await {
        Ok(Ok(mut addrs)) => addrs.next(),
        Ok(Err(_)) | Err(_) => None,
    };
    let Some(addr) = addr else {
        return debug!("poke of rank {rank}: {host} does not resolve");
    };
    match try_connect(&ctx, addr, stop).await {
        Ok(_) => debug!("poke of rank {rank} at {addr}: welcomed, closed"),
        Err(e) if stop => {
            info!("stop: poked rank {rank}, which the tree could not reach, at {addr}: {e}")
        }
        Err(e) => debug!("poke of rank {rank}: {e}"),
    }
}

/// How long one lookup of an ancestor's name may take before its last address is used.
const REDIAL_LOOKUP: Duration = Duration::from_secs(2);

/// The address to dial `rank` at: its name resolved again (see [`Ancestors`]), else the
/// address it had at bootstrap.
async fn redial_address(redial: &Arc<Ancestors>, rank: Rank, booted: SocketAddr) -> SocketAddr {
    let names = redial.clone();
    let lookup = tokio::task::spawn_blocking(move || names.address(rank));
    match tokio::time::timeout(REDIAL_LOOKUP, lookup).await {
        Ok(Ok(Some(ip))) => {
            let now = SocketAddr::new(ip, booted.port());
            if now != booted {
                debug!("rank {rank}'s host now resolves to {now} (at bootstrap: {booted})");
            }
            now
        }
        _ => booted,
    }
}

/// A welcomed connection up: its write half and sealer, its frames, and the protocol
/// version the welcome named.
type Halves = (
    tokio::net::tcp::OwnedWriteHalf,
    Option<Sealer>,
    FramedRead<tokio::net::tcp::OwnedReadHalf, FrameCodec>,
    u32,
);

/// Connects to an ancestor (or pokes a descendant): the key handshake (with a key), then
/// the hello, both within the hello window; `stopping` marks the hello of a stopping
/// controller's poke.
async fn try_connect(ctx: &Ctx, addr: SocketAddr, stopping: bool) -> Result<Halves, String> {
    let mut stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| format!("connect to {addr} timed out"))?
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let window = tokio::time::Instant::now() + ctx.handshake;
    let (sealer, opener) = match &ctx.key {
        None => (None, None),
        Some(key) => {
            let c = tokio::time::timeout_at(window, initiate(&mut stream, key))
                .await
                .map_err(|_| format!("{addr}: no key handshake within {:?}", ctx.handshake))?
                .map_err(|e| format!("{addr}: {e}"))?;
            let (s, o) = c.split();
            (Some(s), Some(o))
        }
    };
    let (read, mut write) = stream.into_split();
    let mut sealer = sealer;
    let hello = Frame::Hello(if stopping {
        Hello::stopping(&ctx.nspace, ctx.me.clone())
    } else {
        Hello::new(&ctx.nspace, ctx.me.clone())
    });
    let bytes = wire_bytes(&hello, sealer.as_mut())?;
    write
        .write_all(&bytes)
        .await
        .map_err(|e| format!("hello to {addr}: {e}"))?;
    let mut frames = FramedRead::new(read, FrameCodec::reading(opener));
    match tokio::time::timeout_at(window, frames.next()).await {
        Ok(Some(Ok(Frame::Welcome { version, .. }))) => {
            frames.decoder_mut().accepted();
            Ok((write, sealer, frames, version))
        }
        Ok(Some(Ok(Frame::Refuse { reason }))) => Err(format!("{addr} refused: {reason}")),
        Ok(Some(Ok(other))) => Err(format!("{addr} answered hello with {other:?}")),
        Ok(Some(Err(e))) => Err(format!("{addr}: {e}")),
        Ok(None) => Err(format!("{addr} closed during hello")),
        Err(_) => Err(format!("{addr}: no welcome within {:?}", ctx.handshake)),
    }
}

#[cfg(test)]
mod tests {
    /// Whether the calling thread blocks SIGCHLD, from its `SigBlk` (bit n-1 for signal n).
    fn this_thread_blocks_sigchld() -> bool {
        let status = std::fs::read_to_string("/proc/thread-self/status").expect("status");
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .expect("SigBlk");
        mask & (1 << (nix::sys::signal::Signal::SIGCHLD as i32 - 1)) != 0
    }

    #[test]
    fn the_runtimes_blocking_threads_leave_sigchld_to_the_daemons_thread() {
        let rt = super::daemon_runtime().expect("runtime");
        let (main, pool) = rt.block_on(async {
            let pool = tokio::task::spawn_blocking(this_thread_blocks_sigchld).await;
            (this_thread_blocks_sigchld(), pool.expect("blocking task"))
        });
        assert!(!main, "the daemon's own thread must take SIGCHLD");
        assert!(pool, "a blocking-pool thread takes SIGCHLD");
    }
}
