//! dvmlab's sans-IO cores. Each is a plain type that takes inputs (the time as an argument)
//! and returns outputs; [`daemon_core::DaemonCore`] composes them into one daemon, and is the
//! only thing the tokio shell (`dvmlab-prted`) and the simulator (`dvmlab-sim`) drive.
//!
//! No tokio, no nix, no file, clock or environment access in here (enforced by this crate's
//! dependencies and `clippy.toml`): `conf` parses text it is given, and reads nothing.

pub mod campaign;
pub mod conf;
pub mod daemon_core;
pub mod diag;
pub mod elastic;
pub mod event;
pub mod exec;
pub mod held_removes;
pub mod hostname;
pub mod identity;
pub mod jobs;
pub mod net;
pub mod overlay;
pub mod roster;
pub mod tree;
pub mod uplink;
