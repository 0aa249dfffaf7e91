//! Starting job processes. Most of a node's work for a job of short processes is starting
//! them, and glibc's `posix_spawn` (what the standard library uses) spends much of that in
//! its child before `exec`: it asks the kernel about each of the 64 signals, and resets the
//! ones with a handler, so that no handler of the daemon runs in a child that shares its
//! memory. With `clone3`'s `CLONE_CLEAR_SIGHAND` (Linux 5.5) the kernel resets them in the
//! clone itself, so the child here only sets up its descriptors, its process group and
//! directory, and calls `execve`: about a tenth of the system calls. The same clone hands
//! back a pidfd, which is what the exit is awaited on.
//!
//! Where that clone is refused (a kernel before 5.5, a seccomp profile that answers
//! `ENOSYS`, as Docker 20.10's does, or another architecture than x86-64), the process is
//! started the standard library's way, and the rest of the daemon does not see the
//! difference.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};

use nix::libc;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The child's stack: it only sets up descriptors and calls `execve`, as glibc's spawn
/// child does in its 32 KiB.
const STACK_SIZE: usize = 64 << 10;

/// Pids of cloned processes whose handle went away before they were reaped: killed, and
/// reaped at the next start, so that none stays a zombie for the daemon's life.
static UNREAPED: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// What a job's processes on this node run, made once per job: the candidate paths of the
/// program (the `PATH` search done beforehand, as `execvp` would do it), its arguments and
/// its whole environment as C strings, and the entry that differs for each process.
pub struct Program {
    paths: Vec<CString>,
    argv: Vec<CString>,
    /// `/bin/sh`, for a candidate that is no executable format (`ENOEXEC`): `execvp` runs
    /// it as a shell script, with `sh` first and the file in place of the program's name.
    sh: CString,
    env: Vec<EnvVar>,
    /// The index in `env` of the variable set per process, and its name.
    per_proc: Option<(usize, &'static str)>,
    cwd: Option<CString>,
}

/// One `NAME=value` of a job process's environment: the daemon's own, or the job's.
enum EnvVar {
    Daemon(&'static CStr),
    Job(CString),
}

impl EnvVar {
    fn as_c_str(&self) -> &CStr {
        match self {
            EnvVar::Daemon(c) => c,
            EnvVar::Job(c) => c,
        }
    }
}

/// This daemon's own environment, by name, each as its `NAME=value`: read once (nothing in
/// the daemon changes it), where every job used to read and copy it again.
fn daemon_env() -> &'static [(OsString, CString)] {
    static ENV: OnceLock<Vec<(OsString, CString)>> = OnceLock::new();
    ENV.get_or_init(|| {
        let vars: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
        vars.into_iter()
            .filter_map(|(k, v)| {
                let mut kv = k.clone().into_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                // An environment holds no NUL byte.
                CString::new(kv).ok().map(|kv| (k, kv))
            })
            .collect()
    })
}

impl Program {
    /// `argv` run with this daemon's environment, changed by `env` (later entries win), in
    /// `cwd`. The variable `per_proc` is given its value for each process by
    /// [`Program::set`].
    pub fn new(
        argv: &[String],
        env: &[(String, String)],
        per_proc: &'static str,
        cwd: Option<&str>,
    ) -> io::Result<Program> {
        let c = |s: &[u8], what: &str| {
            CString::new(s).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{what} holds a NUL byte"),
                )
            })
        };
        let prog = argv
            .first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
        if prog.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "an empty program name",
            ));
        }
        // By name, each once, as the standard library's spawn passes an environment: the
        // job's variables merged into the daemon's, both in name order.
        let mut own: BTreeMap<&OsStr, &OsStr> = env
            .iter()
            .map(|(k, v)| (OsStr::new(k), OsStr::new(v)))
            .collect();
        own.insert(OsStr::new(per_proc), OsStr::new(""));
        let daemon = daemon_env();
        let mut envp = Vec::with_capacity(daemon.len() + own.len());
        let mut at = None;
        let mut path = None;
        let mut theirs = daemon.iter().peekable();
        for (k, v) in &own {
            while let Some((dk, kv)) = theirs.next_if(|(dk, _)| dk.as_os_str() <= *k) {
                if dk.as_os_str() < *k {
                    if dk == "PATH" {
                        path = Some(&kv.as_bytes()[5..]);
                    }
                    envp.push(EnvVar::Daemon(kv));
                }
            }
            if *k == per_proc {
                at = Some(envp.len());
            }
            if *k == "PATH" {
                path = Some(v.as_bytes());
            }
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            envp.push(EnvVar::Job(c(&kv, "an environment variable")?));
        }
        for (dk, kv) in theirs {
            if dk == "PATH" {
                path = Some(&kv.as_bytes()[5..]);
            }
            envp.push(EnvVar::Daemon(kv));
        }
        let paths = search(prog.as_bytes(), path.map(OsStr::from_bytes))
            .into_iter()
            .map(|p| c(&p, "the program's path"))
            .collect::<io::Result<_>>()?;
        Ok(Program {
            paths,
            argv: argv
                .iter()
                .map(|a| c(a.as_bytes(), "an argument"))
                .collect::<io::Result<_>>()?,
            sh: c(b"/bin/sh", "sh")?,
            env: envp,
            per_proc: at.map(|i| (i, per_proc)),
            cwd: cwd
                .map(|d| c(d.as_bytes(), "the working directory"))
                .transpose()?,
        })
    }

    /// Gives the per-process variable its value for the next start.
    pub fn set(&mut self, value: &str) {
        if let Some((i, name)) = self.per_proc {
            // Neither part holds a NUL: the name is ours, the value a number.
            if let Ok(kv) = CString::new(format!("{name}={value}")) {
                self.env[i] = EnvVar::Job(kv);
            }
        }
    }
}

