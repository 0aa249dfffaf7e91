//! The harness's launch agent: what `ssh HOST COMMAND ARGS…` is to real machines, for the
//! hosts of one run. A cluster writes a small script into its run directory naming this
//! run's hosts file; the script runs `dvmlab-harness agent`, which enters the host (its
//! network namespace, `/etc` and host name; a docker host's container; or for process hosts
//! just their identity environment) and becomes COMMAND there.

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
    /// The pid of the host's container, and the directory to work in there (docker hosts).
    #[serde(default)]
    pub container: Option<(u32, PathBuf)>,
    pub etc_dir: PathBuf,
    /// Everything the process starts with.
    pub env: Vec<(String, String)>,
    /// The host's log, which the command's output is appended to (as a daemon the cluster
    /// starts writes there), so a launched daemon's lines are found under its own host.
    #[serde(default)]
    pub log: Option<PathBuf>,
}

/// The `dvmlab-harness` program beside the calling test binary (`<target>/<profile>/`),
/// built first (once per process) so that it is never stale.
pub fn program() -> Result<PathBuf, String> {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let (dir, profile) = build_dir()?;
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
            let st = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .args([
                    "build",
                    "--quiet",
                    "--bin",
                    "dvmlab-harness",
                    "--profile",
                    &profile,
                ])
                .arg("--manifest-path")
                .arg(&manifest)
                .status()
                .map_err(|e| format!("building dvmlab-harness: {e}"))?;
            let program = dir.join("dvmlab-harness");
            if !st.success() || !program.exists() {
                return Err(format!(
                    "building dvmlab-harness ({st}) left no {}",
                    program.display()
                ));
            }
            Ok(program)
        })
        .clone()
}

/// The cargo build directory this program runs from (`<target>/<profile>`, for a test
/// binary in its `deps/` as for a program beside it) and the cargo profile that made it.
pub fn build_dir() -> Result<(PathBuf, String), String> {
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let mut dir = exe
        .parent()
        .ok_or("no directory above this program")?
        .to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    let profile = match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_string(),
        Some(other) => other.to_string(),
    };
    Ok((dir, profile))
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

/// The agent's command line (`--hosts FILE HOST COMMAND ARGS…`), for the subcommand of any
/// program a cluster's agent script names (`dvmlab-harness agent`, `lab agent`).
#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    /// The run's hosts file (`RUN_DIR/agent.json`).
    #[arg(long)]
    pub hosts: PathBuf,
    pub host: String,
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

impl AgentArgs {
    /// Becomes the command on the host; returns only with why it could not.
    pub fn exec(&self) -> String {
        exec(&self.hosts, &self.host, &self.command)
    }
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
    if let Some(log) = &h.log {
        let opened = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .and_then(|f| Ok((f.try_clone()?, f)));
        match opened {
            Ok((out, err)) => {
                cmd.stdout(out).stderr(err);
            }
            Err(e) => return format!("{}: {e}", log.display()),
        }
    }
    if let Some(ns) = &h.netns {
        if let Err(e) = crate::netns::enter_named(&mut cmd, ns, &h.name, &h.etc_dir) {
            return format!("entering host {host}: {e}");
        }
    }
    if let Some((pid, cwd)) = &h.container {
        if let Err(e) = crate::docker::enter_container(&mut cmd, *pid, cwd, &h.etc_dir) {
            return format!("entering host {host}: {e}");
        }
    }
    let e: io::Error = cmd.exec();
    format!("{prog}: {e}")
}

/// Writes `dir/gated-agent`, which runs `agent` for a host only once the test lets it:
/// it waits for the file `dir/open-HOST` (handing over, after writing its pid, which becomes
/// the daemon's, to `dir/pid-HOST`) or `dir/fail-HOST` (exiting 7 without starting
/// anything). A grow through it stays in progress until the test decides how it ends.
pub fn write_gated(dir: &Path, agent: &Path) -> Result<PathBuf, String> {
    let gated = dir.join("gated-agent");
    let script = format!(
        "#!/bin/sh\n# Waits for the test's word before it runs the launch agent for a host.\nd='{}'\nh=\"$1\"\nwhile [ ! -e \"$d/open-$h\" ] && [ ! -e \"$d/fail-$h\" ]; do sleep 0.02; done\nif [ -e \"$d/fail-$h\" ]; then echo \"gated agent: $h fails\" >&2; exit 7; fi\necho $$ > \"$d/pid-$h\"\nexec '{}' \"$@\"\n",
        dir.display(),
        agent.display()
    );
    std::fs::write(&gated, script).map_err(|e| format!("write {}: {e}", gated.display()))?;
    std::fs::set_permissions(&gated, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", gated.display()))?;
    Ok(gated)
}

/// Writes `dir/failable-agent`, which runs `agent` for a host unless the file
/// `dir/fail-HOST` exists, and then exits 7 without starting anything: the launch failure of
/// a grow target, switched on and off while the DVM runs ([`fail_launches`]).
pub fn write_failable(dir: &Path, agent: &Path) -> Result<PathBuf, String> {
    let path = dir.join("failable-agent");
    let script = format!(
        "#!/bin/sh\n# Fails the launch on a host while the harness says so.\nif [ -e '{}/fail-'\"$1\" ]; then echo \"failable agent: the launch on $1 fails\" >&2; exit 7; fi\nexec '{}' \"$@\"\n",
        dir.display(),
        agent.display()
    );
    std::fs::write(&path, script).map_err(|e| format!("write {}: {e}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", path.display()))?;
    Ok(path)
}

/// Makes launches on `host` through the failable agent of run directory `dir` fail (`true`)
/// or go through again (`false`).
pub fn fail_launches(dir: &Path, host: &str, fail: bool) -> Result<(), String> {
    let f = dir.join(format!("fail-{host}"));
    let r = if fail {
        std::fs::write(&f, "")
    } else {
        match std::fs::remove_file(&f) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    };
    r.map_err(|e| {
        format!(
            "{} {}: {e}",
            if fail { "write" } else { "remove" },
            f.display()
        )
    })
}

/// Lets the gated agent of run directory `dir` hand `host` over (or fail it).
pub fn gate(dir: &Path, host: &str, open: bool) -> Result<(), String> {
    let f = dir.join(format!("{}-{host}", if open { "open" } else { "fail" }));
    std::fs::write(&f, "").map_err(|e| format!("write {}: {e}", f.display()))
}

/// The pid the gated agent handed `host` over as (the daemon's), once it has.
pub fn gated_pid(dir: &Path, host: &str) -> Option<i32> {
    std::fs::read_to_string(dir.join(format!("pid-{host}")))
        .ok()
        .and_then(|p| p.trim().parse().ok())
}
