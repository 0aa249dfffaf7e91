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

/// Replaces `path` by `json`, whole or not at all (a sibling written, then renamed over it):
/// a controller killed meanwhile leaves the old file, never half a new one.
pub fn replace_json(path: &Path, json: serde_json::Result<Vec<u8>>) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    json.map_err(std::io::Error::other)
        .and_then(|b| std::fs::write(&tmp, b))
        .and_then(|()| std::fs::rename(&tmp, path))
}

/// Writes the controller's list of live jobs to its file, off the daemon's thread: replacing
/// a file by rename costs about a millisecond on ext4 (it flushes the new data first), which
/// every job would otherwise wait for several times. Only the latest list is written when
/// several are queued; dropping the value writes what is queued before it returns, so a
/// controller that stops leaves its last list behind. A controller killed within that
/// millisecond of a submit loses the job; its daemons then end it as unknown, as they do for
/// any job the controller forgot.
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