/// Where `execvp` would look for `prog`: itself if it names a path, else each directory of
/// `path` (the empty one being the current directory), or the default search path.
fn search(prog: &[u8], path: Option<&OsStr>) -> Vec<Vec<u8>> {
    if prog.contains(&b'/') {
        return vec![prog.to_vec()];
    }
    let path = path.map_or(&b"/bin:/usr/bin"[..], |p| p.as_bytes());
    path.split(|b| *b == b':')
        .map(|dir| {
            let mut p = if dir.is_empty() {
                b".".to_vec()
            } else {
                dir.to_vec()
            };
            p.push(b'/');
            p.extend_from_slice(prog);
            p
        })
        .collect()
}

/// The descriptors a job process starts with: its stdin, stdout, stderr and barrier socket
/// become 0, 1, 2 and 3; everything else the daemon holds is close-on-exec.
pub struct Descriptors {
    pub stdin: RawFd,
    pub stdout: RawFd,
    pub stderr: RawFd,
    pub barrier: RawFd,
}

/// Starts job processes with a vfork-style clone while the kernel allows it. One per
/// daemon; one start at a time (its stack is reused).
pub struct Spawner {
    stack: Option<Stack>,
    /// The signals this daemon ignores, which its processes must not inherit.
    ignored: Vec<libc::c_int>,
}

/// Why a clone did not start the process.
pub enum CloneError {
    /// This kernel (or its seccomp profile) has no such clone: start it another way, now and
    /// from now on.
    Unsupported(io::Error),
    /// The process could not be started (the program is missing, a directory is wrong...).
    Failed(io::Error),
}

impl Spawner {
    /// A spawner that clones where it can. `allow` false: never (the standard library's
    /// spawn only).
    pub fn new(allow: bool) -> Spawner {
        let stack = if allow && cfg!(target_arch = "x86_64") {
            Stack::new().ok()
        } else {
            None
        };
        let ignored = if stack.is_some() {
            ignored_signals()
        } else {
            Vec::new()
        };
        Spawner { stack, ignored }
    }

    /// Whether starts are cloned (until a clone is refused).
    pub fn clones(&self) -> bool {
        self.stack.is_some()
    }

