//! Stop: the DVM stops top-down, and each daemon exits once its subtree confirmed.

use super::*;

impl Node {
    pub(super) fn begin_stop(&mut self, tool: Option<LinkId>) {
        if self.stopping.is_some() {
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
        self.stopping = Some(Stopping {
            tool,
            pending,
            confirmed: BTreeSet::new(),
        });
        self.note(Note::JobState {
            state: "TERMINATING",
        });
        let links: Vec<LinkId> = self.children.keys().copied().collect();
        for l in links {
            self.send(l, DaemonMsg::Shutdown);
        }
        self.emit(Output::SetTimer {
            timer: Timer::StopGrace,
            delay: STOP_GRACE,
        });
        self.maybe_finish_stop();
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
        }
        self.note(Note::ProcState {
            rank: self.me,
            state: "TERMINATED",
        });
        self.note(Note::JobState {
            state: "TERMINATED",
        });
        if let Some((up, _)) = self.up {
            let mut ranks: Vec<Rank> = st.confirmed.into_iter().collect();
            ranks.push(self.me);
            self.send(up, DaemonMsg::Stopped { ranks });
        }
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
        self.io(Io::Exit);
    }
}
