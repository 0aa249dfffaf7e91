//! The tools: the client side of the wire ([`client`]), `pctl` and `prun`. Each command's
//! `main` is called by the thin binary of the same name in `dvmlab-runtime`.

pub mod client;
pub mod pctl;
pub mod prun;
