//! Routes: what each child reports reachable through it, withdrawals, formation on the
//! controller, and messages routed hop by hop.

use super::*;

impl Node {
    pub(super) fn on_report(&mut self, link: LinkId, members: Vec<Member>) {
        let Some(child) = self.children.get(&link).map(|c| c.rank) else {
            return;
        };
        let mut accepted = Vec::new();
        let mut foreign = Vec::new();
        for m in members {
            if m.rank == 0 || m.rank == self.me {
                continue;
            }
            if !self.roster.contains(m.rank) {
                // Only the controller's membership is the DVM's: a daemon's may lag.
                if !self.is_controller() {
                    self.hold(link, child, m);
                }
                continue;
            }
            // A rank that left the DVM and comes back through a daemon that had not heard
            // yet: it gets no route, and is told again to leave.
            if self.roster.state(m.rank) == Some(State::Departed) {
                self.send(
                    link,
                    DaemonMsg::Routed {
                        src: self.me,
                        dst: m.rank,
                        ttl: ROUTE_TTL,
                        body: Body::Depart,
                    },
                );
                continue;
            }
            // A daemon speaks only for its own subtree: whoever it is connected to, the ranks
            // below it are its descendants by the tree formula.
            if !self.cfg.tree.is_ancestor_or_self(child, m.rank) {
                foreign.push(m.rank);
                continue;
            }
            let fresh = (m.via, m.epoch);
            let renewed = match self.routes.get(&m.rank) {
                // Travelled an older path than the route we have: stale.
                Some(&(_, f)) if fresh < f => continue,
                Some(&(old, f)) => {
                    if old != link {
                        if let Some(c) = self.children.get_mut(&old) {
                            c.members.remove(&m.rank);
                        }
                    }
                    fresh > f
                }
                None => false,
            };
            // A newer path means a daemon on the way up reconnected, and the tools of the
            // member were closed there (`path_lost`): the controller forgets them too.
            if renewed && self.is_controller() {
                self.forget_relayed_from(m.rank);
            }
            self.routes.insert(m.rank, (link, fresh));
            if let Some(c) = self.children.get_mut(&link) {
                c.members.insert(m.rank);
            }
            self.below.insert(m.rank, m.clone());
            if m.parent == self.me {
                self.note(Note::ProcState {
                    rank: m.rank,
                    state: "JOINED",
                });
            }
            accepted.push(m);
        }
        if !foreign.is_empty() {
            self.note(Note::Refused {
                link,
                reason: format!(
                    "rank {child} reported ranks {foreign:?} outside its subtree; ignored"
                ),
            });
        }
        if accepted.is_empty() {
            return;
        }
        if self.is_controller() {
            let mut reported = IdSet::new();
            let mut unsettled = IdSet::new();
            for m in &accepted {
                self.roster.set(m.rank, State::Wired);
                reported.insert(m.rank);
                // Reached only through a daemon that is leaving, a rank will move again
                // when it goes: a shrink waits until it reports along daemons that stay.
                if !self.through_staying(m.rank) {
                    unsettled.insert(m.rank);
                }
                // A departing daemon reported again was cut off on its way out, and the
                // order to leave may have been lost with its old route: it is told again.
                if self.roster.state(m.rank) == Some(State::Departing) {
                    self.tell_depart(m.rank);
                }
                self.roster.set_uri(m.rank, &m.uri);
                self.tell_dropped(m.rank);
            }
            self.check_formed();
            self.emit(Output::Wired {
                ranks: reported,
                unsettled,
            });
        } else if let Some((up, _)) = self.up {
            let epoch = self.epoch;
            for m in &mut accepted {
                m.via = m.via.max(epoch);
            }
            self.send(up, DaemonMsg::Report { members: accepted });
        }
    }

    /// Controller: whether every daemon between `rank` and here, as reported, stays (none
    /// departing or departed, none unknown).
    fn through_staying(&self, rank: Rank) -> bool {
        let mut at = rank;
        // A chain of reported parents is at most as long as the DVM is large.
        for _ in 0..self.roster.len() {
            let Some(parent) = self.below.get(&at).map(|m| m.parent) else {
                return false;
            };
            if parent == self.me {
                return true;
            }
            if matches!(
                self.roster.state(parent),
                Some(State::Departing | State::Departed)
            ) {
                return false;
            }
            at = parent;
        }
        false
    }

    pub(super) fn on_lost(&mut self, link: LinkId, ranks: Vec<RankEpoch>) {
        // A rank held for want of a membership that names it is gone as a routed one is: by
        // the same link, as of the same report or a later one.
        for re in &ranks {
            if self
                .held
                .get(&re.rank)
                .is_some_and(|(l, m)| *l == link && (m.via, m.epoch) <= (re.via, re.epoch))
            {
                self.held.remove(&re.rank);
            }
        }
        let gone: Vec<Rank> = ranks
            .into_iter()
            .filter(|re| self.routes.get(&re.rank) == Some(&(link, (re.via, re.epoch))))
            .map(|re| re.rank)
            .collect();
        self.forget(link, gone);
        self.maybe_finish_stop();
    }

