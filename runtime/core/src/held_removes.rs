//! The controller's hold on a job's `remove` (RFC 33 `state-update`, type `remove`).
//!
//! When a job's final release reaches the controller, the job is over everywhere and what
//! is left is to purge it from every daemon's state: a `remove` down every link it went.
//! Sent at once, it wakes every daemon of the job one more time, just to forget it, while
//! the next job (on a busy DVM, submitted right after) is starting on the same daemons.
//! Held for a moment, it goes out in the same write as whatever goes down that link next
//! (the next job's data and `add`), and a daemon reads both with one wakeup.
//!
//! A held `remove` is only late, never reordered: everything sent on its link later goes
//! after it ([`HeldRemoves::before_sends`]), as if the link were slower. The controller
//! itself forgets the job at once, so nothing it decides (events, shrinks, answers to a
//! hello) sees the job as running.

use std::time::Duration;

use dvmlab_proto::exec::{ExecDown, UpdateType};
use dvmlab_proto::wire::{DaemonMsg, Frame};

use crate::daemon_core::{Output, Timer};
use crate::overlay::{Io, LinkId};

/// Most `remove` frames held at once (one per child link and job: a job on every daemon
/// of a radix-64 tree takes 64); one more sends them all. A controller ending jobs faster
/// than this within one hold gains little from holding, and each frame is a few hundred
/// bytes.
pub const MAX_HELD_REMOVES: usize = 1024;

/// The `remove` frames held back, in the order they were to be sent.
#[derive(Debug, Default)]
pub struct HeldRemoves {
    /// How long a frame may be held (zero: not at all).
    hold: Duration,
    frames: Vec<(LinkId, Frame)>,
    /// A [`Timer::RemoveHold`] is outstanding.
    timer: bool,
}

impl HeldRemoves {
    /// Holds removes for up to `hold` (zero: not at all).
    pub fn new(hold: Duration) -> HeldRemoves {
        HeldRemoves {
            hold,
            ..HeldRemoves::default()
        }
    }

    /// Takes the frames of `out` in order: a `remove` is held (with the timer that sends it
    /// at the latest, if none is outstanding), and whatever else goes on a link (a frame, its
    /// close) or ends the daemon goes after what is held for it.
    pub fn pass(&mut self, out: Vec<Output>) -> Vec<Output> {
        if self.hold.is_zero() || (self.frames.is_empty() && !out.iter().any(is_remove)) {
            return out;
        }
        let mut with = Vec::with_capacity(out.len() + self.frames.len() + 1);
        let mut set_timer = false;
        for o in out {
            match o {
                Output::Net(Io::Send { link, frame }) if is_remove_frame(&frame) => {
                    if self.frames.len() >= MAX_HELD_REMOVES {
                        self.send(|_| true, &mut with);
                    }
                    self.frames.push((link, frame));
                    set_timer |= !self.timer;
                    self.timer = true;
                }
                Output::Net(Io::Send { link, .. } | Io::Close { link }) => {
                    self.send(|l| l == link, &mut with);
                    with.push(o);
                }
                Output::Net(Io::Exit) => {
                    self.send(|_| true, &mut with);
                    with.push(o);
                }
                o => with.push(o),
            }
        }
        if set_timer {
            with.push(Output::SetTimer {
                timer: Timer::RemoveHold,
                delay: self.hold,
            });
        }
        with
    }

    /// The hold ran out: every frame held, to be sent now.
    pub fn due(&mut self) -> Vec<Output> {
        self.timer = false;
        let mut out = Vec::with_capacity(self.frames.len());
        self.send(|_| true, &mut out);
        out
    }

    /// Appends the frames held for the links `which` picks to `out`, in order.
    fn send(&mut self, which: impl Fn(LinkId) -> bool, out: &mut Vec<Output>) {
        // Most sends (a tool's, a heartbeat) are on links with nothing held.
        if !self.frames.iter().any(|(link, _)| which(*link)) {
            return;
        }
        let (sent, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.frames)
            .into_iter()
            .partition(|(link, _)| which(*link));
        self.frames = kept;
        out.extend(
            sent.into_iter()
                .map(|(link, frame)| Output::Net(Io::Send { link, frame })),
        );
    }
}

fn is_remove(o: &Output) -> bool {
    matches!(o, Output::Net(Io::Send { frame, .. }) if is_remove_frame(frame))
}

