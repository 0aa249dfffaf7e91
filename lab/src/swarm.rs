//! The lab on Docker's swarm mode, an engine that spans machines: the plan as a stack of
//! one service per host, each with one task whose container has the host's fixed name,
//! reached through the overlay network's DNS (round robin, `endpoint_mode: dnsrr`, so a
//! name resolves to its task's own address, also after the task is replaced). prte.conf is
//! a swarm config and the DVM key a swarm secret, so every machine of the swarm gets them
//! from the managers, not from a file of its own.
//!
//! `lab up --swarm` deploys what `lab export --swarm` writes, with `docker stack deploy`
//! (the stack format is the Docker CLI's: the engine's API has no stacks), except that on a
//! swarm of one machine a local image is named by its ID ([`task_image`]). The
//! other commands act on the tasks' containers through this machine's engine, so on a
//! swarm of many machines they reach the tasks that run here; `lab logs` (the swarm's
//! service logs) and `restart`/`late-boot` (service updates) reach every task.
//!
//! The DVM is elastic: every task runs the runtime's launch service (`plaunch`), which is
//! how the controller starts daemons in other tasks, spares (`--spares`) included.
//!
//! A swarm lab is remembered by a file in the lab's directory (see [`keeper::dir`]); the
//! stack's files (stack.yml, prte.conf, dvm.key) are kept beside it.

use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::keeper;
use crate::plan::{Plan, CONTROLLER};

/// The stack's default name; services are `<stack>_<host>`.
pub const STACK: &str = "dvmlab-lab";
/// The overlay network's subnet: dedicated, beside the other lab forms' 10.210.0.0/16.
pub const SUBNET: &str = "10.211.0.0/16";
/// Where a task finds the DVM key: swarm secrets are files under /run/secrets.
pub const KEY_PATH: &str = "/run/secrets/dvm.key";
/// The controller's launch agent: the launch service of the target's task.
pub const AGENT: &str = "/bin/plaunch run";
const CONFIG: &str = "prte_conf";
const SECRET: &str = "dvm_key";
/// How long `down` waits for the engine to remove the stack's containers and network.
const DOWN_LIMIT: Duration = Duration::from_secs(90);

/// The files of a swarm stack, as `lab export --swarm` writes them (the key aside).
pub fn files(
    plan: &Plan,
    image: &str,
    hold: &[String],
) -> Result<Vec<(&'static str, String)>, String> {
    Ok(vec![
        ("stack.yml", stack_file(plan, image, hold)?),
        ("prte.conf", conf(plan)),
    ])
}

/// prte.conf for the swarm: the plan's names (the services' host names), the key where
/// swarm puts secrets, and only the overlay network (tasks also have a gateway network).
pub fn conf(plan: &Plan) -> String {
    plan.conf_text(
        "lab up --swarm",
        &plan.dvm_nodes(),
        CONTROLLER,
        Some(SUBNET),
        KEY_PATH,
    )
}

