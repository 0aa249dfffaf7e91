//! The daemon's session directory: where it leaves its contact URI and pid for tools and
//! operators, removed again on a clean exit.

use std::io;
use std::path::{Path, PathBuf};

/// A created session directory, removed by [`Session::remove`].
#[derive(Debug)]
pub struct Session {
    dir: PathBuf,
}

impl Session {
    /// Creates `dir` and writes `contact` (the URI) and `pid` into it.
    pub fn create(dir: &Path, uri: &str) -> io::Result<Session> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("contact"), format!("{uri}\n"))?;
        std::fs::write(dir.join("pid"), format!("{}\n", std::process::id()))?;
        Ok(Session {
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Removes the directory, and its parent if that is now empty (the DVM-wide directory
    /// under `DVMTempDir`).
    pub fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}
