//! The black-box conformance suite arrives with the conformance issue.
