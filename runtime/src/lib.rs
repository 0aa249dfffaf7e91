//! dvmlab's runtime: `prted` daemons that form a DVM by the bootstrap method, and `pctl`.
//!
//! The protocol and state machines are sans-IO types (`conf`, `identity`, `tree`, `net`,
//! `uplink`, `node`, `wire`, `idset`); `hosts`, `bootstrap`, `daemon` and `client` do the IO around
//! them. See `ARCHITECTURE.md` at the repository root.

pub mod bootstrap;
pub mod client;
pub mod conf;
pub mod contract;
pub mod daemon;
pub mod daemon_core;
pub mod diag;
pub mod hostname;
pub mod hosts;
pub mod identity;
pub mod idset;
pub mod jobexec;
pub mod jobmgr;
pub mod limits;
pub mod net;
pub mod node;
pub mod placement;
pub mod roster;
pub mod stdout;
pub mod tree;
pub mod uplink;
pub mod wire;
