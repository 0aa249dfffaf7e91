//! The docker backend: every host is a long-running container on a user-defined Docker
//! network of the cluster's own (fixed IPv4 and IPv6 addresses, `internal`, so no traffic can
//! leave it), with the host name, `/etc/hosts` entries and embedded DNS that Docker gives it.
//!
//! Processes on a host (the daemon, commands, probes) are children of this process entered
//! into the container's network, UTS and mount namespaces, as `docker exec` enters them. So
//! signals, exit statuses, process groups and log files work as on every other backend, and a
//! status query costs a fork, not an engine round trip.
//!
//! Containers see this machine's `/usr` read-only, so any dynamically linked runtime, shell
//! or tool runs unchanged; the run directory read-write at its own path; the directories the
//! spec names ([`crate::ClusterSpec::mounts`]) read-only at their own paths; and every file
//! of the host's configuration directory (but `hosts`, which Docker writes) through a symlink
//! in `/etc`, so that a changed, added or removed file is what the next process started there
//! sees.
//!
//! Everything is labelled with the run's name, so `gc` finds what a crashed run left behind.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io;
use std::net::IpAddr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bollard::models::{
    ContainerCreateBody, EndpointIpamConfig, EndpointSettings, HostConfig, Ipam, IpamConfig,
    NetworkConnectRequest, NetworkCreateRequest, NetworkDisconnectRequest, NetworkingConfig,
};
use bollard::query_parameters::{
    BuildImageOptionsBuilder, CreateContainerOptionsBuilder, ListContainersOptionsBuilder,
    ListImagesOptionsBuilder, ListNetworksOptionsBuilder, RemoveContainerOptionsBuilder,
    RemoveImageOptionsBuilder,
};
use bollard::Docker;
use futures::StreamExt;
use nix::mount::{mount, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};

use crate::addr::{self, Block};
use crate::cluster::HostInfo;
use crate::partition::Switch;

/// The label on every container and network the backend makes; its value is the run name.
pub const LABEL: &str = "dvmlab.harness.run";
/// The repository of the host images (one tag per distinct image content).
pub const IMAGE_REPO: &str = "dvmlab-host";
/// Where a container sees its host's configuration directory.
const ETC_MOUNT: &str = "/run/dvmlab/etc";

/// A connection to the Docker engine, with the runtime its client needs.
pub struct Engine {
    rt: tokio::runtime::Runtime,
    docker: Docker,
}

fn err(what: impl std::fmt::Display) -> impl Fn(bollard::errors::Error) -> String {
    move |e| format!("{what}: {e}")
}

impl Engine {
    /// Connects to the local engine, agreeing on an API version it speaks.
    pub fn connect() -> Result<Engine, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("starting the Docker client's runtime: {e}"))?;
        let docker = rt.block_on(async {
            let d = Docker::connect_with_local_defaults()
                .map_err(|e| format!("no Docker engine: {e}"))?;
            let d = tokio::time::timeout(Duration::from_secs(5), d.negotiate_version())
                .await
                .map_err(|_| "the Docker engine did not answer within 5 s".to_string())?
                .map_err(|e| format!("no Docker engine: {e}"))?;
            d.ping()
                .await
                .map_err(|e| format!("no Docker engine: {e}"))?;
            Ok::<_, String>(d)
        })?;
        Ok(Engine { rt, docker })
    }

    /// Whether an engine answers here.
    pub fn available() -> bool {
        Engine::connect().is_ok()
    }

    /// Builds image `tag` from a build context tar (a Dockerfile and what it copies); the
    /// engine's own error when the build fails.
    pub fn build_image(&self, tag: &str, context: Vec<u8>) -> Result<(), String> {
        self.rt.block_on(build_image(&self.docker, tag, context))
    }

    /// Removes image `tag`; false if there was none.
    pub fn remove_image(&self, tag: &str) -> Result<bool, String> {
        if self.rt.block_on(self.docker.inspect_image(tag)).is_err() {
            return Ok(false);
        }
        let opts = RemoveImageOptionsBuilder::default().force(true).build();
        self.rt
            .block_on(self.docker.remove_image(tag, Some(opts), None))
            .map_err(err(format!("removing image {tag}")))?;
        Ok(true)
    }
}

