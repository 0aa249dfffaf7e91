//! The tools: the client side of the wire ([`client`]), the events client library
//! ([`events`]), `pctl`, `prun` and `pevent`. Each command's
//! `main` is called by the thin binary of the same name in `dvmlab-runtime`.

pub mod client;
pub mod events;
pub mod pctl;
pub mod pevent;
pub mod prun;