/// A `state-update` of removes only (not a hello's answer, which is never held).
fn is_remove_frame(frame: &Frame) -> bool {
    matches!(frame, Frame::Daemon(DaemonMsg::ExecDown { msg: ExecDown::StateUpdate { data, answer: false, .. } })
        if !data.jobs.is_empty() && data.jobs.iter().all(|t| t.2 == UpdateType::Remove))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dvmlab_proto::exec::{JobTuple, Jobs};
    use dvmlab_proto::idset::IdSet;

    const HOLD: Duration = Duration::from_millis(50);

    fn update(id: u64, kind: UpdateType, answer: bool) -> Frame {
        let idset = IdSet::range(1, 4);
        Frame::Daemon(DaemonMsg::ExecDown {
            msg: ExecDown::StateUpdate {
                idset: idset.clone(),
                data: Jobs {
                    jobs: vec![JobTuple(id, 0, kind, idset)],
                },
                answer,
            },
        })
    }

    fn remove(id: u64) -> Frame {
        update(id, UpdateType::Remove, false)
    }

    fn send(link: LinkId, frame: Frame) -> Output {
        Output::Net(Io::Send { link, frame })
    }

    fn other() -> Frame {
        Frame::Daemon(DaemonMsg::Heartbeat)
    }

    fn timer() -> Output {
        Output::SetTimer {
            timer: Timer::RemoveHold,
            delay: HOLD,
        }
    }

    #[test]
    fn a_remove_waits_for_the_next_frame_on_its_link_and_goes_just_before_it() {
        let mut h = HeldRemoves::new(HOLD);
        let out = h.pass(vec![send(1, remove(7)), send(2, remove(7))]);
        assert_eq!(out, vec![timer()], "both held, one timer");
        let out = h.pass(vec![send(1, update(8, UpdateType::Add, false))]);
        assert_eq!(
            out,
            vec![
                send(1, remove(7)),
                send(1, update(8, UpdateType::Add, false))
            ]
        );
        assert_eq!(
            h.due(),
            vec![send(2, remove(7))],
            "the other link's at the hold's end"
        );
        assert_eq!(h.due(), vec![], "sent once");
    }

    #[test]
    fn what_came_before_a_remove_in_the_same_output_stays_before_it() {
        let mut h = HeldRemoves::new(HOLD);
        let out = h.pass(vec![send(1, other()), send(1, remove(7)), send(1, other())]);
        assert_eq!(
            out,
            vec![
                send(1, other()),
                send(1, remove(7)),
                send(1, other()),
                timer()
            ]
        );
    }

    #[test]
    fn one_timer_is_outstanding_at_a_time_and_the_next_hold_sets_a_new_one() {
        let mut h = HeldRemoves::new(HOLD);
        assert_eq!(h.pass(vec![send(1, remove(1))]), vec![timer()]);
        assert_eq!(h.pass(vec![send(1, remove(2))]), vec![]);
        assert_eq!(h.due(), vec![send(1, remove(1)), send(1, remove(2))]);
        assert_eq!(h.pass(vec![send(1, remove(3))]), vec![timer()]);
    }

    #[test]
    fn a_close_or_the_daemons_exit_sends_what_is_held_first() {
        let mut h = HeldRemoves::new(HOLD);
        h.pass(vec![send(1, remove(7)), send(2, remove(7))]);
        let close = Output::Net(Io::Close { link: 1 });
        assert_eq!(h.pass(vec![close.clone()]), vec![send(1, remove(7)), close]);
        let exit = Output::Net(Io::Exit);
        assert_eq!(h.pass(vec![exit.clone()]), vec![send(2, remove(7)), exit]);
    }

    #[test]
    fn only_removes_are_held_and_nothing_without_a_hold() {
        let mut h = HeldRemoves::new(HOLD);
        for f in [
            update(7, UpdateType::Add, false),
            update(7, UpdateType::Check, false),
            update(7, UpdateType::Remove, true),
            other(),
        ] {
            assert_eq!(h.pass(vec![send(1, f.clone())]), vec![send(1, f)]);
        }
        let mut off = HeldRemoves::new(Duration::ZERO);
        assert_eq!(off.pass(vec![send(1, remove(7))]), vec![send(1, remove(7))]);
    }

    #[test]
    fn at_most_max_held_removes_are_held() {
        let mut h = HeldRemoves::new(HOLD);
        let all: Vec<Output> = (0..=MAX_HELD_REMOVES as u64)
            .map(|id| send(1, remove(id)))
            .collect();
        let out = h.pass(all.clone());
        assert_eq!(
            out.len(),
            MAX_HELD_REMOVES + 1,
            "the first ones and the timer"
        );
        assert_eq!(&out[..MAX_HELD_REMOVES], &all[..MAX_HELD_REMOVES]);
        assert_eq!(h.due(), all[MAX_HELD_REMOVES..].to_vec());
    }
}