async fn build_image(docker: &Docker, tag: &str, context: Vec<u8>) -> Result<(), String> {
    let opts = BuildImageOptionsBuilder::default()
        .t(tag)
        .rm(true)
        .forcerm(true)
        .build();
    let mut s = docker.build_image(opts, None, Some(bollard::body_full(context.into())));
    while let Some(info) = s.next().await {
        let info = info.map_err(err(format!("building {tag}")))?;
        if let Some(e) = info.error_detail.and_then(|d| d.message) {
            return Err(format!("building {tag}: {e}"));
        }
    }
    Ok(())
}

/// Every subnet of the engine's networks, as CIDR text.
pub fn subnets_in_use() -> Result<Vec<String>, String> {
    let engine = Engine::connect()?;
    let nets = engine
        .rt
        .block_on(engine.docker.list_networks(None))
        .map_err(err("listing Docker networks"))?;
    Ok(nets
        .into_iter()
        .filter_map(|n| n.ipam?.config)
        .flatten()
        .filter_map(|c| c.subnet)
        .collect())
}

/// What the docker backend needs from the cluster spec.
pub(crate) struct DockerPlan<'a> {
    pub run: &'a str,
    pub hosts: &'a [HostInfo],
    pub v6: bool,
    pub dual_homed: bool,
    pub domain: Option<&'a str>,
    /// `(address, names)` for every line of the hosts file.
    pub hosts_lines: Vec<(IpAddr, String)>,
    /// Host `i`'s configuration directory (seen at [`ETC_MOUNT`]).
    pub etc_dirs: Vec<PathBuf>,
    pub run_dir: &'a Path,
    pub mounts: Vec<PathBuf>,
}

/// The containers and networks of one cluster. Destroyed by [`DockerWorld::destroy`].
pub struct DockerWorld {
    engine: Engine,
    run: String,
    networks: Vec<String>,
    containers: Vec<String>,
    /// The pid (in this machine's namespace) of each container's init, whose namespaces
    /// processes enter.
    pids: Vec<u32>,
    /// Each host's endpoint on each network, to reconnect a host that was cut off.
    endpoints: Vec<Vec<EndpointSettings>>,
    switch: Switch,
    block: Block,
}

/// The run a container or network name belongs to: `dvl<pid>-<n>` of `dvl<pid>-<n>-<host>`
/// or `dvl<pid>-<n>s`.
fn run_of(name: &str) -> String {
    let mut parts = name.splitn(3, '-');
    let (a, b) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    format!("{a}-{}", b.trim_end_matches('s'))
}

/// The name of run `run`'s container for host `host`.
fn container_name(run: &str, host: &str) -> String {
    format!("{run}-{host}")
}

impl DockerWorld {
    /// Builds (or reuses) the host image, creates the network(s) and one running container
    /// per host. On error, everything created so far is removed.
    /// `block` is the subnet block the hosts' addresses were drawn from.
    pub(crate) fn create(block: Block, plan: &DockerPlan) -> Result<DockerWorld, String> {
        let engine = Engine::connect()?;
        let switch = Switch {
            ns: None,
            name: plan.run.replace('-', "_"),
        };
        let mut w = DockerWorld {
            engine,
            run: plan.run.to_string(),
            networks: Vec::new(),
            containers: Vec::new(),
            pids: Vec::new(),
            endpoints: Vec::new(),
            switch,
            block,
        };
        match w.build(plan) {
            Ok(()) => Ok(w),
            Err(e) => {
                w.destroy();
                Err(e)
            }
        }
    }

