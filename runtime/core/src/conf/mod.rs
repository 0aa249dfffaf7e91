//! Reading the bootstrap configuration: the `Key=Value` reader, the `DVMNodes` parser and the
//! resolved settings. This module is the only place `prte.conf` is interpreted.

pub mod nodes;
pub mod reader;
pub mod settings;

pub use nodes::NodeEntry;
pub use reader::ConfFile;
pub use settings::{Family, NetSpec, Params, Settings};

// Reading the file (and its `file:` node lists) from disk is `dvmlab_host::conf_file`'s.
