//! Resolved bootstrap settings: every `prte.conf` key with its default, its validation, and the
//! precedence between the command line (`--prtemca NAME VALUE`), the configuration file and the
//! environment (`PRTE_MCA_<name>`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;

use super::nodes::{self, NodeEntry, ReadFile};
use super::reader::ConfFile;
use crate::diag::{Diagnostic, Kind, Origin};

/// Where `prte.conf` lives unless [`CONF_PARAM`] says otherwise.
pub const DEFAULT_CONF: &str = "/etc/prte.conf";
/// The parameter that relocates `prte.conf`, so several DVMs can share one machine.
pub const CONF_PARAM: &str = "prte_bootstrap_conf";
/// Test-only: the host name this daemon takes as its own instead of the kernel's.
pub const TEST_HOSTNAME_PARAM: &str = "dvmlab_test_hostname";
/// Test-only: a hosts file consulted instead of the system resolver, and for this host's
/// aliases and addresses.
pub const TEST_HOSTS_FILE_PARAM: &str = "dvmlab_test_hosts_file";
/// The first delay of the reconnect backoff (seconds); an operator setting overrides the
/// default bootstrap seeds.
pub const INITIAL_DELAY_PARAM: &str = "prte_bootstrap_retry_initial_delay";

/// Heartbeat interval (seconds) on daemon links; a link silent for three intervals is dead.
pub const HEARTBEAT_PARAM: &str = "dvmlab_heartbeat_interval";

/// Elastic mode (PRRTE's name): the DVM may grow and shrink while it runs. Off by default;
/// off, the DVM is fixed-size and grow and shrink requests are refused.
pub const ELASTIC_PARAM: &str = "prte_elastic_mode";
/// The command the controller starts new daemons through, invoked as `AGENT HOST COMMAND
/// ARGS…` (PRRTE's name; `ssh` by default). Split on whitespace, never given to a shell.
pub const LAUNCH_AGENT_PARAM: &str = "plm_ssh_agent";
/// Seconds a new daemon has to report in after its launch before the grow fails; also how
/// long a shrink target has to leave before it is cut off (an extension).
pub const LAUNCH_TIMEOUT_PARAM: &str = "dvmlab_launch_timeout";
/// PRRTE's verbosity of job state changes: from 1 on, every job state the controller
/// enters is logged, `WAITING FOR DAEMON CAMPAIGN` included.
pub const STATE_VERBOSE_PARAM: &str = "state_base_verbose";
/// PRRTE's verbosity of the local launcher: from 1 on, every daemon logs each job process
/// it starts, with its own rank and the process's pid (what a soak's history is made of).
pub const ODLS_VERBOSE_PARAM: &str = "odls_base_verbose";
/// A command run with the hosts a shrink freed (`CMD HOST…`) before the shrink completes,
/// so a resource manager can take its nodes back (an extension).
pub const RELEASE_COMMAND_PARAM: &str = "dvmlab_release_command";
/// Test-only: makes the elastic DVM deliberately wrong in one way (see
/// [`crate::campaign::Fault`]), so the conformance suite can show it catches it.
pub const ELASTIC_FAULT_PARAM: &str = "dvmlab_test_elastic_fault";
/// At most this many jobs launching at once; the rest wait, mapped, for their turn.
pub const MAX_LAUNCHING_PARAM: &str = "dvmlab_max_launching";
/// Seconds a daemon below the controller may hold a job's start report back, so that a
/// job whose processes end by then reports start and finish in one message (an extension;
/// 0 turns it off).
pub const START_HOLD_PARAM: &str = "dvmlab_start_hold";
/// Whether a daemon starts job processes by a vfork-style `clone3` that clears the signal
/// handlers in the kernel, rather than by `posix_spawn` (an extension; on by default, and
/// off by itself where the kernel refuses that clone).
pub const SPAWN_CLONE_PARAM: &str = "dvmlab_spawn_clone";
/// [`START_HOLD_PARAM`]'s default: longer than a short job's processes take on a busy node,
/// short enough that nobody watching a job's state sees its `RUN` late.
pub const DEFAULT_START_HOLD: Duration = Duration::from_millis(50);
/// The longest [`START_HOLD_PARAM`] or [`REMOVE_HOLD_PARAM`] taken.
pub const MAX_START_HOLD: Duration = Duration::from_secs(1);
/// Seconds the controller may hold a job's `remove` back, so that it goes to each daemon
/// with the next frame on its link (the next job's) rather than waking it alone (an
/// extension; 0 turns it off).
pub const REMOVE_HOLD_PARAM: &str = "dvmlab_remove_hold";
/// [`REMOVE_HOLD_PARAM`]'s default: longer than a tool takes to submit its next job, short
/// enough that the daemons' job state lags the job's end by no more than a glance.
pub const DEFAULT_REMOVE_HOLD: Duration = Duration::from_millis(50);

