//! A link emulator: delay, jitter, loss and duplication on one host's link.
//!
//! The kernels this runs on may lack `sch_netem`, so the emulation is done in user space:
//! the host's switch-side veth end is taken off the bridge, a second veth pair is plugged in
//! its place, and a relay thread (living in the switch namespace) moves every frame between
//! the two through a delay queue, dropping or duplicating some on the way. Frames keep their
//! virtio-net header (`PACKET_VNET_HDR`), so segmentation and checksum offloads pass through
//! untouched.

use std::collections::BinaryHeap;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::libc;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sched::{setns, CloneFlags};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What the emulated link does to each frame, in each direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Impairment {
    /// Added to every frame.
    pub delay: Duration,
    /// Each frame's delay varies uniformly by up to this much either way (frames may then
    /// overtake each other, as on a real multi-path link).
    pub jitter: Duration,
    /// Probability that a frame is dropped.
    pub loss: f64,
    /// Probability that a frame is delivered twice.
    pub duplicate: f64,
    /// Seeds the loss, duplication and jitter draws, so a run can be replayed.
    pub seed: u64,
}

impl Impairment {
    /// Only a delay.
    pub fn delay(d: Duration) -> Impairment {
        Impairment {
            delay: d,
            jitter: Duration::ZERO,
            loss: 0.0,
            duplicate: 0.0,
            seed: 0,
        }
    }
}

/// Frames seen by a relay, for verification and reports.
#[derive(Debug, Default)]
pub struct RelayStats {
    pub forwarded: AtomicU64,
    pub dropped: AtomicU64,
    pub duplicated: AtomicU64,
}

/// A running relay; stopped and joined on drop.
pub struct Relay {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub stats: Arc<RelayStats>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn packet_socket(ifname: &str) -> std::io::Result<OwnedFd> {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain system calls on values owned here; the fd is wrapped at once.
    unsafe {
        let fd = libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(proto),
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let one: libc::c_int = 1;
        for opt in [libc::PACKET_VNET_HDR, libc::PACKET_IGNORE_OUTGOING] {
            if libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                opt,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            ) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        let name = std::ffi::CString::new(ifname)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let index = libc::if_nametoindex(name.as_ptr());
        if index == 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = index as i32;
        if libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        ) < 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(fd)
    }
}

/// A frame waiting in the delay queue; the earliest `due` (then the lowest `seq`) first.
struct Pending {
    due: Instant,
    seq: u64,
    to_b: bool,
    frame: Vec<u8>,
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.seq) == (o.due, o.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.due, o.seq).cmp(&(self.due, self.seq))
    }
}

/// Starts relaying frames between interfaces `a` and `b` of namespace `ns` (a file of
/// `/var/run/netns`). Both sockets are open before this returns.
pub fn start(ns: File, a: &str, b: &str, imp: Impairment) -> std::io::Result<Relay> {
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(RelayStats::default());
    let (tx, rx) = std::sync::mpsc::channel();
    let (a, b) = (a.to_string(), b.to_string());
    let (stop2, stats2) = (stop.clone(), stats.clone());
    let thread = std::thread::Builder::new()
        .name(format!("linkem-{a}"))
        .spawn(move || {
            let socks = setns(ns.as_fd(), CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)
                .and_then(|()| Ok((packet_socket(&a)?, packet_socket(&b)?)));
            match socks {
                Ok((sa, sb)) => {
                    let _ = tx.send(Ok(()));
                    relay_loop(&sa, &sb, imp, &stop2, &stats2);
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        })?;
    let ready = rx
        .recv()
        .map_err(|_| std::io::Error::other("relay thread died during setup"))?;
    let relay = Relay {
        stop,
        thread: Some(thread),
        stats,
    };
    ready.map(|()| relay)
}

fn relay_loop(a: &OwnedFd, b: &OwnedFd, imp: Impairment, stop: &AtomicBool, st: &RelayStats) {
    let mut rng = ChaCha8Rng::seed_from_u64(imp.seed);
    let mut queue: BinaryHeap<Pending> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut buf = vec![0u8; 65536 + 64];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while queue.peek().is_some_and(|p| p.due <= now) {
            let Some(p) = queue.pop() else { break };
            let out = if p.to_b { b } else { a };
            // SAFETY: sending an owned buffer on an open socket.
            let n =
                unsafe { libc::send(out.as_raw_fd(), p.frame.as_ptr().cast(), p.frame.len(), 0) };
            if n >= 0 {
                st.forwarded.fetch_add(1, Ordering::Relaxed);
            }
        }
        let wait_ms = queue
            .peek()
            .map(|p| p.due.saturating_duration_since(Instant::now()).as_millis() as u16 + 1)
            .unwrap_or(20)
            .min(20);
        let mut fds = [
            PollFd::new(a.as_fd(), PollFlags::POLLIN),
            PollFd::new(b.as_fd(), PollFlags::POLLIN),
        ];
        if poll(&mut fds, PollTimeout::from(wait_ms)).is_err() {
            continue;
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| r.contains(PollFlags::POLLIN)))
            .collect();
        for (i, is_ready) in ready.into_iter().enumerate() {
            if !is_ready {
                continue;
            }
            let from = if i == 0 { a } else { b };
            // SAFETY: receiving into an owned buffer of the given length.
            let n = unsafe {
                libc::recv(
                    from.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                continue;
            }
            if imp.loss > 0.0 && rng.random_bool(imp.loss.min(1.0)) {
                st.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let copies = if imp.duplicate > 0.0 && rng.random_bool(imp.duplicate.min(1.0)) {
                st.duplicated.fetch_add(1, Ordering::Relaxed);
                2
            } else {
                1
            };
            for _ in 0..copies {
                let jitter = if imp.jitter.is_zero() {
                    0i64
                } else {
                    let j = imp.jitter.as_micros() as i64;
                    rng.random_range(-j..=j)
                };
                let d = (imp.delay.as_micros() as i64 + jitter).max(0) as u64;
                seq += 1;
                queue.push(Pending {
                    due: Instant::now() + Duration::from_micros(d),
                    seq,
                    to_b: i == 0,
                    frame: buf[..n as usize].to_vec(),
                });
            }
        }
    }
}
