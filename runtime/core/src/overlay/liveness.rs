//! Liveness: heartbeats on every daemon link; silence is the only sign of a frozen,
//! powered-off or cut-off peer.

use super::*;

impl Node {
    /// Sends a heartbeat on every daemon link and drops links that went silent: a frozen,
    /// powered-off or cut-off peer sends no FIN, so silence is the only sign.
    pub(super) fn heartbeat(&mut self, now: Duration) {
        let limit = self.cfg.heartbeat * MISSED_HEARTBEATS;
        let silent =
            |heard: Option<&Duration>| heard.is_none_or(|t| now.saturating_sub(*t) > limit);
        if let Some((up, rank)) = self.up {
            if silent(self.last_heard.get(&up)) {
                self.note(Note::LinkDead { rank });
                self.io(Io::Close { link: up });
                self.drop_uplink(now);
            } else {
                self.send(up, DaemonMsg::Heartbeat);
            }
        }
        let links: Vec<(LinkId, Rank)> = self.children.iter().map(|(l, c)| (*l, c.rank)).collect();
        for (link, rank) in links {
            if silent(self.last_heard.get(&link)) {
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
}
