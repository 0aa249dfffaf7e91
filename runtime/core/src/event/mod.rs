//! PMIx event notification (RFC 0002) without IO: a process's handler registrations and
//! their order ([`registry`]), one event's chain through them ([`chain`]), a daemon's events
//! server for the clients on its node with the events it keeps for late comers
//! ([`server`]), one job process or tool ([`client`]), and PMIx's names and numbers ([`codes`]). The client library runs chains in
//! job processes and tools; the daemon runs one for its own registrations.

pub mod chain;
pub mod client;
pub mod codes;
pub mod range;
pub mod registry;
pub mod server;
