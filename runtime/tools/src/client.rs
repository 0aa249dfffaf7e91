//! The tool side of the wire: how `pctl` (or any tool) reaches the DVM. On a node of the
//! DVM it talks to that node's daemon over its tools socket, which lets in only the DVM
//! owner's user (and root) and relays requests to the controller; elsewhere it talks to the
//! controller over TCP, proving it holds the DVM key.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};
use tokio_util::codec::Framed;

use dvmlab_core::conf::settings::Params;
use dvmlab_proto::codec::initiate;
use dvmlab_proto::secure::DvmKey;
use dvmlab_proto::wire::{Frame, FrameCodec, Hello, Peer, ToolReply, ToolRequest};

/// A byte stream to the DVM: a tools socket or TCP.
pub(crate) trait Conn: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Conn for T {}

/// Connects to the DVM `prte.conf` (with `params`) describes: through this node's daemon
/// when this host is one of its nodes and its daemon is up, else to the controller over TCP
/// (with the DVM key when `DVMKeyFile` is set).
pub async fn connect_to_dvm(params: &Params, timeout: Duration) -> Result<Client, String> {
    if let Ok(p) = dvmlab_host::bootstrap::Prepared::new(params) {
        let socket = p.settings.tool_socket(&p.identity.host, p.identity.rank);
        let peer = format!("the daemon of this node at {}", socket.display());
        match tokio::time::timeout(timeout, UnixStream::connect(&socket)).await {
            Ok(Ok(stream)) => {
                return Client::local(stream, peer, &p.identity.nspace, timeout).await
            }
            // No daemon here (none started, or one that died left its socket): the
            // controller may still be reachable.
            Ok(Err(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) => {}
            Ok(Err(e)) => return Err(format!("cannot reach {peer}: {e}")),
            Err(_) => return Err(format!("{peer} did not answer within {timeout:?}")),
        }
    }
    let (settings, addr) =
        dvmlab_host::bootstrap::controller_addr(params).map_err(|d| d.to_string())?;
    let key = match &settings.key_file {
        None => None,
        Some((path, _)) => Some(dvmlab_host::keyfile::load(path)?),
    };
    Client::connect(addr, &settings.namespace(), key.as_ref(), timeout).await
}

/// Whether the daemon's socket `stream` is served by this user or root (anyone else could be
/// impersonating the daemon).
pub(crate) fn served_by_us(stream: &UnixStream, peer: &str) -> Result<(), String> {
    let me = nix::unistd::geteuid().as_raw();
    let uid = stream
        .peer_cred()
        .map_err(|e| format!("{peer}: cannot learn who serves it: {e}"))?
        .uid();
    if uid != me && uid != 0 {
        return Err(format!(
            "{peer} is served by uid {uid}, neither this user (uid {me}) nor root; not using it"
        ));
    }
    Ok(())
}

/// A connection to the DVM.
pub struct Client {
    framed: Framed<Box<dyn Conn>, FrameCodec>,
    /// Who answers, for messages ("the controller at …", "the daemon of this node at …").
    peer: String,
}

impl Client {
    /// Talks to this node's daemon over its tools socket, once it is known to be served by
    /// this user or root (anyone else could be impersonating the daemon).
    async fn local(
        stream: UnixStream,
        peer: String,
        nspace: &str,
        timeout: Duration,
    ) -> Result<Client, String> {
        served_by_us(&stream, &peer)?;
        let c = Client {
            framed: Framed::new(Box::new(stream), FrameCodec::default()),
            peer,
        };
        c.hello(nspace, None, timeout).await
    }

    /// Connects to the controller at `addr` and introduces itself as a tool of `nspace`,
    /// after proving it holds `key` (the DVM's key, when it has one).
    pub async fn connect(
        addr: std::net::SocketAddr,
        nspace: &str,
        key: Option<&DvmKey>,
        timeout: Duration,
    ) -> Result<Client, String> {
        let peer = format!("the controller at {addr}");
        let mut stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| format!("{peer} did not answer within {timeout:?}"))?
            .map_err(|e| format!("cannot reach {peer}: {e}"))?;
        let codec = match key {
            None => FrameCodec::default(),
            Some(k) => {
                let channel = tokio::time::timeout(timeout, initiate(&mut stream, k))
                    .await
                    .map_err(|_| format!("{peer}: no key handshake within {timeout:?}"))?
                    .map_err(|e| format!("{peer}: {e}"))?;
                FrameCodec::sealed(channel)
            }
        };
        let c = Client {
            framed: Framed::new(Box::new(stream), codec),
            peer,
        };
        c.hello(nspace, Some(key.is_some()), timeout).await
    }

    /// Says hello and waits for the welcome. `keyed` tells, on TCP, whether the key was
    /// used, to explain a connection dropped unanswered.
    async fn hello(
        mut self,
        nspace: &str,
        keyed: Option<bool>,
        timeout: Duration,
    ) -> Result<Client, String> {
        // A refusing daemon may close before the hello is written; its refusal is still
        // there to read.
        let sent = self
            .framed
            .send(Frame::Hello(Hello::new(nspace, Peer::Tool)))
            .await;
        let answer = self.next(timeout).await.map_err(|e| match (keyed, &sent) {
            // A DVM with a key drops a tool that starts without the handshake.
            (Some(false), _) => format!(
                "{e}: the DVM may require its key, and this tool has none (set DVMKeyFile in prte.conf, or the MCA parameter dvmlab_dvm_key_file)"
            ),
            (_, Err(s)) => format!("{e} (after the hello failed: {s})"),
            _ => e,
        })?;
        match answer {
            Frame::Welcome { .. } => {
                self.framed.codec_mut().accepted();
                Ok(self)
            }
            Frame::Refuse { reason } => Err(format!("{} refused: {reason}", self.peer)),
            other => Err(format!("{} answered hello with {other:?}", self.peer)),
        }
    }

    async fn next(&mut self, timeout: Duration) -> Result<Frame, String> {
        let peer = &self.peer;
        match tokio::time::timeout(timeout, self.framed.next()).await {
            Err(_) => Err(format!("no answer from {peer} within {timeout:?}")),
            Ok(None) => Err(format!("{peer} closed the connection")),
            Ok(Some(Err(e))) => Err(format!("{peer}: {e}")),
            Ok(Some(Ok(f))) => Ok(f),
        }
    }

    /// Sends a request without waiting (for streams of replies, see [`Client::recv`]).
    pub async fn send(&mut self, req: ToolRequest) -> Result<(), String> {
        self.framed
            .send(Frame::Tool(req))
            .await
            .map_err(|e| format!("{}: {e}", self.peer))
    }

    /// The next reply, however long it takes.
    pub async fn recv(&mut self) -> Result<ToolReply, String> {
        let peer = &self.peer;
        match self.framed.next().await {
            None => Err(format!("{peer} closed the connection")),
            Some(Err(e)) => Err(format!("{peer}: {e}")),
            Some(Ok(Frame::ToolReply(r))) => Ok(r),
            Some(Ok(other)) => Err(format!("unexpected answer from {peer}: {other:?}")),
        }
    }

    /// The next reply, waiting at most `timeout`.
    pub async fn reply_within(&mut self, timeout: Duration) -> Result<ToolReply, String> {
        match self.next(timeout).await? {
            Frame::ToolReply(r) => Ok(r),
            other => Err(format!("unexpected answer from {}: {other:?}", self.peer)),
        }
    }

    /// Sends one request and waits for its reply.
    pub async fn request(
        &mut self,
        req: ToolRequest,
        timeout: Duration,
    ) -> Result<ToolReply, String> {
        self.framed
            .send(Frame::Tool(req))
            .await
            .map_err(|e| format!("{}: {e}", self.peer))?;
        match self.next(timeout).await? {
            Frame::ToolReply(r) => Ok(r),
            other => Err(format!("unexpected answer from {}: {other:?}", self.peer)),
        }
    }
}
