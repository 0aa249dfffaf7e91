//! Elastic membership on the tree: the controller sends a changed membership down to every
//! daemon (each passes a newer one on to its children); a daemon told to depart hands its
//! children on to its own parent and leaves once they have gone; a child told its parent
//! is leaving connects past it; a rank that departed is told to leave again if it ever
//! says hello.

use super::*;

impl Node {
    /// The controller's membership changed: every daemon below gets it.
    pub(super) fn send_membership(&mut self) {
        let wireup = self.roster.wireup();
        let links: Vec<LinkId> = self.children.keys().copied().collect();
        for link in links {
            self.send(
                link,
                DaemonMsg::Wireup {
                    wireup: wireup.clone(),
                },
            );
        }
    }

    /// A membership from the parent: taken if newer, and passed on to the children.
    pub(super) fn on_wireup(&mut self, link: LinkId, wireup: crate::roster::Wireup) {
        let known = self.roster.len();
        match self.roster.apply(&wireup) {
            Ok(true) => {
                for r in wireup.departed.iter() {
                    if let Some(u) = self.uplink.as_mut() {
                        u.avoid(r);
                    }
                }
                let links: Vec<LinkId> = self.children.keys().copied().collect();
                for l in links {
                    self.send(
                        l,
                        DaemonMsg::Wireup {
                            wireup: wireup.clone(),
                        },
                    );
                }
                self.take_held();
                self.poke_children_from(known);
            }
            Ok(false) => {}
            Err(e) => self.note(Note::Refused {
                link,
                reason: format!("membership from the parent not taken: {e}"),
            }),
        }
    }

    /// The members children reported before this daemon's membership named them, taken now
    /// that it does (through links that are still children's: the report's own checks).
    fn take_held(&mut self) {
        let named: Vec<Rank> = self
            .held
            .keys()
            .copied()
            .filter(|r| self.roster.contains(*r))
            .collect();
        let mut by_link: BTreeMap<LinkId, Vec<Member>> = BTreeMap::new();
        for r in named {
            if let Some((link, m)) = self.held.remove(&r) {
                by_link.entry(link).or_default().push(m);
            }
        }
        for (link, members) in by_link {
            self.on_report(link, members);
        }
    }

    /// The controller tells `rank` to leave (wherever it is below).
    pub(super) fn tell_depart(&mut self, rank: Rank) {
        if rank == self.me {
            return;
        }
        self.route(self.me, rank, ROUTE_TTL, Body::Depart);
    }

    /// The controller gave up waiting for `rank` to leave by itself: it is told once more,
    /// and a direct link to it is closed (its route goes with it; a later hello is answered
    /// with a departure).
    pub(super) fn cut_off(&mut self, rank: Rank) {
        self.tell_depart(rank);
        let links: Vec<LinkId> = self
            .children
            .iter()
            .filter(|(_, c)| c.rank == rank)
            .map(|(l, _)| *l)
            .collect();
        for link in links {
            self.io(Io::Close { link });
            self.drop_child(link);
        }
    }

    /// This daemon is to leave the DVM: its children are sent to its parent first.
    pub(super) fn begin_depart(&mut self) {
        if self.is_controller() || self.departing || self.stopping.is_some() {
            return;
        }
        self.departing = true;
        self.note(Note::ProcState {
            rank: self.me,
            state: "DEPARTING",
        });
        let links: Vec<LinkId> = self.children.keys().copied().collect();
        for link in &links {
            self.send(*link, DaemonMsg::Rehome);
        }
        if links.is_empty() && !self.cfg.depart_lingers {
            return self.finish_depart();
        }
        self.emit(Output::SetTimer {
            timer: Timer::DepartGrace,
            delay: STOP_GRACE,
        });
    }

    /// A departing daemon's children have gone (or the grace is over): it exits, and its
    /// parent sees its route go, which is the departure the controller counts.
    pub(super) fn finish_depart(&mut self) {
        if !self.departing {
            return;
        }
        self.departing = false;
        self.note(Note::ProcState {
            rank: self.me,
            state: "DEPARTED",
        });
        self.io(Io::Exit);
    }

    /// The parent said it is leaving: connect past it now rather than wait to notice.
    pub(super) fn on_rehome(&mut self, now: Duration) {
        let Some((link, parent)) = self.up else {
            return;
        };
        if let Some(u) = self.uplink.as_mut() {
            u.avoid(parent);
        }
        self.io(Io::Close { link });
        self.drop_uplink(now);
    }
}
