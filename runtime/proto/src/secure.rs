//! The DVM key's secure channel, without IO: a Noise handshake in which both sides prove
//! they hold the DVM key, then every byte of the connection sealed in records. The shell
//! moves bytes; nothing here touches a socket, so the whole exchange runs in a unit test and
//! under the fuzzer.
//!
//! The pattern is `NNpsk0`: both sides make fresh ephemeral keys for every connection and the
//! DVM key is mixed in before the first message. A peer without the key cannot produce a
//! first message that decrypts, nor read the answer; a recorded handshake replayed later
//! meets a new ephemeral key and yields nothing it can use. No protocol frame is decoded
//! before its record authenticated.
//!
//! On the wire, handshake messages and records alike are a 2-byte big-endian length and that
//! many bytes (a Noise message is at most 65 535 bytes).

use std::sync::Arc;

use bytes::{Buf, BufMut, BytesMut};
use snow::{HandshakeState, StatelessTransportState};

/// The Noise protocol name: what both sides must agree on byte for byte.
pub const PATTERN: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
/// Bytes of a DVM key.
pub const KEY_LEN: usize = 32;
/// Largest Noise message.
const MAX_MESSAGE: usize = 65_535;
/// Bytes the AEAD tag adds to each record.
const TAG: usize = 16;
/// Plaintext bytes in one record.
pub const MAX_RECORD_PLAIN: usize = MAX_MESSAGE - TAG;

/// The DVM key: 32 random bytes shared by every daemon and tool the owner runs. Its text form
/// (a key file's one line) is 64 hexadecimal digits.
#[derive(Clone, PartialEq, Eq)]
pub struct DvmKey([u8; KEY_LEN]);

impl std::fmt::Debug for DvmKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DvmKey(..)")
    }
}

impl DvmKey {
    pub fn from_bytes(b: [u8; KEY_LEN]) -> DvmKey {
        DvmKey(b)
    }

    /// Parses a key file's text: one line of 64 hexadecimal digits (surrounding white space
    /// ignored). The error says what is wrong, never what the key is.
    pub fn parse(text: &str) -> Result<DvmKey, String> {
        let t = text.trim();
        if t.len() != 2 * KEY_LEN {
            return Err(format!(
                "expected one line of {} hexadecimal digits, found {} characters",
                2 * KEY_LEN,
                t.len()
            ));
        }
        let mut k = [0u8; KEY_LEN];
        for (i, pair) in t.as_bytes().chunks(2).enumerate() {
            let hex = std::str::from_utf8(pair).ok();
            k[i] = hex
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("character {} is not a hexadecimal digit", 2 * i + 1))?;
        }
        Ok(DvmKey(k))
    }

    /// The key file's text.
    pub fn to_text(&self) -> String {
        let mut s: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        s.push('\n');
        s
    }
}

fn builder(key: &DvmKey) -> Result<snow::Builder<'_>, String> {
    let params = PATTERN
        .parse()
        .map_err(|e| format!("noise pattern {PATTERN}: {e}"))?;
    snow::Builder::new(params)
        .psk(0, &key.0)
        .map_err(|e| format!("noise key: {e}"))
}

/// Appends `msg` with its 2-byte length.
fn framed(msg: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
}

/// One side's handshake in progress.
pub struct Handshake {
    state: HandshakeState,
}

impl Handshake {
    /// The connecting side: its handshake and the first message to send (framed).
    pub fn initiate(key: &DvmKey) -> Result<(Handshake, Vec<u8>), String> {
        let mut state = builder(key)?
            .build_initiator()
            .map_err(|e| format!("noise: {e}"))?;
        let mut buf = vec![0u8; MAX_MESSAGE];
        let n = state
            .write_message(&[], &mut buf)
            .map_err(|e| format!("noise: {e}"))?;
        let mut out = Vec::with_capacity(n + 2);
        framed(&buf[..n], &mut out);
        Ok((Handshake { state }, out))
    }

    /// The accepting side, before the first message.
    pub fn accept(key: &DvmKey) -> Result<Handshake, String> {
        let state = builder(key)?
            .build_responder()
            .map_err(|e| format!("noise: {e}"))?;
        Ok(Handshake { state })
    }

