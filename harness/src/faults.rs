//! The network faults a test injects into a netns (or, but for impaired links, docker) cluster: partitions between host sets (both
//! ways or one way) and impaired links (delay, jitter, loss, duplication). Every call returns
//! only once the fault is shown to be in effect, or fails saying why it could not be shown:
//! a test must never rely on a fault that did not happen.

use std::collections::HashMap;
use std::fs::File;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::cluster::{Cluster, World};
use crate::linkem::{self, Impairment, Relay};
use crate::netns::{ip_batch, PORTS_PER_BRIDGE};
use crate::partition::{self, Direction, PartitionId, Switch, PROBE_WAIT};

/// The faults currently injected into a cluster.
#[derive(Default)]
pub(crate) struct Faults {
    table_ready: bool,
    next_id: u32,
    /// Each partition's probe pair, direction, and the full host sets it separates.
    partitions: HashMap<PartitionId, Partition>,
    relays: HashMap<usize, Relay>,
}

struct Partition {
    x: String,
    y: String,
    a: Vec<String>,
    b: Vec<String>,
}

impl Partition {
    /// Whether it blocks any traffic between `h` and `g` (in either direction: probes
    /// need the answer too).
    fn separates(&self, h: &str, g: &str) -> bool {
        let (ha, hb) = (self.a.iter().any(|x| x == h), self.b.iter().any(|x| x == h));
        let (ga, gb) = (self.a.iter().any(|x| x == g), self.b.iter().any(|x| x == g));
        (ha && gb) || (hb && ga)
    }
}

/// What a probe from one host to another showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProbeSeen {
    /// The SYN reached the switch.
    sent: bool,
    /// The SYN got through the partition rules.
    passed: bool,
}

impl Cluster {
    fn netns_world(&self, what: &str) -> Result<&crate::netns::NetnsWorld, String> {
        match self.world.as_ref() {
            Some(World::Netns(w)) => Ok(w),
            _ => Err(format!("{what} needs the netns backend")),
        }
    }

    /// Where the cluster's switch rules live (netns and docker clusters).
    fn switch(&self, what: &str) -> Result<Switch, String> {
        match self.world.as_ref() {
            Some(World::Netns(w)) => Ok(Switch {
                ns: Some(w.switch().to_string()),
                name: "dvl".into(),
            }),
            Some(World::Docker(w)) => Ok(w.switch()),
            _ => Err(format!("{what} needs the netns or docker backend")),
        }
    }

    fn addrs_of(&self, hosts: &[&str]) -> Result<Vec<IpAddr>, String> {
        let mut v = Vec::new();
        for h in hosts {
            let info = self.host(h)?;
            v.extend([info.v4, info.v6].into_iter().flatten());
            v.extend(info.second.iter().copied());
        }
        Ok(v)
    }

    /// The address probes use between `src` and `dst`: a family both have.
    fn probe_pair(&self, src: &str, dst: &str) -> Result<(IpAddr, IpAddr), String> {
        let (s, d) = (self.host(src)?, self.host(dst)?);
        match (s.v4, d.v4, s.v6, d.v6) {
            (Some(a), Some(b), _, _) => Ok((a, b)),
            (_, _, Some(a), Some(b)) => Ok((a, b)),
            _ => Err(format!("{src} and {dst} share no address family")),
        }
    }

    /// Sends one probe for each `(src, dst)` pair, all at once, and reads the switch's
    /// counters for them.
    fn probe(&self, pairs: &[(&str, &str)]) -> Result<Vec<ProbeSeen>, String> {
        let sw = self.switch("probing")?;
        let t = sw.table();
        let addrs: Vec<(IpAddr, IpAddr)> = pairs
            .iter()
            .map(|(s, d)| self.probe_pair(s, d))
            .collect::<Result<_, _>>()?;
        let rules: String = addrs
            .iter()
            .map(|&(a, b)| {
                partition::probe_rule(&t, "seen", a, b) + &partition::probe_rule(&t, "passed", a, b)
            })
            .collect();
        sw.nft(&rules)?;
        let seen = self.run_probes(&sw, pairs, &addrs);
        // Counting rules go whatever happened, so no later probe reads a stale counter.
        let flushed = sw.nft(&format!("flush chain {t} seen\nflush chain {t} passed\n"));
        let seen = seen?;
        flushed?;
        Ok(seen)
    }

