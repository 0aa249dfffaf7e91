//! The tool side of the wire: how `pctl` (or any tool) talks to the controller.

use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

use dvmlab_core::conf::settings::Params;
use dvmlab_proto::codec::initiate;
use dvmlab_proto::secure::DvmKey;
use dvmlab_proto::wire::{Frame, FrameCodec, Hello, Peer, ToolReply, ToolRequest};

/// Connects to the controller `prte.conf` (with `params`) names, proving this user holds the
/// DVM key when `DVMKeyFile` is set.
pub async fn connect_to_dvm(params: &Params, timeout: Duration) -> Result<Client, String> {
    let (settings, addr) =
        dvmlab_host::bootstrap::controller_addr(params).map_err(|d| d.to_string())?;
    let key = match &settings.key_file {
        None => None,
        Some((path, _)) => Some(dvmlab_host::keyfile::load(path)?),
    };
    Client::connect(addr, &settings.namespace(), key.as_ref(), timeout).await
}

/// A connection to the controller.
pub struct Client {
    framed: Framed<TcpStream, FrameCodec>,
    addr: SocketAddr,
}

impl Client {
    /// Connects to the controller at `addr` and introduces itself as a tool of `nspace`,
    /// after proving it holds `key` (the DVM's key, when it has one).
    pub async fn connect(
        addr: SocketAddr,
        nspace: &str,
        key: Option<&DvmKey>,
        timeout: Duration,
    ) -> Result<Client, String> {
        let mut stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| format!("controller at {addr} did not answer within {timeout:?}"))?
            .map_err(|e| format!("cannot reach the controller at {addr}: {e}"))?;
        let codec = match key {
            None => FrameCodec::default(),
            Some(k) => {
                let channel = tokio::time::timeout(timeout, initiate(&mut stream, k))
                    .await
                    .map_err(|_| {
                        format!("controller at {addr}: no key handshake within {timeout:?}")
                    })?
                    .map_err(|e| format!("controller at {addr}: {e}"))?;
                FrameCodec::sealed(channel)
            }
        };
        let mut c = Client {
            framed: Framed::new(stream, codec),
            addr,
        };
        c.framed
            .send(Frame::Hello(Hello::new(nspace, Peer::Tool)))
            .await
            .map_err(|e| format!("{addr}: {e}"))?;
        let answer = c.next(timeout).await.map_err(|e| match key {
            // A DVM with a key drops a tool that starts without the handshake.
            None => format!(
                "{e}: the DVM may require its key, and this tool has none (set DVMKeyFile in prte.conf, or the MCA parameter dvmlab_dvm_key_file)"
            ),
            Some(_) => e,
        })?;
        match answer {
            Frame::Welcome { .. } => {
                c.framed.codec_mut().accepted();
                Ok(c)
            }
            Frame::Refuse { reason } => Err(format!("controller at {addr} refused: {reason}")),
            other => Err(format!(
                "controller at {addr} answered hello with {other:?}"
            )),
        }
    }

    async fn next(&mut self, timeout: Duration) -> Result<Frame, String> {
        let addr = self.addr;
        match tokio::time::timeout(timeout, self.framed.next()).await {
            Err(_) => Err(format!(
                "no answer from the controller at {addr} within {timeout:?}"
            )),
            Ok(None) => Err(format!("the controller at {addr} closed the connection")),
            Ok(Some(Err(e))) => Err(format!("{addr}: {e}")),
            Ok(Some(Ok(f))) => Ok(f),
        }
    }

    /// Sends a request without waiting (for streams of replies, see [`Client::recv`]).
    pub async fn send(&mut self, req: ToolRequest) -> Result<(), String> {
        self.framed
            .send(Frame::Tool(req))
            .await
            .map_err(|e| format!("{}: {e}", self.addr))
    }

    /// The next reply, however long it takes.
    pub async fn recv(&mut self) -> Result<ToolReply, String> {
        let addr = self.addr;
        match self.framed.next().await {
            None => Err(format!("the controller at {addr} closed the connection")),
            Some(Err(e)) => Err(format!("{addr}: {e}")),
            Some(Ok(Frame::ToolReply(r))) => Ok(r),
            Some(Ok(other)) => Err(format!("unexpected answer from the controller: {other:?}")),
        }
    }

    /// The next reply, waiting at most `timeout`.
    pub async fn reply_within(&mut self, timeout: Duration) -> Result<ToolReply, String> {
        match self.next(timeout).await? {
            Frame::ToolReply(r) => Ok(r),
            other => Err(format!("unexpected answer from the controller: {other:?}")),
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
            .map_err(|e| format!("{}: {e}", self.addr))?;
        match self.next(timeout).await? {
            Frame::ToolReply(r) => Ok(r),
            other => Err(format!("unexpected answer from the controller: {other:?}")),
        }
    }
}
