//! Log output of a daemon: stderr, plus the file named by `ControllerLogPath` / `PRTEDLogPath`.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::Mutex;

use tracing::level_filters::LevelFilter;
use tracing_subscriber::fmt::writer::MakeWriterExt;

/// The level from `DVMLAB_LOG` (error, warn, info, debug, trace), info by default.
fn level() -> LevelFilter {
    std::env::var("DVMLAB_LOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(LevelFilter::INFO)
}

/// Installs the global subscriber, writing to stderr and, if given, appending to `file`.
pub fn init(file: Option<&Path>) -> io::Result<()> {
    let builder = tracing_subscriber::fmt()
        .with_max_level(level())
        .with_target(false)
        .with_ansi(false);
    let res = match file {
        Some(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let f: File = OpenOptions::new().create(true).append(true).open(path)?;
            builder
                .with_writer(io::stderr.and(Mutex::new(f)))
                .try_init()
        }
        None => builder.with_writer(io::stderr).try_init(),
    };
    res.map_err(|e| io::Error::other(e.to_string()))
}
