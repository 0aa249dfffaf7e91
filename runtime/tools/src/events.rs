//! The client library for PMIx events (RFC 0002): a job process or tool connected to its
//! node's daemon, registering handlers, notifying events and running its handler chains.
//!
//! The chains themselves are `dvmlab_core::event::client::EventClient`'s; this is its IO.
//! Handlers are closures ([`Events::on`], then [`Events::serve`]); or, for a handler that
//! completes later (asynchronously), [`Events::next`] hands over each call
//! ([`Step::Invoke`]) and the caller reports [`Events::done`] when it is ready, and the
//! chain goes on. A job process finds its daemon and its identity in its environment
//! (`DVMLAB_EVENTS`, `DVMLAB_NSPACE`, `DVMLAB_PROC`); a tool on a node of the DVM uses that
//! node's daemon.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::net::UnixStream;
use tokio_util::codec::Framed;

use crate::client::{served_by_us, Conn};
use dvmlab_core::conf::settings::Params;
use dvmlab_core::event::chain::Invocation;
use dvmlab_core::event::client::{EventClient, Output};
use dvmlab_core::event::registry::RegId;
use dvmlab_proto::event::{
    Completion, Directives, Event, EventDown, HandlerResult, Info, Proc, Range, Status,
};
use dvmlab_proto::wire::{Directive, Frame, FrameCodec, Hello, Peer, ToolReply, ToolRequest};

/// What happened next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Run this handler, then call [`Events::done`].
    Invoke(Invocation),
    /// An event went through its whole chain; `internal` for the lost-server event this
    /// process raised itself when its daemon went away.
    Served {
        event: Event,
        results: Vec<HandlerResult>,
        internal: bool,
    },
    /// The daemon refused registration `id`.
    Refused { id: RegId, reason: String },
}

/// A handler as a closure: given its call (the event, and what the handlers before it in
/// the chain returned), how it completed and the results it adds.
pub type Handler = Box<dyn FnMut(&Invocation) -> (Completion, Vec<Info>) + Send>;

/// A connection to this node's daemon for events.
pub struct Events {
    framed: Option<Framed<Box<dyn Conn>, FrameCodec>>,
    core: EventClient,
    ready: VecDeque<Step>,
    peer: String,
    /// The closures registered with [`Events::on`], by registration.
    handlers: BTreeMap<RegId, Handler>,
}

impl Events {
    /// Connects as the job process the environment names, or else as a tool of the DVM
    /// `params` describes, on this node.
    pub async fn connect(params: &Params, timeout: Duration) -> Result<Events, String> {
        let job = (
            std::env::var("DVMLAB_EVENTS"),
            std::env::var("DVMLAB_NSPACE"),
            std::env::var("DVMLAB_PROC"),
        );
        let (socket, dvm, peer, me) = match job {
            (Ok(socket), Ok(nspace), Ok(rank)) => {
                let rank: u32 = rank
                    .parse()
                    .map_err(|_| format!("DVMLAB_PROC={rank} is not a process index"))?;
                let dvm = nspace.split('@').next().unwrap_or_default().to_string();
                let me = Proc { nspace, rank };
                let peer = Peer::Process {
                    nspace: me.nspace.clone(),
                    rank,
                };
                (socket.into(), dvm, peer, Some(me))
            }
            _ => {
                let p = dvmlab_host::bootstrap::Prepared::new(params).map_err(|e| {
                    format!("events need a node of the DVM (its daemon serves them): {e}")
                })?;
                let socket = p.settings.tool_socket(&p.identity.host, p.identity.rank);
                (socket, p.identity.nspace, Peer::Tool, None)
            }
        };
        let name = format!("the daemon of this node at {}", socket.display());
        let stream = tokio::time::timeout(timeout, UnixStream::connect(&socket))
            .await
            .map_err(|_| format!("{name} did not answer within {timeout:?}"))?
            .map_err(|e| format!("cannot reach {name}: {e}"))?;
        served_by_us(&stream, &name)?;
        Events::hello(Box::new(stream), name, &dvm, peer, me, timeout).await
    }