/// The stack file for `docker stack deploy`: a service per host and spare, IPv4 on an
/// overlay network of its own (hosts in `hold` deployed with no task, for `late-boot`).
///
/// Every task runs the launch service, `plaunch serve`, which is how the controller starts
/// daemons in other tasks (there is no ssh): on a spare it only serves; on the DVM's hosts
/// it also boots the host's daemon (`--boot`) and fails with it, so a crashed daemon's task
/// is restarted as a crashed node is rebooted, while a daemon that left (a shrink) leaves a
/// host the DVM can grow onto again. The DVM is elastic, its agent `plaunch run`.
pub fn stack_file(plan: &Plan, image: &str, hold: &[String]) -> Result<String, String> {
    for h in hold {
        if plan.is_spare(h) {
            return Err(format!("{h} is a spare: it has no daemon to hold"));
        }
        plan.host(h)?;
    }
    let mut services = serde_json::Map::new();
    for h in plan.all_hosts() {
        let replicas = if hold.contains(&h.name) { 0 } else { 1 };
        let entrypoint = if plan.is_spare(&h.name) {
            json!(["/bin/plaunch", "serve"])
        } else {
            json!(["/bin/plaunch", "serve", "--boot", "--", "--bootstrap"])
        };
        services.insert(
            h.name.clone(),
            json!({
                "image": image,
                "hostname": h.name,
                "entrypoint": entrypoint,
                "init": true,
                "stop_grace_period": "5s",
                "environment": {
                    "DVMLAB_LOG": "info",
                    "PRTE_MCA_prte_elastic_mode": "1",
                    "PRTE_MCA_plm_ssh_agent": AGENT,
                    // The controller logs when a job waits for a campaign.
                    "PRTE_MCA_state_base_verbose": "1",
                },
                "configs": [{"source": CONFIG, "target": "/etc/prte.conf", "mode": 0o444}],
                "secrets": [{"source": SECRET, "target": "dvm.key", "mode": 0o400}],
                "networks": ["dvm"],
                "deploy": {
                    "endpoint_mode": "dnsrr",
                    "replicas": replicas,
                    // A task that fails is replaced, as a crashed node is rebooted; one
                    // whose daemon left cleanly stays (it still serves launches).
                    "restart_policy": {"condition": "on-failure", "delay": "2s"},
                },
            }),
        );
    }
    let doc = json!({
        "version": "3.8",
        "services": services,
        "configs": {CONFIG: {"file": "./prte.conf"}},
        "secrets": {SECRET: {"file": "./dvm.key"}},
        "networks": {
            "dvm": {
                "driver": "overlay",
                "ipam": {"config": [{"subnet": SUBNET}]},
            }
        },
    });
    serde_norway::to_string(&doc).map_err(|e| format!("stack file: {e}"))
}

/// What the tasks of a stack run. On a swarm of this one machine, an image of a plain local
/// name (`make lab-image`'s) by its ID: a swarm's agent pulls every task's image by name
/// before it looks on the machine (it asks Docker Hub for a local-only image, and falls back
/// to the local one only once that fails), and an image named by its ID is never pulled.
/// An image whose name has a repository path (`lab image --push REGISTRY`'s), or any image
/// on a swarm of several machines (where each may have built its own, under another ID), by
/// its name.
fn task_image(image: &str, id: &str, one_machine: bool) -> String {
    if !one_machine || image.contains('/') || id.is_empty() {
        image.to_string()
    } else {
        id.to_string()
    }
}

