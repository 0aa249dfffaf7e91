//! The daemon's timers: every timer the cores ask for, in one deadline queue that one
//! `timerfd` wakes.
//!
//! A tokio timer per request cost a task (allocated, scheduled, aborted when cancelled) and
//! a hop through the event channel, and tokio's timer wheel adds wakeups of its own: a
//! deadline earlier than the one the driver last parked for writes the runtime's eventfd
//! (a system call and a spurious return from `epoll_wait`), and a deadline more than 64 ms
//! away wakes the thread once at its wheel slot and again when it is due. A node's daemon
//! sets a start hold for every job and a heartbeat every second, so those were wakeups and
//! allocations on every node for every job. Here a deadline costs an entry in a map, and
//! the thread wakes when the earliest one is due and not otherwise.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use nix::time::{clock_gettime, ClockId as Clock};
use tokio::io::unix::AsyncFd;

/// A set timer, to cancel it by: its deadline and its place among timers of that deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct TimerId {
    deadline: Duration,
    seq: u64,
}

/// The timerfd, as tokio's `AsyncFd` takes it.
struct Alarm(TimerFd);

impl AsRawFd for Alarm {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// The timers not yet due, each with what it delivers (`T`), in deadline order (timers
/// of one deadline in the order they were set), and the timerfd armed for the earliest.
pub(crate) struct Timers<T> {
    due: BTreeMap<TimerId, T>,
    seq: u64,
    alarm: AsyncFd<Alarm>,
    /// The deadline the timerfd is armed for, if any.
    armed: Option<Duration>,
    /// The timerfd expired since the last [`Timers::take_due`]: a one-shot timerfd is then
    /// disarmed, whatever the clock read here says.
    fired: Cell<bool>,
}

/// The furthest a timer is set: a delay beyond it (none the cores ask for comes near) waits
/// this long instead, where adding it to the clock would overflow.
const FURTHEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The monotonic clock the timerfd counts on, as a duration since its epoch.
fn monotonic() -> Duration {
    clock_gettime(Clock::CLOCK_MONOTONIC)
        .map(Duration::from)
        .unwrap_or_default()
}

impl<T> Timers<T> {
    /// Needs a tokio runtime with IO enabled (the timerfd is watched by its driver).
    pub(crate) fn new() -> std::io::Result<Timers<T>> {
        let fd = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        // SAFETY: the timerfd is owned by what is registered, so it stays open while
        // registered (AsyncFd deregisters before dropping it).
        let alarm =
            unsafe { AsyncFd::register_with_interest(Alarm(fd), tokio::io::Interest::READABLE) }?;
        Ok(Timers {
            due: BTreeMap::new(),
            seq: 0,
            alarm,
            armed: None,
            fired: Cell::new(false),
        })
    }

    /// Delivers `what` from [`Timers::take_due`] once `delay` has passed.
    pub(crate) fn set(&mut self, delay: Duration, what: T) -> TimerId {
        self.set_at(monotonic() + delay.min(FURTHEST), what)
    }

    /// Delivers `what` once the monotonic clock reads `deadline`; timers of one deadline in
    /// the order they were set.
    fn set_at(&mut self, deadline: Duration, what: T) -> TimerId {
        self.seq += 1;
        let id = TimerId {
            // Never zero: a timerfd armed for zero is disarmed instead.
            deadline: deadline.max(Duration::from_nanos(1)),
            seq: self.seq,
        };
        self.due.insert(id, what);
        self.arm();
        id
    }

    /// Forgets a timer not yet delivered; nothing if it was.
    pub(crate) fn cancel(&mut self, id: TimerId) {
        if self.due.remove(&id).is_some() {
            self.arm();
        }
    }

    /// Every timer due now, in deadline order, each delivered once.
    pub(crate) fn take_due(&mut self) -> Vec<T> {
        let now = monotonic();
        let mut fired = Vec::new();
        while let Some(entry) = self.due.first_entry() {
            if entry.key().deadline > now {
                break;
            }
            fired.push(entry.remove());
        }
        // A one-shot timerfd disarms itself when it expires: nothing to unset (the next
        // timer the core sets usually follows at once, and arms it again).
        if self.fired.replace(false) {
            self.armed = None;
        }
        self.arm();
        fired
    }

