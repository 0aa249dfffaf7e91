//! The job shell: the processes a daemon starts on its node for a job (after the prolog),
//! their output, their exit, signals to them, barriers, and the epilog. Every process leads
//! its own process group, so a signal reaches what it forks, and the daemon's [`Reaper`]
//! kills those groups if the daemon dies, so a dying daemon leaves none of them behind.
//!
//! Stdin: process 0 of a job submitted with stdin reads a pipe fed by what its tool sends
//! (acknowledged as it is written, so the tool never has more than a window in flight);
//! every other process reads `/dev/null`.
//!
//! Barrier client: every process has a socket on file descriptor `DVMLAB_BARRIER_FD` (3). It
//! writes `barrier SEQ` on its own line and reads a line back (`ok SEQ`) once every process
//! of the job, on every node, entered barrier SEQ. In a shell:
//! `echo "barrier 1" >&3; read reply <&3`.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use nix::fcntl::OFlag;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::{dup3, dup3_raw, Pid};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::unix::pipe;
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::reaper::Reaper;
use crate::spawn::{self, CloneError, Cloned, Descriptors, Program, Spawner};
use dvmlab_core::exec::{Input, JobId, JobSpec};
use dvmlab_core::tree::Rank;
use dvmlab_proto::limits::{MAX_OUTPUT_CHUNK, MAX_STDIN_QUEUE, STDIN_WINDOW};
use dvmlab_proto::wire::Stream;

/// Starts and signals job shells; reports back through `events` as job-exec inputs.
pub struct Runner {
    me: Rank,
    prolog: Option<String>,
    epilog: Option<String>,
    events: mpsc::Sender<Input>,
    /// Process groups of each job's local processes.
    groups: Arc<Mutex<HashMap<JobId, Vec<i32>>>>,
    /// Kills those groups if this daemon dies.
    reaper: Arc<Mutex<Reaper>>,
    slot: Arc<Mutex<BarrierSlot>>,
    spawner: Arc<Mutex<Spawner>>,
    barriers: Arc<Mutex<HashMap<JobId, Barriers>>>,
    /// Process 0's stdin of each job that runs it here with stdin.
    stdins: Arc<Mutex<HashMap<JobId, StdinFeed>>>,
    /// The DVM's namespace and this daemon's tools socket, which job processes are told
    /// (`DVMLAB_NSPACE`, `DVMLAB_EVENTS`) to reach its events server.
    pmix: Option<(String, std::path::PathBuf)>,
    /// Who each live local job process is, by its process group.
    procs: ProcTable,
    log_starts: bool,
}

/// The live local job processes by process group (each is its group's leader, and what it
/// starts stays in its group): the PMIx process (namespace, rank) each one is. The events
/// server believes a job process's hello only if its process group says the same.
pub type ProcTable = Arc<Mutex<HashMap<i32, (String, u32)>>>;

/// What waits to be written to one process's stdin, in order, and its size in bytes.
struct StdinFeed {
    tx: mpsc::UnboundedSender<(Vec<u8>, bool)>,
    queued: Arc<AtomicUsize>,
}

/// Forgets a job's stdin feed when its shell task ends, however it ends.
struct StdinGone(Arc<Mutex<HashMap<JobId, StdinFeed>>>, JobId);

impl Drop for StdinGone {
    fn drop(&mut self) {
        if let Ok(mut m) = self.0.lock() {
            m.remove(&self.1);
        }
    }
}

/// The barrier sockets of one job's local processes, and who entered which barrier.
#[derive(Default)]
struct Barriers {
    /// Local processes of the job, and the write side of each one's socket.
    procs: usize,
    writers: Vec<Arc<UnixStream>>,
    entered: HashMap<u64, usize>,
    /// Whether a request past [`MAX_OPEN_BARRIERS`] was logged (once per job).
    refused: bool,
}

/// Runs `cmd` with `sh -c`, with the job's id in the environment; its exit status.
async fn hook(cmd: &str, id: JobId) -> Result<(), String> {
    let st = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("DVMLAB_JOB_ID", id.to_string())
        .stdin(Stdio::null())
        .status()
        .await
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} exited with {st}"))
    }
}

impl Runner {
    pub fn new(
        me: Rank,
        prolog: Option<String>,
        epilog: Option<String>,
        events: mpsc::Sender<Input>,
        reaper: Reaper,
        slot: BarrierSlot,
    ) -> Runner {
        Runner {
            me,
            prolog,
            epilog,
            events,
            groups: Arc::new(Mutex::new(HashMap::new())),
            reaper: Arc::new(Mutex::new(reaper)),
            slot: Arc::new(Mutex::new(slot)),
            spawner: Arc::new(Mutex::new(Spawner::new(true))),
            barriers: Arc::new(Mutex::new(HashMap::new())),
            stdins: Arc::new(Mutex::new(HashMap::new())),
            pmix: None,
            procs: ProcTable::default(),
            log_starts: false,
        }
    }

    /// Whether job processes are started by the clone where the kernel has it (else always
    /// the standard library's way, `posix_spawn`: `dvmlab_spawn_clone`).
    pub fn spawn_clone(mut self, on: bool) -> Runner {
        self.spawner = Arc::new(Mutex::new(Spawner::new(on)));
        self
    }

    /// Logs every job process this daemon starts (`odls_base_verbose` 1 and up): job,
    /// process, this daemon's rank and the pid, so a process can be traced to where it ran.
    pub fn log_starts(mut self, on: bool) -> Runner {
        self.log_starts = on;
        self
    }

    /// Tells every job process its PMIx namespace (job `id` of DVM `dvm`) and where its
    /// daemon serves events (`socket`).
    /// `procs` is kept up to date with who each live local job process is.
    pub fn with_events(
        mut self,
        dvm: String,
        socket: std::path::PathBuf,
        procs: ProcTable,
    ) -> Runner {
        self.pmix = Some((dvm, socket));
        self.procs = procs;
        self
    }