    fn build(&mut self, plan: &DockerPlan) -> Result<(), String> {
        let image = self.ensure_image()?;
        let block = self.block.block;
        let mut nets = vec![(self.run.clone(), false)];
        if plan.dual_homed {
            nets.push((format!("{}s", self.run), true));
        }
        for (name, second) in &nets {
            self.create_network(name, block, *second, plan.v6)?;
        }
        let binds = binds(plan);
        let extra_hosts: Vec<String> = plan
            .hosts_lines
            .iter()
            .map(|(a, names)| format!("{names}:{a}"))
            .collect();
        let docker = self.engine.docker.clone();
        let mut created: Vec<Result<(String, Vec<EndpointSettings>), String>> = Vec::new();
        self.engine.rt.block_on(async {
            let jobs = plan.hosts.iter().map(|h| {
                let name = container_name(&self.run, &h.name);
                let endpoints: Vec<EndpointSettings> = nets
                    .iter()
                    .map(|(_, second)| endpoint(h, block, *second, plan.v6))
                    .collect();
                let mut host_binds = binds.clone();
                host_binds.push(format!(
                    "{}:{ETC_MOUNT}:ro",
                    plan.etc_dirs[h.index].display()
                ));
                let body = ContainerCreateBody {
                    image: Some(image.clone()),
                    hostname: Some(h.name.clone()),
                    domainname: plan.domain.map(str::to_string),
                    labels: Some(HashMap::from([(LABEL.to_string(), self.run.clone())])),
                    // No init: nothing lives in the container's pid namespace but the idle
                    // keeper (entered processes stay in this one), and Docker's init would
                    // need /sbin, which is the machine's read-only /usr here.
                    host_config: Some(HostConfig {
                        binds: Some(host_binds),
                        extra_hosts: Some(extra_hosts.clone()),
                        // The embedded DNS answers the hosts' names; anything else is refused
                        // at once (nothing listens there) instead of leaving the machine.
                        dns: Some(vec!["127.0.0.1".into()]),
                        dns_options: Some(vec!["timeout:1".into(), "attempts:1".into()]),
                        network_mode: Some(nets[0].0.clone()),
                        ..Default::default()
                    }),
                    networking_config: Some(NetworkingConfig {
                        endpoints_config: Some(HashMap::from([(
                            nets[0].0.clone(),
                            endpoints[0].clone(),
                        )])),
                    }),
                    ..Default::default()
                };
                let docker = docker.clone();
                let nets = nets.clone();
                async move {
                    docker
                        .create_container(
                            Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                            body,
                        )
                        .await
                        .map_err(err(format!("creating container {name}")))?;
                    for ((net, _), ep) in nets.iter().zip(&endpoints).skip(1) {
                        connect(&docker, net, &name, ep).await?;
                    }
                    docker
                        .start_container(&name, None)
                        .await
                        .map_err(err(format!("starting container {name}")))?;
                    Ok((name, endpoints))
                }
            });
            let mut s = futures::stream::iter(jobs).buffered(8);
            while let Some(r) = s.next().await {
                created.push(r);
            }
        });
        for r in created {
            let (name, endpoints) = r?;
            self.containers.push(name);
            self.endpoints.push(endpoints);
        }
        for name in self.containers.clone() {
            let pid = self.init_pid(&name)?;
            self.pids.push(pid);
        }
        Ok(())
    }

    fn init_pid(&self, name: &str) -> Result<u32, String> {
        let c = self
            .engine
            .rt
            .block_on(self.engine.docker.inspect_container(name, None))
            .map_err(err(format!("inspecting {name}")))?;
        let state = c.state.unwrap_or_default();
        match (state.running, state.pid) {
            (Some(true), Some(pid)) if pid > 0 => Ok(pid as u32),
            _ => Err(format!("container {name} is not running: {state:?}")),
        }
    }

    fn create_network(
        &mut self,
        name: &str,
        block: u8,
        second: bool,
        v6: bool,
    ) -> Result<(), String> {
        let (s4, s6) = addr::docker_subnets(block, second);
        // Docker 20.10 cannot leave IPv4 out; IPv6-only clusters simply never name it.
        let mut config = vec![IpamConfig {
            subnet: Some(s4),
            ..Default::default()
        }];
        if v6 {
            config.push(IpamConfig {
                subnet: Some(s6),
                ..Default::default()
            });
        }
        let req = NetworkCreateRequest {
            name: name.to_string(),
            driver: Some("bridge".into()),
            internal: Some(true),
            enable_ipv6: Some(v6),
            ipam: Some(Ipam {
                config: Some(config),
                ..Default::default()
            }),
            options: Some(HashMap::from([(
                "com.docker.network.bridge.name".to_string(),
                name.to_string(),
            )])),
            labels: Some(HashMap::from([(LABEL.to_string(), self.run.clone())])),
            ..Default::default()
        };
        self.engine
            .rt
            .block_on(self.engine.docker.create_network(req))
            .map_err(err(format!("creating network {name}")))?;
        self.networks.push(name.to_string());
        Ok(())
    }