    /// Starts `program` with `fds` as its 0 to 3, leading a process group of its own; its
    /// pid and a pidfd for it.
    pub fn clone_exec(
        &mut self,
        program: &Program,
        fds: &Descriptors,
    ) -> Result<(i32, OwnedFd), CloneError> {
        let Some(stack) = &self.stack else {
            return Err(CloneError::Unsupported(io::Error::from_raw_os_error(
                libc::ENOSYS,
            )));
        };
        reap_unreaped();
        let sources = [fds.stdin, fds.stdout, fds.stderr, fds.barrier];
        let mut argv: Vec<*const libc::c_char> = program.argv.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut envp: Vec<*const libc::c_char> =
            program.env.iter().map(|e| e.as_c_str().as_ptr()).collect();
        envp.push(std::ptr::null());
        let paths: Vec<*const libc::c_char> = program.paths.iter().map(|p| p.as_ptr()).collect();
        // `sh FILE ARGS…`; the child writes FILE into slot 1.
        let mut sh_argv: Vec<*const libc::c_char> = vec![program.sh.as_ptr(), std::ptr::null()];
        sh_argv.extend_from_slice(&argv[1..]);
        let plan = Plan {
            paths: &paths,
            argv: argv.as_ptr(),
            sh: program.sh.as_ptr(),
            sh_argv: sh_argv.as_mut_ptr(),
            envp: envp.as_ptr(),
            cwd: program.cwd.as_ref().map(|d| d.as_ptr()),
            ignored: &self.ignored,
            sources,
            error: AtomicI32::new(0),
        };
        match unsafe { clone_with(stack, &plan) } {
            Ok((pid, pidfd)) => match plan.error.load(Ordering::Acquire) {
                0 => Ok((pid, pidfd)),
                errno => {
                    // It exited before `exec` (CLONE_VFORK returned once it had): reap it.
                    // SAFETY: our own child, not yet waited for.
                    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
                    Err(CloneError::Failed(io::Error::from_raw_os_error(errno)))
                }
            },
            Err(e) => {
                let unsupported = matches!(
                    e.raw_os_error(),
                    Some(libc::ENOSYS | libc::EINVAL | libc::EPERM | libc::E2BIG)
                );
                if unsupported {
                    self.stack = None;
                    Err(CloneError::Unsupported(e))
                } else {
                    Err(CloneError::Failed(e))
                }
            }
        }
    }
}

/// A cloned job process, until reaped: its pidfd tells when it exited.
pub struct Cloned {
    pid: i32,
    pidfd: AsyncFd<OwnedFd>,
    reaped: bool,
}

impl Cloned {
    /// Watches `pid` through `pidfd` (within the daemon's runtime).
    pub fn new(pid: i32, pidfd: OwnedFd) -> io::Result<Cloned> {
        // SAFETY: the registration owns the descriptor, so it is open while registered.
        let pidfd = unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) }?;
        Ok(Cloned {
            pid,
            pidfd,
            reaped: false,
        })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Waits for the exit and reaps the process: its wait status.
    pub async fn wait(&mut self) -> io::Result<i32> {
        loop {
            let mut ready = self.pidfd.readable().await?;
            let mut status = 0;
            // SAFETY: our own child, reaped nowhere else (it is in no other table).
            let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            if r == self.pid {
                self.reaped = true;
                return Ok(status);
            }
            if r < 0 {
                let e = io::Error::last_os_error();
                // Reaped by someone else (nothing here does): there is nothing left to kill.
                self.reaped = e.raw_os_error() == Some(libc::ECHILD);
                return Err(e);
            }
            ready.clear_ready();
        }
    }
}

impl Drop for Cloned {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        // Through the pidfd: it names this process and no other, whoever reaped it.
        // SAFETY: a system call on a descriptor we hold.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.get_ref().as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        reap_later(self.pid);
    }
}

/// A started child nothing watches any more (killed, or about to be): reaped now if it
/// is gone already, else at the next start.
fn reap_later(pid: i32) {
    // SAFETY: our own child, not yet waited for.
    if unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) } != pid {
        if let Ok(mut u) = UNREAPED.lock() {
            u.push(pid);
        }
    }
}

