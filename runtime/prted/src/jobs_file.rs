//! The controller's list of live jobs on disk, in its session directory, so that a restarted
//! controller recovers them.

use std::path::{Path, PathBuf};

use tracing::warn;

use dvmlab_core::jobs::{Persisted, Saved};

/// The live jobs and next job id a previous life of this controller left in `path` (none if
/// there is no file, or a file that is not a job list, which is said in the log). A bare
/// list of jobs, as earlier versions wrote, is read too.
pub fn read(path: &Path) -> Saved {
    let saved = match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str::<Saved>(&text)
            .or_else(|_| {
                serde_json::from_str::<Vec<Persisted>>(&text).map(|live| Saved { next_id: 0, live })
            })
            .unwrap_or_else(|e| {
                warn!(
                    "{}: not a job list ({e}); starting with none",
                    path.display()
                );
                Saved::default()
            }),
        Err(_) => Saved::default(),
    };
    if !saved.live.is_empty() {
        warn!(
            "recovering {} running job(s) after a restart",
            saved.live.len()
        );
    }
    saved
}

/// Replaces `path` by `json`, whole or not at all: a controller killed meanwhile leaves the
/// old file, never half a new one. The new text is written into a sibling, which is then
/// swapped with `path` (`RENAME_EXCHANGE`), so the sibling keeps the previous text and is
/// written over next time. Renaming a fresh file over `path` instead made ext4 allocate an
/// inode and free (and, mounted with `discard`, discard) another every time: its search for
/// a free inode skips recently freed ones, so each write cost more than the last (a
/// millisecond and more of the controller's CPU per job after a few hundred jobs). Where the
/// exchange is not possible (no `path` yet, a filesystem without it) the sibling is renamed.
pub fn replace_json(path: &Path, json: serde_json::Result<Vec<u8>>) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let bytes = json.map_err(std::io::Error::other)?;
    let tmp = path.with_extension("tmp");
    // Not truncated first: writing over the old text and cutting what is left frees no
    // block in the common case, where the list stays within the same block.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&tmp)?;
    f.write_all_at(&bytes, 0)?;
    f.set_len(bytes.len() as u64)?;
    drop(f);
    let exchanged = nix::fcntl::renameat2(
        nix::fcntl::AT_FDCWD,
        &tmp,
        nix::fcntl::AT_FDCWD,
        path,
        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
    );
    match exchanged {
        Ok(()) => Ok(()),
        Err(_) => std::fs::rename(&tmp, path),
    }
}

/// Writes the controller's list of live jobs to its file, off the daemon's thread: replacing
/// a file costs a tenth of a millisecond and more of filesystem work, which every job would
/// otherwise wait for twice. Only the latest list is written when several are queued;
/// dropping the value writes what is queued before it returns, so a controller that stops
/// leaves its last list behind. A controller killed within that moment after a submit loses
/// the job; its daemons then end it as unknown, as they do for any job the controller forgot.
pub struct JobsFile {
    latest: Option<std::sync::mpsc::Sender<Saved>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl JobsFile {
    pub fn start(path: PathBuf) -> JobsFile {
        let (latest, rx) = std::sync::mpsc::channel::<Saved>();
        let writer = std::thread::spawn(move || {
            crate::helper_thread_ignores_signals();
            while let Ok(mut live) = rx.recv() {
                while let Ok(newer) = rx.try_recv() {
                    live = newer;
                }
                let res = replace_json(&path, serde_json::to_vec(&live));
                if let Err(e) = res {
                    warn!("cannot keep the job list in {}: {e}", path.display());
                }
            }
        });
        JobsFile {
            latest: Some(latest),
            writer: Some(writer),
        }
    }

    pub fn write(&self, live: Saved) {
        if let Some(tx) = &self.latest {
            // Fails only once the writer is gone, which happens only in drop.
            let _ = tx.send(live);
        }
    }
}

impl Drop for JobsFile {
    fn drop(&mut self) {
        // Closing the channel ends the writer after its last write.
        self.latest = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::os::unix::fs::MetadataExt;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("dvmlab-jobs-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    #[test]
    fn each_replacement_leaves_exactly_the_new_list() {
        let dir = scratch("whole");
        let path = dir.join("jobs.json");
        replace_json(
            &path,
            Ok(br#"{"next_id":7,"live":[{"long":"aaaaaaaaaaaa"}]}"#.to_vec()),
        )
        .expect("first write");
        replace_json(&path, Ok(br#"{"next_id":8,"live":[]}"#.to_vec())).expect("second write");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            r#"{"next_id":8,"live":[]}"#
        );
        replace_json(
            &path,
            Ok(br#"{"next_id":9,"live":[1,2,3,4,5,6,7,8]}"#.to_vec()),
        )
        .expect("third write");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            r#"{"next_id":9,"live":[1,2,3,4,5,6,7,8]}"#
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn replacing_the_list_reuses_two_files_rather_than_making_one_per_write() {
        let dir = scratch("inodes");
        let path = dir.join("jobs.json");
        let mut inodes = BTreeSet::new();
        for i in 0..20 {
            replace_json(
                &path,
                Ok(format!(r#"{{"next_id":{i},"live":[]}}"#).into_bytes()),
            )
            .expect("write");
            inodes.insert(std::fs::metadata(&path).expect("stat").ino());
        }
        assert!(
            inodes.len() <= 2,
            "the list went through {} files",
            inodes.len()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
