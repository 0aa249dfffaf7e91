//! Tools on any node. Every daemon serves the tools of its own node; one that is not the
//! controller relays their requests up the tree to the controller, and the controller's
//! replies come back down to it. The controller serves a relayed tool as it serves its own,
//! under a link id of its own (with [`RELAYED`] set), and forgets it when the relaying
//! daemon says the tool has gone or the daemon is lost.
//!
//! Routed messages are not retransmitted, so a request or reply may be lost while the tree
//! re-homes. A tool is never left waiting for one: a daemon that loses its upward link
//! closes its tools with the reason and tells every daemon below to close theirs
//! (`path_lost`); a request that cannot go further up is answered by closing its tool; and
//! the controller, once a daemon whose tools it had to forget is reachable again, tells it to
//! close them.

use super::*;

/// Set in the link ids the controller gives relayed tools; the shell's ids never have it.
pub const RELAYED: LinkId = 1 << 63;

/// A tool connected to another daemon, as the controller knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Relayed {
    pub origin: Rank,
    pub tool: u64,
}

impl Node {
    /// For a tool relayed to the controller: its daemon and that daemon's number for it.
    pub(super) fn relayed_origin(&self, link: LinkId) -> Option<(Rank, u64)> {
        self.relayed.get(&link).map(|r| (r.origin, r.tool))
    }

    /// Every reply to a tool: on its own link, or down the tree to the daemon it is on.
    pub(super) fn reply(&mut self, link: LinkId, reply: ToolReply) {
        match self.relayed.get(&link).copied() {
            Some(r) => self.route(
                self.me,
                r.origin,
                ROUTE_TTL,
                Body::ToolDown {
                    tool: r.tool,
                    reply,
                },
            ),
            None => self.io(Io::Send {
                link,
                frame: Frame::ToolReply(reply),
            }),
        }
    }

    /// A daemon other than the controller: a local tool's request goes to the controller.
    /// A stop also gets its answer here, as this daemon finishes stopping (the controller's
    /// own answer comes after this daemon has gone).
    pub(super) fn relay_up(&mut self, link: LinkId, req: ToolRequest) {
        if self.up.is_none() {
            let reason = format!(
                "rank {} has not joined the DVM (no path to the controller yet); try again",
                self.me
            );
            return self.close_tool(link, reason);
        }
        if req == ToolRequest::Stop {
            self.stop_tools.insert(link);
        }
        self.route(self.me, 0, ROUTE_TTL, Body::ToolUp { tool: link, req });
    }

    /// The controller: a request of a tool on the daemon `origin`.
    pub(super) fn on_tool_up(&mut self, now: Duration, origin: Rank, tool: u64, req: ToolRequest) {
        let key = Relayed { origin, tool };
        let link = match self.relayed_ids.get(&key) {
            Some(&l) => l,
            None if self.relayed.len() >= MAX_RELAYED_TOOLS => {
                let reply = ToolReply::Error {
                    message: format!(
                        "the controller serves at most {MAX_RELAYED_TOOLS} tools of other nodes at once"
                    ),
                };
                return self.route(self.me, origin, ROUTE_TTL, Body::ToolDown { tool, reply });
            }
            None => {
                let l = RELAYED | self.next_relayed;
                self.next_relayed += 1;
                self.relayed.insert(l, key);
                self.relayed_ids.insert(key, l);
                self.tools.insert(l);
                l
            }
        };
        self.on_tool(now, link, req);
    }

    /// The controller: tool `tool` of the daemon `origin` has gone.
    pub(super) fn on_tool_gone(&mut self, origin: Rank, tool: u64) {
        if let Some(l) = self.relayed_ids.remove(&Relayed { origin, tool }) {
            self.relayed.remove(&l);
            self.forget_tool(l);
        }
    }

    /// The controller: the tools relayed by `origin` are gone with it (the route to it is).
    /// Each is remembered (a bounded number) to be closed once `origin` is back.
    pub(super) fn drop_relayed_from(&mut self, origin: Rank) {
        for k in self.forget_relayed_from(origin) {
            if self.dropped.len() >= MAX_RELAYED_TOOLS {
                self.dropped.pop_front();
            }
            self.dropped.push_back(k);
        }
    }

