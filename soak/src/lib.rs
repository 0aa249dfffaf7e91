//! dvmlab's soak: a big elastic DVM on harness hosts under a seeded workload and nemesis
//! for as long as asked, every operation, fault and membership change recorded as a
//! history, and an independent checker that judges the history alone.
//!
//! `history` is the only thing the runner and the checker share.

pub mod checker;
pub mod driver;
pub mod history;
pub mod logs;
pub mod nemesis;
pub mod observer;
pub mod report;
pub mod soak;
pub mod workload;
