//! The tokio-util codec for [`Frame`]s over a byte stream (feature `codec`): what the
//! daemon's shell and the tools read and write with, in the clear or inside the DVM key's
//! secure channel. The cores never touch it.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec};

use crate::limits::{MAX_FRAME, MAX_HELLO_FRAME};
use crate::secure::{Channel, DvmKey, Handshake, Opener, Sealer, MAX_HANDSHAKE_MESSAGE};
use crate::wire::{encode_frame, Frame};

/// The codec for [`Frame`]s over any byte stream. It starts with the small pre-hello frame
/// limit; [`FrameCodec::accepted`] raises it once the peer's hello is accepted. With an
/// [`Opener`], bytes are records of the secure channel and only what authenticates is ever
/// decoded as a frame; with a [`Sealer`], frames are sealed before they are written.
pub struct FrameCodec {
    inner: LengthDelimitedCodec,
    opener: Option<Opener>,
    sealer: Option<Sealer>,
    /// Opened bytes not yet decoded: at most one frame (the inner codec's limit) and a record.
    plain: BytesMut,
}

impl std::fmt::Debug for FrameCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameCodec")
            .field("secure", &self.opener.is_some())
            .finish()
    }
}

impl Default for FrameCodec {
    fn default() -> Self {
        FrameCodec {
            inner: LengthDelimitedCodec::builder()
                .max_frame_length(MAX_HELLO_FRAME)
                .new_codec(),
            opener: None,
            sealer: None,
            plain: BytesMut::new(),
        }
    }
}

impl FrameCodec {
    /// Frames inside `channel`, both ways.
    pub fn sealed(channel: Channel) -> FrameCodec {
        let (sealer, opener) = channel.split();
        FrameCodec {
            opener: Some(opener),
            sealer: Some(sealer),
            ..FrameCodec::default()
        }
    }

    /// Frames read from a secure channel whose sending half is elsewhere, or in the clear.
    pub fn reading(opener: Option<Opener>) -> FrameCodec {
        FrameCodec {
            opener,
            ..FrameCodec::default()
        }
    }

    /// The peer's hello was accepted (or ours was welcomed): full-size frames from now on.
    pub fn accepted(&mut self) {
        self.inner.set_max_frame_length(MAX_FRAME);
    }
}

fn invalid(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        let body = match &mut self.opener {
            None => self.inner.decode(src)?,
            Some(opener) => {
                // Every byte is taken into the opener at once, so the read buffer never
                // holds more than one read; what is opened waits in `plain`.
                if !src.is_empty() {
                    opener.open(src, &mut self.plain).map_err(invalid)?;
                    src.clear();
                }
                self.inner.decode(&mut self.plain)?
            }
        };
        match body {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| invalid(format!("undecodable frame: {e}"))),
        }
    }

    /// A connection that ends inside a record or a frame was cut, not closed.
    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        if let Some(frame) = self.decode(src)? {
            return Ok(Some(frame));
        }
        let partial = !src.is_empty()
            || !self.plain.is_empty()
            || self.opener.as_ref().is_some_and(|o| o.holds_partial());
        if partial {
            return Err(invalid("the connection ended in the middle of a frame"));
        }
        Ok(None)
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = std::io::Error;

    fn encode(&mut self, item: Frame, dst: &mut BytesMut) -> Result<(), Self::Error> {
        let bytes = encode_frame(&item).map_err(std::io::Error::other)?;
        match &mut self.sealer {
            None => dst.extend_from_slice(&bytes),
            Some(s) => s.seal(&bytes, dst).map_err(std::io::Error::other)?,
        }
        Ok(())
    }
}

/// Reads one handshake message (2-byte length, then that many bytes), refusing one longer
/// than any handshake message. Reads exactly that much: nothing after it is consumed.
async fn read_message<S: AsyncRead + Unpin>(s: &mut S) -> Result<Vec<u8>, String> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len)
        .await
        .map_err(|e| format!("closed during the key handshake ({e})"))?;
    let len = u16::from_be_bytes(len) as usize;
    if len == 0 || len > MAX_HANDSHAKE_MESSAGE {
        return Err(format!(
            "sent {len} bytes where a key handshake message belongs: it does not use the DVM key"
        ));
    }
    let mut msg = vec![0u8; len];
    s.read_exact(&mut msg)
        .await
        .map_err(|e| format!("closed during the key handshake ({e})"))?;
    Ok(msg)
}