    /// Says hello on `stream` to the daemon called `name` as `peer` of DVM `dvm`.
    async fn hello(
        stream: Box<dyn Conn>,
        name: String,
        dvm: &str,
        peer: Peer,
        me: Option<Proc>,
        timeout: Duration,
    ) -> Result<Events, String> {
        let mut framed: Framed<Box<dyn Conn>, FrameCodec> =
            Framed::new(stream, FrameCodec::default());
        framed
            .send(Frame::Hello(Hello::new(dvm, peer)))
            .await
            .map_err(|e| format!("{name}: {e}"))?;
        match tokio::time::timeout(timeout, framed.next()).await {
            Ok(Some(Ok(Frame::Welcome { .. }))) => framed.codec_mut().accepted(),
            Ok(Some(Ok(Frame::Refuse { reason }))) => {
                return Err(format!("{name} refused: {reason}"))
            }
            Ok(Some(Ok(other))) => return Err(format!("{name} answered hello with {other:?}")),
            Ok(Some(Err(e))) => return Err(format!("{name}: {e}")),
            Ok(None) => return Err(format!("{name} closed the connection")),
            Err(_) => return Err(format!("no answer from {name} within {timeout:?}")),
        }
        Ok(Events {
            framed: Some(framed),
            core: EventClient::new(me),
            ready: VecDeque::new(),
            peer: name,
            handlers: BTreeMap::new(),
        })
    }

    /// Registers `handler` for `codes` (none: every code) with `directives`; [`Events::serve`]
    /// calls it.
    pub async fn on(
        &mut self,
        codes: Vec<Status>,
        directives: Directives,
        handler: Handler,
    ) -> Result<RegId, String> {
        let id = self.register(codes, directives).await?;
        self.handlers.insert(id, handler);
        Ok(id)
    }

    /// Serves events with the closures registered with [`Events::on`] until `stop`, told of
    /// each event that went through its chain (and what each handler returned), says so; or
    /// the daemon goes away (an error, after its loss was served).
    pub async fn serve(
        &mut self,
        mut stop: impl FnMut(&Event, &[HandlerResult]) -> bool,
    ) -> Result<(), String> {
        loop {
            match self.next().await? {
                Step::Invoke(inv) => {
                    let (how, results) = match self.handlers.get_mut(&inv.reg) {
                        Some(h) => h(&inv),
                        None => (Completion::NoActionTaken, Vec::new()),
                    };
                    self.done(inv.reg, how, results).await?;
                }
                Step::Served { event, results, .. } => {
                    if stop(&event, &results) {
                        return Ok(());
                    }
                }
                Step::Refused { id, reason } => {
                    return Err(format!("{} refused registration {id}: {reason}", self.peer))
                }
            }
        }
    }

    /// The job process this is (`None` for a tool).
    pub fn me(&self) -> Option<&Proc> {
        self.core.me()
    }

    /// Registers a handler for `codes` (none: every code); its id, given to it when called.
    /// Returns once the daemon has it in place (or refused it).
    pub async fn register(
        &mut self,
        codes: Vec<Status>,
        directives: Directives,
    ) -> Result<RegId, String> {
        let (id, out) = self
            .core
            .register(codes, directives)
            .map_err(|e| e.to_string())?;
        let sent = !out.is_empty();
        self.carry_out(out).await?;
        if sent {
            match self.reply().await? {
                EventDown::Registered { id: got } if got == id => {}
                EventDown::Refused { reason, .. } => {
                    let _ = self.core.deregister(id);
                    return Err(format!("{} refused registration {id}: {reason}", self.peer));
                }
                other => {
                    return Err(format!(
                        "{} answered registration {id} with {other:?}",
                        self.peer
                    ))
                }
            }
        }
        Ok(id)
    }

    /// Removes a registration (also from inside its handler).
    pub async fn deregister(&mut self, id: RegId) -> Result<(), String> {
        self.handlers.remove(&id);
        let out = self.core.deregister(id);
        self.carry_out(out).await
    }

