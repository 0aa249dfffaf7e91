//! What the lab's end-to-end tests share: running `lab` from the workspace.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const LAB: &str = env!("CARGO_BIN_EXE_lab");

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// `lab ARGS`, run in the workspace.
pub fn lab(args: &[&str]) -> Output {
    Command::new(LAB)
        .args(args)
        .current_dir(workspace())
        .output()
        .unwrap()
}

/// `lab ARGS`, which must succeed; its stdout.
pub fn ok(args: &[&str]) -> String {
    let o = lab(args);
    assert!(
        o.status.success(),
        "lab {args:?}: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Takes the lab down however the test ends, printing these hosts' logs on failure.
pub struct Down(pub &'static [&'static str]);

impl Drop for Down {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for host in self.0 {
                let o = lab(&["logs", host]);
                eprintln!(
                    "---- {host} ----\n{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
            }
        }
        let _ = lab(&["down"]);
    }
}
