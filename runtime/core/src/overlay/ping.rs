//! Ping: a round trip through the tree, controller to a daemon and back, for tools.

use super::*;

impl Node {
    pub(super) fn finish_ping(&mut self, now: Duration, id: u64, path: Vec<Rank>) {
        let Some(p) = self.pings.remove(&id) else {
            return;
        };
        let report = PingReport {
            rank: p.rank,
            host: self.roster.host(p.rank).to_string(),
            ok: true,
            rtt_us: Some(now.saturating_sub(p.sent).as_micros() as u64),
            path,
            error: None,
        };
        self.reply(p.tool, ToolReply::Ping(report));
    }

    pub(super) fn start_ping(&mut self, now: Duration, tool: LinkId, rank: Rank) {
        let size = self.roster.len();
        let fail = |msg: String| PingReport {
            rank,
            host: self.roster.host(rank).to_string(),
            ok: false,
            rtt_us: None,
            path: vec![],
            error: Some(msg),
        };
        if !self.roster.contains(rank) {
            let r = fail(format!("rank {rank} is not in this DVM (0..{size})"));
            return self.reply(tool, ToolReply::Ping(r));
        }
        if rank == self.me {
            let r = PingReport {
                ok: true,
                rtt_us: Some(0),
                path: vec![self.me],
                error: None,
                ..fail(String::new())
            };
            return self.reply(tool, ToolReply::Ping(r));
        }
        if !self.routes.contains_key(&rank) {
            let r = fail(format!("rank {rank} has not joined the DVM"));
            return self.reply(tool, ToolReply::Ping(r));
        }
        if self.pings.len() >= dvmlab_proto::limits::MAX_PENDING_PINGS {
            let r = fail(format!(
                "{} pings are already in flight, the most this daemon tracks",
                self.pings.len()
            ));
            return self.reply(tool, ToolReply::Ping(r));
        }
        let id = self.next_ping;
        self.next_ping += 1;
        self.pings.insert(
            id,
            PendingPing {
                tool,
                rank,
                sent: now,
            },
        );
        self.emit(Output::SetTimer {
            timer: Timer::Ping(id),
            delay: PING_TIMEOUT,
        });
        self.route(
            self.me,
            rank,
            ROUTE_TTL,
            Body::Ping {
                id,
                path: vec![self.me],
            },
        );
    }
}
