//! Implementation profiles: how the suite drives an implementation it has never seen. A
//! profile (TOML) names the daemon command, where the configuration file goes, the commands
//! that report status and stop the DVM, and the optional features the implementation
//! declares. `conformance/README.md` documents every key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::status::Field;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Implementation {
    pub name: String,
    /// Run once (in the profile's directory) before the first trial that needs the
    /// implementation.
    #[serde(default)]
    pub build: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Daemon {
    /// Started, identically, on every host.
    pub command: Vec<String>,
    /// Where each host's configuration file is read from.
    #[serde(default = "default_conf_path")]
    pub conf_path: String,
    /// Environment for the daemon and every command the suite runs on a host. `{key}` is a
    /// file the suite makes fresh for each cluster (64 random hexadecimal digits, mode 0600,
    /// the same on every host), for an implementation that authenticates its links with a
    /// shared key; `{host}`, `{hosts_file}` and `{conf}` as in `[process_backend]`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Added to `env` by the benches when they pack so many hosts onto one machine's cores
    /// that a daemon may wait seconds for the CPU (`dvmlab-bench`'s crowding threshold):
    /// typically a longer liveness timeout, since a daemon starved that long looks exactly
    /// like a frozen one. The conformance suite never sets it.
    #[serde(default)]
    pub crowded_env: BTreeMap<String, String>,
}

fn default_conf_path() -> String {
    "/etc/prte.conf".into()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Command {
    pub command: Vec<String>,
}

/// The status command, and what its JSON reports.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusCmd {
    pub command: Vec<String>,
    /// The status JSON's fields beyond `formed` and the joined members' hosts (default: the
    /// documented shape, without `job_messages`).
    #[serde(default = "documented")]
    pub reports: Vec<Field>,
}

fn documented() -> Vec<Field> {
    Field::DOCUMENTED.to_vec()
}

impl StatusCmd {
    pub fn reports(&self, f: Field) -> bool {
        self.reports.contains(&f)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stop {
    pub command: Vec<String>,
    /// Seconds every daemon gets to exit after the stop command returned.
    #[serde(default = "default_grace")]
    pub grace_seconds: f64,
}

fn default_grace() -> f64 {
    10.0
}

/// How MCA-style parameters are given to the implementation (for the precedence items).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mca {
    /// Environment variable naming a parameter; `{name}` is replaced.
    pub env: String,
    /// Command-line words setting a parameter; `{name}` and `{value}` are replaced.
    pub cli: Vec<String>,
    /// The parameter `DVMPort` seeds.
    pub port: String,
}

/// How a host learns who it is when hosts are plain processes (no namespaces).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessBackend {
    /// Environment for every process on a host; `{host}`, `{hosts_file}`, `{conf}` replaced.
    pub env: BTreeMap<String, String>,
}

/// How to run and watch jobs (RFC 33 items). Placeholders: `{nprocs}`, `{hosts}` (comma
/// separated) in `submit`; `{id}`, `{signal}` (a name such as `TERM`) in `kill`; `{secs}` in
/// `time_limit`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Jobs {
    /// Runs a job and waits for it: the job's command is appended; it must stream the job's
    /// output and exit with the job's status (an exit code, or 128 + a signal).
    pub submit: Vec<String>,
    /// Prints the job list JSON (see `conformance/README.md`).
    pub list: Vec<String>,
    /// Sends a signal to every process of a job; `KILL` ends it.
    pub kill: Vec<String>,
    /// Words inserted before the command to give the job a time limit.
    #[serde(default)]
    pub time_limit: Vec<String>,
    /// The environment variable that holds a job process's index (0 … nprocs-1).
    pub proc_env: String,
    /// The environment variable naming a job process's barrier descriptor: the process
    /// writes `barrier SEQ` on a line and reads one line back once every process of the
    /// job entered barrier SEQ.
    #[serde(default)]
    pub barrier_fd_env: Option<String>,
}

