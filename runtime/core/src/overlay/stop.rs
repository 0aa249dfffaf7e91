//! Stop: the DVM stops top-down, and each daemon exits once its subtree confirmed.
//!
//! A daemon's last word up is `Stopped` with the ranks it vouches for. Its parent may have
//! given up on the link just before (the link looked dead to it: a partition that healed
//! as the stop came), and a confirmation on a link its parent dropped is lost. So from
//! protocol version 4 the parent acknowledges a counted confirmation, and a daemon exits
//! only on that acknowledgment: if its link up breaks first, it connects to the controller,
//! the one daemon that awaits every rank to the end, and confirms there.
//!
//! A member the stop cannot reach through the tree (cut off just before it, its parent
//! having given up on it) would never hear of it: it heals up to a controller that is gone
//! and retries forever. So the controller pokes each member it has no route to, as the stop
//! begins and again for those unconfirmed at its end, with a hello that says it is stopping.
//! A daemon told so stops its subtree and exits without awaiting an acknowledgment: nobody
//! above awaits it.

use super::*;

impl Node {
    pub(super) fn begin_stop(&mut self, tool: Option<LinkId>, unawaited: bool) {
        if self.stopping.is_some() || self.confirming.is_some() {
            if let Some(t) = tool {
                self.reply(
                    t,
                    ToolReply::Error {
                        message: "the DVM is already stopping".into(),
                    },
                );
            }
            return;
        }
        let mut pending = BTreeSet::new();
        for c in self.children.values() {
            pending.insert(c.rank);
            pending.extend(c.members.iter().copied());
        }
        let told: BTreeSet<Rank> = if self.is_controller() {
            self.roster
                .iter()
                .filter(|(r, m)| {
                    *r != self.me && m.state != State::Departed && !pending.contains(r)
                })
                .map(|(r, _)| r)
                .collect()
        } else {
            BTreeSet::new()
        };
        self.tell_stop(told.iter().copied());
        self.stopping = Some(Stopping {
            tool,
            pending,
            confirmed: BTreeSet::new(),
            unawaited,
            told,
        });
        self.note(Note::JobState {
            state: "TERMINATING",
        });
        let links: Vec<LinkId> = self.children.keys().copied().collect();
        for l in links {
            self.send(l, DaemonMsg::Shutdown);
        }
        let delay = if self.is_controller() {
            CONTROLLER_STOP_GRACE
        } else {
            STOP_GRACE
        };
        self.emit(Output::SetTimer {
            timer: Timer::StopGrace,
            delay,
        });
        self.maybe_finish_stop();
    }

    /// `ranks` left this daemon's subtree during a stop: a daemon other than the controller
    /// stops awaiting them. Every ancestor up to the controller awaits the same ranks, and a
    /// daemon cut off from its parent heals up to one of them and confirms there; waiting
    /// here only made this daemon's own confirmation late, and with it its live subtree's.
    /// The controller keeps awaiting them: it is where a healed daemon ends up at the last.
    pub(super) fn unawait(&mut self, ranks: impl IntoIterator<Item = Rank>) {
        if self.is_controller() {
            return;
        }
        if let Some(st) = self.stopping.as_mut() {
            for r in ranks {
                st.pending.remove(&r);
            }
        }
    }

    pub(super) fn maybe_finish_stop(&mut self) {
        if self
            .stopping
            .as_ref()
            .is_some_and(|st| st.pending.is_empty())
        {
            self.finish_stop(Vec::new());
        }
    }