    /// The next bytes of process 0's stdin (then its end, with `eof`). Queued at once; a
    /// tool that sends beyond its window overruns the queue, and its job fails.
    pub fn stdin(&self, id: JobId, data: Vec<u8>, eof: bool) {
        let feed = self
            .stdins
            .lock()
            .ok()
            .and_then(|m| m.get(&id).map(|f| (f.tx.clone(), f.queued.clone())));
        let Some((tx, queued)) = feed else {
            return tracing::debug!(
                "stdin for job {id}, whose process 0 is not running here; dropped"
            );
        };
        let len = data.len();
        if queued.load(Ordering::Relaxed) + len > MAX_STDIN_QUEUE {
            // One failure, then the feed is gone: what else the tool sends is dropped.
            if let Ok(mut m) = self.stdins.lock() {
                m.remove(&id);
            }
            let events = self.events.clone();
            tokio::spawn(async move {
                let note = format!(
                    "stdin overrun: the tool sent more than its {STDIN_WINDOW}-byte window beyond what process 0 took"
                );
                let _ = events.send(Input::LocalFailure { id, note }).await;
            });
            return;
        }
        queued.fetch_add(len, Ordering::Relaxed);
        let _ = tx.send((data, eof));
    }

    /// Every shell of the job entered barrier `seq`: tell each local process.
    pub fn barrier_done(&self, id: JobId, seq: u64) {
        if let Ok(mut b) = self.barriers.lock() {
            if let Some(b) = b.get_mut(&id) {
                b.entered.remove(&seq);
                for w in &b.writers {
                    // One short line on a socket the process reads its replies from: the
                    // buffer has room (and the socket does not block).
                    if let Err(e) = (&**w).write(format!("ok {seq}\n").as_bytes()) {
                        warn!("job {id}: barrier {seq} reply lost: {e}");
                    }
                }
            }
        }
    }

    /// Runs the prolog, then this rank's processes of the job, and reports start, output
    /// lines and the greatest wait status.
    pub fn launch(&self, id: JobId, mut spec: JobSpec) {
        let nspace = self
            .pmix
            .as_ref()
            .map(|(dvm, _)| dvmlab_proto::event::job_nspace(dvm, id));
        if let (Some((_, socket)), Some(nspace)) = (&self.pmix, &nspace) {
            spec.env.push(("DVMLAB_NSPACE".into(), nspace.clone()));
            spec.env.push((
                "DVMLAB_EVENTS".into(),
                socket.to_string_lossy().into_owned(),
            ));
        }
        let mut stdin_rx = None;
        let stdin_queued = Arc::new(AtomicUsize::new(0));
        if spec.stdin && spec.placement.nprocs > 0 && spec.placement.rank_of(0) == self.me {
            let (tx, rx) = mpsc::unbounded_channel();
            stdin_rx = Some(rx);
            if let Ok(mut m) = self.stdins.lock() {
                let queued = stdin_queued.clone();
                m.insert(id, StdinFeed { tx, queued });
            }
        }
        let stdins = self.stdins.clone();
        let procs_table = self.procs.clone();
        let log_starts = self.log_starts;
        let (me, events, groups, prolog, barriers, reaper, slot, spawner) = (
            self.me,
            self.events.clone(),
            self.groups.clone(),
            self.prolog.clone(),
            self.barriers.clone(),
            self.reaper.clone(),
            self.slot.clone(),
            self.spawner.clone(),
        );
        tokio::spawn(async move {
            let _gone = StdinGone(stdins, id);
            // Fails only once the daemon's core is gone, and then nobody listens.
            let send = |i: Input| {
                let events = events.clone();
                async move {
                    let _ = events.send(i).await;
                }
            };
            if let Some(p) = prolog {
                if let Err(e) = hook(&p, id).await {
                    send(Input::LocalFailure {
                        id,
                        note: format!("prolog on rank {me} failed: {e}"),
                    })
                    .await;
                    send(Input::ShellExited { id, status: 1 << 8 }).await;
                    return;
                }
            }
            // Every local process of the job is watched in this one task (its exit, its
            // output, its barrier socket): a node starting one process per job pays for no
            // task of its own per process.
            let mut running = FuturesUnordered::new();
            let mut status = 0;
            let procs = spec.placement.procs_on(me);
            // What the processes run, as the clone takes it, made once for all of them.
            let mut program = match spawner.lock() {
                Ok(s) if s.clones() => Some(job_program(&spec, id)),
                _ => None,
            };
            if let Ok(mut b) = barriers.lock() {
                b.entry(id).or_default().procs = procs.len();
            }
            for (n, proc) in procs.into_iter().enumerate() {
                if n > 0 {
                    // A node may start thousands of processes for one job: between two, the
                    // daemon's other work (heartbeats above all) gets its turn, or its links
                    // look dead to its parent and children while it spawns; and the
                    // processes that already exited are reaped, so it does not hold
                    // thousands of zombies (pids are finite).
                    tokio::task::yield_now().await;
                    status = status.max(reap_ready(&mut running).await);
                }
                let feed = if proc == 0 { stdin_rx.take() } else { None };
                let spawned = match (slot.lock(), spawner.lock()) {
                    (Ok(mut slot), Ok(mut spawner)) => start(
                        &spec,
                        id,
                        proc,
                        feed.is_some(),
                        &mut slot,
                        &mut spawner,
                        &mut program,
                    ),
                    _ => Err(std::io::Error::other("barrier slot or spawner poisoned")),
                };
                let watched = spawned.and_then(|started| {
                    let socket = Arc::new(started.socket);
                    // SAFETY: the socket stays open while registered: the registration holds
                    // one of its references.
                    let requests = unsafe {
                        AsyncFd::register_with_interest(socket.clone(), Interest::READABLE)
                    }?;
                    Ok((
                        started.stdin,
                        Watched {
                            proc: started.proc,
                            stdout: started.stdout,
                            stderr: started.stderr,
                            requests,
                        },
                    ))
                });
                match watched {
                    Ok((stdin, w)) => {
                        if let Some(rx) = feed {
                            tokio::spawn(feed_stdin(
                                stdin,
                                rx,
                                stdin_queued.clone(),
                                events.clone(),
                                id,
                            ));
                        }
                        if let Ok(mut b) = barriers.lock() {
                            b.entry(id)
                                .or_default()
                                .writers
                                .push(w.requests.get_ref().clone());
                        }
                        if let Some(pid) = w.proc.pid() {
                            if let Ok(mut r) = reaper.lock() {
                                r.started(pid as i32);
                            }
                            if let Ok(mut g) = groups.lock() {
                                g.entry(id).or_default().push(pid as i32);
                            }
                            if let (Some(ns), Ok(mut t)) = (&nspace, procs_table.lock()) {
                                t.insert(pid as i32, (ns.clone(), proc));
                            }
                            if log_starts {
                                info!("job {id} process {proc} started on rank {me} (pid {pid})");
                            }
                        }
                        running.push(watch(
                            w,
                            proc,
                            id,
                            events.clone(),
                            barriers.clone(),
                            procs_table.clone(),
                        ));
                    }
                    Err(e) => {
                        send(Input::LocalFailure {
                            id,
                            note: format!("cannot start {:?} on rank {me}: {e}", spec.argv),
                        })
                        .await;
                        kill_groups(&groups, id, Signal::SIGKILL);
                        while running.next().await.is_some() {}
                        forget_groups(&groups, &reaper, id);
                        if let Ok(mut b) = barriers.lock() {
                            b.remove(&id);
                        }
                        send(Input::ShellExited {
                            id,
                            status: 127 << 8,
                        })
                        .await;
                        return;
                    }
                }
            }
            send(Input::ShellStarted { id }).await;
            // Each ends once its process exited and its output was read to the end: the
            // tool must have all of it when the job ends.
            while let Some(st) = running.next().await {
                status = status.max(st);
            }
            forget_groups(&groups, &reaper, id);
            if let Ok(mut b) = barriers.lock() {
                b.remove(&id);
            }
            send(Input::ShellExited { id, status }).await;
        });
    }

