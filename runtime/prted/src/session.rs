//! The daemon's session directory: where it leaves its contact URI and pid for tools and
//! operators, removed again on a clean exit.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// A created session directory, removed by [`Session::remove`].
#[derive(Debug)]
pub struct Session {
    dir: PathBuf,
}

impl Session {
    /// Creates `dir` and writes `contact` (the URI) and `pid` into it. The directory and its
    /// parent must be this user's and writable by no one else (a parent may also be root's,
    /// or sticky like `/tmp`): whoever could change them could put a socket of their own
    /// where the tools of this node look for the daemon's.
    pub fn create(dir: &Path, uri: &str) -> io::Result<Session> {
        if let Some(parent) = dir.parent() {
            if let Some(grand) = parent.parent() {
                std::fs::create_dir_all(grand)?;
            }
            private_dir(parent, true)?;
        }
        private_dir(dir, false)?;
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

/// Makes `dir` (mode 0711: others may reach the tools socket in it by name, but neither list
/// nor change it) unless it exists, and refuses one that is a link, another user's, or
/// writable by others. `shared`: it may also be root's, or world-writable with the sticky
/// bit (where no one can replace another's entries).
fn private_dir(dir: &Path, shared: bool) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o711).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let m = std::fs::symlink_metadata(dir)?;
    let me = nix::unistd::geteuid().as_raw();
    let refuse = |why: String| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{}: {why}; refusing to keep the daemon's session there",
                dir.display()
            ),
        ))
    };
    if !m.file_type().is_dir() {
        return refuse("not a directory".into());
    }
    let sticky = m.mode() & 0o1000 != 0;
    let others_write = m.mode() & 0o022 != 0;
    let ok = if shared {
        (m.uid() == me || m.uid() == 0) && (!others_write || sticky)
    } else {
        m.uid() == me && !others_write
    };
    if !ok {
        return refuse(format!(
            "owned by uid {} with mode {:04o} (it must be this user's, uid {me}, and writable by no one else)",
            m.uid(),
            m.mode() & 0o7777
        ));
    }
    Ok(())
}
