//! PMIx event notification (RFC 0002) without IO: a process's handler registrations and
//! their order ([`registry`]), one event's chain through them ([`chain`]), a job process or
//! tool ([`client`]), a daemon's events server for the clients on its node with the events
//! it keeps for late comers ([`server`]), where a notification goes by its range
//! ([`range`]), which events a daemon needs from its parent ([`interest`]), and a daemon's
//! whole events side with the tree ([`hub`]). The data
//! (events, directives, codes, ranges, messages) is `dvmlab_proto::event`.

pub mod chain;
pub mod client;
pub mod hub;
pub mod interest;
pub mod range;
pub mod registry;
pub mod server;