    /// Notifies an event to `range` (and, for `CUSTOM`, `targets`).
    pub async fn notify(
        &mut self,
        code: Status,
        range: Range,
        targets: Vec<Proc>,
        info: Vec<Info>,
    ) -> Result<(), String> {
        if range != Range::ProcLocal && self.framed.is_none() {
            return Err(format!("{} closed the connection: not sent", self.peer));
        }
        let out = self.core.notify(code, range, targets, info);
        let sent = out.iter().any(|o| matches!(o, Output::Send(_)));
        self.carry_out(out).await?;
        if !sent {
            return Ok(());
        }
        match self.reply().await? {
            EventDown::Notified => Ok(()),
            EventDown::NotifyRefused { reason } => {
                Err(format!("{} refused the event: {reason}", self.peer))
            }
            other => Err(format!(
                "{} answered a notification with {other:?}",
                self.peer
            )),
        }
    }

    /// Asks the DVM for a change of size as this process (PMIx `PMIx_Allocation_request`):
    /// the synchronous answer ([`ToolReply::Allocated`] or an error). The terminal event,
    /// `PMIX_DVM_IS_READY` or `PMIX_ERR_DVM_MOD`, comes later to a handler registered for it
    /// (register before asking, or it may come first and find none).
    pub async fn alloc(
        &mut self,
        directive: Directive,
        hosts: Vec<String>,
        alloc_id: Option<String>,
        req_id: Option<String>,
    ) -> Result<ToolReply, String> {
        let peer = self.peer.clone();
        let Some(framed) = self.framed.as_mut() else {
            return Err(format!("{peer} closed the connection: not sent"));
        };
        framed
            .send(Frame::Tool(ToolRequest::Alloc {
                directive,
                hosts,
                alloc_id,
                req_id,
            }))
            .await
            .map_err(|e| format!("{peer}: {e}"))?;
        loop {
            let Some(framed) = self.framed.as_mut() else {
                return Err(format!("{peer} closed the connection"));
            };
            match framed.next().await {
                Some(Ok(Frame::ToolReply(r))) => return Ok(r),
                Some(Ok(Frame::EventDown(EventDown::Deliver { event }))) => {
                    let out = self.core.arrived(event);
                    self.carry_out(out).await?;
                }
                Some(Ok(other)) => return Err(format!("unexpected frame from {peer}: {other:?}")),
                Some(Err(_)) | None => {
                    self.framed = None;
                    let out = self.core.server_lost();
                    self.carry_out(out).await?;
                    return Err(format!("{peer} closed the connection"));
                }
            }
        }
    }

    /// The daemon's next answer to a request; events arriving meanwhile wait in line.
    async fn reply(&mut self) -> Result<EventDown, String> {
        loop {
            let Some(framed) = self.framed.as_mut() else {
                return Err(format!("{} closed the connection", self.peer));
            };
            match framed.next().await {
                Some(Ok(Frame::EventDown(EventDown::Deliver { event }))) => {
                    let out = self.core.arrived(event);
                    self.carry_out(out).await?;
                }
                Some(Ok(Frame::EventDown(d))) => return Ok(d),
                Some(Ok(other)) => {
                    return Err(format!("unexpected frame from {}: {other:?}", self.peer))
                }
                Some(Err(_)) | None => {
                    self.framed = None;
                    let out = self.core.server_lost();
                    self.carry_out(out).await?;
                    return Err(format!("{} closed the connection", self.peer));
                }
            }
        }
    }

    /// Handler `reg` finished with `how` and its `results`.
    pub async fn done(
        &mut self,
        reg: RegId,
        how: Completion,
        results: Vec<Info>,
    ) -> Result<(), String> {
        let out = self.core.handler_done(reg, how, results);
        self.carry_out(out).await
    }

    /// The next thing to do or know. Once the daemon is gone, its loss is served to the
    /// handlers (PMIx's lost-connection event) and then this fails.
    pub async fn next(&mut self) -> Result<Step, String> {
        loop {
            if let Some(s) = self.ready.pop_front() {
                return Ok(s);
            }
            let Some(framed) = self.framed.as_mut() else {
                return Err(format!("{} closed the connection", self.peer));
            };
            let down = match framed.next().await {
                Some(Ok(Frame::EventDown(d))) => Some(d),
                Some(Ok(other)) => {
                    return Err(format!("unexpected frame from {}: {other:?}", self.peer))
                }
                Some(Err(_)) | None => None,
            };
            match down {
                Some(EventDown::Deliver { event }) => {
                    let out = self.core.arrived(event);
                    self.carry_out(out).await?;
                }
                Some(EventDown::Refused { id, reason }) => {
                    self.ready.push_back(Step::Refused { id, reason });
                }
                Some(
                    d @ (EventDown::Registered { .. }
                    | EventDown::Notified
                    | EventDown::NotifyRefused { .. }),
                ) => {
                    return Err(format!("{} answered what was not asked: {d:?}", self.peer));
                }
                None => {
                    self.framed = None;
                    let out = self.core.server_lost();
                    self.carry_out(out).await?;
                }
            }
        }
    }