/// `prte.conf` keys that seed an MCA parameter, and that parameter's name. For these the
/// command line beats the file, and the file beats the environment.
pub const MCA_KEYS: &[(&str, &str)] = &[
    ("DVMPort", "prte_dvm_port"),
    ("DVMNetworks", "prte_if_include"),
    ("KeepFQDNHostnames", "prte_keep_fqdn_hostnames"),
    ("DVMRadix", "rml_base_radix"),
    // An extension (the bootstrap spec lets implementations ignore keys they do not know).
    ("DVMKeyFile", "dvmlab_dvm_key_file"),
    // An extension: how many environment events each daemon keeps for late registrations.
    ("DVMEventRing", "dvmlab_event_ring"),
];

/// Most environment events a daemon may be told to keep (`DVMEventRing`).
pub const MAX_EVENT_RING: usize = 65_536;

/// Environment variable prefix of MCA parameters.
pub const ENV_PREFIX: &str = "PRTE_MCA_";

/// MCA-style parameters given to this process: `--prtemca` pairs and `PRTE_MCA_*` variables.
#[derive(Debug, Clone, Default)]
pub struct Params {
    cli: Vec<(String, String)>,
    env: Vec<(String, String)>,
    /// The process's temporary directory (`TMPDIR`, else `/tmp`): where `DVMTempDir` defaults.
    temp_dir: PathBuf,
}

impl Params {
    /// `cli` are the `--prtemca NAME VALUE` pairs; `env` is any set of environment variables
    /// (those without the `PRTE_MCA_` prefix are ignored).
    pub fn new(
        cli: Vec<(String, String)>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Params {
        let mut temp_dir = PathBuf::from("/tmp");
        let mut mca = Vec::new();
        for (k, v) in env {
            if k == "TMPDIR" && !v.is_empty() {
                temp_dir = PathBuf::from(&v);
            }
            if let Some(n) = k.strip_prefix(ENV_PREFIX) {
                mca.push((n.to_string(), v));
            }
        }
        Params {
            cli,
            env: mca,
            temp_dir,
        }
    }

    /// A tool's parameters: its `--prtemca NAME VALUE` words (flattened pairs), `--conf`,
    /// and the environment `env`.
    pub fn for_tool(
        prtemca: &[String],
        conf: Option<&str>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Params {
        let mut pairs: Vec<(String, String)> = prtemca
            .chunks(2)
            .map(|c| (c[0].clone(), c.get(1).cloned().unwrap_or_default()))
            .collect();
        if let Some(c) = conf {
            pairs.push((CONF_PARAM.to_string(), c.to_string()));
        }
        Params::new(pairs, env)
    }

    fn cli_value(&self, name: &str) -> Option<(&str, Origin)> {
        self.cli
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(n, v)| {
                (
                    v.as_str(),
                    Origin::CommandLine {
                        name: n.to_string(),
                    },
                )
            })
    }

    fn env_value(&self, name: &str) -> Option<(&str, Origin)> {
        self.env.iter().find(|(n, _)| n == name).map(|(n, v)| {
            (
                v.as_str(),
                Origin::Environment {
                    var: format!("{ENV_PREFIX}{n}"),
                },
            )
        })
    }

    /// The `--prtemca NAME VALUE` pairs, in order.
    pub fn cli_pairs(&self) -> &[(String, String)] {
        &self.cli
    }

    /// A parameter that has no `prte.conf` key: command line, then environment.
    pub fn get(&self, name: &str) -> Option<(&str, Origin)> {
        self.cli_value(name).or_else(|| self.env_value(name))
    }

    /// Where `prte.conf` is read from.
    pub fn conf_path(&self) -> PathBuf {
        self.get(CONF_PARAM)
            .map(|(v, _)| PathBuf::from(v))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONF))
    }
}

/// IP address family of the DVM's inter-node traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn matches(self, ip: &std::net::IpAddr) -> bool {
        matches!(
            (self, ip),
            (Family::V4, std::net::IpAddr::V4(_)) | (Family::V6, std::net::IpAddr::V6(_))
        )
    }
    pub fn max_prefix(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

/// One `DVMNetworks` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetSpec {
    Cidr(IpNet),
    /// A local interface name; its subnets stand for it once the host's interfaces are known.
    Interface(String),
}