/// How to listen for and notify PMIx events (the RFC 0002 items). The suite appends
/// `--chain FILE --timeout SECS` to a listener (the chain file and the JSON lines it prints
/// are documented in `conformance/README.md`) and `CODE --range R [--target NSPACE:RANK]...
/// [--info KEY=VALUE]...` to `notify`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Events {
    /// A listener that is a tool on the host it runs on.
    pub listen: Vec<String>,
    /// A job of `{nprocs}` listeners on `{hosts}` (comma separated), its lines prefixed by
    /// `[PROC] `; each finds its namespace (printed in its `ready` line) and rank itself.
    pub listen_in_job: Vec<String>,
    /// Notifies one event, as a tool on the host it runs on; inside a job (the suite runs it
    /// from a job's process through `listen_in_job`'s job) as that process.
    pub notify: Vec<String>,
    /// For an implementation whose events are served by a process of their own rather than
    /// a DVM: that server, started on one host (it prints `{"ready": true}` once serving).
    /// The events items then run on that host alone; those needing several nodes are
    /// UNSUPPORTED.
    #[serde(default)]
    pub server: Option<Vec<String>>,
    /// The `prte.conf` key that sets how many environment events a daemon keeps (the ring);
    /// without it, the ring's eviction is not judged.
    #[serde(default)]
    pub ring_key: Option<String>,
}

/// How to make a DVM elastic and change its size (the elastic DVM items). Placeholders:
/// `{directive}` (`new`, `extend`, `release`) and `{linger}` (seconds) in `request`,
/// `{hosts}` (comma separated) in `hosts`, `grow` and `shrink`, `{id}` in `alloc_id` and
/// `req_id`. The JSON lines `request` prints are documented in `conformance/README.md`
/// ("Elastic DVM").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Elastic {
    /// The MCA parameter and value that turn elastic mode on (given as `[mca]` says).
    pub mode: [String; 2],
    /// The MCA parameter naming the launch agent (`AGENT HOST COMMAND ARGS…`, as `ssh`);
    /// the suite gives it the harness's agent for the test's spare hosts.
    pub agent_param: String,
    /// A request from a requester: prints `{"phase": "accepted"|"rejected", ...}`, then
    /// each terminal event it hears as `{"phase": "event", ...}` until `{linger}` seconds
    /// after the first.
    pub request: Vec<String>,
    /// Words naming the hosts of a request.
    pub hosts: Vec<String>,
    /// Words naming the allocation of a request.
    pub alloc_id: Vec<String>,
    /// Words giving the requester's own id for a request.
    pub req_id: Vec<String>,
    /// A push with no requester: grow onto `{hosts}`, exit 0 once it is done.
    pub grow: Vec<String>,
    /// A push: the daemons of `{hosts}` leave; exit 0 once they have.
    pub shrink: Vec<String>,
    /// Runs a job of `{nprocs}` processes wherever the DVM places them (one per node when
    /// there are as many nodes) and waits for it; the job's command is appended.
    pub submit: Vec<String>,
    /// The job state a held job shows in the job list.
    pub waiting_state: String,
    /// An MCA parameter and value bounding how long a new daemon may take to report in.
    #[serde(default)]
    pub timeout: Option<[String; 2]>,
    /// The MCA parameter limiting how many jobs launch at once: the launch-boundary items
    /// need it (without it they are UNSUPPORTED).
    #[serde(default)]
    pub launch_limit: Option<String>,
    /// A `prte.conf` key whose value is a shell command each daemon runs before it starts a
    /// job's processes on its node (holding a launch open); with `launch_limit`, the
    /// launch-boundary items need it.
    #[serde(default)]
    pub prolog_key: Option<String>,
    /// The MCA parameter naming a release command (`CMD HOST…`) a finished shrink runs:
    /// the release-cycle items need it.
    #[serde(default)]
    pub release_command: Option<String>,
}

/// Optional features an implementation declares. Items that need an absent one are
/// UNSUPPORTED.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Features {
    #[serde(default)]
    pub ipv6: bool,
    #[serde(default)]
    pub healing: bool,
    #[serde(default)]
    pub dvmnetworks: bool,
    #[serde(default)]
    pub keep_fqdn: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    implementation: Implementation,
    daemon: Option<Daemon>,
    status: Option<StatusCmd>,
    stop: Option<Stop>,
    identity: Option<Command>,
    mca: Option<Mca>,
    process_backend: Option<ProcessBackend>,
    jobs: Option<Jobs>,
    events: Option<Events>,
    elastic: Option<Elastic>,
    #[serde(default)]
    features: Features,
}