/// The connecting side of the DVM key handshake on `s`; the channel, once the other side
/// proved it holds `key`. The caller bounds the time it may take.
pub async fn initiate<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    key: &DvmKey,
) -> Result<Channel, String> {
    let (hs, first) = Handshake::initiate(key)?;
    s.write_all(&first)
        .await
        .map_err(|e| format!("key handshake: {e}"))?;
    let second = read_message(s).await?;
    hs.finish(&second)
}

/// The accepting side of the DVM key handshake on `s`; the channel, once the other side
/// proved it holds `key`. The caller bounds the time it may take.
pub async fn respond<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    key: &DvmKey,
) -> Result<Channel, String> {
    let first = read_message(s).await?;
    // The Diffie-Hellman work runs on the blocking pool: a parent answering many children at
    // once uses every core, and its event loop stays free meanwhile.
    let key = key.clone();
    let (second, channel) =
        tokio::task::spawn_blocking(move || Handshake::accept(&key)?.respond(&first))
            .await
            .map_err(|e| format!("key handshake: {e}"))??;
    s.write_all(&second)
        .await
        .map_err(|e| format!("key handshake: {e}"))?;
    Ok(channel)
}

/// Sends `plain` (at most [`crate::secure::MAX_RECORD_PLAIN`] bytes) as one record of the
/// secure channel: a message exchange that needs no frames (the launch service's).
pub async fn write_sealed<S: AsyncWrite + Unpin>(
    s: &mut S,
    sealer: &mut Sealer,
    plain: &[u8],
) -> Result<(), String> {
    if plain.len() > crate::secure::MAX_RECORD_PLAIN {
        return Err(format!(
            "a message of {} bytes does not fit one record ({} at most)",
            plain.len(),
            crate::secure::MAX_RECORD_PLAIN
        ));
    }
    let mut out = BytesMut::new();
    sealer.seal(plain, &mut out)?;
    s.write_all(&out).await.map_err(|e| format!("sending: {e}"))
}

/// Reads one record of the secure channel and opens it; an error for a connection that
/// ends first or a record that does not authenticate.
pub async fn read_sealed<S: AsyncRead + Unpin>(
    s: &mut S,
    opener: &mut Opener,
) -> Result<Vec<u8>, String> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len)
        .await
        .map_err(|e| format!("closed before a message ({e})"))?;
    let mut record = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut record)
        .await
        .map_err(|e| format!("closed in the middle of a message ({e})"))?;
    let mut plain = Vec::new();
    opener.open(&len, &mut plain)?;
    opener.open(&record, &mut plain)?;
    Ok(plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sealed_message_reaches_only_a_holder_of_the_key_and_arrives_whole() {
        let key = DvmKey::from_bytes([3; 32]);
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        let k = key.clone();
        let server = tokio::spawn(async move {
            let (_, mut opener) = respond(&mut b, &k).await?.split();
            read_sealed(&mut b, &mut opener).await
        });
        let (mut sealer, _) = initiate(&mut a, &key).await.unwrap().split();
        let msg: Vec<u8> = (0..60_000u32).map(|i| i as u8).collect();
        write_sealed(&mut a, &mut sealer, &msg).await.unwrap();
        assert_eq!(server.await.unwrap().unwrap(), msg);
        let too_big = vec![0u8; crate::secure::MAX_RECORD_PLAIN + 1];
        let e = write_sealed(&mut a, &mut sealer, &too_big)
            .await
            .unwrap_err();
        assert!(e.contains("does not fit one record"), "{e}");

        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        let server = tokio::spawn(async move { respond(&mut b, &key).await.map(|_| ()) });
        let e = initiate(&mut a, &DvmKey::from_bytes([4; 32])).await;
        assert!(e.is_err(), "a stranger's handshake must not verify");
        let e = server.await.unwrap().unwrap_err();
        assert!(e.contains("does not hold the DVM key"), "{e}");
    }
}