/// The bootstrap settings, resolved and validated.
#[derive(Debug, Clone)]
pub struct Settings {
    pub conf_path: PathBuf,
    pub cluster_name: String,
    pub controller_host: String,
    pub controller_origin: Origin,
    /// `DVMNodes`, expanded, in order.
    pub nodes: Vec<NodeEntry>,
    pub nodes_origin: Origin,
    pub port: u16,
    pub keep_fqdn: bool,
    pub networks: Vec<NetSpec>,
    pub networks_origin: Option<Origin>,
    /// `DVMNetmask` as a prefix length.
    pub netmask: Option<u8>,
    pub family: Family,
    pub radix: u32,
    /// `None` disables healing.
    pub connect_max_time: Option<Duration>,
    pub retry_max_delay: Duration,
    pub retry_initial_delay: Duration,
    pub heartbeat: Duration,
    /// `DVMEventRing`: environment events each daemon keeps for late registrations.
    pub event_ring: usize,
    /// [`ELASTIC_PARAM`]: whether the DVM may grow and shrink.
    pub elastic: bool,
    /// [`LAUNCH_AGENT_PARAM`], split into words.
    pub launch_agent: Vec<String>,
    /// [`LAUNCH_TIMEOUT_PARAM`].
    pub launch_timeout: Duration,
    /// [`STATE_VERBOSE_PARAM`].
    pub state_verbose: u32,
    /// [`ODLS_VERBOSE_PARAM`].
    pub odls_verbose: u32,
    /// [`ELASTIC_FAULT_PARAM`].
    pub elastic_fault: Option<crate::campaign::Fault>,
    /// [`RELEASE_COMMAND_PARAM`], split into words.
    pub release_command: Option<Vec<String>>,
    /// [`MAX_LAUNCHING_PARAM`]; `None`: no limit but the live jobs'.
    pub max_launching: Option<usize>,
    /// [`START_HOLD_PARAM`].
    pub start_hold: Duration,
    /// [`REMOVE_HOLD_PARAM`].
    pub remove_hold: Duration,
    /// [`SPAWN_CLONE_PARAM`].
    pub spawn_clone: bool,
    pub dvm_temp_dir: PathBuf,
    /// `SessionTmpDir`, a template (see [`expand_template`]).
    pub session_tmp_dir: Option<String>,
    pub controller_log_path: Option<String>,
    pub prted_log_path: Option<String>,
    pub controller_log_job_state: bool,
    pub controller_log_proc_state: bool,
    pub prted_log_job_state: bool,
    pub prted_log_proc_state: bool,
    /// `JobProlog` / `JobEpilog`: shell commands a daemon runs before starting a job's
    /// processes on its node, and after they exited (release waits for the epilog).
    pub job_prolog: Option<String>,
    pub job_epilog: Option<String>,
    /// `DVMKeyFile` (an extension): the DVM key every link proves it holds; `None` runs the
    /// DVM unauthenticated. With where it was set, for diagnostics.
    pub key_file: Option<(PathBuf, Origin)>,
    /// Test-only identity overrides (see [`TEST_HOSTNAME_PARAM`], [`TEST_HOSTS_FILE_PARAM`]).
    pub test_hostname: Option<String>,
    pub test_hosts_file: Option<PathBuf>,
}

impl Settings {
    /// The DVM namespace, `<ClusterName>-prte-dvm`.
    pub fn namespace(&self) -> String {
        format!("{}-prte-dvm", self.cluster_name)
    }