    fn run_probes(
        &self,
        sw: &Switch,
        pairs: &[(&str, &str)],
        addrs: &[(IpAddr, IpAddr)],
    ) -> Result<Vec<ProbeSeen>, String> {
        std::thread::scope(|s| {
            let handles: Vec<_> = pairs
                .iter()
                .zip(addrs)
                .map(|((src, _), &(_, b))| {
                    s.spawn(move || self.exec_within(src, &partition::probe_argv(b), PROBE_WAIT))
                })
                .collect();
            handles.into_iter().try_for_each(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("probe thread panicked".into()))
                    .map(|_| ())
            })
        })?;
        addrs
            .iter()
            .map(|&(a, b)| {
                Ok(ProbeSeen {
                    sent: sw.probe_count("seen", a, b)? > 0,
                    passed: sw.probe_count("passed", a, b)? > 0,
                })
            })
            .collect()
    }

    /// Checks, with one probe per path, that traffic `src` → `dst` is blocked (or passes,
    /// where `blocked` is false).
    fn verify_paths(&self, paths: &[(&str, &str, bool)]) -> Result<(), String> {
        let pairs: Vec<(&str, &str)> = paths.iter().map(|&(s, d, _)| (s, d)).collect();
        let seen = self.probe(&pairs)?;
        for (&(src, dst, blocked), seen) in paths.iter().zip(seen) {
            if !seen.sent {
                return Err(format!(
                    "fault not verified: a probe from {src} to {dst} never reached the switch"
                ));
            }
            if seen.passed == blocked {
                return Err(format!(
                    "fault not verified: a probe from {src} to {dst} {}",
                    if blocked {
                        "got through the partition"
                    } else {
                        "was dropped although nothing should block it"
                    }
                ));
            }
        }
        Ok(())
    }

    /// Partitions hosts `a` from hosts `b`: traffic from `a` to `b` is dropped, and with
    /// [`Direction::Both`] traffic from `b` to `a` too. Returns once probes show it.
    pub fn partition<S: AsRef<str>>(
        &mut self,
        a: &[S],
        b: &[S],
        dir: Direction,
    ) -> Result<PartitionId, String> {
        let a: Vec<&str> = a.iter().map(|s| s.as_ref()).collect();
        let b: Vec<&str> = b.iter().map(|s| s.as_ref()).collect();
        let (Some(x), Some(y)) = (a.first().copied(), b.first().copied()) else {
            return Err("a partition needs a host on each side".into());
        };
        if let Some(h) = a.iter().find(|h| b.contains(h)) {
            return Err(format!("{h} is on both sides of the partition"));
        }
        let (fa, fb) = (self.addrs_of(&a)?, self.addrs_of(&b)?);
        let sw = self.ensure_table()?;
        let t = sw.table();
        let id = PartitionId(self.faults.next_id);
        self.faults.next_id += 1;
        let chain = format!("p{}", id.0);
        let mut script = format!(
            "add chain {t} {chain}\nadd rule {t} cut jump {chain}\n{}",
            partition::drop_rules(&t, &chain, &fa, &fb)
        );
        if dir == Direction::Both {
            script.push_str(&partition::drop_rules(&t, &chain, &fb, &fa));
        }
        sw.nft(&script)?;
        self.faults.partitions.insert(
            id,
            Partition {
                x: x.to_string(),
                y: y.to_string(),
                a: a.iter().map(|s| s.to_string()).collect(),
                b: b.iter().map(|s| s.to_string()).collect(),
            },
        );
        // A partition not shown in effect is not left behind for nobody to heal.
        if let Err(e) = self.verify_paths(&[(x, y, true), (y, x, dir == Direction::Both)]) {
            let _ = self.heal(id);
            return Err(e);
        }
        Ok(id)
    }

    fn ensure_table(&mut self) -> Result<Switch, String> {
        let sw = self.switch("network faults")?;
        if !self.faults.table_ready {
            sw.nft(&partition::table_script(&sw.table()))?;
            self.faults.table_ready = true;
        }
        Ok(sw)
    }

    /// Starts counting the connection attempts (TCP SYNs) from `src` to `dst`'s `port`, as
    /// the switch sees them.
    pub fn watch_connects(&mut self, src: &str, dst: &str, port: u16) -> Result<(), String> {
        let sw = self.ensure_table()?;
        let script: String = self
            .family_pairs(src, dst)?
            .into_iter()
            .map(|(a, b)| partition::syn_rule(&sw.table(), a, b, port))
            .collect();
        sw.nft(&script).map(|_| ())
    }

    /// Every (source, destination) address pair of one family between two hosts.
    fn family_pairs(&self, src: &str, dst: &str) -> Result<Vec<(IpAddr, IpAddr)>, String> {
        let (s, d) = (self.host(src)?, self.host(dst)?);
        let mut v = Vec::new();
        for a in [s.v4, s.v6]
            .into_iter()
            .flatten()
            .chain(s.second.iter().copied())
        {
            for b in [d.v4, d.v6]
                .into_iter()
                .flatten()
                .chain(d.second.iter().copied())
            {
                if a.is_ipv4() == b.is_ipv4() {
                    v.push((a, b));
                }
            }
        }
        Ok(v)
    }

    /// Connection attempts from `src` to `dst`'s `port` since [`Cluster::watch_connects`].
    pub fn connects_seen(&self, src: &str, dst: &str, port: u16) -> Result<u64, String> {
        let sw = self.switch("counting connects")?;
        let mut n = 0;
        for (a, b) in self.family_pairs(src, dst)? {
            n += sw.tagged_count("watch", &partition::syn_tag(a, b, port))?;
        }
        Ok(n)
    }

    /// Removes one partition; returns once traffic is shown to pass again.
    pub fn heal(&mut self, id: PartitionId) -> Result<(), String> {
        let sw = self.switch("healing")?;
        let Partition { x, y, .. } = self
            .faults
            .partitions
            .remove(&id)
            .ok_or_else(|| format!("no partition {id:?}"))?;
        sw.nft(&format!("flush chain {} p{}\n", sw.table(), id.0))?;
        if self.faults.partitions.values().any(|p| p.separates(&x, &y)) {
            // Another partition still separates the probe pair: nothing to show yet.
            return Ok(());
        }
        self.verify_paths(&[(&x, &y, false), (&y, &x, false)])
    }

    /// Removes every partition.
    pub fn heal_all(&mut self) -> Result<(), String> {
        let ids: Vec<PartitionId> = self.faults.partitions.keys().copied().collect();
        for id in ids {
            self.heal(id)?;
        }
        Ok(())
    }

    /// Puts `host`'s link (its first network) through the link emulator, replacing any earlier
    /// impairment. Returns once a probe is shown to pass through the emulator (and, for a
    /// delay, to take at least that long each way).
    pub fn impair(&mut self, host: &str, imp: Impairment) -> Result<(), String> {
        self.unimpair(host)?;
        let i = self.host(host)?.index;
        let peer = match self.reachable_peer(host) {
            Some(p) => {
                let base = self.best_rtt(host, &p, PROBE_WAIT)?;
                Some((p, base))
            }
            None => None,
        };
        let w = self.netns_world("impairing a link")?;
        let sw = w.switch().to_string();
        let br = format!("br{}", i / PORTS_PER_BRIDGE);
        ip_batch(
            Some(&sw),
            &[
                format!("link add ri{i} type veth peer name rb{i}"),
                format!("link set h{i} nomaster"),
                format!("link set h{i} promisc on"),
                format!("link set ri{i} promisc on up"),
                format!("link set rb{i} master {br} up"),
            ],
        )
        .map_err(|e| format!("rewiring {host}'s link: {e}"))?;
        let nsfile = File::open(Path::new("/var/run/netns").join(&sw))
            .map_err(|e| format!("opening namespace {sw}: {e}"))?;
        let relay = linkem::start(nsfile, &format!("h{i}"), &format!("ri{i}"), imp)
            .map_err(|e| format!("starting the link emulator for {host}: {e}"));
        let relay = match relay {
            Ok(r) => r,
            Err(e) => {
                let _ = self.rewire_back(i);
                return Err(e);
            }
        };
        self.faults.relays.insert(i, relay);
        // An impairment not shown in effect is not left behind for nobody to undo.
        self.verify_impairment(host, peer, i, imp).inspect_err(|_| {
            let _ = self.unimpair(host);
        })
    }

    /// Another host no partition separates from `host`, for probes.
    fn reachable_peer(&self, host: &str) -> Option<String> {
        self.hosts().iter().map(|h| h.name.clone()).find(|g| {
            g != host
                && !self
                    .faults
                    .partitions
                    .values()
                    .any(|p| p.separates(host, g))
        })
    }

    /// The quickest of three probe round trips from `host` to `peer` (spawning the probe
    /// costs more than the network; the minimum filters that noise), or `None` if no probe
    /// was answered within `wait`.
    fn best_rtt(&self, host: &str, peer: &str, wait: Duration) -> Result<Option<Duration>, String> {
        let (_, dst) = self.probe_pair(host, peer)?;
        let mut best: Option<Duration> = None;
        for _ in 0..3 {
            let started = Instant::now();
            let (status, _, _) = self.exec_within(host, &partition::probe_argv(dst), wait)?;
            if status.is_some() {
                let took = started.elapsed();
                best = Some(best.map_or(took, |b| b.min(took)));
            }
        }
        Ok(best)
    }

    /// Shows the emulator carries `host`'s frames; with a peer to answer, also that it adds
    /// the configured delay to a round trip (against `baseline`, measured before).
    fn verify_impairment(
        &self,
        host: &str,
        peer: Option<(String, Option<Duration>)>,
        i: usize,
        imp: Impairment,
    ) -> Result<(), String> {
        // Any host serves when all are cut off: its frames still cross the emulator first.
        let target = match &peer {
            Some((p, _)) => p.clone(),
            None => self
                .hosts()
                .iter()
                .map(|h| h.name.clone())
                .find(|g| g != host)
                .ok_or("impairing a link needs a second host to probe")?,
        };
        let forwarded = || {
            self.faults
                .relays
                .get(&i)
                .map(|r| r.stats.forwarded.load(std::sync::atomic::Ordering::Relaxed))
                .unwrap_or(0)
        };
        let before = forwarded();
        // With loss configured a probe may be dropped: TCP retries the SYN, so a refusal
        // still arrives within the wait unless the loss is extreme.
        let wait = PROBE_WAIT + imp.delay * 4 + imp.jitter * 4;
        let rtt = self.best_rtt(host, &target, wait)?;
        if forwarded() <= before {
            return Err(format!(
                "fault not verified: no frame of {host} went through its link emulator"
            ));
        }
        let Some((_, baseline)) = peer else {
            return Ok(());
        };
        let Some(rtt) = rtt else {
            if imp.loss < 0.5 {
                return Err(format!(
                    "fault not verified: no probe from {host} through its emulated link was \
                     answered within {wait:?}"
                ));
            }
            return Ok(());
        };
        // Both directions are delayed; half of that, less the jitter, must show.
        let added = imp.delay.saturating_sub(imp.jitter * 2);
        if let (Some(base), false) = (baseline, added.is_zero()) {
            if rtt < base + added {
                return Err(format!(
                    "fault not verified: a round trip from {host} took {rtt:?} through the \
                     emulator, {base:?} without it: not the configured delay {:?}",
                    imp.delay
                ));
            }
        }
        Ok(())
    }

    fn rewire_back(&self, i: usize) -> Result<(), String> {
        let sw = self.netns_world("restoring a link")?.switch().to_string();
        let br = format!("br{}", i / PORTS_PER_BRIDGE);
        ip_batch(
            Some(&sw),
            &[
                format!("link set h{i} master {br}"),
                format!("link del ri{i}"),
            ],
        )
        .map_err(|e| format!("restoring host {i}'s link: {e}"))
    }

    /// Takes `host`'s link out of the emulator (no-op if it is not impaired); returns once a
    /// probe passes the plain link again.
    pub fn unimpair(&mut self, host: &str) -> Result<(), String> {
        let i = self.host(host)?.index;
        let Some(relay) = self.faults.relays.remove(&i) else {
            return Ok(());
        };
        drop(relay);
        self.rewire_back(i)?;
        let sw = self.netns_world("restoring a link")?.switch().to_string();
        let out = std::process::Command::new("ip")
            .args(["-n", &sw, "-o", "link", "show", &format!("h{i}")])
            .output()
            .map_err(|e| format!("ip link show h{i}: {e}"))?;
        let line = String::from_utf8_lossy(&out.stdout);
        if !line.contains(" master br") {
            return Err(format!(
                "fault not removed: {host}'s link is not back on its bridge: {line}"
            ));
        }
        let Some(peer) = self.reachable_peer(host) else {
            // Cut off from everyone: the plain link cannot be shown to carry traffic now.
            return Ok(());
        };
        // The bridge may still send frames for this host to the removed port until it
        // relearns its address: wait for a probe to be refused, not dropped.
        crate::wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            let (_, dst) = self.probe_pair(host, &peer)?;
            let (st, _, _) = self.exec_within(host, &partition::probe_argv(dst), PROBE_WAIT)?;
            st.map(|_| ())
                .ok_or_else(|| format!("{host}'s restored link does not carry a probe yet"))
        })
    }

    /// The frames each impaired host's emulator has forwarded, dropped and duplicated.
    pub fn impairment_stats(&self, host: &str) -> Option<(u64, u64, u64)> {
        let i = self.host(host).ok()?.index;
        let s = &self.faults.relays.get(&i)?.stats;
        let o = std::sync::atomic::Ordering::Relaxed;
        Some((s.forwarded.load(o), s.dropped.load(o), s.duplicated.load(o)))
    }
}