    /// The image every host runs, built from the machine's files the first time.
    fn ensure_image(&self) -> Result<String, String> {
        let context = image_context()?;
        let mut h = std::hash::DefaultHasher::new();
        context.hash(&mut h);
        let tag = format!("{IMAGE_REPO}:{:016x}", h.finish());
        let docker = &self.engine.docker;
        if self.engine.rt.block_on(docker.inspect_image(&tag)).is_ok() {
            return Ok(tag);
        }
        self.engine
            .rt
            .block_on(build_image(docker, &tag, context))?;
        Ok(tag)
    }

    /// Makes `cmd` start inside host `i`'s container (network, host name, file system), in
    /// directory `cwd` as the container sees it, with the files of `etc_dir` in its `/etc`.
    pub fn enter(&self, cmd: &mut Command, i: usize, cwd: &Path, etc_dir: &Path) -> io::Result<()> {
        enter_container(cmd, self.pids[i], cwd, etc_dir)
    }

    /// The pid of host `i`'s container (its first process), by which it is entered.
    pub fn pid(&self, i: usize) -> u32 {
        self.pids[i]
    }
}

/// Makes `cmd` run in the container whose first process is `pid`: its network, host name and
/// file system, in `cwd`, with `etc_dir`'s files linked into its `/etc`.
pub fn enter_container(cmd: &mut Command, pid: u32, cwd: &Path, etc_dir: &Path) -> io::Result<()> {
    {
        link_etc(pid, etc_dir)?;
        let ns = |kind: &str| File::open(format!("/proc/{pid}/ns/{kind}"));
        let (net, uts, mnt) = (ns("net")?, ns("uts")?, ns("mnt")?);
        let dir = CString::new(cwd.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the closure runs between fork and exec and only makes system calls on data
        // prepared before the fork. The mount namespace comes last: entering it moves the
        // root and working directory into the container. The process stays in this pid
        // namespace, where the container's /proc cannot show it (/proc/self, /proc/net would
        // be wrong), so it gets a mount namespace of its own with a /proc of its pid
        // namespace; /proc/net then shows the container's network.
        unsafe {
            cmd.pre_exec(move || {
                setns(&net, CloneFlags::CLONE_NEWNET)?;
                setns(&uts, CloneFlags::CLONE_NEWUTS)?;
                setns(&mnt, CloneFlags::CLONE_NEWNS)?;
                unshare(CloneFlags::CLONE_NEWNS)?;
                crate::netns::mounts_private()?;
                mount(
                    Some("proc"),
                    "/proc",
                    Some("proc"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                    None::<&str>,
                )?;
                nix::unistd::chdir(dir.as_c_str())?;
                Ok(())
            });
        }
        Ok(())
    }
}

impl DockerWorld {
    /// Disconnects host `i` from every network of the cluster, or connects it again with the
    /// same addresses.
    pub fn set_connected(&self, i: usize, connected: bool) -> Result<(), String> {
        let name = &self.containers[i];
        let docker = &self.engine.docker;
        self.engine.rt.block_on(async {
            for (net, ep) in self.networks.iter().zip(&self.endpoints[i]) {
                if connected {
                    connect(docker, net, name, ep).await?;
                } else {
                    docker
                        .disconnect_network(
                            net,
                            NetworkDisconnectRequest {
                                container: name.clone(),
                                force: Some(true),
                            },
                        )
                        .await
                        .map_err(err(format!("disconnecting {name} from {net}")))?;
                }
            }
            Ok(())
        })
    }

    /// The subnet block the cluster's addresses come from.
    pub fn block(&self) -> u8 {
        self.block.block
    }

    /// Where partitions and connection counters go: a table of the cluster's own in this
    /// machine's namespace, where the cluster's bridges are.
    pub(crate) fn switch(&self) -> Switch {
        self.switch.clone()
    }

    /// Removes every container and network of the run (found by label, so that those a
    /// failed creation left half made go too), and the switch table.
    pub fn destroy(&mut self) {
        self.containers.clear();
        self.networks.clear();
        let docker = self.engine.docker.clone();
        let run = self.run.clone();
        self.engine.rt.block_on(async move {
            let (containers, networks) = labelled(&docker, |r| r == run).await;
            let _ = remove(&docker, containers, networks).await;
        });
        let _ = self.switch.delete_table();
    }
}

impl Drop for DockerWorld {
    fn drop(&mut self) {
        self.destroy();
    }
}

/// The containers and networks whose run label satisfies `pick`.
async fn labelled(docker: &Docker, pick: impl Fn(&str) -> bool) -> (Vec<String>, Vec<String>) {
    let filters = HashMap::from([("label", vec![LABEL])]);
    let containers = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|c| {
            c.labels
                .as_ref()
                .and_then(|l| l.get(LABEL))
                .is_some_and(|r| pick(r))
        })
        .filter_map(|c| c.names.and_then(|n| n.into_iter().next()))
        .map(|n| n.trim_start_matches('/').to_string())
        .collect();
    let networks = docker
        .list_networks(Some(
            ListNetworksOptionsBuilder::default()
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|n| {
            n.labels
                .as_ref()
                .and_then(|l| l.get(LABEL))
                .is_some_and(|r| pick(r))
        })
        .filter_map(|n| n.name)
        .collect();
    (containers, networks)
}

/// Connects container `name` to network `net` with endpoint settings `ep`.
async fn connect(
    docker: &Docker,
    net: &str,
    name: &str,
    ep: &EndpointSettings,
) -> Result<(), String> {
    docker
        .connect_network(
            net,
            NetworkConnectRequest {
                container: name.to_string(),
                endpoint_config: Some(ep.clone()),
            },
        )
        .await
        .map_err(err(format!("connecting {name} to {net}")))
}

/// Links every file of `etc_dir` (seen in the container at [`ETC_MOUNT`]) into the `/etc` of
/// the container whose init is `pid`, unless `/etc` has that name already.
fn link_etc(pid: u32, etc_dir: &Path) -> io::Result<()> {
    let etc = PathBuf::from(format!("/proc/{pid}/root/etc"));
    for e in std::fs::read_dir(etc_dir)? {
        let name = e?.file_name();
        if name == "hosts" {
            continue;
        }
        let link = etc.join(&name);
        if link.symlink_metadata().is_ok() {
            continue;
        }
        match std::os::unix::fs::symlink(Path::new(ETC_MOUNT).join(&name), &link) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// Removes `containers` (killing what runs there), then `networks`; returns the networks the
/// engine would not let go of.
///
/// Docker 20.10 keeps a count of each network's endpoints, and endpoints deleted at the same
/// time (containers removed in parallel) can leave it too high: the network then stays "in
/// use" by nobody until the engine restarts. So each container leaves its networks one
/// endpoint at a time, before anything in it is killed (its init's death makes the engine
/// delete its endpoints on its own, beside the next ones), and only then are the containers
/// removed in parallel; an endpoint a network still lists is taken off it before the
/// network is removed. Every call has [`CALL`] to answer, so a stuck engine holds the
/// teardown for that long per call, not for bollard's two minutes.
async fn remove(docker: &Docker, containers: Vec<String>, networks: Vec<String>) -> Vec<String> {
    for c in &containers {
        let info = within(docker.inspect_container(c, None)).await;
        let nets = info
            .as_ref()
            .and_then(|i| i.network_settings.as_ref()?.networks.as_ref())
            .map(|n| n.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default();
        for net in nets {
            disconnect(docker, &net, c).await;
        }
        // Processes entered into the container without being its own (a daemon an
        // elastic DVM launched through the agent) are not killed with it.
        let pid = info
            .as_ref()
            .and_then(|i| i.state.as_ref()?.pid)
            .filter(|p| *p > 0);
        if let Some(pid) = pid {
            crate::gc::kill_in_netns(Path::new(&format!("/proc/{pid}/ns/net")));
        }
    }
    let mut s = futures::stream::iter(containers.into_iter().map(|c| {
        let docker = docker.clone();
        async move {
            let opts = RemoveContainerOptionsBuilder::default().force(true).build();
            match tokio::time::timeout(CALL, docker.remove_container(&c, Some(opts))).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) if not_found(&e) => {}
                Ok(Err(e)) => eprintln!("dvmlab-harness: removing container {c}: {e}"),
                Err(_) => {
                    eprintln!("dvmlab-harness: removing container {c}: no answer in {CALL:?}")
                }
            }
        }
    }))
    .buffer_unordered(8);
    while s.next().await.is_some() {}
    let mut held = Vec::new();
    for n in networks {
        if let Some(info) = within(docker.inspect_network(&n, None)).await {
            for (id, ep) in info.containers.unwrap_or_default() {
                disconnect(docker, &n, &ep.name.unwrap_or(id)).await;
            }
        }
        // The engine may still be releasing the removed containers' endpoints, or be slow
        // to answer on a busy machine: asked again until the network's deadline.
        let deadline = tokio::time::Instant::now() + 2 * CALL;
        let mut last;
        loop {
            last = match tokio::time::timeout(CALL, docker.remove_network(&n)).await {
                Ok(Ok(())) => None,
                Ok(Err(e)) if not_found(&e) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(_) => Some(format!("no answer in {CALL:?}")),
            };
            if last.is_none() || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if let Some(e) = last {
            eprintln!(
                "dvmlab-harness: LEAKED Docker network {n}: {e} (`dvmlab-harness gc` removes it once the engine lets go of it; a restart of the engine makes it)"
            );
            held.push(n);
        }
    }
    held
}

/// How long one engine call of a teardown may take.
const CALL: Duration = Duration::from_secs(10);

/// What `call` answered within [`CALL`], if it succeeded.
async fn within<T>(
    call: impl std::future::Future<Output = Result<T, bollard::errors::Error>>,
) -> Option<T> {
    tokio::time::timeout(CALL, call).await.ok()?.ok()
}

/// Takes container (or endpoint) `c` off network `net`, forced; one that is not on it is left.
async fn disconnect(docker: &Docker, net: &str, c: &str) {
    let req = NetworkDisconnectRequest {
        container: c.to_string(),
        force: Some(true),
    };
    within(docker.disconnect_network(net, req)).await;
}

/// Whether the engine answered that what was asked for does not exist.
fn not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// Host `h`'s endpoint on the cluster's first (or second) network: fixed addresses, and its
/// name as a DNS alias.
fn endpoint(h: &HostInfo, block: u8, second: bool, v6: bool) -> EndpointSettings {
    let (a4, a6) = if second {
        (
            addr::docker_second_v4(block, h.index),
            addr::docker_second_v6(block, h.index),
        )
    } else {
        (
            addr::docker_v4(block, h.index),
            addr::docker_v6(block, h.index),
        )
    };
    EndpointSettings {
        ipam_config: Some(EndpointIpamConfig {
            ipv4_address: Some(a4.to_string()),
            ipv6_address: v6.then(|| a6.to_string()),
            ..Default::default()
        }),
        aliases: Some(vec![h.name.clone()]),
        ..Default::default()
    }
}

/// The bind mounts every container of a cluster gets (the per-host configuration directory
/// aside).
fn binds(plan: &DockerPlan) -> Vec<String> {
    let mut v = vec!["/usr:/usr:ro".to_string()];
    for dir in ["/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin"] {
        // Merged /usr (a symlink) is in the image; a real directory is mounted.
        if Path::new(dir).is_dir() && !Path::new(dir).is_symlink() {
            v.push(format!("{dir}:{dir}:ro"));
        }
    }
    let rd = plan.run_dir.display();
    v.push(format!("{rd}:{rd}"));
    let mut ro: Vec<&PathBuf> = plan.mounts.iter().filter(|p| p.is_dir()).collect();
    ro.sort();
    ro.dedup();
    let mut kept: Vec<&PathBuf> = Vec::new();
    for p in ro {
        // Under /usr or an already mounted directory: seen already.
        if !p.starts_with("/usr") && !kept.iter().any(|k| p.starts_with(k)) {
            kept.push(p);
        }
    }
    v.extend(
        kept.iter()
            .map(|p| format!("{}:{}:ro", p.display(), p.display())),
    );
    v
}

/// The host image's build context: a scratch image with the directories, symlinks and
/// `/etc` files a host needs; `/usr` and the rest come from bind mounts.
fn image_context() -> Result<Vec<u8>, String> {
    let fail = |e: io::Error| format!("host image context: {e}");
    let mut tar = tar::Builder::new(Vec::new());
    let add = |tar: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], mode: u32| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        tar.append_data(&mut h, path, data).map_err(fail)
    };
    let dockerfile = "FROM scratch\nCOPY rootfs/ /\nCMD [\"/usr/bin/sleep\", \"infinity\"]\n";
    add(&mut tar, "Dockerfile", dockerfile.as_bytes(), 0o644)?;
    for dir in ["/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin"] {
        if let Ok(target) = std::fs::read_link(dir) {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            h.set_mode(0o777);
            tar.append_link(&mut h, format!("rootfs{dir}"), &target)
                .map_err(fail)?;
        }
    }
    for (dir, mode) in [
        ("rootfs/tmp", 0o1777),
        ("rootfs/root", 0o700),
        ("rootfs/usr", 0o755),
        ("rootfs/run/dvmlab/etc", 0o755),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        h.set_mode(mode);
        tar.append_data(&mut h, dir, io::empty()).map_err(fail)?;
    }
    for f in [
        "passwd",
        "group",
        "nsswitch.conf",
        "host.conf",
        "ld.so.cache",
        "ld.so.conf",
    ] {
        if let Ok(data) = std::fs::read(Path::new("/etc").join(f)) {
            add(&mut tar, &format!("rootfs/etc/{f}"), &data, 0o644)?;
        }
    }
    tar.into_inner().map_err(fail)
}

/// What one `gc` pass removed from the engine.
#[derive(Debug, Default)]
pub struct Leftovers {
    pub containers: Vec<String>,
    pub networks: Vec<String>,
    pub images: Vec<String>,
    /// Networks found and not removed: the engine still holds an endpoint of a container
    /// that is gone (a Docker engine defect).
    pub held: Vec<String>,
}

/// Removes containers, networks and switch tables of runs whose owner process is gone
/// (`all`: of every run, and the host images too). Nothing when no engine answers.
pub fn collect(all: bool) -> Leftovers {
    let mut out = Leftovers::default();
    let Ok(engine) = Engine::connect() else {
        return out;
    };
    let stale = |run: &str| all || crate::gc::owner_of(run).is_some_and(|p| !crate::gc::alive(p));
    let docker = &engine.docker;
    engine.rt.block_on(async {
        let (containers, networks) = labelled(docker, stale).await;
        out.containers = containers;
        out.networks = networks;
        let runs: std::collections::BTreeSet<String> = out
            .containers
            .iter()
            .chain(&out.networks)
            .filter_map(|n| crate::gc::owner_of(n).map(|_| run_of(n)))
            .collect();
        out.held = remove(docker, out.containers.clone(), out.networks.clone()).await;
        out.networks.retain(|n| !out.held.contains(n));
        for run in runs {
            let sw = Switch {
                ns: None,
                name: run.replace('-', "_"),
            };
            let _ = sw.delete_table();
        }
        if all {
            let filters = HashMap::from([("reference", vec![IMAGE_REPO])]);
            let images = docker
                .list_images(Some(
                    ListImagesOptionsBuilder::default()
                        .filters(&filters)
                        .build(),
                ))
                .await
                .unwrap_or_default();
            for i in images {
                for tag in i.repo_tags {
                    let opts = RemoveImageOptionsBuilder::default().force(true).build();
                    if docker.remove_image(&tag, Some(opts), None).await.is_ok() {
                        out.images.push(tag);
                    }
                }
            }
        }
    });
    out
}
