//! The controller's hands for the elastic DVM: it starts new daemons through the launch
//! agent (`AGENT… HOST PRTED --bootstrap --prtemca dvmlab_join MEMBERSHIP …`, no shell in
//! between), checks first that a grow's new hosts resolve (as the agent will need them to),
//! reports an agent's exit, stops a launch that is undone, and carries out the release
//! components of a finished shrink.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::sync::mpsc;
use tracing::{info, warn};

use dvmlab_core::campaign::CampaignId;
use dvmlab_core::daemon_core::Input;
use dvmlab_core::roster::Wireup;
use dvmlab_core::tree::Rank;
use dvmlab_host::bootstrap::JOIN_PARAM;
use dvmlab_host::hosts::Resolver;

/// How long resolving a grow's new hosts may take before the request is refused.
const CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long an undone launch gets between TERM and KILL.
const KILL_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Parameters a launched daemon must not inherit from the controller: they name the
/// controller's own host or membership.
const NOT_FORWARDED: &[&str] = &[JOIN_PARAM, "dvmlab_test_hostname"];

/// See the module documentation. Owns the process group of every launch in progress.
pub struct Launcher {
    agent: Vec<String>,
    prted: PathBuf,
    /// The controller's own `--prtemca` pairs, passed on.
    forward: Vec<(String, String)>,
    release_command: Option<Vec<String>>,
    /// How long a release command may take before the shrink goes on without it.
    release_timeout: std::time::Duration,
    groups: HashMap<Rank, i32>,
    events: mpsc::Sender<Input>,
    /// How this host resolves names (the system's, or a test hosts file).
    resolver: Resolver,
}

impl Launcher {
    pub fn new(
        agent: Vec<String>,
        cli: &[(String, String)],
        release_command: Option<Vec<String>>,
        release_timeout: std::time::Duration,
        events: mpsc::Sender<Input>,
        resolver: Resolver,
    ) -> Launcher {
        Launcher {
            agent,
            prted: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("prted")),
            forward: cli
                .iter()
                .filter(|(k, _)| !NOT_FORWARDED.contains(&k.as_str()))
                .cloned()
                .collect(),
            release_command,
            release_timeout,
            groups: HashMap::new(),
            events,
            resolver,
        }
    }

    /// Resolves `hosts` off the event loop (the system resolver blocks); the answer comes
    /// back as [`Input::HostsChecked`] with a reason for each that does not resolve.
    pub fn check_hosts(&self, token: u64, hosts: Vec<String>) {
        let resolver = self.resolver.clone();
        let events = self.events.clone();
        tokio::spawn(async move {
            let lookup = tokio::task::spawn_blocking(move || {
                hosts
                    .into_iter()
                    .filter_map(|h| {
                        resolver
                            .resolve(&h)
                            .err()
                            .map(|e| format!("{h} does not resolve on the controller ({e})"))
                    })
                    .collect::<Vec<String>>()
            });
            let unknown = match tokio::time::timeout(CHECK_TIMEOUT, lookup).await {
                Ok(Ok(unknown)) => unknown,
                Ok(Err(e)) => vec![format!("resolving the hosts failed: {e}")],
                Err(_) => vec![format!(
                    "resolving the hosts took longer than {CHECK_TIMEOUT:?}"
                )],
            };
            let _ = events.send(Input::HostsChecked { token, unknown }).await;
        });
    }

    /// Starts the daemon of `rank` on `host`; its agent's exit comes back as
    /// [`Input::LaunchExited`] (a failure to start it at all, as status 127 << 8).
    pub fn launch(&mut self, rank: Rank, host: &str, membership: &Wireup) {
        let mut cmd = Command::new(&self.agent[0]);
        cmd.args(&self.agent[1..])
            .arg(host)
            .arg(&self.prted)
            .arg("--bootstrap")
            .args(["--prtemca", JOIN_PARAM, &membership.to_arg()]);
        for (k, v) in &self.forward {
            cmd.args(["--prtemca", k, v]);
        }
        cmd.stdin(Stdio::null())
            .process_group(0)
            .kill_on_drop(false);
        info!(
            "launching rank {rank} on {host}: {} {host} {} --bootstrap …",
            self.agent.join(" "),
            self.prted.display()
        );
        let events = self.events.clone();
        match cmd.spawn() {
            Ok(mut child) => {
                if let Some(pid) = child.id() {
                    self.groups.insert(rank, pid as i32);
                }
                tokio::spawn(async move {
                    let status = match child.wait().await {
                        Ok(st) => wait_status(st),
                        Err(_) => 127 << 8,
                    };
                    let _ = events.send(Input::LaunchExited { rank, status }).await;
                });
            }
            Err(e) => {
                warn!(
                    "launch agent {:?} for rank {rank} on {host}: {e}",
                    self.agent[0]
                );
                tokio::spawn(async move {
                    let _ = events
                        .send(Input::LaunchExited {
                            rank,
                            status: 127 << 8,
                        })
                        .await;
                });
            }
        }
    }

    /// The agent of `rank` exited: its group is no longer this launcher's to signal (its
    /// number may be reused).
    pub fn exited(&mut self, rank: Rank) {
        self.groups.remove(&rank);
    }

    /// Stops whatever the launch of `rank` left running: TERM, then KILL.
    pub fn kill(&mut self, rank: Rank) {
        let Some(pg) = self.groups.remove(&rank) else {
            return;
        };
        let pg = Pid::from_raw(pg);
        if killpg(pg, Signal::SIGTERM).is_ok() {
            tokio::spawn(async move {
                tokio::time::sleep(KILL_GRACE).await;
                let _ = killpg(pg, Signal::SIGKILL);
            });
        }
    }

    /// Release component `name` takes the hosts a shrink freed: the static pool has
    /// nothing to do (its hosts may be grown onto again); the allocation component runs the
    /// release command, if one is set, so a resource manager gets its nodes back. The
    /// shrink completes after every component answered.
    pub fn release(
        &mut self,
        campaign: CampaignId,
        component: usize,
        name: &str,
        hosts: &[String],
    ) {
        let events = self.events.clone();
        let done = Input::ReleaseDone {
            campaign,
            component,
        };
        let command = match (name, &self.release_command) {
            ("alloc", Some(words)) => Some(words.clone()),
            _ => None,
        };
        let hosts = hosts.to_vec();
        let limit = self.release_timeout;
        tokio::spawn(async move {
            if let Some(words) = command {
                // A command that hangs must not hold every launch of the DVM: it is given
                // the launch timeout, then killed, and the shrink goes on.
                let st = Command::new(&words[0])
                    .args(&words[1..])
                    .args(&hosts)
                    .stdin(Stdio::null())
                    .kill_on_drop(true)
                    .status();
                match tokio::time::timeout(limit, st).await {
                    Ok(Ok(st)) if st.success() => info!("release command took {hosts:?}"),
                    Ok(Ok(st)) => warn!("release command {words:?} {hosts:?} exited with {st}"),
                    Ok(Err(e)) => warn!("release command {words:?}: {e}"),
                    Err(_) => warn!(
                        "release command {words:?} {hosts:?} still running after {limit:?}; killed"
                    ),
                }
            }
            let _ = events.send(done).await;
        });
    }
}

fn wait_status(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.into_raw()
}
