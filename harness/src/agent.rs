//! The harness's launch agent: what `ssh HOST COMMAND ARGS…` is to real machines, for the
//! hosts of one run. A cluster writes a small script into its run directory naming this
//! run's hosts file; the script runs `dvmlab-harness agent`, which enters the host (its
//! network namespace, `/etc` and host name, or for process hosts just their identity
//! environment) and becomes COMMAND there.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

/// How to run something on one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentHost {
    pub name: String,
    /// The host's network namespace (netns hosts).
    pub netns: Option<String>,
    pub etc_dir: PathBuf,
    /// Everything the process starts with.
    pub env: Vec<(String, String)>,
}

/// Writes `dir/agent.json` and the script `dir/agent`; returns the script's path.
pub fn write(dir: &Path, harness: &Path, hosts: &[AgentHost]) -> Result<PathBuf, String> {
    let spec = dir.join("agent.json");
    let json = serde_json::to_string_pretty(hosts).map_err(|e| e.to_string())?;
    std::fs::write(&spec, json).map_err(|e| format!("write {}: {e}", spec.display()))?;
    let script = dir.join("agent");
    let text = format!(
        "#!/bin/sh\n# The launch agent of this harness run: agent HOST COMMAND ARGS...\nexec '{}' agent --hosts '{}' \"$@\"\n",
        harness.display(),
        spec.display()
    );
    std::fs::write(&script, text).map_err(|e| format!("write {}: {e}", script.display()))?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", script.display()))?;
    Ok(script)
}

/// Becomes `argv` on `host` of the run described by `hosts_file`; returns only on failure.
pub fn exec(hosts_file: &Path, host: &str, argv: &[String]) -> String {
    let hosts: Vec<AgentHost> = match std::fs::read_to_string(hosts_file)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
    {
        Ok(h) => h,
        Err(e) => return format!("{}: {e}", hosts_file.display()),
    };
    let Some(h) = hosts.iter().find(|h| h.name == host) else {
        return format!("no host {host} in {}", hosts_file.display());
    };
    let Some((prog, args)) = argv.split_first() else {
        return "no command to run".into();
    };
    let mut cmd = Command::new(prog);
    cmd.args(args).env_clear().envs(h.env.iter().cloned());
    if let Some(ns) = &h.netns {
        if let Err(e) = crate::netns::enter_named(&mut cmd, ns, &h.name, &h.etc_dir) {
            return format!("entering host {host}: {e}");
        }
    }
    let e: io::Error = cmd.exec();
    format!("{prog}: {e}")
}