/// Runs `docker ARGS`; its stdout, or an error naming the command and what it said.
fn docker(args: &[&str]) -> Result<String, String> {
    let o = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            format!(
                "docker {}: {e} (the swarm lab needs the docker CLI)",
                args.join(" ")
            )
        })?;
    if !o.status.success() {
        return Err(format!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Whether this machine's engine is a manager of an active swarm; why not, if not.
pub fn manager_here() -> Result<(), String> {
    let state = docker(&[
        "info",
        "--format",
        "{{.Swarm.LocalNodeState}} {{.Swarm.ControlAvailable}}",
    ])?;
    match state.trim() {
        "active true" => Ok(()),
        "active false" => Err("this Docker engine is a swarm worker: run lab on a manager".into()),
        other => Err(format!(
            "this Docker engine is not in a swarm (state: {other}); `docker swarm init --advertise-addr 127.0.0.1` makes a one-node swarm"
        )),
    }
}

/// A swarm lab that is up: its stack and plan.
pub struct Lab {
    pub stack: String,
    pub plan: Plan,
}

fn marker() -> PathBuf {
    keeper::dir().join("swarm.json")
}

impl Lab {
    /// The swarm lab recorded in the lab's directory, if one is up.
    pub fn find() -> Result<Option<Lab>, String> {
        let path = marker();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let field = |k: &str| {
            v[k].as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("{}: no {k}", path.display()))
        };
        let num = |k: &str| {
            v[k].as_u64()
                .ok_or_else(|| format!("{}: no {k}", path.display()))
        };
        let ip = crate::plan::IpVersion::V4;
        let plan = Plan::new(num("nodes")? as usize, num("radix")? as u32, ip)?
            .with_spares(v["spares"].as_u64().unwrap_or(0) as usize)?;
        Ok(Some(Lab {
            stack: field("stack")?,
            plan,
        }))
    }

    /// Deploys the stack of `plan` and records it; returns once the engine took it (the
    /// tasks may still be starting). The record is written first, so that `lab down`
    /// removes what a deploy that failed half way made.
    pub fn deploy(plan: &Plan, image: &str, stack: &str, hold: &[String]) -> Result<(), String> {
        manager_here()?;
        let id = docker(&["image", "inspect", "--format", "{{.Id}}", image]).map_err(|_| {
            format!(
                "no image {image} on this machine: `make lab-image` builds it (for a swarm of several machines, `lab image --push REGISTRY` and `--image REGISTRY/{}`)",
                crate::image::IMAGE
            )
        })?;
        let nodes = docker(&["info", "--format", "{{.Swarm.Nodes}}"])?;
        let one_machine = nodes.trim() == "1";
        let image = task_image(image, id.trim(), one_machine);
        let dir = keeper::dir();
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for (name, text) in files(plan, &image, hold)? {
            let p = dir.join(name);
            std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))?;
        }
        dvmlab_host::keyfile::generate(&dir.join("dvm.key"))?;
        let record = json!({
            "stack": stack, "nodes": plan.nodes, "radix": plan.radix, "spares": plan.spares,
            "image": image,
        });
        std::fs::write(marker(), record.to_string())
            .map_err(|e| format!("{}: {e}", marker().display()))?;
        let file = dir.join("stack.yml");
        let file = file.to_string_lossy();
        // No registry is asked for the image's digest: on one machine there may be none.
        docker(&[
            "stack",
            "deploy",
            "--detach=true",
            "--resolve-image",
            "never",
            "-c",
            &file,
            stack,
        ])
        .map_err(|e| format!("{e} (`lab down` removes what it made)"))?;
        Ok(())
    }

    fn service(&self, host: &str) -> Result<String, String> {
        self.plan.host(host)?;
        Ok(format!("{}_{host}", self.stack))
    }

    /// The container of `host`'s task on this machine, in state `state` (running, paused).
    fn container(&self, host: &str, state: &str) -> Result<String, String> {
        let service = self.service(host)?;
        let label = format!("label=com.docker.swarm.service.name={service}");
        let status = format!("status={state}");
        let out = docker(&["ps", "-q", "--filter", &label, "--filter", &status])?;
        out.lines().next().map(str::to_string).ok_or_else(|| {
            format!(
                "{host}: no {state} task on this machine (`docker service ps {service}` shows where it is and why)"
            )
        })
    }

    /// The state of `host`'s task on this machine, in the words of the other labs:
    /// running, frozen (paused), or not running.
    pub fn state(&self, host: &str) -> String {
        if self.container(host, "running").is_ok() {
            "running".into()
        } else if self.container(host, "paused").is_ok() {
            "frozen".into()
        } else {
            "not running".into()
        }
    }

    /// `docker exec` of `argv` in `host`'s task with this process's stdin, stdout and
    /// stderr; its exit code.
    pub fn exec(&self, host: &str, argv: &[String]) -> Result<i64, String> {
        let c = self.container(host, "running")?;
        let status = Command::new("docker")
            .args(["exec", "-i", &c])
            .args(argv)
            .status()
            .map_err(|e| format!("docker exec: {e}"))?;
        Ok(status.code().map_or(1, i64::from))
    }

    /// `argv` in `host`'s task; (exit code, stdout, stderr).
    pub fn output(&self, host: &str, argv: &[String]) -> Result<(i64, String, String), String> {
        let c = self.container(host, "running")?;
        let o = Command::new("docker")
            .args(["exec", &c])
            .args(argv)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("docker exec: {e}"))?;
        Ok((
            o.status.code().map_or(1, i64::from),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        ))
    }

    /// A fault or repair on `host`: what was done, for the user.
    pub fn act(&self, op: &str, host: &str) -> Result<String, String> {
        match op {
            "kill" => {
                docker(&["kill", &self.container(host, "running")?])?;
                Ok("killed (the swarm replaces its task)".into())
            }
            "freeze" => {
                docker(&["pause", &self.container(host, "running")?])?;
                Ok("frozen".into())
            }
            "thaw" => {
                docker(&["unpause", &self.container(host, "paused")?])?;
                Ok("thawed".into())
            }
            // A new task in place of the old one, wherever the swarm puts it.
            "restart" => {
                docker(&[
                    "service",
                    "update",
                    "--detach",
                    "--force",
                    &self.service(host)?,
                ])?;
                Ok("restarted (a new task)".into())
            }
            "late-boot" => {
                let spec = format!("{}=1", self.service(host)?);
                docker(&["service", "scale", "--detach", &spec])?;
                Ok("booted".into())
            }
            other => Err(format!("{other}: not a lab command on swarm")),
        }
    }

    /// Cuts `a` from `b` both ways: an nftables rule in every task's own network namespace
    /// (swarm's overlay has no switch of ours to put it in) drops what arrives from the
    /// other side's overlay addresses. Only arriving packets are dropped, so a sender's
    /// writes succeed and its packets vanish, as on a cut cable (a rule on the way out
    /// would fail the sender's writes at once). Only tasks on this machine can be cut; a
    /// replaced task comes back without the rule, as a rebooted machine would.
    pub fn partition(&self, a: &[String], b: &[String]) -> Result<(), String> {
        let (ia, ib) = (self.addresses(a)?, self.addresses(b)?);
        for (hosts, other) in [(a, &ib), (b, &ia)] {
            for h in hosts {
                let set = other
                    .iter()
                    .map(IpAddr::to_string)
                    .collect::<Vec<_>>()
                    .join(", ");
                let script = format!(
                    "table inet {T} {{\n chain input {{ type filter hook input priority -10; ip saddr {{ {set} }} drop; }}\n}}\n",
                    T = PARTITION_TABLE
                );
                self.nft_in(h, &script)?;
            }
        }
        Ok(())
    }

    /// Removes every partition rule from the tasks on this machine.
    pub fn heal(&self) -> Result<(), String> {
        for h in self.plan.all_hosts() {
            if self.container(&h.name, "running").is_ok() {
                // Declared first, so that a task without the table is no error.
                let t = PARTITION_TABLE;
                self.nft_in(&h.name, &format!("table inet {t}\ndelete table inet {t}\n"))?;
            }
        }
        Ok(())
    }

    fn pid(&self, host: &str) -> Result<String, String> {
        let c = self.container(host, "running")?;
        Ok(docker(&["inspect", "--format", "{{.State.Pid}}", &c])?
            .trim()
            .to_string())
    }

    /// Runs an nft script in the network namespace of `host`'s task.
    fn nft_in(&self, host: &str, script: &str) -> Result<(), String> {
        let mut nft = Command::new("nsenter");
        nft.args(["-t", &self.pid(host)?, "-n", "nft"]);
        dvmlab_harness::partition::run_nft(nft, &format!("{host}'s task"), script).map(|_| ())
    }

    /// The overlay addresses of the tasks of `hosts` on this machine.
    fn addresses(&self, hosts: &[String]) -> Result<Vec<IpAddr>, String> {
        let net = format!("{}_dvm", self.stack);
        let fmt = format!("{{{{(index .NetworkSettings.Networks \"{net}\").IPAddress}}}}");
        hosts
            .iter()
            .map(|h| {
                let c = self.container(h, "running")?;
                let ip = docker(&["inspect", "--format", &fmt, &c])?;
                ip.trim()
                    .parse()
                    .map_err(|e| format!("{h}: overlay address {ip:?}: {e}"))
            })
            .collect()
    }

    /// The swarm's service logs of `host` (every task it had, wherever it ran), on stdout.
    pub fn logs(&self, host: &str, follow: bool) -> Result<(), String> {
        let service = self.service(host)?;
        let mut args = vec!["service", "logs", "--raw", "--no-trunc"];
        if follow {
            args.push("--follow");
        }
        args.push(&service);
        // A task's log is its stderr, which `docker service logs` writes to its own stderr;
        // here it goes to stdout, as the other labs' logs do.
        let stdout = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| format!("stdout: {e}"))?;
        let status = Command::new("docker")
            .args(&args)
            .stderr(Stdio::from(stdout))
            .status()
            .map_err(|e| format!("docker service logs: {e}"))?;
        if !status.success() {
            return Err(format!("docker service logs {service}: {status}"));
        }
        Ok(())
    }

    /// Removes the stack (services, config, secret, network) and waits until the engine has
    /// removed its containers and network; then the lab's directory.
    pub fn remove(self) -> Result<usize, String> {
        let n = self.plan.all_hosts().len();
        docker(&["stack", "rm", &self.stack])?;
        let label = format!("label=com.docker.stack.namespace={}", self.stack);
        dvmlab_harness::wait_until(DOWN_LIMIT, Duration::from_millis(200), || {
            let left = docker(&["ps", "-a", "-q", "--filter", &label])?;
            let nets = docker(&["network", "ls", "-q", "--filter", &label])?;
            if left.trim().is_empty() && nets.trim().is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "the engine is still removing the stack {}: {} containers, {} networks",
                    self.stack,
                    left.lines().count(),
                    nets.lines().count()
                ))
            }
        })?;
        let d = keeper::dir();
        std::fs::remove_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        Ok(n)
    }
}