/// A loaded profile, with suite-level placeholders (`{profile_dir}`, `{build_dir}`,
/// `{cargo_profile}`) already filled in.
#[derive(Debug, Clone)]
pub struct Profile {
    pub path: PathBuf,
    pub dir: PathBuf,
    pub implementation: Implementation,
    /// Whether the profile drives a DVM (`[daemon]`, `[status]` and `[stop]`): without them
    /// every item that needs one is UNSUPPORTED, and the three below are empty.
    pub has_dvm: bool,
    pub daemon: Daemon,
    pub status: StatusCmd,
    pub stop: Stop,
    pub identity: Option<Command>,
    pub mca: Option<Mca>,
    pub process_backend: Option<ProcessBackend>,
    pub jobs: Option<Jobs>,
    pub events: Option<Events>,
    pub elastic: Option<Elastic>,
    pub features: Features,
    /// Known deviations (`<profile>.expected.toml` beside it), by item id. The run passes
    /// when exactly these items FAIL, each as it is expected to.
    pub expected: BTreeMap<String, Expected>,
    /// Where they were read from.
    pub expected_path: PathBuf,
}

/// An implementation's known deviations, as web-platform-tests keeps them: items expected
/// to FAIL, each with the reason (checked against the spec).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expectations {
    #[serde(default)]
    fail: Vec<ExpectedFail>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectedFail {
    id: String,
    why: String,
    #[serde(default)]
    observed: Option<String>,
}

/// One known deviation: why the item fails, and, if given, words its failure report must
/// contain (so that failing some other way is not taken for it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub why: String,
    pub observed: Option<String>,
}

/// `<dir>/<stem>.expected.toml` for the profile at `path`.
fn expectations_path(path: &Path) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!("{stem}.expected.toml"))
}

fn load_expectations(path: &Path) -> Result<BTreeMap<String, Expected>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(format!("expectations {}: {e}", path.display())),
    };
    let e: Expectations =
        toml::from_str(&text).map_err(|e| format!("expectations {}: {e}", path.display()))?;
    let mut out = BTreeMap::new();
    for f in e.fail {
        if f.why.trim().is_empty() {
            return Err(format!(
                "expectations {}: {}: say why it is expected to fail",
                path.display(),
                f.id
            ));
        }
        let e = Expected {
            why: f.why,
            observed: f.observed.filter(|o| !o.trim().is_empty()),
        };
        if out.insert(f.id.clone(), e).is_some() {
            return Err(format!(
                "expectations {}: {} is listed twice",
                path.display(),
                f.id
            ));
        }
    }
    Ok(out)
}

impl Profile {
    /// The directories of every absolute path the profile's commands name (of the path
    /// itself when it is a directory): what a host must see for the commands to run.
    pub fn named_directories(&self) -> Vec<PathBuf> {
        let mut commands: Vec<&Vec<String>> = vec![
            &self.daemon.command,
            &self.status.command,
            &self.stop.command,
        ];
        commands.extend(self.identity.as_ref().map(|c| &c.command));
        if let Some(j) = &self.jobs {
            commands.extend([&j.submit, &j.list, &j.kill]);
        }
        if let Some(e) = &self.events {
            commands.extend([&e.listen, &e.listen_in_job, &e.notify]);
            commands.extend(e.server.as_ref());
        }
        let mut dirs: Vec<PathBuf> = commands
            .into_iter()
            .flatten()
            .map(Path::new)
            .filter(|p| p.is_absolute())
            .filter_map(|p| {
                let p = p.canonicalize().ok()?;
                if p.is_dir() {
                    Some(p)
                } else {
                    p.parent().map(Path::to_path_buf)
                }
            })
            .collect();
        dirs.sort();
        dirs.dedup();
        dirs
    }
}