    /// Signals every local process group of the job.
    pub fn kill(&self, id: JobId, signal: i32) {
        match Signal::try_from(signal) {
            Ok(sig) => kill_groups(&self.groups, id, sig),
            Err(_) => warn!("job {id}: signal {signal} is not a signal"),
        }
    }

    /// Runs the epilog, then reports this rank's resources free. Without an epilog the
    /// report is returned, for the caller to hand the core at once: the release then goes up
    /// in the same write as the finish before it, rather than a wakeup later.
    #[must_use]
    pub fn epilog(&self, id: JobId) -> Option<Input> {
        let (me, events) = (self.me, self.events.clone());
        let Some(e) = self.epilog.clone() else {
            return Some(Input::EpilogDone { id });
        };
        tokio::spawn(async move {
            if let Err(err) = hook(&e, id).await {
                let _ = events
                    .send(Input::LocalFailure {
                        id,
                        note: format!("epilog on rank {me} failed: {err}"),
                    })
                    .await;
            }
            let _ = events.send(Input::EpilogDone { id }).await;
        });
        None
    }

    /// Kills every job process (the daemon is going away).
    pub fn kill_all(&self) {
        if let Ok(g) = self.groups.lock() {
            for pg in g.values().flatten() {
                let _ = killpg(Pid::from_raw(*pg), Signal::SIGKILL);
            }
        }
    }
}

/// A started job process, until reaped: cloned, or started by the standard library (where
/// the kernel has no such clone).
enum Proc {
    Cloned(Cloned),
    Std(tokio::process::Child),
}

impl Proc {
    /// Its pid, while not reaped.
    fn pid(&self) -> Option<u32> {
        match self {
            Proc::Cloned(c) => Some(c.pid() as u32),
            Proc::Std(c) => c.id(),
        }
    }

    /// Waits for the exit and reaps: the wait status.
    async fn wait(&mut self) -> std::io::Result<i32> {
        match self {
            Proc::Cloned(c) => c.wait().await,
            Proc::Std(c) => c.wait().await.map(|st| st.into_raw()),
        }
    }
}

/// A job process just started, and the daemon's ends of its pipes and barrier socket.
struct Started {
    proc: Proc,
    stdin: Option<pipe::Sender>,
    stdout: Option<pipe::Receiver>,
    stderr: Option<pipe::Receiver>,
    socket: UnixStream,
}

/// One local process of a job, as started: what it is watched by.
struct Watched {
    proc: Proc,
    stdout: Option<pipe::Receiver>,
    stderr: Option<pipe::Receiver>,
    /// Its barrier socket, for the requests it writes (readiness to read only: the replies
    /// are written without waiting).
    requests: AsyncFd<Arc<UnixStream>>,
}