    /// Resolves every setting from `conf` and `params`; `read` loads `file:` node lists.
    pub fn resolve(
        conf: &ConfFile,
        params: &Params,
        read: ReadFile<'_>,
    ) -> Result<Settings, Diagnostic> {
        let r = Resolver { conf, params };
        let keep_fqdn = r
            .mca("KeepFQDNHostnames")
            .map(|(v, o)| parse_bool(&v, &o))
            .transpose()?
            .unwrap_or(false);
        let family = match r.file("DVMIPVersion") {
            None => Family::V4,
            Some((v, o)) => match v.as_str() {
                "4" => Family::V4,
                "6" => Family::V6,
                _ => return Err(bad_value(&o, "DVMIPVersion must be 4 or 6", &v)),
            },
        };
        let (nodes_expr, nodes_origin) = r.required("DVMNodes")?;
        let base_dir = conf.path.parent().unwrap_or(Path::new("/"));
        let nodes = nodes::parse(&nodes_expr, &nodes_origin, base_dir, read, keep_fqdn)?;
        let (controller_host, controller_origin) = r.required("DVMControllerHost")?;
        if !crate::hostname::is_valid(&controller_host) {
            return Err(Diagnostic::new(
                Kind::BadValue,
                controller_origin,
                "DVMControllerHost is not a host name or IP literal",
                controller_host,
            ));
        }
        let port = r
            .mca("DVMPort")
            .map(|(v, o)| match v.parse::<u16>() {
                Ok(p) if p > 0 => Ok(p),
                _ => Err(bad_value(&o, "DVMPort must be a TCP port 1-65535", &v)),
            })
            .transpose()?
            .unwrap_or(7817);
        let (networks, networks_origin) = match r.mca("DVMNetworks") {
            None => (Vec::new(), None),
            Some((v, o)) => (parse_networks(&v, &o, family)?, Some(o)),
        };
        let netmask = r
            .file("DVMNetmask")
            .map(|(v, o)| parse_netmask(&v, &o, family))
            .transpose()?;
        let radix = r
            .mca("DVMRadix")
            .map(|(v, o)| match v.parse::<u32>() {
                Ok(x) if (2..=1_000_000).contains(&x) => Ok(x),
                _ => Err(bad_value(&o, "DVMRadix must be an integer >= 2", &v)),
            })
            .transpose()?
            .unwrap_or(64);
        let seconds = |key: &str, default: f64| -> Result<Duration, Diagnostic> {
            r.file(key)
                .map(|(v, o)| parse_seconds(&v, &o, key))
                .transpose()
                .map(|d| d.unwrap_or(Duration::from_secs_f64(default)))
        };
        let connect_max_time = Some(seconds("DVMConnectMaxTime", 30.0)?).filter(|d| !d.is_zero());
        let retry_max_delay = seconds("DVMRetryMaxDelay", 5.0)?;
        if retry_max_delay.is_zero() {
            return Err(bad_value(
                &r.file("DVMRetryMaxDelay")
                    .map(|x| x.1)
                    .unwrap_or(Origin::Host),
                "DVMRetryMaxDelay must be greater than 0",
                "0",
            ));
        }
        let retry_initial_delay = match params.get(INITIAL_DELAY_PARAM) {
            Some((v, o)) => parse_seconds(v, &o, INITIAL_DELAY_PARAM)?,
            None => Duration::from_millis(20),
        }
        .min(retry_max_delay)
        .max(Duration::from_millis(1));
        let heartbeat = match params.get(HEARTBEAT_PARAM) {
            Some((v, o)) => parse_seconds(v, &o, HEARTBEAT_PARAM)?,
            None => Duration::from_secs(1),
        }
        .max(Duration::from_millis(10));
        let event_ring = r
            .mca("DVMEventRing")
            .map(|(v, o)| match v.parse::<usize>() {
                Ok(n) if (1..=MAX_EVENT_RING).contains(&n) => Ok(n),
                _ => Err(bad_value(
                    &o,
                    &format!("DVMEventRing must be a number of events from 1 to {MAX_EVENT_RING}"),
                    &v,
                )),
            })
            .transpose()?
            .unwrap_or(crate::event::server::DEFAULT_RING);
        let elastic = params
            .get(ELASTIC_PARAM)
            .map(|(v, o)| parse_bool(v, &o))
            .transpose()?
            .unwrap_or(false);
        let spawn_clone = params
            .get(SPAWN_CLONE_PARAM)
            .map(|(v, o)| parse_bool(v, &o))
            .transpose()?
            .unwrap_or(true);
        let launch_agent = match params.get(LAUNCH_AGENT_PARAM) {
            Some((v, o)) => {
                let words: Vec<String> = v.split_whitespace().map(str::to_string).collect();
                if words.is_empty() {
                    return Err(bad_value(&o, "plm_ssh_agent must name a command", v));
                }
                words
            }
            None => vec!["ssh".to_string()],
        };
        let launch_timeout = match params.get(LAUNCH_TIMEOUT_PARAM) {
            Some((v, o)) => parse_seconds(v, &o, LAUNCH_TIMEOUT_PARAM)?,
            None => Duration::from_secs(60),
        }
        .max(Duration::from_millis(100));
        let state_verbose = params
            .get(STATE_VERBOSE_PARAM)
            .map(|(v, o)| {
                v.parse::<u32>()
                    .map_err(|_| bad_value(&o, "state_base_verbose must be a level from 0 up", v))
            })
            .transpose()?
            .unwrap_or(0);
        let odls_verbose = params
            .get(ODLS_VERBOSE_PARAM)
            .map(|(v, o)| {
                v.parse::<u32>()
                    .map_err(|_| bad_value(&o, "odls_base_verbose must be a level from 0 up", v))
            })
            .transpose()?
            .unwrap_or(0);
        let max_launching = params
            .get(MAX_LAUNCHING_PARAM)
            .map(|(v, o)| match v.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(bad_value(
                    &o,
                    "dvmlab_max_launching must be a number of jobs from 1 up",
                    v,
                )),
            })
            .transpose()?;
        let hold = |key: &str, default: Duration| -> Result<Duration, Diagnostic> {
            let Some((v, o)) = params.get(key) else {
                return Ok(default);
            };
            let d = parse_seconds(v, &o, key)?;
            if d > MAX_START_HOLD {
                return Err(bad_value(
                    &o,
                    &format!("{key} must be at most {} s", MAX_START_HOLD.as_secs_f64()),
                    v,
                ));
            }
            Ok(d)
        };
        let start_hold = hold(START_HOLD_PARAM, DEFAULT_START_HOLD)?;
        let remove_hold = hold(REMOVE_HOLD_PARAM, DEFAULT_REMOVE_HOLD)?;
        let flag = |key: &str| -> Result<bool, Diagnostic> {
            r.file(key)
                .map(|(v, o)| parse_bool(&v, &o))
                .transpose()
                .map(|b| b.unwrap_or(false))
        };
        let cluster_name = r
            .file("ClusterName")
            .map(|x| x.0)
            .unwrap_or_else(|| "cluster".into());
        Ok(Settings {
            conf_path: conf.path.clone(),
            cluster_name,
            controller_host,
            controller_origin,
            nodes,
            nodes_origin,
            port,
            keep_fqdn,
            networks,
            networks_origin,
            netmask,
            family,
            radix,
            connect_max_time,
            retry_max_delay,
            retry_initial_delay,
            heartbeat,
            event_ring,
            elastic,
            launch_agent,
            launch_timeout,
            state_verbose,
            odls_verbose,
            max_launching,
            start_hold,
            remove_hold,
            spawn_clone,
            elastic_fault: params
                .get(ELASTIC_FAULT_PARAM)
                .map(|(v, o)| {
                    crate::campaign::Fault::parse(v).ok_or_else(|| {
                        let names: Vec<&str> = crate::campaign::Fault::NAMES
                            .iter()
                            .map(|(n, _)| *n)
                            .collect();
                        bad_value(
                            &o,
                            &format!(
                                "dvmlab_test_elastic_fault must be one of {}",
                                names.join(", ")
                            ),
                            v,
                        )
                    })
                })
                .transpose()?,
            release_command: params
                .get(RELEASE_COMMAND_PARAM)
                .map(|(v, _)| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
                .filter(|w| !w.is_empty()),
            dvm_temp_dir: r
                .file("DVMTempDir")
                .map(|x| PathBuf::from(x.0))
                .unwrap_or_else(|| params.temp_dir.clone()),
            session_tmp_dir: r.file("SessionTmpDir").map(|x| x.0),
            job_prolog: r.file("JobProlog").map(|x| x.0),
            key_file: r
                .mca("DVMKeyFile")
                .filter(|(v, _)| !v.trim().is_empty())
                .map(|(v, o)| (PathBuf::from(v.trim()), o)),
            job_epilog: r.file("JobEpilog").map(|x| x.0),
            controller_log_path: r.file("ControllerLogPath").map(|x| x.0),
            prted_log_path: r.file("PRTEDLogPath").map(|x| x.0),
            controller_log_job_state: flag("ControllerLogJobState")?,
            controller_log_proc_state: flag("ControllerLogProcState")?,
            prted_log_job_state: flag("PRTEDLogJobState")?,
            prted_log_proc_state: flag("PRTEDLogProcState")?,
            test_hostname: params.get(TEST_HOSTNAME_PARAM).map(|x| x.0.to_string()),
            test_hosts_file: params
                .get(TEST_HOSTS_FILE_PARAM)
                .map(|x| PathBuf::from(x.0)),
        })
    }