    async fn carry_out(&mut self, out: Vec<Output>) -> Result<(), String> {
        for o in out {
            match o {
                Output::Invoke(inv) => self.ready.push_back(Step::Invoke(inv)),
                Output::Served {
                    event,
                    results,
                    internal,
                } => self.ready.push_back(Step::Served {
                    event,
                    results,
                    internal,
                }),
                Output::Send(up) => {
                    let Some(framed) = self.framed.as_mut() else {
                        continue;
                    };
                    framed
                        .send(Frame::Event(up))
                        .await
                        .map_err(|e| format!("{}: {e}", self.peer))?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A daemon in miniature on the other end of `theirs`: welcomes, confirms every
    /// registration, then delivers one event and waits for the client to go.
    async fn daemon(theirs: UnixStream) {
        let mut f = Framed::new(theirs, FrameCodec::default());
        let Some(Ok(Frame::Hello(_))) = f.next().await else {
            panic!("no hello")
        };
        f.codec_mut().accepted();
        let welcome = Frame::Welcome {
            nspace: "d".into(),
            rank: 1,
            version: dvmlab_proto::wire::VERSION,
            caps: dvmlab_proto::wire::CAPS,
        };
        f.send(welcome).await.unwrap();
        for _ in 0..3 {
            let Some(Ok(Frame::Event(dvmlab_proto::event::EventUp::Register { id, .. }))) =
                f.next().await
            else {
                panic!("no registration")
            };
            f.send(Frame::EventDown(EventDown::Registered { id }))
                .await
                .unwrap();
        }
        let event = Event {
            code: -3001,
            source: None,
            info: vec![],
            level: dvmlab_proto::event::Level::Job,
        };
        f.send(Frame::EventDown(EventDown::Deliver { event }))
            .await
            .unwrap();
        while f.next().await.is_some() {}
    }

    #[test]
    fn closures_are_called_in_service_order_each_given_what_the_ones_before_returned() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (ours, theirs) = UnixStream::pair().unwrap();
            let fake = tokio::spawn(daemon(theirs));
            let mut ev = Events::hello(
                Box::new(ours),
                "the test's daemon".into(),
                "d",
                Peer::Tool,
                None,
                Duration::from_secs(5),
            )
            .await
            .unwrap();
            let seen: Arc<Mutex<Vec<(String, usize)>>> = Arc::default();
            let named = |n: &str| Directives {
                name: Some(n.into()),
                ..Directives::default()
            };
            for (name, codes) in [("default", vec![]), ("specific", vec![-3001])] {
                let log = seen.clone();
                let n = name.to_string();
                ev.on(
                    codes,
                    named(name),
                    Box::new(move |inv: &Invocation| {
                        log.lock().unwrap().push((n.clone(), inv.results.len()));
                        (
                            Completion::PartialActionTaken,
                            vec![Info {
                                key: format!("{n}.did"),
                                value: 1.into(),
                            }],
                        )
                    }),
                )
                .await
                .unwrap();
            }
            let gone = ev
                .on(vec![-3001], named("gone"), Box::new(|_| unreachable!()))
                .await
                .unwrap();
            ev.deregister(gone).await.unwrap();
            let mut results = Vec::new();
            ev.serve(|_, r| {
                results = r.to_vec();
                true
            })
            .await
            .unwrap();
            assert_eq!(
                *seen.lock().unwrap(),
                [("specific".to_string(), 0), ("default".to_string(), 1)],
                "the handler for the code first, then the default one, which is given the first's result"
            );
            assert_eq!(
                results.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
                ["specific", "default"]
            );
            assert!(results[0].results[0].key == "specific.did");
            drop(ev);
            fake.await.unwrap();
        });
    }
}