    /// Accepting side: takes the first message (unframed), answers with the second (framed)
    /// and the channel. Fails for a peer without the DVM key.
    pub fn respond(mut self, first: &[u8]) -> Result<(Vec<u8>, Channel), String> {
        let mut buf = vec![0u8; MAX_MESSAGE];
        self.state
            .read_message(first, &mut buf)
            .map_err(|_| "the peer does not hold the DVM key (handshake did not verify)")?;
        let n = self
            .state
            .write_message(&[], &mut buf)
            .map_err(|e| format!("noise: {e}"))?;
        let mut out = Vec::with_capacity(n + 2);
        framed(&buf[..n], &mut out);
        Ok((out, Channel::new(self.state)?))
    }

    /// Connecting side: takes the second message (unframed); the channel. Fails for a peer
    /// without the DVM key.
    pub fn finish(mut self, second: &[u8]) -> Result<Channel, String> {
        let mut buf = vec![0u8; MAX_MESSAGE];
        self.state
            .read_message(second, &mut buf)
            .map_err(|_| "the peer does not hold the DVM key (handshake did not verify)")?;
        Channel::new(self.state)
    }
}

/// Largest handshake message either side accepts: an `NNpsk0` message is an ephemeral key
/// and a tag (48 bytes), so anything much longer is not a handshake.
pub const MAX_HANDSHAKE_MESSAGE: usize = 256;

/// Splits length-prefixed messages off the front of a byte stream. It holds at most one
/// partial message once every complete one has been taken.
#[derive(Default)]
struct Deframer {
    buf: BytesMut,
}

impl Deframer {
    /// Adds received bytes.
    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete message, if one has arrived.
    fn next_message(&mut self) -> Option<BytesMut> {
        let len = u16::from_be_bytes([*self.buf.first()?, *self.buf.get(1)?]) as usize;
        if self.buf.len() < 2 + len {
            return None;
        }
        self.buf.advance(2);
        Some(self.buf.split_to(len))
    }
}

/// An established channel: seals what this side sends, opens what the other side sent.
/// Records are numbered implicitly, so a record dropped, repeated or reordered by anyone in
/// between fails to open, and the connection must end. It splits into a [`Sealer`] and an
/// [`Opener`] so a connection's writer and reader each own their direction.
pub struct Channel {
    sealer: Sealer,
    opener: Opener,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Channel(..)")
    }
}

impl Channel {
    fn new(state: HandshakeState) -> Result<Channel, String> {
        let transport = Arc::new(
            state
                .into_stateless_transport_mode()
                .map_err(|e| format!("noise: {e}"))?,
        );
        Ok(Channel {
            sealer: Sealer {
                transport: transport.clone(),
                nonce: 0,
            },
            opener: Opener {
                transport,
                nonce: 0,
                incoming: Deframer::default(),
            },
        })
    }

    /// The two directions, for a writer and a reader that run apart.
    pub fn split(self) -> (Sealer, Opener) {
        (self.sealer, self.opener)
    }
}

/// The sending direction of a [`Channel`]: the next record's number is this side's count
/// of records sent.
pub struct Sealer {
    transport: Arc<StatelessTransportState>,
    nonce: u64,
}

impl Sealer {
    /// Appends `plain`, sealed in records of at most [`MAX_RECORD_PLAIN`] bytes, to `out`.
    pub fn seal(&mut self, plain: &[u8], out: &mut impl BufMut) -> Result<(), String> {
        // Sized to the record, not to the largest message: zeroing 64 KiB for every small
        // frame was a visible share of a daemon's work per job.
        let mut buf = vec![0u8; plain.len().min(MAX_RECORD_PLAIN) + TAG];
        for piece in plain.chunks(MAX_RECORD_PLAIN) {
            let n = self
                .transport
                .write_message(self.nonce, piece, &mut buf)
                .map_err(|e| format!("sealing a record: {e}"))?;
            self.nonce += 1;
            out.put_u16(n as u16);
            out.put_slice(&buf[..n]);
        }
        Ok(())
    }
}

/// The receiving direction of a [`Channel`].
pub struct Opener {
    transport: Arc<StatelessTransportState>,
    nonce: u64,
    incoming: Deframer,
}

impl Opener {
    /// Whether part of a record has arrived and not the rest.
    pub fn holds_partial(&self) -> bool {
        !self.incoming.buf.is_empty()
    }