    pub(super) fn finish_stop(&mut self, unconfirmed: Vec<Rank>) {
        let Some(st) = self.stopping.take() else {
            return;
        };
        if !unconfirmed.is_empty() {
            self.note(Note::StopIncomplete {
                ranks: unconfirmed.clone(),
            });
            if self.is_controller() {
                self.tell_stop(unconfirmed.iter().copied());
            }
        }
        self.note(Note::ProcState {
            rank: self.me,
            state: "TERMINATED",
        });
        self.note(Note::JobState {
            state: "TERMINATED",
        });
        let mut ranks: Vec<Rank> = st.confirmed.into_iter().collect();
        ranks.push(self.me);
        if let Some((up, _)) = self.up {
            self.send(
                up,
                DaemonMsg::Stopped {
                    ranks: ranks.clone(),
                },
            );
        }
        // With no link up, a daemon other than the controller is already reconnecting (see
        // `drop_uplink`) and confirms once it is in.
        let await_ack = !st.unawaited
            && match self.up {
                Some(_) => self.up_version >= 4,
                None => self.uplink.is_some(),
            };
        let tools: Vec<LinkId> = st
            .tool
            .into_iter()
            .chain(std::mem::take(&mut self.stop_tools))
            .collect();
        for t in tools {
            self.reply(
                t,
                ToolReply::Stopped {
                    unconfirmed: unconfirmed.clone(),
                },
            );
        }
        if !await_ack {
            return self.io(Io::Exit);
        }
        self.confirming = Some(ranks);
        self.emit(Output::SetTimer {
            timer: Timer::StopAck,
            delay: STOP_GRACE,
        });
    }

    /// A child's confirmation: counted, and acknowledged, while this daemon is stopping.
    /// After its own confirmation went up it cannot vouch for more, so it stays silent, and
    /// the child confirms to the controller once this daemon is gone.
    pub(super) fn on_stopped(&mut self, link: LinkId, ranks: Vec<Rank>) {
        let Some(st) = self.stopping.as_mut() else {
            return;
        };
        for r in ranks {
            st.pending.remove(&r);
            st.confirmed.insert(r);
        }
        if self.children.get(&link).is_some_and(|c| c.version >= 4) {
            self.send(link, DaemonMsg::StopAcked);
        }
        self.maybe_finish_stop();
    }

    pub(super) fn on_stop_acked(&mut self) {
        if self.confirming.take().is_some() {
            self.io(Io::Exit);
        }
    }

    /// Connected again while stopping or stopped: whatever this daemon reached is stopping
    /// too (the stop starts at the controller), and counts this daemon's confirmation.
    pub(super) fn confirm_again(&mut self, link: LinkId) {
        if let Some(ranks) = &self.confirming {
            let ranks = ranks.clone();
            self.send(link, DaemonMsg::Stopped { ranks });
        }
    }

    /// Pokes `ranks` with the stop (the controller's last word to members it cannot reach);
    /// the shell makes these pokes before the controller exits.
    fn tell_stop(&mut self, ranks: impl IntoIterator<Item = Rank>) {
        for rank in ranks {
            let host = self.roster.host(rank).to_string();
            self.io(Io::Poke {
                rank,
                host,
                stop: true,
            });
        }
    }

    /// The controller poked this daemon to say the DVM stops: the stop did not reach it
    /// through the tree, and no daemon above awaits its confirmation. It stops its subtree
    /// as any stopping daemon does and exits without an acknowledgment; one that already
    /// confirmed and awaits it exits now.
    pub(super) fn stop_unawaited(&mut self) {
        if self.confirming.take().is_some() {
            return self.io(Io::Exit);
        }
        match self.stopping.as_mut() {
            Some(st) => st.unawaited = true,
            None => self.begin_stop(None, true),
        }
    }

    pub(super) fn stop_unacknowledged(&mut self) {
        if let Some(ranks) = self.confirming.take() {
            self.note(Note::StopUnacknowledged { ranks });
            self.io(Io::Exit);
        }
    }

    /// The link up broke during a stop: connect straight to the controller. Every daemon
    /// between is stopping and may be gone by the time this one is through.
    pub(super) fn reconnect_to_controller(&mut self, now: Duration) {
        let Some(u) = self.uplink.as_mut() else {
            return;
        };
        for a in self.cfg.tree.ancestors(self.me) {
            u.avoid(a);
        }
        let a = u.lost(now);
        self.io(Io::Connect {
            rank: a.rank,
            delay: a.delay,
        });
    }
}
