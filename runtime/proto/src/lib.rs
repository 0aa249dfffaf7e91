//! dvmlab's protocol: every frame a DVM process sends ([`wire`]), the job-exec messages
//! ([`exec`]), PMIx events ([`event`]), the launch service's messages ([`launch`]), where a job runs ([`placement`]), RFC 22 idsets ([`idset`]), the JSON shapes
//! tools print ([`contract`]) and every limit ([`limits`]). Types and encodings only: no
//! state machines, no IO.

#[cfg(feature = "codec")]
pub mod codec;
pub mod contract;
pub mod event;
pub mod exec;
pub mod idset;
pub mod launch;
pub mod limits;
pub mod placement;
pub mod secure;
pub mod tagged;
pub mod wire;

/// A daemon rank in the DVM namespace; the controller is rank 0.
pub type Rank = u32;
