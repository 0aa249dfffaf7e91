//! `prte.conf` from disk: the one place its file (and the `file:` node lists it names) is
//! read, and where a process's parameters take in its environment. Interpreting them is
//! `dvmlab_core::conf`'s alone.

use std::path::Path;

use dvmlab_core::conf::{ConfFile, Params, Settings};
use dvmlab_core::diag::{Diagnostic, Kind, Origin};

/// Parameters from the command line (`--prtemca` pairs) and this process's environment.
pub fn process_params(cli: Vec<(String, String)>) -> Params {
    Params::new(cli, std::env::vars())
}

/// A tool's parameters: its `--prtemca NAME VALUE` words, `--conf`, and its environment.
pub fn tool_params(prtemca: &[String], conf: Option<&str>) -> Params {
    Params::for_tool(prtemca, conf, std::env::vars())
}

/// Loads `prte.conf` from where `params` say and resolves it, reading `file:` node lists from
/// disk. Both the daemon and the tools call this.
pub fn load(params: &Params) -> Result<Settings, Diagnostic> {
    let conf = read(&params.conf_path())?;
    Settings::resolve(&conf, params, &|p| std::fs::read_to_string(p))
}

/// Reads and parses the file at `path`.
pub fn read(path: &Path) -> Result<ConfFile, Diagnostic> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Diagnostic::new(
            Kind::Unreadable,
            Origin::File {
                path: path.to_path_buf(),
                line: None,
            },
            format!("cannot read configuration file: {e}"),
            path.display().to_string(),
        )
    })?;
    ConfFile::parse(&text, path)
}
