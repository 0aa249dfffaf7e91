//! Links: the upward connection (connect, heal, reconnect) and the daemons that join below
//! (hello, replacing a half-open link, refusing a stranger, dropping a link).

use super::*;

impl Node {
    pub(super) fn self_member(&self, parent: Rank) -> Member {
        Member {
            rank: self.me,
            host: self.cfg.identity.host.clone(),
            parent,
            epoch: self.epoch,
            via: self.epoch,
            uri: self.cfg.uri.clone(),
        }
    }

    pub(super) fn on_uplink_up(&mut self, now: Duration, link: LinkId, rank: Rank, version: u32) {
        let Some(u) = self.uplink.as_mut() else {
            return;
        };
        u.connected();
        self.up = Some((link, rank));
        self.up_version = version;
        // The time of this connection (the incarnation is the start time, `now` the time since),
        // so epochs of different daemons compare as the times they (re)connected.
        let at = self.cfg.incarnation.saturating_add(now.as_micros() as u64);
        self.epoch = (self.epoch + 1).max(at);
        self.quiet.insert(link, 0);
        let tree_parent = self.cfg.tree.parent(self.me).unwrap_or(0);
        self.note(Note::Joined {
            parent: rank,
            tree_parent,
        });
        let mut members = vec![self.self_member(rank)];
        let mut below: Vec<&Member> = self.below.values().collect();
        below.sort_by_key(|m| m.rank);
        let epoch = self.epoch;
        members.extend(below.into_iter().cloned().map(|mut m| {
            m.via = m.via.max(epoch);
            m
        }));
        self.send(link, DaemonMsg::Report { members });
        self.confirm_again(link);
    }

    pub(super) fn on_uplink_failed(&mut self, now: Duration, rank: Rank, reason: String) {
        let Some(u) = self.uplink.as_mut() else {
            return;
        };
        if u.target() != rank {
            return;
        }
        let a = u.failed(now);
        if let Some(from) = a.healed_from {
            self.note(Note::Healing { from, to: a.rank });
        } else {
            self.note(Note::ConnectFailed {
                rank,
                reason,
                retry_in: a.delay,
            });
        }
        self.io(Io::Connect {
            rank: a.rank,
            delay: a.delay,
        });
    }

    pub(super) fn refuse(&mut self, link: LinkId, reason: String) {
        self.note(Note::Refused {
            link,
            reason: reason.clone(),
        });
        self.io(Io::Send {
            link,
            frame: Frame::Refuse { reason },
        });
        self.io(Io::Close { link });
    }

    pub(super) fn on_hello(&mut self, link: LinkId, peer: Peer, version: u32, stopping: bool) {
        let welcome = Frame::Welcome {
            nspace: self.cfg.identity.nspace.clone(),
            rank: self.me,
            version,
            caps: dvmlab_proto::wire::CAPS,
        };
        match peer {
            Peer::Tool => {
                self.tools.insert(link);
                self.io(Io::Send {
                    link,
                    frame: welcome,
                });
                self.emit(Output::EventClient { link, proc: None });
            }
            Peer::Process { nspace, rank } => {
                self.processes.insert(link);
                self.io(Io::Send {
                    link,
                    frame: welcome,
                });
                self.emit(Output::EventClient {
                    link,
                    proc: Some(dvmlab_proto::event::Proc { nspace, rank }),
                });
            }
            Peer::Daemon { rank, host } => {
                if rank != self.me && self.cfg.tree.is_ancestor_or_self(rank, self.me) {
                    return self.on_poke(link, rank, stopping);
                }
                let size = self.roster.len();
                if rank == 0 || !self.roster.contains(rank) || rank == self.me {
                    return self.refuse(
                        link,
                        format!("rank {rank} ({host}) is not a daemon rank of this DVM (1..{size}) or is this daemon's own"),
                    );
                }
                if self.roster.state(rank) == Some(State::Departed) {
                    // It left the DVM (or its grow was undone): it is told to leave again.
                    self.io(Io::Send {
                        link,
                        frame: welcome,
                    });
                    self.send(
                        link,
                        DaemonMsg::Routed {
                            src: self.me,
                            dst: rank,
                            ttl: ROUTE_TTL,
                            body: Body::Depart,
                        },
                    );
                    self.note(Note::Refused {
                        link,
                        reason: format!("rank {rank} ({host}) departed the DVM; told to leave"),
                    });
                    return self.io(Io::Close { link });
                }
                if self.confirming.is_some() {
                    // Its confirmation could no longer go up: it is to reach the controller.
                    return self.refuse(link, format!("rank {} has stopped", self.me));
                }
                if !self.cfg.tree.is_ancestor_or_self(self.me, rank) {
                    return self.refuse(
                        link,
                        format!("rank {} is not an ancestor of rank {rank}", self.me),
                    );
                }
                // A child that reconnects while its old link still looks open (it died
                // without a FIN, or the network dropped it): the new link wins.
                let stale: Vec<LinkId> = self
                    .children
                    .iter()
                    .filter(|(_, c)| c.rank == rank)
                    .map(|(l, _)| *l)
                    .collect();
                for old in stale {
                    self.note(Note::Replaced { rank });
                    self.io(Io::Close { link: old });
                    self.drop_child(old);
                }
                self.children.insert(
                    link,
                    Child {
                        rank,
                        version,
                        members: BTreeSet::new(),
                    },
                );
                self.quiet.insert(link, 0);
                self.io(Io::Send {
                    link,
                    frame: welcome,
                });
                // Version 1 had no wireup message; its daemons know the membership from the
                // conf alone.
                if version >= 2 {
                    let wireup = self.roster.wireup();
                    self.send(link, DaemonMsg::Wireup { wireup });
                }
                // Only a rank never heard from is joining; a lost one stays lost, and a wired one
                // (re-homing while its old route stands) stays wired, until its report.
                if self.is_controller() && self.roster.state(rank) == Some(State::Waiting) {
                    self.roster.set(rank, State::Joining);
                }
                // A daemon that reaches us while we leave is sent on at once.
                if self.departing {
                    self.send(link, DaemonMsg::Rehome);
                }
                // A daemon that reaches us while we stop is told to stop too, and awaited
                // unless it was told directly.
                if let Some(st) = self.stopping.as_mut() {
                    if !st.told.contains(&rank) {
                        st.pending.insert(rank);
                    }
                    self.send(link, DaemonMsg::Shutdown);
                }
            }
        }
    }