/// The directory holding the suite's own build (`target/debug` for a dev build), and the
/// cargo profile that made it: a profile for a Rust implementation in the same workspace
/// finds its binaries there.
fn build_dir() -> (PathBuf, String) {
    dvmlab_harness::agent::build_dir().unwrap_or_else(|_| (PathBuf::new(), "dev".to_string()))
}

fn fill(words: &mut [String], vars: &[(&str, String)]) {
    for w in words.iter_mut() {
        for (k, v) in vars {
            *w = w.replace(k, v);
        }
    }
}

impl Profile {
    pub fn load(path: &Path) -> Result<Profile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("profile {}: {e}", path.display()))?;
        let mut p = Profile::parse(path, &text)?;
        p.expected_path = expectations_path(path);
        p.expected = load_expectations(&p.expected_path)?;
        Ok(p)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Profile, String> {
        let mut raw: Raw =
            toml::from_str(text).map_err(|e| format!("profile {}: {e}", path.display()))?;
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
        let (build, cargo_profile) = build_dir();
        let vars = [
            ("{profile_dir}", dir.display().to_string()),
            ("{build_dir}", build.display().to_string()),
            ("{cargo_profile}", cargo_profile),
        ];
        let err = |key: &str, msg: &str| format!("profile {}: {key}: {msg}", path.display());
        let has_dvm = match (&raw.daemon, &raw.status, &raw.stop) {
            (Some(_), Some(_), Some(_)) => true,
            (None, None, None) => false,
            _ => {
                return Err(err(
                    "daemon, status, stop",
                    "a profile that drives a DVM needs all three sections (and one that does not, none)",
                ))
            }
        };
        let mut daemon = raw.daemon.take().unwrap_or_default();
        let mut status = raw.status.take().unwrap_or_else(|| StatusCmd {
            command: vec![],
            reports: documented(),
        });
        let mut stop = raw.stop.take().unwrap_or(Stop {
            command: vec![],
            grace_seconds: default_grace(),
        });
        if !has_dvm {
            daemon.conf_path = default_conf_path();
        }
        for (key, words) in [
            ("daemon.command", &mut daemon.command),
            ("status.command", &mut status.command),
            ("stop.command", &mut stop.command),
        ] {
            if !has_dvm {
                continue;
            }
            if words.is_empty() {
                return Err(err(key, "must name a program"));
            }
            fill(words, &vars);
        }
        fill(&mut raw.implementation.build, &vars);
        if let Some(j) = raw.jobs.as_mut() {
            for (key, words) in [
                ("jobs.submit", &mut j.submit),
                ("jobs.list", &mut j.list),
                ("jobs.kill", &mut j.kill),
            ] {
                if words.is_empty() {
                    return Err(err(key, "must name a program"));
                }
                fill(words, &vars);
            }
            if j.proc_env.is_empty() {
                return Err(err("jobs.proc_env", "must name an environment variable"));
            }
        }
        if let Some(e) = raw.events.as_mut() {
            for (key, words) in [
                ("events.listen", &mut e.listen),
                ("events.listen_in_job", &mut e.listen_in_job),
                ("events.notify", &mut e.notify),
            ] {
                if words.is_empty() {
                    return Err(err(key, "must name a program"));
                }
                fill(words, &vars);
            }
            if let Some(server) = e.server.as_mut() {
                if server.is_empty() {
                    return Err(err("events.server", "must name a program"));
                }
                fill(server, &vars);
            }
        }
        if let Some(e) = raw.elastic.as_mut() {
            for (key, words) in [
                ("elastic.request", &mut e.request),
                ("elastic.submit", &mut e.submit),
                ("elastic.grow", &mut e.grow),
                ("elastic.shrink", &mut e.shrink),
            ] {
                if words.is_empty() {
                    return Err(err(key, "must name a program"));
                }
                fill(words, &vars);
            }
            if !has_dvm {
                return Err(err(
                    "elastic",
                    "an elastic DVM is a DVM: the profile needs [daemon], [status] and [stop]",
                ));
            }
        }
        if has_dvm && raw.events.as_ref().is_some_and(|e| e.server.is_some()) {
            return Err(err(
                "events.server",
                "is for a profile without a DVM (its daemons serve its events)",
            ));
        }
        if !has_dvm && raw.events.as_ref().is_some_and(|e| e.server.is_none()) {
            return Err(err(
                "events.server",
                "a profile without a DVM serves its events with a server of its own",
            ));
        }
        if let Some(id) = raw.identity.as_mut() {
            if id.command.is_empty() {
                return Err(err("identity.command", "must name a program"));
            }
            fill(&mut id.command, &vars);
        }
        if !daemon.conf_path.starts_with("/etc/") {
            return Err(err(
                "daemon.conf_path",
                "must be a file under /etc (hosts get a private /etc)",
            ));
        }
        if let Some(m) = &raw.mca {
            if !m.env.contains("{name}") {
                return Err(err("mca.env", "must contain {name}"));
            }
            if !m.cli.iter().any(|w| w.contains("{value}")) {
                return Err(err("mca.cli", "must contain {value}"));
            }
        }
        if !(stop.grace_seconds > 0.0 && stop.grace_seconds <= 3600.0) {
            return Err(err(
                "stop.grace_seconds",
                "must be above 0 and at most 3600",
            ));
        }
        Ok(Profile {
            path: path.to_path_buf(),
            dir,
            implementation: raw.implementation,
            has_dvm,
            daemon,
            status,
            stop,
            identity: raw.identity,
            mca: raw.mca,
            process_backend: raw.process_backend,
            jobs: raw.jobs,
            events: raw.events,
            elastic: raw.elastic,
            features: raw.features,
            expected: BTreeMap::new(),
            expected_path: PathBuf::new(),
        })
    }

    /// The profile named by `DVMLAB_PROFILE`, else the reference runtime's.
    pub fn from_env() -> Result<Profile, String> {
        let path = std::env::var_os("DVMLAB_PROFILE")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/reference.toml")
            });
        Profile::load(&path)
    }

    /// Runs the profile's build command, if any, unless `DVMLAB_SKIP_PROFILE_BUILD` is set
    /// (by a caller that has built the implementation already, e.g. `make test`).
    pub fn build(&self) -> Result<(), String> {
        let Some((prog, args)) = self.implementation.build.split_first() else {
            return Ok(());
        };
        if std::env::var_os("DVMLAB_SKIP_PROFILE_BUILD").is_some() {
            return Ok(());
        }
        let st = std::process::Command::new(prog)
            .args(args)
            .current_dir(&self.dir)
            .status()
            .map_err(|e| format!("profile build command {prog}: {e}"))?;
        if st.success() {
            Ok(())
        } else {
            Err(format!(
                "profile build command {:?} failed: {st}",
                self.implementation.build
            ))
        }
    }

    /// The words that set MCA parameter `name` to `value` on a command line.
    pub fn mca_cli(&self, name: &str, value: &str) -> Option<Vec<String>> {
        let m = self.mca.as_ref()?;
        Some(
            m.cli
                .iter()
                .map(|w| w.replace("{name}", name).replace("{value}", value))
                .collect(),
        )
    }

    /// The environment variable that sets MCA parameter `name`.
    pub fn mca_env(&self, name: &str) -> Option<String> {
        Some(self.mca.as_ref()?.env.replace("{name}", name))
    }

    /// The words a daemon command needs to run in an elastic DVM whose launch agent is
    /// `agent`: elastic mode (unless `fixed`), the agent, and the new-daemon timeout, as
    /// `[mca]` says. An error names what the profile lacks.
    pub fn elastic_words(&self, agent: &str, fixed: bool) -> Result<Vec<String>, String> {
        let e = self.elastic.as_ref().ok_or_else(|| {
            "the profile has no [elastic] section (how to grow and shrink the DVM)".to_string()
        })?;
        let mca = |name: &str, value: &str| {
            self.mca_cli(name, value).ok_or_else(|| {
                "the profile has no [mca] section (how to set elastic mode and the agent)"
                    .to_string()
            })
        };
        let mut words = Vec::new();
        if !fixed {
            words.extend(mca(&e.mode[0], &e.mode[1])?);
        }
        words.extend(mca(&e.agent_param, agent)?);
        if let Some([k, v]) = &e.timeout {
            words.extend(mca(k, v)?);
        }
        Ok(words)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = "[implementation]\nname='x'\n[daemon]\ncommand=['d']\n[status]\ncommand=['s']\n[stop]\ncommand=['t']\n";

    #[test]
    fn expectations_sit_beside_the_profile_each_item_once_with_its_reason() {
        let dir = std::env::temp_dir().join(format!("dvmlab-expect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let profile = dir.join("impl.toml");
        std::fs::write(&profile, MIN).unwrap();
        assert!(Profile::load(&profile).unwrap().expected.is_empty());
        let exp = dir.join("impl.expected.toml");
        std::fs::write(&exp, "[[fail]]\nid='a.b'\nwhy='it does c'\n").unwrap();
        let p = Profile::load(&profile).unwrap();
        assert_eq!(p.expected_path, exp);
        assert_eq!(
            p.expected.get("a.b").map(|e| e.why.as_str()),
            Some("it does c")
        );
        std::fs::write(&exp, "[[fail]]\nid='a.b'\nwhy=''\n").unwrap();
        assert!(Profile::load(&profile).unwrap_err().contains("say why"));
        std::fs::write(
            &exp,
            "[[fail]]\nid='a.b'\nwhy='x'\n[[fail]]\nid='a.b'\nwhy='y'\n",
        )
        .unwrap();
        assert!(Profile::load(&profile)
            .unwrap_err()
            .contains("listed twice"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_profile_without_a_dvm_serves_its_events_itself_or_is_refused() {
        let events = "[events]\nlisten=['l']\nlisten_in_job=['j']\nnotify=['n']\n";
        let base = "[implementation]\nname='x'\n";
        let p = Profile::parse(
            Path::new("/tmp/p.toml"),
            &format!("{base}{events}server=['s']\n"),
        )
        .unwrap();
        assert!(!p.has_dvm);
        let e = Profile::parse(Path::new("/tmp/p.toml"), &format!("{base}{events}")).unwrap_err();
        assert!(e.contains("events.server"), "{e}");
        let e = Profile::parse(
            Path::new("/tmp/p.toml"),
            &format!("{base}[daemon]\ncommand=['d']\n"),
        )
        .unwrap_err();
        assert!(e.contains("all three sections"), "{e}");
        let e = Profile::parse(
            Path::new("/tmp/p.toml"),
            &format!("{MIN}{events}server=['s']\n"),
        )
        .unwrap_err();
        assert!(e.contains("without a DVM"), "{e}");
    }

    #[test]
    fn a_minimal_profile_loads_with_defaults() {
        let p = Profile::parse(Path::new("/tmp/p.toml"), MIN).unwrap();
        assert_eq!(p.daemon.conf_path, "/etc/prte.conf");
        assert!(!p.features.ipv6);
        assert!(p.identity.is_none());
    }

    #[test]
    fn bad_profiles_are_refused_naming_the_file_and_key() {
        let e = Profile::parse(Path::new("/tmp/p.toml"), &MIN.replace("['d']", "[]")).unwrap_err();
        assert!(
            e.contains("/tmp/p.toml") && e.contains("daemon.command"),
            "{e}"
        );
        let e = Profile::parse(
            Path::new("/tmp/p.toml"),
            &format!("{MIN}[features]\nipv7=true\n"),
        )
        .unwrap_err();
        assert!(e.contains("ipv7"), "{e}");
        let e = Profile::parse(
            Path::new("/tmp/p.toml"),
            &MIN.replace("command=['d']", "command=['d']\nconf_path='/opt/prte.conf'"),
        )
        .unwrap_err();
        assert!(e.contains("daemon.conf_path"), "{e}");
    }

    #[test]
    fn shipped_profiles_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
        for f in [
            "reference.toml",
            "human-status-example.toml",
            "probe-job-example.toml",
        ] {
            Profile::load(&dir.join(f)).unwrap();
        }
    }
}