/// Kills child `pid`, just started, that cannot be watched (its pidfd could not be
/// registered), and reaps it now or at the next start.
pub fn abandon(pid: i32) {
    // Not reaped yet, the pid is still ours: the kill reaches this process and no other.
    // SAFETY: a system call on our own child.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    reap_later(pid);
}

fn reap_unreaped() {
    if let Ok(mut u) = UNREAPED.lock() {
        // SAFETY: our own children, killed and not yet reaped.
        u.retain(|pid| unsafe { libc::waitpid(*pid, std::ptr::null_mut(), libc::WNOHANG) } == 0);
    }
}

/// The child's stack: an anonymous mapping with a guard page below it.
struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is owned by the Stack alone and used only by the clone it is lent to.
unsafe impl Send for Stack {}

impl Stack {
    fn new() -> io::Result<Stack> {
        let page = 4096;
        let len = STACK_SIZE + page;
        // SAFETY: a fresh private anonymous mapping, aliasing nothing.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the lowest page of the mapping just made.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: the mapping just made, used by nothing.
            unsafe { libc::munmap(base, len) };
            return Err(e);
        }
        Ok(Stack { base, len })
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no clone runs on it (a clone ends before
        // `clone_exec` returns).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// What the child does, prepared by the parent (the child may not allocate: it shares the
/// parent's memory, and another thread may hold the allocator's lock).
struct Plan<'a> {
    paths: &'a [*const libc::c_char],
    argv: *const *const libc::c_char,
    sh: *const libc::c_char,
    /// `sh`'s argument vector, its slot 1 free for the file (only the child writes it).
    sh_argv: *mut *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: Option<*const libc::c_char>,
    ignored: &'a [libc::c_int],
    sources: [RawFd; 4],
    /// The child's errno if it could not `exec`.
    error: AtomicI32,
}

/// `struct clone_args` of `clone3(2)`.
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;

/// The kernel's `struct sigaction` (x86-64): all zero is `SIG_DFL`, no flags, empty mask.
#[repr(C)]
#[derive(Default)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// The signals this process ignores, from `/proc/self/status` (read once: one file read,
/// where asking the kernel signal by signal takes 64 system calls).
fn ignored_signals() -> Vec<libc::c_int> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        // Unreadable: SIGPIPE, which every Rust program ignores.
        .unwrap_or(1 << (libc::SIGPIPE - 1));
    (0..64)
        .filter(|b| mask & (1u64 << b) != 0)
        .map(|b| b + 1)
        .collect()
}

/// Clones a child that runs [`child`] with `plan` on `stack`, sharing memory with this
/// process, which waits until the child called `execve` or exited (`CLONE_VFORK`).
///
/// # Safety
/// `plan` and everything it points to live until this returns; nothing else uses `stack`.
unsafe fn clone_with(stack: &Stack, plan: &Plan) -> io::Result<(i32, OwnedFd)> {
    let mut pidfd: libc::c_int = -1;
    let mut args = CloneArgs {
        flags: (libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD) as u64
            | CLONE_CLEAR_SIGHAND,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        stack: stack.base as u64,
        stack_size: stack.len as u64,
        ..CloneArgs::default()
    };
    // Every signal blocked through the clone: the child starts with them blocked and
    // unblocks them just before `execve`, its handlers cleared by the kernel meanwhile.
    let mut all: libc::sigset_t = std::mem::zeroed();
    let mut old: libc::sigset_t = std::mem::zeroed();
    libc::sigfillset(&mut all);
    libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    let r = raw_clone3(&mut args, plan);
    libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    if r < 0 {
        return Err(io::Error::from_raw_os_error(-r as i32));
    }
    Ok((r as i32, OwnedFd::from_raw_fd(pidfd)))
}