    /// The controller: forgets the tools relayed by `origin`; which they were.
    pub(super) fn forget_relayed_from(&mut self, origin: Rank) -> Vec<Relayed> {
        let from = Relayed { origin, tool: 0 };
        let to = Relayed {
            origin,
            tool: u64::MAX,
        };
        let gone: Vec<(Relayed, LinkId)> = self
            .relayed_ids
            .range(from..=to)
            .map(|(k, l)| (*k, *l))
            .collect();
        for &(k, l) in &gone {
            self.relayed_ids.remove(&k);
            self.relayed.remove(&l);
            self.forget_tool(l);
        }
        gone.into_iter().map(|(k, _)| k).collect()
    }

    /// The controller: `origin` is reachable again; the tools it relayed that were forgotten
    /// meanwhile are closed there.
    pub(super) fn tell_dropped(&mut self, origin: Rank) {
        if !self.dropped.iter().any(|d| d.origin == origin) {
            return;
        }
        let (theirs, rest): (VecDeque<Relayed>, VecDeque<Relayed>) =
            self.dropped.drain(..).partition(|d| d.origin == origin);
        self.dropped = rest;
        for d in theirs {
            let reason = format!(
                "the tree lost the path between rank {origin} and the controller; the controller forgot this tool and its replies may have been lost"
            );
            self.route(
                self.me,
                origin,
                ROUTE_TTL,
                Body::ToolDropped {
                    tool: d.tool,
                    reason,
                },
            );
        }
    }

    /// This daemon's tool `tool` is to be closed, with `reason` as its last reply.
    pub(super) fn close_tool(&mut self, tool: u64, reason: String) {
        if !self.tools.remove(&tool) {
            return;
        }
        self.pings.retain(|_, p| p.tool != tool);
        self.stop_tools.remove(&tool);
        // A job process that made a request keeps its events connection: it hears why its
        // request may be lost, and is no tool any more.
        if self.processes.contains(&tool) {
            return self.io(Io::Send {
                link: tool,
                frame: Frame::ToolReply(ToolReply::Error { message: reason }),
            });
        }
        self.emit(Output::EventClientGone { link: tool });
        self.io(Io::Send {
            link: tool,
            frame: Frame::ToolReply(ToolReply::Error { message: reason }),
        });
        self.io(Io::Close { link: tool });
    }

    /// The path from this daemon to the controller broke at `why`: requests and replies of
    /// its tools, and of every daemon's below, may have been lost, so they are closed rather
    /// than left waiting.
    pub(super) fn path_lost(&mut self, why: &str) {
        let tools: Vec<LinkId> = self.tools.iter().copied().collect();
        for t in tools {
            let reason = format!(
                "{why}, on the way to the controller; this tool's requests and replies may have been lost"
            );
            self.close_tool(t, reason);
        }
        let children: Vec<LinkId> = self.children.keys().copied().collect();
        for c in children {
            self.send(c, DaemonMsg::PathLost);
        }
    }

    /// A tool request that cannot go further up: its tool is closed (here, or down the tree
    /// on the daemon it came from).
    pub(super) fn bounce(&mut self, src: Rank, tool: u64) {
        let reason = format!(
            "rank {} could not pass the request on to the controller (no path to it)",
            self.me
        );
        if src == self.me {
            self.close_tool(tool, reason);
        } else {
            self.route(self.me, src, ROUTE_TTL, Body::ToolDropped { tool, reason });
        }
    }

    /// A reply came down for a tool of this daemon.
    pub(super) fn on_tool_down(&mut self, tool: u64, reply: ToolReply) {
        // A stop the controller refused is not answered again when this daemon stops.
        if matches!(reply, ToolReply::Error { .. }) {
            self.stop_tools.remove(&tool);
        }
        if self.tools.contains(&tool) {
            self.io(Io::Send {
                link: tool,
                frame: Frame::ToolReply(reply),
            });
        }
    }

    /// A tool link closed (or a relayed tool went): its pings and jobs forget it, and a
    /// daemon other than the controller tells the controller.
    pub(super) fn forget_tool(&mut self, link: LinkId) {
        if !self.tools.remove(&link) {
            return;
        }
        self.pings.retain(|_, p| p.tool != link);
        self.stop_tools.remove(&link);
        self.emit(Output::EventClientGone { link });
        if self.is_controller() {
            self.emit(Output::ToolGone { link });
        } else {
            self.route(self.me, 0, ROUTE_TTL, Body::ToolGone { tool: link });
        }
    }
}