    /// This daemon's session directory: `SessionTmpDir` if set, else
    /// `<DVMTempDir>/dvmlab.<namespace>/<rank>`.
    pub fn session_dir(&self, host: &str, rank: u32) -> PathBuf {
        match &self.session_tmp_dir {
            Some(t) => PathBuf::from(expand_template(t, host, rank, &self.namespace())),
            None => self
                .dvm_temp_dir
                .join(format!("dvmlab.{}", self.namespace()))
                .join(rank.to_string()),
        }
    }

    /// Where the daemon of `rank` on `host` serves the tools of its node: a socket in its
    /// session directory.
    pub fn tool_socket(&self, host: &str, rank: u32) -> PathBuf {
        self.session_dir(host, rank).join("tools.sock")
    }
}

/// Expands `%h` (host), `%r` (rank), `%n` (namespace) and `%%` in a path template, so one
/// `prte.conf` shared by every node can give each daemon its own log file or directory.
pub fn expand_template(template: &str, host: &str, rank: u32, nspace: &str) -> String {
    let mut out = String::with_capacity(template.len());
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(host),
            Some('r') => out.push_str(&rank.to_string()),
            Some('n') => out.push_str(nspace),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Looks values up with the documented precedence.
struct Resolver<'a> {
    conf: &'a ConfFile,
    params: &'a Params,
}

