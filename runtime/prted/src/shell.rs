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
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::reaper::Reaper;
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
    writers: Vec<tokio::net::unix::OwnedWriteHalf>,
    entered: HashMap<u64, usize>,
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
            barriers: Arc::new(Mutex::new(HashMap::new())),
            stdins: Arc::new(Mutex::new(HashMap::new())),
            pmix: None,
            procs: ProcTable::default(),
            log_starts: false,
        }
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
                    // One short line on a fresh socket: the buffer always has room.
                    if let Err(e) = w.try_write(format!("ok {seq}\n").as_bytes()) {
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
        let (me, events, groups, prolog, barriers, reaper, slot) = (
            self.me,
            self.events.clone(),
            self.groups.clone(),
            self.prolog.clone(),
            self.barriers.clone(),
            self.reaper.clone(),
            self.slot.clone(),
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
            let mut children = Vec::new();
            let mut readers = Vec::new();
            let procs = spec.placement.procs_on(me);
            if let Ok(mut b) = barriers.lock() {
                b.entry(id).or_default().procs = procs.len();
            }
            for proc in procs {
                // A node may start thousands of processes for one job: between two, the
                // daemon's other work (heartbeats above all) gets its turn, or its links look
                // dead to its parent and children while it spawns.
                tokio::task::yield_now().await;
                let feed = if proc == 0 { stdin_rx.take() } else { None };
                let spawned = match slot.lock() {
                    Ok(mut slot) => spawn(&spec, id, proc, feed.is_some(), &mut slot),
                    Err(_) => Err(std::io::Error::other("barrier slot poisoned")),
                };
                match spawned {
                    Ok((mut child, socket)) => {
                        if let Some(rx) = feed {
                            tokio::spawn(feed_stdin(
                                child.stdin.take(),
                                rx,
                                stdin_queued.clone(),
                                events.clone(),
                                id,
                            ));
                        }
                        let (read, write) = socket.into_split();
                        if let Ok(mut b) = barriers.lock() {
                            b.entry(id).or_default().writers.push(write);
                        }
                        tokio::spawn(barrier_requests(read, barriers.clone(), events.clone(), id));
                        if let Some(pid) = child.id() {
                            if let Ok(mut r) = reaper.lock() {
                                r.started(pid as i32);
                            }
                            if let Ok(mut g) = groups.lock() {
                                g.entry(id).or_default().push(pid as i32);
                            }
                            if let (Some(ns), Ok(mut t)) = (&nspace, procs_table.lock()) {
                                t.insert(pid as i32, (ns.clone(), proc));
                            }
                        }
                        let pid = child.id().map(|p| p as i32);
                        if log_starts {
                            info!(
                                "job {id} process {proc} started on rank {me} (pid {})",
                                pid.unwrap_or(0)
                            );
                        }
                        let table = procs_table.clone();
                        for (stream, pipe) in [
                            (Stream::Stdout, child.stdout.take().map(box_reader)),
                            (Stream::Stderr, child.stderr.take().map(box_reader)),
                        ] {
                            if let Some(r) = pipe {
                                readers.push(tokio::spawn(forward(
                                    r,
                                    events.clone(),
                                    id,
                                    proc,
                                    stream,
                                )));
                            }
                        }
                        // Waited for at once, so a process that exits while its siblings are
                        // still being started is reaped at once: a node starting thousands
                        // for one job does not hold thousands of zombies (pids are finite).
                        let told = events.clone();
                        children.push(tokio::spawn(async move {
                            let st = match child.wait().await {
                                Ok(st) => st.into_raw(),
                                Err(e) => {
                                    warn!("waiting for a process of job {id}: {e}");
                                    1 << 8
                                }
                            };
                            if let (Some(pid), Ok(mut t)) = (pid, table.lock()) {
                                t.remove(&pid);
                            }
                            // For PMIx events: the job's other processes may hear of it.
                            let _ = told
                                .send(Input::ProcExited {
                                    id,
                                    proc,
                                    status: st,
                                })
                                .await;
                            st
                        }));
                    }
                    Err(e) => {
                        send(Input::LocalFailure {
                            id,
                            note: format!("cannot start {:?} on rank {me}: {e}", spec.argv),
                        })
                        .await;
                        kill_groups(&groups, id, Signal::SIGKILL);
                        for c in children {
                            let _ = c.await;
                        }
                        forget_groups(&groups, &reaper, id);
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
            let mut status = 0;
            for c in children {
                // A wait task that could not finish counts as a failed process.
                status = status.max(c.await.unwrap_or(1 << 8));
            }
            // All output before the exit: the tool must have all of it when the job ends.
            // (A process that left a child holding its pipes gets a second, not forever.)
            for r in readers {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(1), r).await;
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

type Reader = Box<dyn tokio::io::AsyncRead + Unpin + Send>;

fn box_reader<R: tokio::io::AsyncRead + Unpin + Send + 'static>(r: R) -> Reader {
    Box::new(r)
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

/// Reads `barrier SEQ` lines from one process; once every local process of the job entered
/// SEQ, this rank's shell has entered it.
async fn barrier_requests(
    read: tokio::net::unix::OwnedReadHalf,
    barriers: Arc<Mutex<HashMap<JobId, Barriers>>>,
    events: mpsc::Sender<Input>,
    id: JobId,
) {
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Some(seq) = line
            .strip_prefix("barrier ")
            .and_then(|s| s.trim().parse::<u64>().ok())
        else {
            warn!("job {id}: not a barrier request: {line:?}");
            continue;
        };
        let complete = barriers.lock().ok().is_some_and(|mut b| {
            b.get_mut(&id).is_some_and(|b| {
                let n = b.entered.entry(seq).or_default();
                *n += 1;
                *n == b.procs
            })
        });
        if complete {
            let _ = events.send(Input::ShellBarrier { id, seq }).await;
        }
    }
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
/// start-up cost on a busy node; and a small number, which every shell can redirect.
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

fn spawn(
    spec: &JobSpec,
    id: JobId,
    proc: u32,
    stdin: bool,
    slot: &mut BarrierSlot,
) -> std::io::Result<(tokio::process::Child, tokio::net::UnixStream)> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    let ours = tokio::net::UnixStream::from_std(ours)?;
    let (prog, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .env("DVMLAB_JOB_ID", id.to_string())
        .env("DVMLAB_PROC", proc.to_string())
        .env("DVMLAB_NPROCS", spec.placement.nprocs.to_string())
        .env("DVMLAB_BARRIER_FD", BARRIER_FD.to_string())
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
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
    Ok((child?, ours))
}

/// Writes what the tool sends to a process's stdin, in order, and acknowledges every piece
/// once written. Once the process closed its stdin or exited (or the tool said `eof`), the
/// rest is acknowledged unwritten, so the tool never waits on a process that reads no more.
async fn feed_stdin(
    mut pipe: Option<tokio::process::ChildStdin>,
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

/// Sends what process `proc` writes on `r` to job-exec, as it was written: a piece per line,
/// a line longer than [`MAX_OUTPUT_CHUNK`] in pieces of that size, and whatever is left
/// without a newline at the end. Bytes, not text: nothing a process writes is lost or
/// refused. The channel is bounded, so a process that writes faster than its output travels
/// blocks in its write. What waits here is less than a piece and one read.
async fn forward(mut r: Reader, events: mpsc::Sender<Input>, id: JobId, proc: u32, stream: Stream) {
    let mut pending: Vec<u8> = Vec::new();
    // How many bytes at the front of `pending` are known to hold no newline: a line that
    // comes a byte at a time is searched once, not once per byte.
    let mut clean = 0;
    let mut room = FIRST_READ;
    loop {
        pending.reserve(room);
        // Into the spare capacity as it is: no buffer is zeroed or allocated before a
        // process writes anything (most never do, and this runs twice per process).
        let n = match r.read_buf(&mut pending).await {
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
        let r: Reader = Box::new(Trickle { bytes, at: 0, step });
        tokio::spawn(forward(r, tx, 1, 0, Stream::Stdout));
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

    #[tokio::test]
    async fn a_process_that_writes_nothing_sends_nothing() {
        assert!(pieces(Vec::new(), 100).await.is_empty());
    }
}
