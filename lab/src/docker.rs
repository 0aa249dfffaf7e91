//! The lab on Docker: one user-defined dual-stack network, a controller container and one
//! container per node, all named and labelled with [`PREFIX`] so that `down` removes exactly
//! what `up` made. The plan's parameters live in the network's labels, so every later
//! command finds the lab again without any state file.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, EndpointIpamConfig, EndpointSettings, HostConfig, Ipam, IpamConfig,
    NetworkCreateRequest, NetworkingConfig,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, KillContainerOptionsBuilder, ListContainersOptionsBuilder,
    ListNetworksOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder,
    RemoveImageOptionsBuilder, RestartContainerOptionsBuilder,
};
use bollard::Docker;
use futures::{StreamExt, TryStreamExt};

use crate::image::IMAGE;
use crate::plan::{IpVersion, Plan, CONTROLLER, PREFIX, SUBNET_V4, SUBNET_V6};

/// The label every lab object carries; its value is the host name for containers.
const LABEL: &str = "dvmlab.lab";

/// A connection to the Docker engine, and the lab on it.
pub struct DockerLab {
    docker: Docker,
}

/// The output of a command run in a container.
pub struct ExecOutput {
    pub code: i64,
    pub stdout: String,
    pub stderr: String,
}

/// A container's name for a lab host.
pub fn container(host: &str) -> String {
    format!("{PREFIX}-{host}")
}

/// Where `up` keeps the prte.conf it mounts into the containers.
fn conf_dir() -> PathBuf {
    std::env::temp_dir().join(PREFIX)
}