/// How long a process's pipes are read after it exited, when something it left running
/// holds them: the job ends anyway. (Only the wait for bytes is cut short: what was read is
/// sent, however long the way up is blocked.)
const OUTPUT_AFTER_EXIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Watches process `proc` until it exited and its output was read to the end (or
/// [`OUTPUT_AFTER_EXIT`] after its exit); its wait status. Its exit is reported at once
/// (for PMIx events: the job's other processes may hear of it), its output as it comes,
/// and its barrier requests until it exits.
async fn watch(
    w: Watched,
    proc: u32,
    id: JobId,
    events: mpsc::Sender<Input>,
    barriers: Arc<Mutex<HashMap<JobId, Barriers>>>,
    table: ProcTable,
) -> i32 {
    let Watched {
        proc: mut process,
        stdout: out,
        stderr: err,
        requests,
    } = w;
    let pid = process.pid().map(|p| p as i32);
    let give_up = CancellationToken::new();
    let output = async {
        tokio::join!(
            forward(out, events.clone(), id, proc, Stream::Stdout, &give_up),
            forward(err, events.clone(), id, proc, Stream::Stderr, &give_up),
        )
    };
    let exit = async {
        let st = match process.wait().await {
            Ok(st) => st,
            Err(e) => {
                warn!("waiting for a process of job {id}: {e}");
                1 << 8
            }
        };
        if let (Some(pid), Ok(mut t)) = (pid, table.lock()) {
            t.remove(&pid);
        }
        let _ = events
            .send(Input::ProcExited {
                id,
                proc,
                status: st,
            })
            .await;
        st
    };
    let mut requests = BarrierRequests::new(requests);
    tokio::pin!(output, exit);
    let (mut output_done, mut requests_done) = (false, false);
    let status = {
        let serving = requests.serve(&barriers, &events, id);
        tokio::pin!(serving);
        loop {
            tokio::select! {
                st = &mut exit => break st,
                _ = &mut output, if !output_done => output_done = true,
                _ = &mut serving, if !requests_done => requests_done = true,
            }
        }
    };
    if !requests_done {
        requests.drain(&barriers, &events, id).await;
    }
    if !output_done {
        tokio::select! {
            biased;
            _ = &mut output => {}
            _ = tokio::time::sleep(OUTPUT_AFTER_EXIT) => {
                // Something the process left running holds its pipes: what was read goes
                // up, what it writes from now on is not read.
                give_up.cancel();
                output.await;
            }
        }
    }
    status
}

/// The greatest wait status among the processes in `running` that already ended (0 if
/// none), without waiting for the others.
async fn reap_ready<F: std::future::Future<Output = i32>>(
    running: &mut FuturesUnordered<F>,
) -> i32 {
    std::future::poll_fn(|cx| {
        let mut status = 0;
        while let std::task::Poll::Ready(Some(st)) = running.poll_next_unpin(cx) {
            status = status.max(st);
        }
        std::task::Poll::Ready(status)
    })
    .await
}

/// The job's processes were reaped: once their groups empty, the numbers may be reused, so
/// the reaper must no longer kill them. (What a process left running in its group after it
/// exited is therefore no longer covered.)
fn forget_groups(groups: &Mutex<HashMap<JobId, Vec<i32>>>, reaper: &Mutex<Reaper>, id: JobId) {
    let gone = groups.lock().ok().and_then(|mut g| g.remove(&id));
    if let Ok(mut r) = reaper.lock() {
        for pg in gone.into_iter().flatten() {
            r.ended(pg);
        }
    }
}

fn kill_groups(groups: &Mutex<HashMap<JobId, Vec<i32>>>, id: JobId, sig: Signal) {
    if let Ok(g) = groups.lock() {
        for pg in g.get(&id).into_iter().flatten() {
            let _ = killpg(Pid::from_raw(*pg), sig);
        }
    }
}

/// The longest line a process may write on its barrier socket (`barrier SEQ` takes 28
/// bytes at most): a longer one is not a request, and is dropped as it comes rather than
/// kept, so a process cannot make its daemon hold what it writes there.
const MAX_BARRIER_LINE: usize = 64;

/// One process's barrier socket, and what it wrote there that is not yet accounted for.
/// Each `barrier SEQ` line enters barrier SEQ; once every local process of the job entered
/// it, this rank's shell has. Reading may stop at any await (the process exited): a request
/// read is kept until it is counted, and a completed barrier until job-exec has it, so
/// [`BarrierRequests::drain`] finishes what [`BarrierRequests::serve`] began.
struct BarrierRequests {
    socket: AsyncFd<Arc<UnixStream>>,
    /// The part of a line read so far, and whether it grew past [`MAX_BARRIER_LINE`].
    line: Vec<u8>,
    too_long: bool,
    /// Requests read, not yet counted.
    read: std::collections::VecDeque<u64>,
    /// A barrier this process completed, not yet told to job-exec.
    complete: Option<u64>,
    /// Whether a line that is not a request was logged (once per process: a process may
    /// write any amount there).
    warned: bool,
}

/// Bytes read from a barrier socket at a time.
const BARRIER_READ: usize = 512;

/// What is read from a barrier socket after its process exited, at most: the requests it
/// wrote before exiting fit many times over; a writer it left behind may never stop.
const BARRIER_DRAIN: usize = 16 * BARRIER_READ;

impl BarrierRequests {
    fn new(socket: AsyncFd<Arc<UnixStream>>) -> BarrierRequests {
        BarrierRequests {
            socket,
            line: Vec::new(),
            too_long: false,
            read: std::collections::VecDeque::new(),
            complete: None,
            warned: false,
        }
    }

    /// Reads and counts requests until the process (and whatever it left running) closed
    /// the socket.
    async fn serve(
        &mut self,
        barriers: &Mutex<HashMap<JobId, Barriers>>,
        events: &mpsc::Sender<Input>,
        id: JobId,
    ) {
        let mut chunk = [0u8; BARRIER_READ];
        loop {
            self.account(barriers, events, id).await;
            let Ok(mut ready) = self.socket.readable().await else {
                return;
            };
            match ready.try_io(|s| (&**s.get_ref()).read(&mut chunk)) {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => self.take(&chunk[..n], id),
                Err(_would_block) => {}
            }
        }
        self.take(b"\n", id);
        self.account(barriers, events, id).await;
    }

    /// Finishes what [`BarrierRequests::serve`] began and reads what requests are there
    /// already (up to [`BARRIER_DRAIN`] bytes), without waiting for more: a process that
    /// exited right after writing one still entered that barrier.
    async fn drain(
        &mut self,
        barriers: &Mutex<HashMap<JobId, Barriers>>,
        events: &mpsc::Sender<Input>,
        id: JobId,
    ) {
        let mut chunk = [0u8; BARRIER_READ];
        let mut left = BARRIER_DRAIN;
        while left > 0 {
            match (&**self.socket.get_ref()).read(&mut chunk) {
                Ok(0) => {
                    self.take(b"\n", id);
                    break;
                }
                Ok(n) => {
                    self.take(&chunk[..n], id);
                    left = left.saturating_sub(n);
                }
                Err(_) => break,
            }
        }
        self.account(barriers, events, id).await;
    }

    /// Takes the complete lines in `bytes` (a lone `\n` ends a last line that had none):
    /// requests are kept to be counted; what is not a request is dropped, a line longer
    /// than [`MAX_BARRIER_LINE`] as it comes.
    fn take(&mut self, bytes: &[u8], id: JobId) {
        for &b in bytes {
            if b != b'\n' {
                if self.line.len() < MAX_BARRIER_LINE {
                    self.line.push(b);
                } else {
                    self.too_long = true;
                }
                continue;
            }
            if self.line.is_empty() && !self.too_long {
                continue;
            }
            let text = String::from_utf8_lossy(&self.line);
            match text
                .strip_prefix("barrier ")
                .and_then(|s| s.trim().parse::<u64>().ok())
            {
                Some(seq) if !self.too_long => self.read.push_back(seq),
                _ if !self.warned => {
                    self.warned = true;
                    warn!("job {id}: not a barrier request: {text:?} (further ones from this process not logged)");
                }
                _ => {}
            }
            self.line.clear();
            self.too_long = false;
        }
    }

    /// Counts the requests read; tells job-exec of each barrier they complete. Stopping at
    /// the await loses nothing: the barrier stays `complete` until the send went through.
    async fn account(
        &mut self,
        barriers: &Mutex<HashMap<JobId, Barriers>>,
        events: &mpsc::Sender<Input>,
        id: JobId,
    ) {
        loop {
            if let Some(seq) = self.complete {
                let _ = events.send(Input::ShellBarrier { id, seq }).await;
                self.complete = None;
            }
            let Some(seq) = self.read.pop_front() else {
                return;
            };
            if enter_barrier(barriers, id, seq) {
                self.complete = Some(seq);
            }
        }
    }
}

/// The most barriers one job may have open on a node at once (entered by some of its local
/// processes and not yet done everywhere): a process may write any number of them. A
/// request past it is not entered, so the process that wrote it waits for its reply until
/// its job ends.
const MAX_OPEN_BARRIERS: usize = 1024;

/// One local process of job `id` entered barrier `seq`: whether it was the last of them.
fn enter_barrier(barriers: &Mutex<HashMap<JobId, Barriers>>, id: JobId, seq: u64) -> bool {
    barriers.lock().ok().is_some_and(|mut b| {
        b.get_mut(&id).is_some_and(|b| {
            if !b.entered.contains_key(&seq) && b.entered.len() >= MAX_OPEN_BARRIERS {
                if !b.refused {
                    b.refused = true;
                    warn!("job {id}: more than {MAX_OPEN_BARRIERS} barriers open on this node; barrier {seq} and further new ones not entered");
                }
                return false;
            }
            let n = b.entered.entry(seq).or_default();
            *n += 1;
            *n == b.procs
        })
    })
}

/// Bytes read at most at a time from a job process's stdout or stderr.
const READ_BUFFER: usize = 16 << 10;

/// Room for a process's first read: most write little or nothing. It doubles while reads
/// fill it, up to [`READ_BUFFER`].
const FIRST_READ: usize = 256;

/// The file descriptor a job process finds its barrier socket on.
const BARRIER_FD: i32 = 3;

/// The daemon's own descriptor 3, claimed at start-up (on /dev/null, close-on-exec) so that
/// nothing else is ever given that number. For each spawn it holds the child's barrier
/// socket without close-on-exec, so the child inherits it as descriptor 3, and goes back to
/// /dev/null right after. This keeps the spawn free of pre-exec hooks, so the standard
/// library uses posix_spawn (vfork-style, no page-table copy), which is most of a job's
/// start-up cost on a busy node; and a small number, which every shell can redirect. Its
/// /dev/null is also, duplicated, the stdin of every process that gets no input.
pub struct BarrierSlot {
    fd3: OwnedFd,
    null: OwnedFd,
}

impl BarrierSlot {
    /// Claims descriptor 3. Call before the process opens anything of its own: an inherited
    /// descriptor 3 is replaced.
    pub fn claim() -> std::io::Result<BarrierSlot> {
        let first = OwnedFd::from(std::fs::File::open("/dev/null")?);
        let fd3 = if first.as_raw_fd() == BARRIER_FD {
            first
        } else {
            // SAFETY: descriptor 3 belongs to no object of this process yet (see above).
            unsafe { dup3_raw(&first, BARRIER_FD, OFlag::O_CLOEXEC) }?
        };
        let null = OwnedFd::from(std::fs::File::open("/dev/null")?);
        Ok(BarrierSlot { fd3, null })
    }
}

/// The environment variables every process of job `id` is told, besides its own number
/// (`DVMLAB_PROC`).
fn job_vars(spec: &JobSpec, id: JobId) -> [(&'static str, String); 3] {
    [
        ("DVMLAB_JOB_ID", id.to_string()),
        ("DVMLAB_NPROCS", spec.placement.nprocs.to_string()),
        ("DVMLAB_BARRIER_FD", BARRIER_FD.to_string()),
    ]
}

/// What job `id`'s processes run, for the clone (an error here is the start's error).
fn job_program(spec: &JobSpec, id: JobId) -> std::io::Result<Program> {
    let mut env = spec.env.clone();
    env.extend(job_vars(spec, id).map(|(k, v)| (k.to_string(), v)));
    Program::new(&spec.argv, &env, "DVMLAB_PROC", spec.cwd.as_deref())
}

/// Starts process `proc` of job `id`: by the clone while the kernel has it (`program`, made
/// once per job), else the standard library's way.
fn start(
    spec: &JobSpec,
    id: JobId,
    proc: u32,
    stdin: bool,
    slot: &mut BarrierSlot,
    spawner: &mut Spawner,
    program: &mut Option<std::io::Result<Program>>,
) -> std::io::Result<Started> {
    // Another job's start may have found the clone refused since this job's began.
    if !spawner.clones() {
        *program = None;
    }
    if let Some(p) = program {
        let p = p
            .as_mut()
            .map_err(|e| std::io::Error::new(e.kind(), e.to_string()))?;
        match cloned(p, proc, stdin, slot, spawner) {
            Ok(started) => return Ok(started),
            Err(CloneError::Failed(e)) => return Err(e),
            Err(CloneError::Unsupported(e)) => {
                warn!("job processes are started by posix_spawn from now on: clone3 with CLONE_CLEAR_SIGHAND refused ({e})");
                *program = None;
            }
        }
    }
    std_spawn(spec, id, proc, stdin, slot)
}

/// Starts a process of `program` by the clone.
fn cloned(
    program: &mut Program,
    proc: u32,
    stdin: bool,
    slot: &BarrierSlot,
    spawner: &mut Spawner,
) -> Result<Started, CloneError> {
    let failed = CloneError::Failed;
    let (ours, theirs) = UnixStream::pair().map_err(failed)?;
    ours.set_nonblocking(true).map_err(failed)?;
    let (stdin_ours, stdin_theirs) = if stdin {
        let (o, t) = spawn::pipe(false).map_err(failed)?;
        (Some(o), Some(t))
    } else {
        (None, None)
    };
    let (out_ours, out_theirs) = spawn::pipe(true).map_err(failed)?;
    let (err_ours, err_theirs) = spawn::pipe(true).map_err(failed)?;
    program.set(&proc.to_string());
    let fds = Descriptors {
        stdin: stdin_theirs
            .as_ref()
            .map_or(slot.null.as_raw_fd(), |t| t.as_raw_fd()),
        stdout: out_theirs.as_raw_fd(),
        stderr: err_theirs.as_raw_fd(),
        barrier: theirs.as_raw_fd(),
    };
    let (pid, pidfd) = spawner.clone_exec(program, &fds)?;
    // The child has its copies (it called `execve`): ours go now, or the pipes would never
    // end.
    drop((stdin_theirs, out_theirs, err_theirs, theirs));
    let proc = Cloned::new(pid, pidfd).map_err(|e| {
        spawn::abandon(pid);
        failed(e)
    })?;
    Ok(Started {
        proc: Proc::Cloned(proc),
        stdin: stdin_ours
            .map(pipe::Sender::from_owned_fd_unchecked)
            .transpose()
            .map_err(failed)?,
        stdout: Some(pipe::Receiver::from_owned_fd_unchecked(out_ours).map_err(failed)?),
        stderr: Some(pipe::Receiver::from_owned_fd_unchecked(err_ours).map_err(failed)?),
        socket: ours,
    })
}

/// Starts process `proc` of job `id` by the standard library (`posix_spawn`).
fn std_spawn(
    spec: &JobSpec,
    id: JobId,
    proc: u32,
    stdin: bool,
    slot: &mut BarrierSlot,
) -> std::io::Result<Started> {
    let (ours, theirs) = UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    let (prog, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .envs(job_vars(spec, id))
        .env("DVMLAB_PROC", proc.to_string())
        // The slot's /dev/null, duplicated: no path to look up per process.
        .stdin(if stdin {
            Stdio::piped()
        } else {
            Stdio::from(slot.null.try_clone()?)
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(d) = &spec.cwd {
        cmd.current_dir(d);
    }
    // Only this thread spawns processes, so only this child inherits the socket.
    dup3(&theirs, &mut slot.fd3, OFlag::empty())?;
    let child = cmd.spawn();
    dup3(&slot.null, &mut slot.fd3, OFlag::O_CLOEXEC)?;
    let mut child = child?;
    let stdin = child
        .stdin
        .take()
        .map(|p| p.into_owned_fd().and_then(pipe::Sender::from_owned_fd))
        .transpose()?;
    let stdout = child
        .stdout
        .take()
        .map(|p| p.into_owned_fd().and_then(pipe::Receiver::from_owned_fd))
        .transpose()?;
    let stderr = child
        .stderr
        .take()
        .map(|p| p.into_owned_fd().and_then(pipe::Receiver::from_owned_fd))
        .transpose()?;
    Ok(Started {
        proc: Proc::Std(child),
        stdin,
        stdout,
        stderr,
        socket: ours,
    })
}

/// Writes what the tool sends to a process's stdin, in order, and acknowledges every piece
/// once written. Once the process closed its stdin or exited (or the tool said `eof`), the
/// rest is acknowledged unwritten, so the tool never waits on a process that reads no more.
async fn feed_stdin(
    mut pipe: Option<pipe::Sender>,
    mut rx: mpsc::UnboundedReceiver<(Vec<u8>, bool)>,
    queued: Arc<AtomicUsize>,
    events: mpsc::Sender<Input>,
    id: JobId,
) {
    let mut taken = 0u64;
    while let Some((data, eof)) = rx.recv().await {
        if let Some(p) = pipe.as_mut() {
            if p.write_all(&data).await.is_err() {
                pipe = None;
            }
        }
        queued.fetch_sub(data.len(), Ordering::Relaxed);
        taken += data.len() as u64;
        if eof {
            pipe = None;
        }
        let ack = Input::ShellStdinAck { id, bytes: taken };
        if events.send(ack).await.is_err() {
            return;
        }
    }
}

/// Sends what process `proc` writes on `r` to job-exec, as it was written (until `give_up`
/// is cancelled while it waits for more): a piece per line,
/// a line longer than [`MAX_OUTPUT_CHUNK`] in pieces of that size, and whatever is left
/// without a newline at the end. Bytes, not text: nothing a process writes is lost or
/// refused. The channel is bounded, so a process that writes faster than its output travels
/// blocks in its write. What waits here is less than a piece and one read.
async fn forward<R: AsyncRead + Unpin>(
    r: Option<R>,
    events: mpsc::Sender<Input>,
    id: JobId,
    proc: u32,
    stream: Stream,
    give_up: &CancellationToken,
) {
    let Some(mut r) = r else {
        return;
    };
    let mut pending: Vec<u8> = Vec::new();
    // How many bytes at the front of `pending` are known to hold no newline: a line that
    // comes a byte at a time is searched once, not once per byte.
    let mut clean = 0;
    let mut room = FIRST_READ;
    loop {
        pending.reserve(room);
        // Into the spare capacity as it is: no buffer is zeroed or allocated before a
        // process writes anything (most never do, and this runs twice per process).
        // Only the wait for more bytes is given up, never a piece already read; and giving
        // up is looked at first, or a writer that never lets the pipe run dry would keep it
        // from ever being seen.
        let read = tokio::select! {
            biased;
            _ = give_up.cancelled() => break,
            read = r.read_buf(&mut pending) => read,
        };
        let n = match read {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if n >= room {
            room = (room * 2).min(READ_BUFFER);
        }
        let mut start = 0;
        while let Some(len) = piece_len(&pending[start..], clean) {
            let data = pending[start..start + len].to_vec();
            start += len;
            clean = 0;
            let piece = Input::ShellOutput {
                id,
                proc,
                stream,
                data,
            };
            if events.send(piece).await.is_err() {
                return;
            }
        }
        pending.drain(..start);
        clean = pending.len().min(MAX_OUTPUT_CHUNK);
    }
    if !pending.is_empty() {
        let _ = events
            .send(Input::ShellOutput {
                id,
                proc,
                stream,
                data: pending,
            })
            .await;
    }
}

/// The length of the first complete piece at the start of `buf`, whose first `clean` bytes
/// hold no newline: up to its first newline within [`MAX_OUTPUT_CHUNK`] bytes, or that many
/// bytes of a longer line.
fn piece_len(buf: &[u8], clean: usize) -> Option<usize> {
    let window = &buf[..buf.len().min(MAX_OUTPUT_CHUNK)];
    let from = clean.min(window.len());
    match window[from..].iter().position(|b| *b == b'\n') {
        Some(i) => Some(from + i + 1),
        None => (window.len() == MAX_OUTPUT_CHUNK).then_some(MAX_OUTPUT_CHUNK),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// Gives its bytes a few at a time, as a pipe does.
    struct Trickle {
        bytes: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl tokio::io::AsyncRead for Trickle {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let n = self
                .step
                .min(buf.remaining())
                .min(self.bytes.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.bytes[at..at + n]);
            self.at += n;
            Poll::Ready(Ok(()))
        }
    }

    async fn pieces(bytes: Vec<u8>, step: usize) -> Vec<Vec<u8>> {
        let (tx, mut rx) = mpsc::channel(4);
        let r = Trickle { bytes, at: 0, step };
        tokio::spawn(async move {
            forward(Some(r), tx, 1, 0, Stream::Stdout, &CancellationToken::new()).await
        });
        let mut got = Vec::new();
        while let Some(i) = rx.recv().await {
            match i {
                Input::ShellOutput { data, .. } => got.push(data),
                other => panic!("not output: {other:?}"),
            }
        }
        got
    }

    #[tokio::test]
    async fn output_goes_as_a_piece_per_line_a_long_line_in_pieces_and_the_rest_at_the_end() {
        let long = MAX_OUTPUT_CHUNK * 2 + 10;
        let mut bytes = b"a\nbb\n".to_vec();
        bytes.extend(std::iter::repeat_n(b'x', long));
        bytes.extend(b"\n\ntail");
        for step in [1, 7, 300, READ_BUFFER, usize::MAX] {
            let got = pieces(bytes.clone(), step).await;
            let lens: Vec<usize> = got.iter().map(Vec::len).collect();
            assert_eq!(
                lens,
                [2, 3, MAX_OUTPUT_CHUNK, MAX_OUTPUT_CHUNK, 11, 1, 4],
                "reads of {step} bytes"
            );
            assert_eq!(got.concat(), bytes, "reads of {step} bytes");
        }
    }

    /// A barrier socket as a job process has it (the other end) and a job of `procs`
    /// local processes to count its requests in.
    fn barrier_socket(
        procs: usize,
    ) -> (BarrierRequests, UnixStream, Mutex<HashMap<JobId, Barriers>>) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        // SAFETY: the registration holds the socket's only reference.
        let fd =
            unsafe { AsyncFd::register_with_interest(Arc::new(ours), Interest::READABLE) }.unwrap();
        let barriers = HashMap::from([(
            1,
            Barriers {
                procs,
                ..Barriers::default()
            },
        )]);
        (BarrierRequests::new(fd), theirs, Mutex::new(barriers))
    }

    /// Job-exec's channel, with no room left (it holds one `ProcExited`).
    async fn full_channel() -> (mpsc::Sender<Input>, mpsc::Receiver<Input>) {
        let (tx, rx) = mpsc::channel(1);
        let exited = Input::ProcExited {
            id: 1,
            proc: 0,
            status: 0,
        };
        tx.send(exited).await.expect("an empty channel takes one");
        (tx, rx)
    }

    /// Lets the runtime's other work run until `done` holds.
    async fn until(done: impl Fn() -> bool) {
        while !done() {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_barrier_completed_while_job_exec_takes_nothing_is_told_once_reading_resumes() {
        let (mut requests, mut process, barriers) = barrier_socket(1);
        let (tx, mut rx) = full_channel().await;
        process.write_all(b"barrier 7\n").unwrap();
        // Job-exec's channel is full: the request is read and counted, the send waits, and
        // the reading stops there (the process exited).
        let counted = || {
            barriers
                .lock()
                .unwrap()
                .get(&1)
                .is_some_and(|b| b.entered.contains_key(&7))
        };
        tokio::select! {
            _ = requests.serve(&barriers, &tx, 1) => panic!("served to the end"),
            _ = until(counted) => {}
        }
        assert_eq!(
            requests.complete,
            Some(7),
            "the reading did not stop at the send"
        );
        assert!(matches!(rx.recv().await, Some(Input::ProcExited { .. })));
        requests.drain(&barriers, &tx, 1).await;
        match rx.try_recv() {
            Ok(Input::ShellBarrier { id: 1, seq: 7 }) => {}
            other => panic!("barrier 7 lost: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_last_request_without_a_newline_counts_at_the_end_of_the_socket() {
        let (mut requests, mut process, barriers) = barrier_socket(1);
        let (tx, mut rx) = mpsc::channel(4);
        process.write_all(b"barrier 3").unwrap();
        drop(process);
        requests.serve(&barriers, &tx, 1).await;
        assert!(matches!(
            rx.try_recv(),
            Ok(Input::ShellBarrier { id: 1, seq: 3 })
        ));
    }

    #[tokio::test]
    async fn after_the_exit_a_barrier_socket_is_read_only_so_far() {
        // A writer left behind may never stop: what lies past the bound is not read, even
        // a request.
        let (mut requests, mut process, barriers) = barrier_socket(1);
        let (tx, mut rx) = mpsc::channel(4);
        process.write_all(&b"x\n".repeat(BARRIER_DRAIN)).unwrap();
        process.write_all(b"barrier 1\n").unwrap();
        requests.drain(&barriers, &tx, 1).await;
        assert!(rx.try_recv().is_err(), "read past {BARRIER_DRAIN} bytes");
        // Within the bound, a request is read.
        let (mut requests, mut process, barriers) = barrier_socket(1);
        process.write_all(b"x\nbarrier 2\n").unwrap();
        requests.drain(&barriers, &tx, 1).await;
        assert!(matches!(
            rx.try_recv(),
            Ok(Input::ShellBarrier { id: 1, seq: 2 })
        ));
    }

    /// Gives its bytes (and says so), then nothing ever again: a pipe that something left
    /// running holds.
    struct Held(Option<Vec<u8>>, Arc<std::sync::atomic::AtomicBool>);

    impl tokio::io::AsyncRead for Held {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            match self.0.take() {
                Some(bytes) => {
                    buf.put_slice(&bytes);
                    self.1.store(true, Ordering::Relaxed);
                    Poll::Ready(Ok(()))
                }
                None => Poll::Pending,
            }
        }
    }

    #[tokio::test]
    async fn output_read_before_giving_up_goes_up_however_long_the_way_up_is_blocked() {
        let (tx, mut rx) = full_channel().await;
        let give_up = CancellationToken::new();
        let read = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let forwarding = {
            let (give_up, read) = (give_up.clone(), read.clone());
            tokio::spawn(async move {
                let r = Held(Some(b"last words\n".to_vec()), read);
                forward(Some(r), tx, 1, 0, Stream::Stdout, &give_up).await
            })
        };
        // The line is read; its send waits for room. Giving up now stops only the reading.
        until(|| read.load(Ordering::Relaxed)).await;
        give_up.cancel();
        assert!(matches!(rx.recv().await, Some(Input::ProcExited { .. })));
        match rx.recv().await {
            Some(Input::ShellOutput { data, .. }) => assert_eq!(data, b"last words\n"),
            other => panic!("the line read was lost: {other:?}"),
        }
        forwarding.await.unwrap();
        assert!(
            rx.recv().await.is_none(),
            "forward went on reading after giving up"
        );
    }

    /// A pipe that never runs dry: something the process left running writes for ever.
    struct Endless;

    impl tokio::io::AsyncRead for Endless {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            while buf.remaining() >= 2 {
                buf.put_slice(b"y\n");
            }
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn giving_up_stops_the_reading_of_a_pipe_that_never_runs_dry() {
        let (tx, mut rx) = mpsc::channel(64);
        let give_up = CancellationToken::new();
        let forwarding = {
            let give_up = give_up.clone();
            tokio::spawn(
                async move { forward(Some(Endless), tx, 1, 0, Stream::Stdout, &give_up).await },
            )
        };
        assert!(rx.recv().await.is_some(), "nothing read");
        let taking = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        give_up.cancel();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), forwarding).await;
        assert!(ended.is_ok(), "still reading 10 s after giving up");
        taking.await.unwrap();
    }

    #[tokio::test]
    async fn a_process_that_writes_nothing_sends_nothing() {
        assert!(pieces(Vec::new(), 100).await.is_empty());
    }
}
