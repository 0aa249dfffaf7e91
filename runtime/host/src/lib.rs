//! The IO half of identity, shared by the daemon and the tools: reading `prte.conf` and its
//! `file:` node lists from disk ([`conf_file`]), this host's names and addresses and the
//! resolution of the others ([`hosts`]), the DVM key file ([`keyfile`]), what a daemon works out before it listens
//! ([`bootstrap`]), and line output that never panics on a closed pipe ([`stdout`]).

pub mod bootstrap;
pub mod conf_file;
pub mod hosts;
pub mod keyfile;
pub mod stdout;