    /// Resolves once the earliest timer may be due (then call [`Timers::take_due`]); never
    /// while none is set. Cancel-safe: dropped early, it loses nothing.
    pub(crate) async fn expired(&self) {
        loop {
            let mut ready = match self.alarm.readable().await {
                Ok(ready) => ready,
                // Only once the runtime shuts down.
                Err(e) => {
                    tracing::warn!("the daemon's timer cannot be watched: {e}");
                    return std::future::pending().await;
                }
            };
            let mut count = [0u8; 8];
            let read = nix::unistd::read(self.alarm.get_ref().0.as_fd(), &mut count);
            // Its next expiry is a new edge (the timer is one-shot and re-armed later).
            ready.clear_ready();
            match read {
                // Re-armed or disarmed since the edge was seen.
                Err(nix::errno::Errno::EAGAIN) => continue,
                Ok(_) => {
                    self.fired.set(true);
                    return;
                }
                // Not seen on Linux for a monotonic timerfd; `take_due` checks the deadlines
                // against the clock anyway.
                Err(e) => {
                    tracing::warn!("reading the daemon's timer: {e}");
                    return;
                }
            }
        }
    }

    /// Arms the timerfd for the earliest deadline, when that changed.
    fn arm(&mut self) {
        let earliest = self.due.keys().next().map(|id| id.deadline);
        if earliest == self.armed {
            return;
        }
        let result = match earliest {
            Some(at) => self.alarm.get_ref().0.set(
                Expiration::OneShot(TimeSpec::from_duration(at)),
                TimerSetTimeFlags::TFD_TIMER_ABSTIME,
            ),
            None => self.alarm.get_ref().0.unset(),
        };
        match result {
            Ok(()) => self.armed = earliest,
            // timerfd_settime fails only on arguments this code never makes.
            Err(e) => tracing::warn!("cannot arm the daemon's timer: {e}"),
        }
    }

    /// How many timers are set and not yet delivered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.due.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn timers_are_delivered_once_each_in_deadline_order_and_a_cancelled_one_never() {
        runtime().block_on(async {
            let mut t = Timers::new().expect("timerfd");
            t.set(Duration::from_secs(1), "late");
            let held = t.set(Duration::from_millis(20), "cancelled");
            t.set(Duration::from_millis(10), "first");
            t.set(Duration::from_millis(10), "second");
            t.cancel(held);
            t.expired().await;
            assert_eq!(t.take_due(), ["first", "second"], "only what is due");
            let mut got = Vec::new();
            while got.is_empty() {
                t.expired().await;
                got.extend(t.take_due());
            }
            assert_eq!(got, ["late"]);
            assert_eq!(t.len(), 0);
            assert!(t.take_due().is_empty());
        });
    }

    #[test]
    fn the_thread_is_not_woken_before_the_earliest_deadline_nor_after_every_timer_is_cancelled() {
        runtime().block_on(async {
            let mut t = Timers::new().expect("timerfd");
            let start = std::time::Instant::now();
            t.set(Duration::from_millis(300), "only");
            t.expired().await;
            assert!(
                start.elapsed() >= Duration::from_millis(300),
                "woken after {:?}",
                start.elapsed()
            );
            assert_eq!(t.take_due(), ["only"]);
            let id = t.set(Duration::from_millis(20), "gone");
            t.cancel(id);
            let woke = tokio::time::timeout(Duration::from_millis(200), t.expired()).await;
            assert!(woke.is_err(), "woken with no timer set");
        });
    }

    #[test]
    fn timers_of_one_deadline_come_in_the_order_they_were_set_and_a_fired_one_cannot_be_cancelled()
    {
        runtime().block_on(async {
            let mut t = Timers::new().expect("timerfd");
            let at = monotonic() + Duration::from_millis(10);
            let first = t.set_at(at, 1);
            for n in 2..=5 {
                t.set_at(at, n);
            }
            while t.len() > 0 {
                t.expired().await;
                let got = t.take_due();
                if !got.is_empty() {
                    assert_eq!(got, [1, 2, 3, 4, 5]);
                }
            }
            t.cancel(first);
            let later = t.set(Duration::from_millis(10), 6);
            assert_ne!(later, first);
            t.expired().await;
            assert_eq!(t.take_due(), [6]);
        });
    }

    #[test]
    fn a_timer_set_with_no_delay_is_due_at_once() {
        runtime().block_on(async {
            let mut t = Timers::new().expect("timerfd");
            t.set(Duration::ZERO, 7);
            t.set(Duration::MAX, 8);
            tokio::time::timeout(Duration::from_secs(5), t.expired())
                .await
                .expect("the timer wakes");
            assert_eq!(t.take_due(), [7]);
        });
    }
}
