//! Liveness: heartbeats on every daemon link; silence is the only sign of a frozen,
//! powered-off or cut-off peer.

use super::*;

impl Node {
    /// Sends a heartbeat on every daemon link and drops links that went silent: a frozen,
    /// powered-off or cut-off peer sends no FIN, so silence is the only sign.
    ///
    /// Silence is counted in this daemon's own beats, not measured as time since the last
    /// frame. A daemon starved of CPU (2048 daemons on 2 cores) runs its overdue timer when
    /// it gets the CPU back, possibly before the frames its peers sent meanwhile; measured in
    /// time, that one late beat found them all silent. Counted, a stall costs one beat,
    /// and the frames waiting behind it reset the count before the next. On time, both
    /// agree: the link is dropped at the first beat more than `MISSED_HEARTBEATS` intervals
    /// after its last frame.
    pub(super) fn heartbeat(&mut self, now: Duration) {
        if let Some((up, rank)) = self.up {
            if self.beat_silent(up) {
                self.note(Note::LinkDead { rank });
                self.io(Io::Close { link: up });
                self.drop_uplink(now);
            } else {
                self.send(up, DaemonMsg::Heartbeat);
            }
        }
        let links: Vec<(LinkId, Rank)> = self.children.iter().map(|(l, c)| (*l, c.rank)).collect();
        for (link, rank) in links {
            if self.beat_silent(link) {
                self.note(Note::LinkDead { rank });
                self.io(Io::Close { link });
                self.drop_child(link);
                if self.stopping.is_some() {
                    self.maybe_finish_stop();
                }
            } else {
                self.send(link, DaemonMsg::Heartbeat);
            }
        }
        self.emit(Output::SetTimer {
            timer: Timer::Heartbeat,
            delay: self.cfg.heartbeat,
        });
    }

    /// Counts one more beat without a frame on `link`; true once that makes it dead.
    fn beat_silent(&mut self, link: LinkId) -> bool {
        let quiet = self.quiet.entry(link).or_insert(0);
        *quiet += 1;
        *quiet > MISSED_HEARTBEATS
    }
}