impl Resolver<'_> {
    fn file(&self, key: &str) -> Option<(String, Origin)> {
        self.conf
            .get(key)
            .map(|e| (e.value.clone(), self.conf.origin_of(e)))
    }

    fn required(&self, key: &str) -> Result<(String, Origin), Diagnostic> {
        self.file(key).ok_or_else(|| {
            Diagnostic::new(
                Kind::MissingKey,
                self.conf.origin(),
                format!("required key {key} is missing"),
                key,
            )
        })
    }

    /// Command line, then file, then environment.
    fn mca(&self, key: &str) -> Option<(String, Origin)> {
        let mca = MCA_KEYS.iter().find(|(k, _)| *k == key).map(|(_, m)| *m)?;
        if let Some((v, o)) = self.params.cli_value(mca) {
            return Some((v.to_string(), o));
        }
        self.file(key)
            .or_else(|| self.params.env_value(mca).map(|(v, o)| (v.to_string(), o)))
    }
}

fn bad_value(origin: &Origin, message: &str, text: &str) -> Diagnostic {
    Diagnostic::new(Kind::BadValue, origin.clone(), message, text)
}

fn parse_bool(v: &str, origin: &Origin) -> Result<bool, Diagnostic> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(bad_value(origin, "expected true or false", v)),
    }
}

fn parse_seconds(v: &str, origin: &Origin, key: &str) -> Result<Duration, Diagnostic> {
    match v.parse::<f64>() {
        Ok(s) if s.is_finite() && (0.0..=1e6).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => Err(bad_value(
            origin,
            &format!("{key} must be a number of seconds"),
            v,
        )),
    }
}

fn parse_networks(v: &str, origin: &Origin, family: Family) -> Result<Vec<NetSpec>, Diagnostic> {
    v.split(',')
        .map(|tok| {
            let tok = tok.trim();
            if let Ok(net) = tok.parse::<IpNet>() {
                if !family.matches(&net.addr()) {
                    return Err(bad_value(
                        origin,
                        "DVMNetworks entry is not of the DVMIPVersion family",
                        tok,
                    ));
                }
                Ok(NetSpec::Cidr(net.trunc()))
            } else if !tok.is_empty()
                && tok.len() <= 15
                && tok
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
                && !tok.contains('/')
            {
                Ok(NetSpec::Interface(tok.to_string()))
            } else {
                Err(bad_value(
                    origin,
                    "DVMNetworks entry is neither a CIDR subnet nor an interface name",
                    tok,
                ))
            }
        })
        .collect()
}