/// The nftables table a swarm partition adds inside a task's network namespace.
const PARTITION_TABLE: &str = "dvmlab_lab_partition";

/// Tags `image` for `registry` and pushes it there, for a swarm of several machines (each
/// pulls it); the name to deploy with `--image`. The tag goes again if the push fails.
pub fn push(image: &str, registry: &str) -> Result<String, String> {
    if registry.is_empty() || registry.contains(char::is_whitespace) {
        return Err(format!(
            "--push {registry:?}: expected a registry such as registry.example:5000"
        ));
    }
    let target = format!("{}/{image}", registry.trim_end_matches('/'));
    docker(&["tag", image, &target])?;
    let pushed = docker(&["push", &target]);
    if let Err(e) = pushed {
        let _ = docker(&["rmi", &target]);
        return Err(format!("pushing to registry {registry}: {e}"));
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::IpVersion;
    use serde_json::Value;

    #[test]
    fn a_local_image_runs_by_its_id_and_one_in_a_registry_by_its_name() {
        let id = "sha256:0123456789abcdef";
        assert_eq!(task_image("dvmlab-lab:latest", id, true), id);
        assert_eq!(task_image("dvmlab-lab", id, true), id);
        assert_eq!(
            task_image("dvmlab-lab:latest", id, false),
            "dvmlab-lab:latest"
        );
        for pushed in [
            "someone/dvmlab-lab",
            "registry.example:5000/dvmlab-lab:latest",
            "localhost:5000/dvmlab-lab",
            "localhost/dvmlab-lab",
            "ghcr.io/someone/dvmlab-lab:1",
        ] {
            assert_eq!(task_image(pushed, id, true), pushed);
        }
    }

    /// The stack's services are the plan's hosts under their own names; the prte.conf it
    /// ships is accepted by the runtime's own resolver and lists exactly those names; the
    /// key is where swarm puts the secret; held hosts start with no task.
    #[test]
    fn the_stack_file_names_each_host_once_and_its_prte_conf_lists_them_for_the_runtime() {
        use dvmlab_core::conf::{reader::ConfFile, settings::Params, settings::Settings};
        let plan = Plan::new(12, 3, IpVersion::V4)
            .unwrap()
            .with_spares(2)
            .unwrap();
        let files = files(
            &plan,
            "registry.example:5000/dvmlab-lab:latest",
            &["node12".into()],
        )
        .unwrap();
        let stack: Value = serde_norway::from_str(&files[0].1).unwrap();
        let services = stack["services"].as_object().unwrap();
        let names: Vec<String> = plan.hosts().into_iter().map(|h| h.name).collect();
        assert_eq!(services.len(), names.len() + 2, "the hosts and the spares");
        for spare in ["spare01", "spare02"] {
            let s = &services[spare];
            assert_eq!(s["hostname"], spare);
            assert_eq!(
                s["entrypoint"],
                serde_json::json!(["/bin/plaunch", "serve"]),
                "a spare only serves launches"
            );
            assert_eq!(s["deploy"]["replicas"], 1);
        }
        for name in names.iter().chain(["spare01".to_string()].iter()) {
            let env = &services[name]["environment"];
            assert_eq!(env["PRTE_MCA_prte_elastic_mode"], "1", "{name}");
            assert_eq!(
                env["PRTE_MCA_plm_ssh_agent"], AGENT,
                "the agent the controller runs, and the one a launched daemon inherits"
            );
            assert_eq!(
                services[name]["deploy"]["restart_policy"]["condition"], "on-failure",
                "a daemon that left is not started again"
            );
        }
        for name in &names {
            assert_eq!(
                services[name]["entrypoint"],
                serde_json::json!(["/bin/plaunch", "serve", "--boot", "--", "--bootstrap"]),
                "{name} boots its daemon and serves launches"
            );
            let s = &services[name];
            assert_eq!(
                s["hostname"],
                name.as_str(),
                "a task's host name is its host's"
            );
            assert_eq!(s["image"], "registry.example:5000/dvmlab-lab:latest");
            assert_eq!(s["deploy"]["endpoint_mode"], "dnsrr");
            let replicas = if name == "node12" { 0 } else { 1 };
            assert_eq!(s["deploy"]["replicas"], replicas, "{name}");
            assert_eq!(s["configs"][0]["source"], CONFIG);
            assert!(stack["configs"][CONFIG].is_object());
            assert_eq!(s["configs"][0]["target"], "/etc/prte.conf");
            assert_eq!(s["secrets"][0]["source"], SECRET);
            assert!(stack["secrets"][SECRET].is_object());
            assert_eq!(
                format!(
                    "/run/secrets/{}",
                    s["secrets"][0]["target"].as_str().unwrap()
                ),
                KEY_PATH
            );
            assert_eq!(
                s["secrets"][0]["mode"], 0o400,
                "the key readable by its owner only"
            );
        }
        assert_eq!(stack["networks"]["dvm"]["driver"], "overlay");
        assert_eq!(
            stack["networks"]["dvm"]["ipam"]["config"][0]["subnet"],
            SUBNET
        );

        assert_eq!(files[1].0, "prte.conf");
        let conf = ConfFile::parse(&files[1].1, std::path::Path::new("/etc/prte.conf"))
            .unwrap_or_else(|d| panic!("{d}"));
        let params = Params::new(Vec::new(), Vec::<(String, String)>::new());
        let none = |p: &std::path::Path| -> std::io::Result<String> {
            Err(std::io::Error::other(p.display().to_string()))
        };
        let s = Settings::resolve(&conf, &params, &none).unwrap_or_else(|d| panic!("{d}"));
        let listed: Vec<String> = s.nodes.iter().map(|n| n.name.clone()).collect();
        assert_eq!(
            listed,
            names[1..],
            "DVMNodes is the node services, in order"
        );
        assert_eq!(s.controller_host, CONTROLLER);
        assert_eq!(s.radix, 3);
        assert_eq!(
            s.key_file.as_ref().map(|(p, _)| p.display().to_string()),
            Some(KEY_PATH.to_string())
        );
        assert_eq!(s.networks.len(), 1, "only the overlay network");
    }

    #[test]
    fn a_held_host_must_be_in_the_plan_and_not_a_spare() {
        let plan = Plan::new(4, 2, IpVersion::V4)
            .unwrap()
            .with_spares(1)
            .unwrap();
        let e = stack_file(&plan, "i", &["node09".into()]).unwrap_err();
        assert!(e.contains("no host node09"), "{e}");
        let e = stack_file(&plan, "i", &["spare01".into()]).unwrap_err();
        assert!(e.contains("spare01 is a spare"), "{e}");
    }
}