    /// Keeps member `m`, reported by `child` on `link`, until this daemon's membership names
    /// it (see `Node::held`): only a descendant of `child`, and only over an older report of
    /// it, as a route is replaced.
    fn hold(&mut self, link: LinkId, child: Rank, m: Member) {
        if m.rank as usize >= MAX_HELD_MEMBERS || !self.cfg.tree.is_ancestor_or_self(child, m.rank)
        {
            return self.note(Note::Refused {
                link,
                reason: format!(
                    "rank {} reported by rank {child}: not a rank of a DVM below it",
                    m.rank
                ),
            });
        }
        if let Some((_, old)) = self.held.get(&m.rank) {
            if (m.via, m.epoch) < (old.via, old.epoch) {
                return;
            }
        }
        self.held.insert(m.rank, (link, m));
    }

    /// Drops routes to `gone` (all reached through `link`) and tells whoever is above.
    pub(super) fn forget(&mut self, link: LinkId, gone: Vec<Rank>) {
        if gone.is_empty() {
            return;
        }
        self.unawait(gone.iter().copied());
        let mut lost = Vec::with_capacity(gone.len());
        for r in gone {
            if let Some((_, (via, epoch))) = self.routes.remove(&r) {
                // As the parent recorded the route: through this daemon's connection.
                let via = via.max(self.epoch);
                lost.push(RankEpoch {
                    rank: r,
                    epoch,
                    via,
                });
            }
            self.below.remove(&r);
            if let Some(c) = self.children.get_mut(&link) {
                c.members.remove(&r);
            }
            if self.is_controller() {
                self.roster.set(r, State::Lost);
                self.drop_relayed_from(r);
            }
            self.note(Note::ProcState {
                rank: r,
                state: "LOST",
            });
        }
        if self.is_controller() {
            self.check_formed();
            let ids: IdSet = lost.iter().map(|l| l.rank).collect();
            if !ids.is_empty() {
                self.emit(Output::Exec(crate::exec::Input::Lost(ids)));
            }
        } else if self.departing || self.confirming.is_some() {
            // Departing: its children are moving to its parent: their routes are not lost,
            // only moved, and their own reports from there say so. Stopped: its
            // confirmation went up, and its children are leaving after theirs.
        } else if let Some((up, _)) = self.up {
            self.send(up, DaemonMsg::Lost { ranks: lost });
        }
        if self.departing && self.children.is_empty() {
            self.finish_depart();
        }
    }

    pub(super) fn check_formed(&mut self) {
        let expected = self.roster.expected();
        let joined = self.roster.count(State::Wired);
        let formed = self.roster.formed();
        if formed && !self.formed {
            self.note(Note::DvmReady {
                nspace: self.cfg.identity.nspace.clone(),
                daemons: expected,
            });
            self.note(Note::JobState { state: "VM READY" });
        } else if !formed && self.formed && self.stopping.is_none() {
            self.note(Note::DvmIncomplete { joined, expected });
        }
        self.formed = formed;
    }

    pub(super) fn route(&mut self, src: Rank, dst: Rank, ttl: u8, body: Body) {
        let next = match ttl.checked_sub(1) {
            None => None,
            Some(_) if dst == self.me => None,
            Some(_) => match self.routes.get(&dst) {
                Some(&(link, _)) => Some(link),
                None => self.up.map(|u| u.0),
            },
        };
        match (next, body) {
            (Some(link), body) => self.send(
                link,
                DaemonMsg::Routed {
                    src,
                    dst,
                    ttl: ttl - 1,
                    body,
                },
            ),
            (None, Body::ToolUp { tool, .. }) => {
                self.note(Note::Unroutable { dst });
                self.bounce(src, tool);
            }
            (None, _) => self.note(Note::Unroutable { dst }),
        }
    }

    pub(super) fn on_routed(
        &mut self,
        now: Duration,
        link: LinkId,
        src: Rank,
        dst: Rank,
        ttl: u8,
        body: Body,
    ) {
        // A daemon speaks only for its own subtree: what claims to come from a tool of
        // `src` must arrive by the link `src` is reached through.
        if matches!(body, Body::ToolUp { .. } | Body::ToolGone { .. })
            && self.routes.get(&src).map(|r| r.0) != Some(link)
        {
            return self.note(Note::Refused {
                link,
                reason: format!(
                    "a tool message from rank {src}, which is not reached by this link"
                ),
            });
        }
        // Replies to tools come only from the controller, down the tree.
        if matches!(body, Body::ToolDown { .. } | Body::ToolDropped { .. })
            && self.up.map(|u| u.0) != Some(link)
        {
            return self.note(Note::Refused {
                link,
                reason: "a reply to a tool that did not come from above".into(),
            });
        }
        let body = match body {
            Body::Ping { id, mut path } => {
                path.push(self.me);
                Body::Ping { id, path }
            }
            Body::Pong { id, mut path } => {
                path.push(self.me);
                Body::Pong { id, path }
            }
            other => other,
        };
        if dst != self.me {
            return self.route(src, dst, ttl, body);
        }
        match body {
            Body::Ping { id, path } => self.route(self.me, src, ROUTE_TTL, Body::Pong { id, path }),
            Body::Pong { id, path } => self.finish_ping(now, id, path),
            Body::ToolUp { tool, req } if self.is_controller() => {
                self.on_tool_up(now, src, tool, req)
            }
            Body::ToolGone { tool } if self.is_controller() => self.on_tool_gone(src, tool),
            Body::ToolDown { tool, reply } => self.on_tool_down(tool, reply),
            Body::ToolDropped { tool, reason } => self.close_tool(tool, reason),
            Body::Depart if self.up.map(|u| u.0) == Some(link) => self.begin_depart(),
            Body::ToolUp { .. } | Body::ToolGone { .. } | Body::Depart | Body::Unknown => {}
        }
    }
}