fn parse_netmask(v: &str, origin: &Origin, family: Family) -> Result<u8, Diagnostic> {
    let err = || {
        bad_value(
            origin,
            "DVMNetmask must be a prefix length or a contiguous mask of the DVMIPVersion family",
            v,
        )
    };
    let s = v.strip_prefix('/').unwrap_or(v);
    if let Ok(p) = s.parse::<u8>() {
        return if p <= family.max_prefix() {
            Ok(p)
        } else {
            Err(err())
        };
    }
    let ip: std::net::IpAddr = s.parse().map_err(|_| err())?;
    if !family.matches(&ip) {
        return Err(err());
    }
    let bits: u128 = match ip {
        std::net::IpAddr::V4(a) => u128::from(u32::from(a)) << 96,
        std::net::IpAddr::V6(a) => u128::from(a),
    };
    let ones = bits.leading_ones();
    if bits.checked_shl(ones).unwrap_or(0) != 0 {
        return Err(err());
    }
    u8::try_from(ones).map_err(|_| err())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(
        text: &str,
        cli: &[(&str, &str)],
        env: &[(&str, &str)],
    ) -> Result<Settings, Diagnostic> {
        let conf = ConfFile::parse(text, Path::new("/etc/prte.conf"))?;
        let params = Params::new(
            cli.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            env.iter().map(|(a, b)| (a.to_string(), b.to_string())),
        );
        let read = |_: &Path| -> std::io::Result<String> { Ok(String::new()) };
        Settings::resolve(&conf, &params, &read)
    }

    const MIN: &str = "DVMNodes=n[1:1-3]\nDVMControllerHost=ctl\n";

    #[test]
    fn defaults_follow_the_spec() {
        let s = settings(MIN, &[], &[]).unwrap();
        assert_eq!(s.port, 7817);
        assert_eq!(s.namespace(), "cluster-prte-dvm");
        assert_eq!(s.radix, 64);
        assert_eq!(s.family, Family::V4);
        assert!(!s.keep_fqdn);
        assert_eq!(s.connect_max_time, Some(Duration::from_secs(30)));
        assert_eq!(s.retry_max_delay, Duration::from_secs(5));
        assert!(s.retry_initial_delay <= Duration::from_millis(50));
    }

    #[test]
    fn conf_beats_environment_and_command_line_beats_both() {
        let text = format!("{MIN}DVMRadix=3\nDVMPort=9000\n");
        let env = [
            ("PRTE_MCA_rml_base_radix", "5"),
            ("PRTE_MCA_prte_dvm_port", "9100"),
        ];
        let s = settings(&text, &[], &env).unwrap();
        assert_eq!((s.radix, s.port), (3, 9000));
        let s = settings(&text, &[("rml_base_radix", "7")], &env).unwrap();
        assert_eq!((s.radix, s.port), (7, 9000));
        let s = settings(MIN, &[], &env).unwrap();
        assert_eq!((s.radix, s.port), (5, 9100));
        let s = settings(MIN, &[], &[("PRTE_MCA_prte_keep_fqdn_hostnames", "true")]).unwrap();
        assert!(s.keep_fqdn);
        let keep = format!("{MIN}KeepFQDNHostnames=false\nDVMNetworks=10.1.0.0/16\n");
        let env = [
            ("PRTE_MCA_prte_keep_fqdn_hostnames", "true"),
            ("PRTE_MCA_prte_if_include", "10.2.0.0/16"),
        ];
        let s = settings(&keep, &[], &env).unwrap();
        assert!(!s.keep_fqdn, "conf beats env for KeepFQDNHostnames");
        assert_eq!(s.networks, [NetSpec::Cidr("10.1.0.0/16".parse().unwrap())]);
        let cli = [
            ("prte_keep_fqdn_hostnames", "1"),
            ("prte_if_include", "eth9"),
        ];
        let s = settings(&keep, &cli, &env).unwrap();
        assert!(s.keep_fqdn, "command line beats conf");
        assert_eq!(s.networks, [NetSpec::Interface("eth9".into())]);
    }

    #[test]
    fn missing_required_keys_name_the_key_and_file() {
        let e = settings("DVMNodes=a\n", &[], &[]).unwrap_err();
        assert_eq!(e.kind, Kind::MissingKey);
        assert_eq!(e.offending, "DVMControllerHost");
        assert!(e.to_string().contains("/etc/prte.conf"));
        assert_eq!(
            settings("DVMControllerHost=a\n", &[], &[])
                .unwrap_err()
                .offending,
            "DVMNodes"
        );
    }

    #[test]
    fn bad_values_name_their_origin() {
        let e = settings(&format!("{MIN}DVMPort=http\n"), &[], &[]).unwrap_err();
        assert_eq!(
            (e.kind, e.origin),
            (Kind::BadValue, Origin::file_line("/etc/prte.conf", 3))
        );
        let e = settings(MIN, &[("rml_base_radix", "1")], &[]).unwrap_err();
        assert_eq!(
            e.origin,
            Origin::CommandLine {
                name: "rml_base_radix".into()
            }
        );
        let e = settings(MIN, &[], &[("PRTE_MCA_prte_dvm_port", "0")]).unwrap_err();
        assert_eq!(
            e.origin,
            Origin::Environment {
                var: "PRTE_MCA_prte_dvm_port".into()
            }
        );
        for bad in [
            "DVMIPVersion=5",
            "DVMNetworks=10.0.0.0/33",
            "DVMNetmask=255.0.255.0",
            "DVMConnectMaxTime=soon",
            "KeepFQDNHostnames=maybe",
            "DVMRetryMaxDelay=0",
        ] {
            let e = settings(&format!("{MIN}{bad}\n"), &[], &[]).expect_err(bad);
            assert_eq!(e.kind, Kind::BadValue, "{bad}");
        }
    }

    #[test]
    fn ipv6_family_reads_address_keys_as_ipv6() {
        let s = settings(
            &format!("{MIN}DVMIPVersion=6\nDVMNetworks=fd00:200::/64\nDVMNetmask=ffff:ffff::\n"),
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(s.family, Family::V6);
        assert_eq!(s.netmask, Some(32));
        assert!(settings(
            &format!("{MIN}DVMIPVersion=6\nDVMNetworks=10.0.0.0/8\n"),
            &[],
            &[]
        )
        .is_err());
        let s = settings(
            &format!("{MIN}DVMNetworks=10.200.0.0/16,eth1\nDVMNetmask=255.255.0.0\n"),
            &[],
            &[],
        )
        .unwrap();
        assert_eq!(s.netmask, Some(16));
        assert_eq!(s.networks[1], NetSpec::Interface("eth1".into()));
    }

    #[test]
    fn job_processes_are_cloned_unless_told_otherwise_and_a_word_not_a_yes_or_no_is_refused() {
        assert!(settings(MIN, &[], &[]).unwrap().spawn_clone);
        let s = settings(MIN, &[], &[("PRTE_MCA_dvmlab_spawn_clone", "0")]).unwrap();
        assert!(!s.spawn_clone);
        let e = settings(MIN, &[("dvmlab_spawn_clone", "maybe")], &[]).unwrap_err();
        assert!(e.to_string().contains("maybe"), "{e}");
    }

    #[test]
    fn the_start_and_remove_holds_default_to_50_ms_may_be_off_and_are_bounded() {
        type Field = fn(&Settings) -> Duration;
        let holds: [(&str, Field); 2] = [
            ("dvmlab_start_hold", |s| s.start_hold),
            ("dvmlab_remove_hold", |s| s.remove_hold),
        ];
        for (key, field) in holds {
            let s = settings(MIN, &[], &[]).unwrap();
            assert_eq!(field(&s), Duration::from_millis(50), "{key}");
            let s = settings(MIN, &[(key, "0")], &[]).unwrap();
            assert_eq!(field(&s), Duration::ZERO, "{key}");
            let env = format!("PRTE_MCA_{key}");
            let s = settings(MIN, &[], &[(env.as_str(), "0.2")]).unwrap();
            assert_eq!(field(&s), Duration::from_millis(200), "{key}");
            for bad in ["2", "-1", "soon"] {
                let e = settings(MIN, &[(key, bad)], &[]).unwrap_err();
                assert!(e.to_string().contains(key), "{key} {bad}: {e}");
            }
        }
    }

    #[test]
    fn elastic_mode_is_off_by_default_and_set_from_the_command_line_or_environment() {
        let s = settings(MIN, &[], &[]).unwrap();
        assert!(!s.elastic);
        assert_eq!(s.launch_agent, vec!["ssh"]);
        assert_eq!(s.launch_timeout, Duration::from_secs(60));
        let s = settings(MIN, &[], &[("PRTE_MCA_prte_elastic_mode", "1")]).unwrap();
        assert!(s.elastic);
        let s = settings(
            MIN,
            &[
                ("prte_elastic_mode", "true"),
                ("plm_ssh_agent", "/opt/agent --quiet"),
                ("dvmlab_launch_timeout", "2.5"),
            ],
            &[("PRTE_MCA_prte_elastic_mode", "0")],
        )
        .unwrap();
        assert!(s.elastic, "the command line beats the environment");
        assert_eq!(s.launch_agent, vec!["/opt/agent", "--quiet"]);
        assert_eq!(s.launch_timeout, Duration::from_millis(2500));
        let e = settings(MIN, &[("prte_elastic_mode", "maybe")], &[]).unwrap_err();
        assert!(e.to_string().contains("prte_elastic_mode"), "{e}");
        let e = settings(MIN, &[("dvmlab_max_launching", "0")], &[]).unwrap_err();
        assert!(e.to_string().contains("dvmlab_max_launching"), "{e}");
        let s = settings(
            MIN,
            &[("state_base_verbose", "1"), ("dvmlab_max_launching", "2")],
            &[],
        )
        .unwrap();
        assert_eq!((s.state_verbose, s.max_launching), (1, Some(2)));
        let e = settings(MIN, &[("plm_ssh_agent", "  ")], &[]).unwrap_err();
        assert!(
            e.to_string().contains("plm_ssh_agent must name a command"),
            "{e}"
        );
    }

    #[test]
    fn zero_connect_max_time_disables_healing() {
        let s = settings(&format!("{MIN}DVMConnectMaxTime=0\n"), &[], &[]).unwrap();
        assert_eq!(s.connect_max_time, None);
    }

    #[test]
    fn templates_expand_host_rank_and_namespace() {
        assert_eq!(
            expand_template("/l/%n/%h-%r.log%%", "n1", 4, "c-prte-dvm"),
            "/l/c-prte-dvm/n1-4.log%"
        );
    }
}