/// `clone3(args)`; in the child, `child(plan)` on the new stack (it never returns). The
/// parent's result: the child's pid, or minus the errno.
#[cfg(target_arch = "x86_64")]
unsafe fn raw_clone3(args: &mut CloneArgs, plan: &Plan) -> i64 {
    let ret: i64;
    // The child starts on the new stack's top (16-byte aligned, so the `call` leaves it
    // as a function entry expects) with every register as the parent had it: r12 and r13
    // carry the plan and the function across the system call.
    std::arch::asm!(
        "syscall",
        "test rax, rax",
        "jnz 2f",
        "mov rdi, r12",
        "call r13",
        "ud2",
        "2:",
        inlateout("rax") libc::SYS_clone3 => ret,
        in("rdi") args as *mut CloneArgs,
        in("rsi") std::mem::size_of::<CloneArgs>(),
        in("r12") plan as *const Plan,
        in("r13") child as extern "C" fn(*const Plan) -> !,
        lateout("rcx") _,
        lateout("r11") _,
        options(nostack),
    );
    ret
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn raw_clone3(_: &mut CloneArgs, _: &Plan) -> i64 {
    -(libc::ENOSYS as i64)
}

/// The child, between the clone and `execve`: system calls only (no allocation, no lock),
/// and its errno for the parent if it cannot run the program.
extern "C" fn child(plan: *const Plan) -> ! {
    // SAFETY: the parent keeps the plan alive and waits (CLONE_VFORK) until this exits or
    // execs; the calls below are plain system calls.
    unsafe {
        let plan = &*plan;
        let fail = |plan: &Plan| -> ! {
            plan.error
                .store(*libc::__errno_location(), Ordering::Release);
            libc::_exit(127)
        };
        // A source among 0 to 3 that is not already in its place is moved above them
        // first, or an earlier `dup2` could overwrite it (the copies close at `exec`).
        let mut sources = plan.sources;
        for (to, from) in sources.iter_mut().enumerate() {
            if (0..4).contains(from) && *from != to as RawFd {
                *from = libc::fcntl(*from, libc::F_DUPFD_CLOEXEC, 4);
                if *from < 0 {
                    fail(plan);
                }
            }
        }
        for (to, from) in sources.iter().enumerate() {
            let to = to as RawFd;
            // `dup2` onto itself leaves close-on-exec set: clear it by hand.
            let r = if *from == to {
                libc::fcntl(to, libc::F_SETFD, 0)
            } else {
                libc::dup2(*from, to)
            };
            if r < 0 {
                fail(plan);
            }
        }
        if libc::setpgid(0, 0) < 0 {
            fail(plan);
        }
        if let Some(d) = plan.cwd {
            if libc::chdir(d) < 0 {
                fail(plan);
            }
        }
        // What the daemon ignores (SIGPIPE, as every Rust program; whatever it inherited)
        // stays ignored through `exec`: its processes start with every signal's default.
        // By the system call itself, which takes glibc's own signals too.
        let default = KernelSigaction::default();
        for sig in plan.ignored {
            libc::syscall(
                libc::SYS_rt_sigaction,
                *sig,
                &default as *const KernelSigaction,
                std::ptr::null_mut::<KernelSigaction>(),
                8usize,
            );
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        // As `execvp`: a file of no executable format runs as a shell script, and the
        // first error other than "not there" is the one reported.
        let mut first = 0;
        for p in plan.paths {
            libc::execve(*p, plan.argv, plan.envp);
            if *libc::__errno_location() == libc::ENOEXEC {
                *plan.sh_argv.add(1) = *p;
                libc::execve(plan.sh, plan.sh_argv, plan.envp);
            }
            let e = *libc::__errno_location();
            match e {
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                libc::EACCES => {
                    if first == 0 {
                        first = e;
                    }
                }
                _ => {
                    first = e;
                    break;
                }
            }
        }
        if first != 0 {
            *libc::__errno_location() = first;
        }
        fail(plan)
    }
}

/// Opens a pipe whose end `ours` is this daemon's (non-blocking), the other the child's
/// (blocking, as a program expects its stdio); both close-on-exec here. `(ours, theirs)`.
pub fn pipe(ours_reads: bool) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills both slots with fresh descriptors on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just opened, owned by nothing else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let (ours, theirs) = if ours_reads { (r, w) } else { (w, r) };
    let flags = if ours_reads {
        libc::O_RDONLY
    } else {
        libc::O_WRONLY
    };
    // SAFETY: a descriptor we own.
    if unsafe { libc::fcntl(ours.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((ours, theirs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixStream;

    /// Whether this kernel clones as the daemon would; if not, the test says loudly that it
    /// skips (and fails in CI, where the kernel must).
    fn clones_here(test: &str) -> bool {
        let argv = ["true".to_string()];
        let program = Program::new(&argv, &[], "P", None).unwrap();
        let null = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let fds = Descriptors {
            stdin: null.as_raw_fd(),
            stdout: null.as_raw_fd(),
            stderr: null.as_raw_fd(),
            barrier: null.as_raw_fd(),
        };
        match Spawner::new(true).clone_exec(&program, &fds) {
            Err(CloneError::Unsupported(e)) => {
                let why = format!("this kernel refuses clone3 with CLONE_CLEAR_SIGHAND: {e}");
                assert!(
                    std::env::var_os("CI").is_none(),
                    "{test} may not skip in CI: {why}"
                );
                eprintln!("\n!!!! SKIPPED {test}: {why} !!!!\n");
                false
            }
            Err(CloneError::Failed(e)) => panic!("true did not start: {e}"),
            Ok((pid, _)) => {
                // SAFETY: our own child.
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
                true
            }
        }
    }

    /// This thread's signal mask.
    fn mask() -> Vec<bool> {
        // SAFETY: reads this thread's mask into a zeroed set.
        unsafe {
            let mut m: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut m);
            (1..65).map(|s| libc::sigismember(&m, s) == 1).collect()
        }
    }

    /// This thread's children (the clone makes them this thread's, not the process's).
    fn children() -> String {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        std::fs::read_to_string(format!("/proc/self/task/{tid}/children")).unwrap()
    }

    /// Clones `argv` with fresh pipes and socket as its 0 to 3 (input written to its stdin
    /// first); its wait status, stdout, stderr and what it wrote on descriptor 3.
    fn run(
        argv: &[&str],
        env: &[(&str, &str)],
        cwd: Option<&str>,
        input: &str,
    ) -> io::Result<(i32, String, String, String)> {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut program = Program::new(&argv, &env, "DVMLAB_PROC", cwd)?;
        program.set("7");
        let mut spawner = Spawner::new(true);
        let (in_ours, in_theirs) = pipe(false).unwrap();
        let (out_ours, out_theirs) = pipe(true).unwrap();
        let (err_ours, err_theirs) = pipe(true).unwrap();
        let (sock_ours, sock_theirs) = UnixStream::pair().unwrap();
        let fds = Descriptors {
            stdin: in_theirs.as_raw_fd(),
            stdout: out_theirs.as_raw_fd(),
            stderr: err_theirs.as_raw_fd(),
            barrier: sock_theirs.as_raw_fd(),
        };
        let before = mask();
        let started = spawner.clone_exec(&program, &fds);
        assert_eq!(mask(), before, "the signal mask is this thread's again");
        let (pid, pidfd) = match started {
            Ok(s) => s,
            Err(CloneError::Failed(e)) => return Err(e),
            Err(CloneError::Unsupported(e)) => panic!("clone refused: {e}"),
        };
        drop((in_theirs, out_theirs, err_theirs, sock_theirs));
        let mut stdin = std::fs::File::from(in_ours);
        let _ = stdin.write_all(input.as_bytes());
        drop(stdin);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        let status = rt
            .block_on(async { Cloned::new(pid, pidfd).unwrap().wait().await })
            .unwrap();
        let read_all = |fd: OwnedFd| {
            // SAFETY: our own descriptor; blocking reads from here on (the writer is gone).
            unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, 0) };
            let mut s = String::new();
            std::fs::File::from(fd).read_to_string(&mut s).unwrap();
            s
        };
        let mut sock = String::new();
        let mut sock_ours = sock_ours;
        sock_ours.read_to_string(&mut sock).unwrap();
        Ok((status, read_all(out_ours), read_all(err_ours), sock))
    }

    /// A scratch directory of this test's own, removed when dropped.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let d =
                std::env::temp_dir().join(format!("dvmlab-spawn-{}-{name}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }

        /// Writes file `name` with `text` and permission bits `mode`; its path.
        fn file(&self, name: &str, text: &str, mode: u32) -> String {
            let p = self.0.join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p.to_string_lossy().into_owned()
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_cloned_process_has_its_descriptors_environment_directory_and_group_and_no_signal_blocked_or_ignored(
    ) {
        if !clones_here("a cloned process's start") {
            return;
        }
        let script = r#"read line; echo "in=$line proc=$DVMLAB_PROC x=$X"; pwd; echo err >&2; echo bar >&3
            pg=$(cut -d' ' -f5 /proc/$$/stat); [ "$pg" = "$$" ] && echo leader
            grep -E '^Sig(Blk|Ign)' /proc/self/status"#;
        let (status, out, err, sock) = run(
            &["sh", "-c", script],
            &[("X", "y"), ("DVMLAB_PROC", "not this")],
            Some("/tmp"),
            "hello\n",
        )
        .unwrap();
        assert_eq!(status, 0, "{out}{err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[..3],
            ["in=hello proc=7 x=y", "/tmp", "leader"],
            "{out}"
        );
        assert_eq!(err, "err\n");
        assert_eq!(sock, "bar\n");
        for l in &lines[3..] {
            assert!(l.ends_with("0000000000000000"), "{out}");
        }
        assert_eq!(lines.len(), 5, "{out}");
    }

    #[test]
    fn a_cloned_process_exit_status_and_death_by_signal_come_back_as_wait_statuses() {
        if !clones_here("a cloned process's status") {
            return;
        }
        let status = |script: &str| run(&["sh", "-c", script], &[], None, "").unwrap().0;
        assert_eq!(status("exit 3"), 3 << 8);
        assert_eq!(status("kill -TERM $$"), libc::SIGTERM);
    }

    #[test]
    fn a_program_that_cannot_be_run_is_an_error_saying_why_and_leaves_no_child() {
        if !clones_here("a program that cannot run") {
            return;
        }
        let scratch = Scratch::new("denied");
        let plain = scratch.file("true", "#!/bin/sh\n", 0o644);
        let dir = scratch.0.to_string_lossy().into_owned();
        let err = |argv: &[&str], env: &[(&str, &str)], cwd: Option<&str>| {
            let before = children();
            let e = match run(argv, env, cwd, "") {
                Err(e) => e,
                Ok(r) => panic!("{argv:?} ran: {r:?}"),
            };
            assert_eq!(children(), before, "{argv:?} left a child");
            e.kind()
        };
        use io::ErrorKind::{NotFound, PermissionDenied};
        assert_eq!(err(&["/nonexistent/dvmlab"], &[], None), NotFound);
        assert_eq!(err(&["dvmlab-no-such-program"], &[], None), NotFound);
        assert_eq!(err(&[""], &[], None), NotFound);
        assert_eq!(err(&["true"], &[], Some("/nonexistent")), NotFound);
        // Found but not executable: as execvp, that is what is said, not "not found"...
        assert_eq!(err(&[&plain], &[], None), PermissionDenied);
        assert_eq!(err(&["true"], &[("PATH", &dir)], None), PermissionDenied);
        // ...unless a later directory of the path has one that runs.
        let path = format!("{dir}:/bin:/usr/bin");
        let (status, ..) = run(&["true"], &[("PATH", &path)], None, "").unwrap();
        assert_eq!(status, 0);
        let e = Program::new(&["a\0b".to_string()], &[], "P", None)
            .err()
            .unwrap();
        assert!(e.to_string().contains("NUL"), "{e}");
    }

    #[test]
    fn a_file_of_no_executable_format_runs_as_a_shell_script_with_its_arguments() {
        if !clones_here("a script without #!") {
            return;
        }
        let scratch = Scratch::new("script");
        let script = scratch.file("job", "echo \"script $0 $1 $2\"\n", 0o755);
        let (status, out, err, _) = run(&[&script, "a", "b"], &[], None, "").unwrap();
        assert_eq!(status, 0, "{err}");
        assert_eq!(out, format!("script {script} a b\n"));
    }

    #[test]
    fn the_program_is_looked_for_as_execvp_would_in_the_jobs_path() {
        let got = |prog: &str, path: Option<&str>| -> Vec<String> {
            search(prog.as_bytes(), path.map(OsStr::new))
                .into_iter()
                .map(|p| String::from_utf8(p).unwrap())
                .collect()
        };
        assert_eq!(got("./x", Some("/a")), ["./x"]);
        assert_eq!(got("/bin/x", None), ["/bin/x"]);
        assert_eq!(got("x", Some("/a::/b")), ["/a/x", "./x", "/b/x"]);
        assert_eq!(got("x", None), ["/bin/x", "/usr/bin/x"]);
        let env = [("PATH".to_string(), "/nonexistent".to_string())];
        let p = Program::new(&["true".to_string()], &env, "P", None).unwrap();
        assert_eq!(p.paths, [CString::new("/nonexistent/true").unwrap()]);
    }

    #[test]
    fn the_environment_is_the_daemons_changed_by_the_jobs_each_name_once_in_order() {
        let env = [
            ("PATH".to_string(), "/x".to_string()),
            ("ZZ_DVMLAB".to_string(), "1".to_string()),
            ("ZZ_DVMLAB".to_string(), "2".to_string()),
        ];
        let mut p = Program::new(&["true".to_string()], &env, "P_DVMLAB", None).unwrap();
        p.set("5");
        let vars: Vec<String> = p
            .env
            .iter()
            .map(|c| c.as_c_str().to_string_lossy().into_owned())
            .collect();
        let names: Vec<&str> = vars.iter().map(|v| v.split('=').next().unwrap()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(names, sorted, "sorted by name, each once");
        for v in ["PATH=/x", "ZZ_DVMLAB=2", "P_DVMLAB=5"] {
            assert!(vars.iter().any(|x| x == v), "{v} in {vars:?}");
        }
        for (k, v) in std::env::vars() {
            if k != "PATH" {
                assert!(vars.contains(&format!("{k}={v}")), "the daemon's {k} kept");
            }
        }
        assert_eq!(
            p.paths,
            [CString::new("/x/true").unwrap()],
            "the job's PATH searched"
        );
        let p = Program::new(&["true".to_string()], &[], "P_DVMLAB", None).unwrap();
        let want: Vec<CString> = search(b"true", std::env::var_os("PATH").as_deref())
            .into_iter()
            .map(|p| CString::new(p).unwrap())
            .collect();
        assert_eq!(p.paths, want, "the daemon's PATH searched");
    }

    #[test]
    fn a_cloned_process_whose_handle_is_dropped_is_killed_and_reaped() {
        if !clones_here("a dropped handle") {
            return;
        }
        let argv = ["sleep".to_string(), "100".to_string()];
        let program = Program::new(&argv, &[], "P", None).unwrap();
        let mut spawner = Spawner::new(true);
        let null = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let fds = Descriptors {
            stdin: null.as_raw_fd(),
            stdout: null.as_raw_fd(),
            stderr: null.as_raw_fd(),
            barrier: null.as_raw_fd(),
        };
        let Ok((pid, pidfd)) = spawner.clone_exec(&program, &fds) else {
            panic!("sleep did not start");
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        rt.block_on(async { drop(Cloned::new(pid, pidfd).unwrap()) });
        // Reaped at once, or at the next start.
        let t = std::time::Instant::now();
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(10),
                "pid {pid} still there"
            );
            let argv = ["true".to_string()];
            let p = Program::new(&argv, &[], "P", None).unwrap();
            if let Ok((pid, pidfd)) = spawner.clone_exec(&p, &fds) {
                rt.block_on(async { Cloned::new(pid, pidfd).unwrap().wait().await })
                    .unwrap();
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
