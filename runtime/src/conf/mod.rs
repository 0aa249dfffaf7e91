//! Reading the bootstrap configuration: the `Key=Value` reader, the `DVMNodes` parser and the
//! resolved settings. This module is the only place `prte.conf` is interpreted.

pub mod nodes;
pub mod reader;
pub mod settings;

pub use nodes::NodeEntry;
pub use reader::ConfFile;
pub use settings::{Family, NetSpec, Params, Settings};

use crate::diag::Diagnostic;

/// Loads `prte.conf` from where `params` say and resolves it, reading `file:` node lists from
/// disk. Both the daemon and the controller-side tools call this.
pub fn load(params: &Params) -> Result<Settings, Diagnostic> {
    let conf = ConfFile::load(&params.conf_path())?;
    Settings::resolve(&conf, params, &|p| std::fs::read_to_string(p))
}
