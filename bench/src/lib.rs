//! Benchmarks that compare: every figure beside what it is compared with in the same run —
//! the machine's own floor for the same work ([`floor`]), another runtime driven through its
//! conformance profile ([`driver`]; job by job in pairs, [`pair`]), or Open MPI ([`peers`]);
//! each timed run of a DVM's jobs starts on a quiet machine ([`quiet`]); and a job taken
//! apart, its CPU split by who ran it beside its floor's ([`anatomy`]).

pub mod anatomy;
pub mod driver;
pub mod floor;
pub mod pair;
pub mod peers;
pub mod plot;
pub mod procfs;
pub mod quiet;
pub mod report;
pub mod stamp;
pub mod stats;
