//! The fuzz targets' bodies, shared by the cargo-fuzz binaries (`fuzz_targets/`) and by the
//! stable test that replays every corpus and regression input (`runtime/tests/fuzz_inputs.rs`).
//! Each takes any bytes and must neither panic nor grow without bound; where a round trip is
//! defined, it must hold.

use std::path::Path;

use bytes::BytesMut;
use tokio_util::codec::Decoder;

use dvmlab_core::conf::reader::ConfFile;
use dvmlab_core::conf::settings::{Params, Settings};
use dvmlab_proto::idset::IdSet;
use dvmlab_proto::secure::{DvmKey, Handshake};
use dvmlab_proto::wire::{encode_frame, Frame, FrameCodec};

/// Decodes frames from `data` until the codec wants more or refuses, both before the hello
/// (small frame limit) and after it; every frame decoded re-encodes to one that decodes
/// equal.
pub fn frame_decoder(data: &[u8]) {
    for accepted in [false, true] {
        let mut codec = FrameCodec::default();
        if accepted {
            codec.accepted();
        }
        let mut buf = BytesMut::from(data);
        while let Ok(Some(frame)) = codec.decode(&mut buf) {
            round_trip(&frame);
        }
    }
}

fn round_trip(frame: &Frame) {
    let bytes = encode_frame(frame).expect("a decoded frame re-encodes");
    let mut codec = FrameCodec::default();
    codec.accepted();
    let again = codec
        .decode(&mut BytesMut::from(&bytes[..]))
        .expect("a re-encoded frame decodes")
        .expect("whole");
    assert_eq!(&again, frame);
}

/// By the first byte: the accepting side of the key handshake fed the rest as its first
/// message (even), or the rest as records on a genuine channel, the way a peer that got
/// past the handshake could send anything (odd). Neither may panic.
pub fn handshake(data: &[u8]) {
    let key = DvmKey::from_bytes([7; 32]);
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        let _ = Handshake::accept(&key).map(|h| h.respond(rest));
        return;
    }
    let (hi, msg1) = Handshake::initiate(&key).expect("initiator");
    let (msg2, accepted) = Handshake::accept(&key)
        .expect("responder")
        .respond(&msg1[2..])
        .expect("a genuine first message verifies");
    hi.finish(&msg2[2..]).expect("a genuine answer verifies");
    let mut codec = FrameCodec::sealed(accepted);
    let mut buf = BytesMut::from(rest);
    while let Ok(Some(frame)) = codec.decode(&mut buf) {
        round_trip(&frame);
    }
}

/// `data` as a `prte.conf` (with every `file:` node list reading `data` again), through the
/// reader, the key validation and the `DVMNodes` parser.
pub fn conf(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(file) = ConfFile::parse(text, Path::new("/etc/prte.conf")) else {
        return;
    };
    let params = Params::new(Vec::new(), Vec::new());
    let _ = Settings::resolve(&file, &params, &|_| Ok(text.to_string()));
}

/// `data` as an RFC 22 idset; what decodes re-encodes to the same set, and the canonical
/// text decodes back to it.
pub fn idset(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(set) = IdSet::decode(text) {
        for brackets in [false, true] {
            let again = IdSet::decode(&set.encode(brackets)).expect("canonical text decodes");
            assert_eq!(again, set);
        }
    }
}
