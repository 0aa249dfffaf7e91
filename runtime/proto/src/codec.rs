//! The tokio-util codec for [`Frame`]s over a byte stream (feature `codec`): what the
//! daemon's shell and the tools read and write with. The cores never touch it.

use bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec};

use crate::limits::{MAX_FRAME, MAX_HELLO_FRAME};
use crate::wire::{encode_frame, Frame};

/// The codec for [`Frame`]s over any byte stream. It starts with the small pre-hello frame
/// limit; [`FrameCodec::accepted`] raises it once the peer's hello is accepted.
#[derive(Debug)]
pub struct FrameCodec {
    inner: LengthDelimitedCodec,
}

impl Default for FrameCodec {
    fn default() -> Self {
        FrameCodec {
            inner: LengthDelimitedCodec::builder()
                .max_frame_length(MAX_HELLO_FRAME)
                .new_codec(),
        }
    }
}

impl FrameCodec {
    /// The peer's hello was accepted (or ours was welcomed): full-size frames from now on.
    pub fn accepted(&mut self) {
        self.inner.set_max_frame_length(MAX_FRAME);
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = std::io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, Self::Error> {
        match self.inner.decode(src)? {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("undecodable frame: {e}"),
                )
            }),
        }
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = std::io::Error;

    fn encode(&mut self, item: Frame, dst: &mut BytesMut) -> Result<(), Self::Error> {
        let bytes = encode_frame(&item).map_err(std::io::Error::other)?;
        dst.extend_from_slice(&bytes);
        Ok(())
    }
}
