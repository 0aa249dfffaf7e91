//! dvmlab's black-box conformance suite.
//!
//! It judges a DVM runtime item by item against the specs: each item of a spec's catalog
//! (`catalog/<spec>.toml`) is a trial, judged by the tests the catalog names for it. The
//! tests see the implementation only through a profile (`profiles/*.toml`: the daemon
//! command, where the configuration goes, how to read status and stop the DVM) and the
//! harness's hosts and faults, so the suite runs on a runtime it has never seen.
//!
//! Code map: [`runner`] (libtest-compatible trials, sharing, records), [`catalog`] and
//! [`traceability`] (the items and the matrix), [`profile`], [`knobs`] (matrix cells),
//! [`sut`] (the implementation on a cluster), [`listeners`] (its PMIx event listeners
//! and notifications), [`status`] (the JSON it must print),
//! [`checks`] (the tests), [`report`] (results.json, JUnit, Markdown), [`outcome`].

pub mod catalog;
pub mod checks;
pub mod knobs;
pub mod listeners;
pub mod outcome;
pub mod profile;
pub mod report;
pub mod runner;
pub mod status;
pub mod sut;
pub mod traceability;
