//! The lab CLI (Docker cluster of the runtime) arrives with the lab issue.