    /// Takes received bytes and appends the plaintext of every record they complete to
    /// `plain`; holds at most one partial record. An error means a record did not
    /// authenticate: the connection must end.
    pub fn open(&mut self, bytes: &[u8], plain: &mut impl BufMut) -> Result<(), String> {
        self.incoming.push(bytes);
        let mut buf = Vec::new();
        while let Some(rec) = self.incoming.next_message() {
            buf.resize(rec.len(), 0);
            let n = self
                .transport
                .read_message(self.nonce, &rec, &mut buf)
                .map_err(|_| "a record did not authenticate (tampered, replayed or reordered)")?;
            self.nonce += 1;
            plain.put_slice(&buf[..n]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> DvmKey {
        DvmKey([b; KEY_LEN])
    }

    /// One side's two directions.
    type Side = (Sealer, Opener);

    /// Runs a handshake between holders of `a` and `b`; both sides if it verified.
    fn pair(a: &DvmKey, b: &DvmKey) -> Result<(Side, Side), String> {
        let (hi, first) = Handshake::initiate(a)?;
        let mut d = Deframer::default();
        d.push(&first);
        let (second, rc) = Handshake::accept(b)?.respond(&d.next_message().unwrap())?;
        d.push(&second);
        let ic = hi.finish(&d.next_message().unwrap())?;
        Ok((ic.split(), rc.split()))
    }

    #[test]
    fn holders_of_the_key_exchange_bytes_in_records_of_any_size() {
        let ((mut a_seal, mut a_open), (mut b_seal, mut b_open)) = pair(&key(7), &key(7)).unwrap();
        let big: Vec<u8> = (0..200_000u32).map(|i| (i * 31) as u8).collect();
        let mut wire = Vec::new();
        a_seal.seal(&big, &mut wire).unwrap();
        a_seal.seal(b"after", &mut wire).unwrap();
        let mut got = Vec::new();
        // Delivered in awkward pieces, as TCP may.
        for piece in wire.chunks(777) {
            b_open.open(piece, &mut got).unwrap();
        }
        assert_eq!(&got[..big.len()], &big[..]);
        assert_eq!(&got[big.len()..], b"after");
        let mut back = Vec::new();
        b_seal.seal(b"reply", &mut back).unwrap();
        let mut got = Vec::new();
        a_open.open(&back, &mut got).unwrap();
        assert_eq!(got, b"reply");
    }

    #[test]
    fn a_peer_with_another_key_fails_the_handshake_either_way() {
        let e = pair(&key(1), &key(2)).err().unwrap();
        assert!(e.contains("does not hold the DVM key"), "{e}");
    }

    #[test]
    fn a_replayed_first_message_gives_the_replayer_nothing_it_can_use() {
        let k = key(9);
        let (_, first) = Handshake::initiate(&k).unwrap();
        // The responder answers a replay (it cannot tell), but the replayer, lacking the
        // initiator's ephemeral secret, can build no record the responder opens.
        let (_, responder) = Handshake::accept(&k).unwrap().respond(&first[2..]).unwrap();
        let (_, mut responder) = responder.split();
        let (hi, _) = Handshake::initiate(&k).unwrap();
        let (other_second, _) = Handshake::accept(&k)
            .unwrap()
            .respond(&Handshake::initiate(&k).unwrap().1[2..])
            .unwrap();
        let forged = hi.finish(&other_second[2..]);
        assert!(forged.is_err(), "a second message from another handshake");
        let mut junk = Vec::new();
        framed(&[0u8; 64], &mut junk);
        let mut plain = Vec::new();
        assert!(responder.open(&junk, &mut plain).is_err());
        assert!(plain.is_empty());
    }

    #[test]
    fn a_tampered_or_repeated_record_does_not_open() {
        let ((mut a, _), (_, mut b)) = pair(&key(3), &key(3)).unwrap();
        let mut wire = Vec::new();
        a.seal(b"hello", &mut wire).unwrap();
        let mut bad = wire.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let mut plain = Vec::new();
        assert!(b.open(&bad, &mut plain).is_err());
        let ((mut a, _), (_, mut b)) = pair(&key(3), &key(3)).unwrap();
        let mut wire = Vec::new();
        a.seal(b"once", &mut wire).unwrap();
        b.open(&wire, &mut plain).unwrap();
        assert!(b.open(&wire, &mut plain).is_err(), "replayed record");
    }

    #[test]
    fn key_text_round_trips_and_bad_text_says_what_is_wrong() {
        let k = key(0xab);
        assert_eq!(DvmKey::parse(&k.to_text()).unwrap(), k);
        assert!(DvmKey::parse("abc").unwrap_err().contains("64 hexadecimal"));
        let bad = format!("{}zz", "0".repeat(62));
        assert!(DvmKey::parse(&bad).unwrap_err().contains("character 63"));
        assert_eq!(format!("{k:?}"), "DvmKey(..)", "never printed");
    }
}