fn err(what: &str) -> impl Fn(bollard::errors::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl DockerLab {
    /// Connects to the local engine, agreeing on an API version it speaks.
    pub async fn connect() -> Result<DockerLab, String> {
        let docker =
            Docker::connect_with_local_defaults().map_err(|e| format!("no Docker engine: {e}"))?;
        let docker = tokio::time::timeout(Duration::from_secs(5), docker.negotiate_version())
            .await
            .map_err(|_| "the Docker engine did not answer within 5 s".to_string())?
            .map_err(|e| format!("no Docker engine: {e}"))?;
        docker
            .ping()
            .await
            .map_err(|e| format!("no Docker engine: {e}"))?;
        Ok(DockerLab { docker })
    }

    /// Builds the lab image from a context tar (see `image.rs`).
    pub async fn build_image(&self, context: Vec<u8>) -> Result<(), String> {
        dvmlab_harness::docker::build_image(&self.docker, IMAGE, context).await
    }

    pub async fn image_exists(&self) -> bool {
        self.docker.inspect_image(IMAGE).await.is_ok()
    }

    /// The plan of the lab that is up, from its network's labels.
    pub async fn plan(&self) -> Result<Option<Plan>, String> {
        let Some(labels) = self.network_labels().await? else {
            return Ok(None);
        };
        let get = |k: &str| {
            labels
                .get(&format!("{LABEL}.{k}"))
                .cloned()
                .ok_or_else(|| format!("lab network lacks label {LABEL}.{k}; run `lab down`"))
        };
        let nodes = get("nodes")?
            .parse()
            .map_err(|e| format!("nodes label: {e}"))?;
        let radix = get("radix")?
            .parse()
            .map_err(|e| format!("radix label: {e}"))?;
        let ip = IpVersion::parse(&get("ip")?)?;
        Plan::new(nodes, radix, ip).map(Some)
    }

    async fn network_labels(&self) -> Result<Option<HashMap<String, String>>, String> {
        let filters = HashMap::from([("name", vec![PREFIX])]);
        let nets = self
            .docker
            .list_networks(Some(
                ListNetworksOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(err("listing networks"))?;
        Ok(nets
            .into_iter()
            .find(|n| n.name.as_deref() == Some(PREFIX))
            .map(|n| n.labels.unwrap_or_default()))
    }

    /// Creates the network and every container; starts all but `held`, calling `started`
    /// after each start.
    pub async fn create(
        &self,
        plan: &Plan,
        held: &[String],
        mut started: impl FnMut(&str),
    ) -> Result<(), String> {
        if self.network_labels().await?.is_some() {
            return Err(format!(
                "a lab is already up (network {PREFIX}); `lab down` first"
            ));
        }
        for h in held {
            plan.host(h)?;
            if h == CONTROLLER {
                return Err("the controller cannot be held back".into());
            }
        }
        let dir = conf_dir();
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let conf = dir.join("prte.conf");
        std::fs::write(&conf, plan.prte_conf()).map_err(|e| format!("{}: {e}", conf.display()))?;
        let labels = HashMap::from([
            (LABEL.to_string(), "network".to_string()),
            (format!("{LABEL}.nodes"), plan.nodes.to_string()),
            (format!("{LABEL}.radix"), plan.radix.to_string()),
            (format!("{LABEL}.ip"), plan.ip.number().to_string()),
        ]);
        self.docker
            .create_network(NetworkCreateRequest {
                name: PREFIX.into(),
                driver: Some("bridge".into()),
                enable_ipv6: Some(true),
                ipam: Some(Ipam {
                    config: Some(vec![
                        IpamConfig {
                            subnet: Some(SUBNET_V4.into()),
                            ..Default::default()
                        },
                        IpamConfig {
                            subnet: Some(SUBNET_V6.into()),
                            ..Default::default()
                        },
                    ]),
                    ..Default::default()
                }),
                labels: Some(labels),
                ..Default::default()
            })
            .await
            .map_err(err("creating the lab network"))?;
        let extra_hosts = plan.extra_hosts();
        let bind = format!("{}:/etc/prte.conf:ro", conf.display());
        for h in plan.hosts() {
            let name = container(&h.name);
            let endpoint = EndpointSettings {
                ipam_config: Some(EndpointIpamConfig {
                    ipv4_address: Some(h.v4.to_string()),
                    ipv6_address: Some(h.v6.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let body = ContainerCreateBody {
                image: Some(IMAGE.into()),
                hostname: Some(h.name.clone()),
                labels: Some(HashMap::from([(LABEL.to_string(), h.name.clone())])),
                env: Some(vec!["DVMLAB_LOG=info".into()]),
                stop_timeout: Some(5),
                host_config: Some(HostConfig {
                    init: Some(true),
                    binds: Some(vec![bind.clone()]),
                    extra_hosts: Some(extra_hosts.clone()),
                    dns_options: Some(vec!["timeout:1".into(), "attempts:1".into()]),
                    network_mode: Some(PREFIX.into()),
                    ..Default::default()
                }),
                networking_config: Some(NetworkingConfig {
                    endpoints_config: Some(HashMap::from([(PREFIX.to_string(), endpoint)])),
                }),
                ..Default::default()
            };
            self.docker
                .create_container(
                    Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                    body,
                )
                .await
                .map_err(err(&format!("creating {name}")))?;
        }
        let to_start: Vec<String> = plan
            .hosts()
            .into_iter()
            .map(|h| h.name)
            .filter(|n| !held.contains(n))
            .collect();
        let mut starts = futures::stream::iter(to_start.into_iter().map(|h| async move {
            let r = self.start(&h).await;
            (h, r)
        }))
        .buffer_unordered(8);
        while let Some((h, r)) = starts.next().await {
            r?;
            started(&h);
        }
        Ok(())
    }

    /// Starts the container of `host` (created, stopped or killed).
    pub async fn start(&self, host: &str) -> Result<(), String> {
        self.docker
            .start_container(&container(host), None)
            .await
            .map_err(err(&format!("starting {host}")))
    }

    pub async fn running(&self, host: &str) -> Result<bool, String> {
        let c = self
            .docker
            .inspect_container(&container(host), None)
            .await
            .map_err(err(&format!("inspecting {host}")))?;
        Ok(c.state.and_then(|s| s.running).unwrap_or(false))
    }

    /// SIGKILL to the host's daemon: the container stops at once, as a crashed node would.
    pub async fn kill(&self, host: &str) -> Result<(), String> {
        self.docker
            .kill_container(
                &container(host),
                Some(
                    KillContainerOptionsBuilder::default()
                        .signal("SIGKILL")
                        .build(),
                ),
            )
            .await
            .map_err(err(&format!("killing {host}")))
    }

    /// Freezes every process of the host (cgroup freezer): no answer, no FIN.
    pub async fn freeze(&self, host: &str) -> Result<(), String> {
        self.docker
            .pause_container(&container(host))
            .await
            .map_err(err(&format!("freezing {host}")))
    }

    pub async fn thaw(&self, host: &str) -> Result<(), String> {
        self.docker
            .unpause_container(&container(host))
            .await
            .map_err(err(&format!("thawing {host}")))
    }

    /// Stops (SIGTERM, then SIGKILL after 5 s) and starts the host again.
    pub async fn restart(&self, host: &str) -> Result<(), String> {
        self.docker
            .restart_container(
                &container(host),
                Some(RestartContainerOptionsBuilder::default().t(5).build()),
            )
            .await
            .map_err(err(&format!("restarting {host}")))
    }

    /// Everything the host's daemon wrote.
    pub async fn logs(&self, host: &str, follow: bool) -> Result<(), String> {
        let opts = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .follow(follow)
            .build();
        let mut s = self.docker.logs(&container(host), Some(opts));
        while let Some(chunk) = s.next().await {
            let chunk = chunk.map_err(err(&format!("logs of {host}")))?;
            dvmlab_host::stdout::bytes(&chunk.into_bytes());
        }
        Ok(())
    }

    /// The last `n` lines the host's daemon wrote.
    pub async fn logs_tail(&self, host: &str, n: usize) -> Result<String, String> {
        let opts = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .tail(&n.to_string())
            .build();
        let chunks: Vec<_> = self
            .docker
            .logs(&container(host), Some(opts))
            .try_collect()
            .await
            .map_err(err(&format!("logs of {host}")))?;
        Ok(chunks
            .into_iter()
            .map(|c| String::from_utf8_lossy(&c.into_bytes()).into_owned())
            .collect())
    }

    /// Runs `argv` in the host's container and collects its output.
    pub async fn exec(&self, host: &str, argv: &[String]) -> Result<ExecOutput, String> {
        let mut out = ExecOutput {
            code: -1,
            stdout: String::new(),
            stderr: String::new(),
        };
        let code = self
            .exec_with(host, argv, |stream, bytes| {
                let s = String::from_utf8_lossy(bytes);
                match stream {
                    Stream::Out => out.stdout.push_str(&s),
                    Stream::Err => out.stderr.push_str(&s),
                }
            })
            .await?;
        out.code = code;
        Ok(out)
    }

    /// Runs `argv` in the host's container, handing output to `sink` as it comes; its exit
    /// code.
    pub async fn exec_with(
        &self,
        host: &str,
        argv: &[String],
        mut sink: impl FnMut(Stream, &[u8]),
    ) -> Result<i64, String> {
        let what = format!("running {argv:?} on {host}");
        let exec = self
            .docker
            .create_exec(
                &container(host),
                CreateExecOptions {
                    cmd: Some(argv.to_vec()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .map_err(err(&what))?;
        match self
            .docker
            .start_exec(&exec.id, None)
            .await
            .map_err(err(&what))?
        {
            StartExecResults::Attached { mut output, .. } => {
                while let Some(chunk) = output.try_next().await.map_err(err(&what))? {
                    match chunk {
                        bollard::container::LogOutput::StdErr { message } => {
                            sink(Stream::Err, &message)
                        }
                        other => sink(Stream::Out, &other.into_bytes()),
                    }
                }
            }
            StartExecResults::Detached => return Err(format!("{what}: detached")),
        }
        let inspect = self
            .docker
            .inspect_exec(&exec.id)
            .await
            .map_err(err(&what))?;
        inspect
            .exit_code
            .ok_or_else(|| format!("{what}: no exit code"))
    }

    /// Removes every container and the network of the lab, the image tag and the mounted
    /// prte.conf; nothing that `up` did not make. Returns what it removed.
    pub async fn down(&self) -> Result<Vec<String>, String> {
        let mut removed = Vec::new();
        let filters = HashMap::from([("label", vec![LABEL])]);
        let list = self
            .docker
            .list_containers(Some(
                ListContainersOptionsBuilder::default()
                    .all(true)
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(err("listing containers"))?;
        let names: Vec<String> = list
            .into_iter()
            .filter_map(|c| c.names.and_then(|n| n.into_iter().next()))
            .map(|n| n.trim_start_matches('/').to_string())
            .filter(|n| n.starts_with(PREFIX))
            .collect();
        let mut removals = futures::stream::iter(names.into_iter().map(|n| async move {
            let r = self
                .docker
                .remove_container(
                    &n,
                    Some(RemoveContainerOptionsBuilder::default().force(true).build()),
                )
                .await;
            (n, r)
        }))
        .buffer_unordered(8);
        while let Some((n, r)) = removals.next().await {
            r.map_err(err(&format!("removing {n}")))?;
            removed.push(format!("container {n}"));
        }
        if self.network_labels().await?.is_some() {
            self.docker
                .remove_network(PREFIX)
                .await
                .map_err(err("removing the lab network"))?;
            removed.push(format!("network {PREFIX}"));
        }
        if self.image_exists().await {
            self.docker
                .remove_image(
                    IMAGE,
                    Some(RemoveImageOptionsBuilder::default().force(true).build()),
                    None,
                )
                .await
                .map_err(err("removing the lab image"))?;
            removed.push(format!("image {IMAGE}"));
        }
        let dir = conf_dir();
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            removed.push(format!("directory {}", dir.display()));
        }
        Ok(removed)
    }

    /// Waits until the controller reports every started daemon joined and (when none is
    /// held) the DVM formed; its JSON status.
    pub async fn wait_ready(
        &self,
        expect_joined: usize,
        within: Duration,
        mut progress: impl FnMut(usize),
    ) -> Result<serde_json::Value, String> {
        let start = Instant::now();
        let argv = ["pctl", "status", "--json"].map(String::from);
        let mut last;
        loop {
            match self.exec(CONTROLLER, &argv).await {
                Ok(o) if o.code == 0 => {
                    match serde_json::from_str::<serde_json::Value>(&o.stdout) {
                        Ok(s) => {
                            let joined = s["joined"].as_u64().unwrap_or(0) as usize;
                            progress(joined);
                            if joined >= expect_joined {
                                return Ok(s);
                            }
                            last = format!("{joined} of {expect_joined} daemons joined");
                        }
                        Err(e) => last = format!("status is not JSON: {e}"),
                    }
                }
                Ok(o) => last = o.stderr.trim().to_string(),
                Err(e) => {
                    if !self.running(CONTROLLER).await? {
                        return Err(format!(
                            "the controller's container exited; its log ends:\n{}",
                            self.logs_tail(CONTROLLER, 10).await?
                        ));
                    }
                    last = e;
                }
            }
            if start.elapsed() > within {
                return Err(format!(
                    "the DVM did not form within {within:?}: {last} (see `lab logs {CONTROLLER}`)"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Which stream a chunk of output came on.
#[derive(Debug, Clone, Copy)]
pub enum Stream {
    Out,
    Err,
}
