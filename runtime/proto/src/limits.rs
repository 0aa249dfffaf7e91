//! Every limit of the runtime in one place ("put a limit on everything"). Each is enforced
//! where its comment says and has a test that crosses it; `ARCHITECTURE.md` has the table.
//! Crossing one is a clear error for whoever crossed it, never a collapse of the DVM.

/// Daemons in one DVM: the `DVMNodes` expansion and every rank list on the wire.
pub const MAX_NODES: usize = 65_536;

/// Largest frame before a connection's hello is accepted: a hello is small, so a stranger
/// cannot make a daemon buffer much.
pub const MAX_HELLO_FRAME: usize = 4 << 10;

/// Largest frame after the hello (a status or report of a `MAX_NODES` DVM fits).
pub const MAX_FRAME: usize = 16 << 20;

/// Bytes queued for writing on one link. A peer that does not read them is dropped: the
/// queue never grows past this.
pub const MAX_LINK_QUEUE: usize = 2 * MAX_FRAME;

/// A daemon reads its local job processes' output only while the link that output goes to
/// has less than this queued: a job that writes faster than the tree carries it waits.
pub const OUTPUT_LOW_WATER: usize = 1 << 20;

/// Connections a daemon holds at once, daemons and tools together; more are closed at once.
pub const MAX_CONNECTIONS: usize = 4096;

/// Connections that have not finished their hello; more wait in the kernel's backlog.
pub const MAX_PENDING_HANDSHAKES: usize = 64;

/// Events queued for a daemon's core from its connections, timers and job shells. Readers
/// wait when it is full, so TCP pushes back on the sender.
pub const EVENT_QUEUE: usize = 4096;

/// Processes in one job.
pub const MAX_PROCS_PER_JOB: u32 = 1 << 20;

/// Processes of one job on one node.
pub const MAX_PROCS_PER_NODE: u32 = 32_768;

/// Bytes of a job's command, environment, working directory and host list together.
pub const MAX_JOB_SPEC_BYTES: usize = 64 << 10;

/// Jobs the controller runs at once (not yet INACTIVE).
pub const MAX_LIVE_JOBS: usize = 4096;

/// Finished jobs the controller remembers for `pctl jobs`.
pub const JOB_HISTORY: usize = 1000;

/// Longest type, and longest note, of a job exception job-exec takes in; longer ones are cut
/// (with `…` at the end). What happened fits; a job's record and the fatal exceptions a
/// daemon holds while it has no parent stay small.
pub const MAX_EXCEPTION_TEXT: usize = 4 << 10;

/// Longest piece of job output in one message; a longer line arrives in pieces.
pub const MAX_OUTPUT_CHUNK: usize = 64 << 10;

/// Bytes of a daemon's contact URI as it reports it; a longer one is not recorded.
pub const MAX_URI_LEN: usize = 256;

/// Bytes of a job's stdin a tool may send ahead of the acknowledgement that the process
/// took them: the tool waits for acknowledgements beyond this, so stdin never piles up in
/// the tree.
pub const STDIN_WINDOW: usize = 256 << 10;

/// Bytes a daemon queues for one job process's stdin. Only a tool that ignores
/// [`STDIN_WINDOW`] gets here: the excess is dropped and the job gets a fatal exception.
pub const MAX_STDIN_QUEUE: usize = 2 * STDIN_WINDOW;

/// Pings the controller waits for at once.
pub const MAX_PENDING_PINGS: usize = 1024;

/// Words in the command line of one launch request (`plaunch`).
pub const MAX_LAUNCH_WORDS: usize = 4096;

/// Callers a launch service (`plaunch serve`) serves at once; more are closed at once.
pub const MAX_LAUNCH_CALLERS: usize = 16;

/// Seconds a launch service's caller has for the key handshake, its request and reading the
/// reply; then it is closed.
pub const LAUNCH_EXCHANGE_SECS: u64 = 10;