    /// Tells this daemon's children by the tree formula that it is up. A child started long
    /// before its parent sits in its back-off (up to `DVMRetryMaxDelay`, 5 s by default)
    /// and would reach the parent only at its next attempt; poked, it tries at once.
    pub(super) fn poke_children(&mut self) {
        self.poke_children_from(0);
    }

    /// Pokes the children by the tree formula from rank `first` on: those a membership from
    /// the parent just named (a restarted daemon knows only prte.conf's ranks when it starts,
    /// and those grown meanwhile wait on it as the others did).
    pub(super) fn poke_children_from(&mut self, first: Rank) {
        let pokes: Vec<(Rank, String)> = self
            .roster
            .iter()
            .filter(|(r, m)| {
                *r >= first
                    && self.cfg.tree.parent(*r) == Some(self.me)
                    && m.state != State::Departed
            })
            .map(|(r, _)| (r, self.roster.host(r).to_string()))
            .collect();
        for (rank, host) in pokes {
            self.io(Io::Poke {
                rank,
                host,
                stop: false,
            });
        }
    }

    /// An ancestor connected down to say it is up: declined (links go up, never down), and
    /// this daemon's connect up, if it is waiting out its back-off, is made now. The
    /// controller saying it is stopping stops this daemon (see `stop.rs`).
    fn on_poke(&mut self, link: LinkId, rank: Rank, stopping: bool) {
        let stop = stopping && rank == 0;
        let reason = if stop {
            format!("rank {} stops", self.me)
        } else {
            format!("rank {} connects up by itself", self.me)
        };
        self.io(Io::Send {
            link,
            frame: Frame::Refuse { reason },
        });
        self.io(Io::Close { link });
        if stop {
            self.note(Note::ToldToStop);
            return self.stop_unawaited();
        }
        let waiting = self.up.is_none()
            && self.stopping.is_none()
            && self.confirming.is_none()
            && !self.departing;
        if let (true, Some(u)) = (waiting, self.uplink.as_mut()) {
            // The back-off starts over: the daemons above are coming up.
            u.connected();
            self.note(Note::Poked { rank });
            self.io(Io::Hurry);
        }
    }

    /// Forgets child link `link` and the routes through it.
    pub(super) fn drop_child(&mut self, link: LinkId) {
        self.quiet.remove(&link);
        self.held.retain(|_, (l, _)| *l != link);
        let Some(child) = self.children.remove(&link) else {
            return;
        };
        if child.members.is_empty() && self.stopping.is_none() {
            self.note(Note::ProcState {
                rank: child.rank,
                state: "LOST",
            });
        }
        if self.is_controller() && self.roster.state(child.rank) == Some(State::Joining) {
            self.roster.set(child.rank, State::Waiting);
        }
        self.unawait([child.rank]);
        let gone: Vec<Rank> = child
            .members
            .into_iter()
            .filter(|r| self.routes.get(r).is_some_and(|(l, _)| *l == link))
            .collect();
        self.forget(link, gone);
    }

    /// Forgets the upward link and starts reconnecting.
    pub(super) fn drop_uplink(&mut self, now: Duration) {
        let Some((link, rank)) = self.up.take() else {
            return;
        };
        self.quiet.remove(&link);
        self.note(Note::UplinkLost { rank });
        if self.stopping.is_some() || self.confirming.is_some() {
            return self.reconnect_to_controller(now);
        }
        self.path_lost(&format!(
            "rank {} lost its connection to rank {rank}",
            self.me
        ));
        if let Some(u) = self.uplink.as_mut() {
            let a = u.lost(now);
            self.io(Io::Connect {
                rank: a.rank,
                delay: a.delay,
            });
        }
    }
}
