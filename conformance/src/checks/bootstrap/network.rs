//! Ports, address families, networks and host-name matching.

use std::time::Duration;

use dvmlab_harness::IpMode;

use super::{conf, formed_with, reported_contact, with_ctl, FORM};
use crate::outcome::{check, fail, Problem, Verdict};
use crate::status::Field;
use crate::sut::{node_names, Ctx, Dvm};

/// Four nodes and the controller.
fn small() -> (Vec<String>, Vec<String>) {
    let nodes = node_names(4);
    let hosts = with_ctl(&nodes);
    (nodes, hosts)
}

pub fn every_daemon_listens_on_the_default_port_7817(ctx: &Ctx) -> Verdict {
    let (nodes, hosts) = small();
    let mut dvm = Dvm::new(ctx, "port-default", &hosts, &conf(ctx, &nodes))?;
    dvm.start_all()?;
    dvm.wait_formed(FORM)?;
    for h in &hosts {
        check(
            dvm.listens_on(h, 7817)?,
            format!("the daemon on {h} listens on 7817"),
            dvm.tcp_sockets(h)?,
        )?;
    }
    dvm.stop()
}

pub fn dvmport_moves_every_daemon_to_that_port(ctx: &Ctx) -> Verdict {
    let (nodes, hosts) = small();
    let c = conf(ctx, &nodes).set("DVMPort", 7911);
    let mut dvm = Dvm::new(ctx, "port-set", &hosts, &c)?;
    dvm.start_all()?;
    dvm.wait_formed(FORM)?;
    for h in &hosts {
        check(
            dvm.listens_on(h, 7911)? && !dvm.listens_on(h, 7817)?,
            format!("the daemon on {h} listens on DVMPort 7911 and not on 7817"),
            dvm.tcp_sockets(h)?,
        )?;
    }
    dvm.stop()
}

/// Whether a socket line of `ss -p` belongs to the process group `group` (the daemon and
/// what it runs); a socket whose owner `ss` does not show counts as the daemon's.
fn owned_by(line: &str, group: Option<u32>) -> bool {
    let Some(group) = group else {
        return true;
    };
    let pids: Vec<u32> = line
        .split("pid=")
        .skip(1)
        .filter_map(|r| r.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .collect();
    pids.is_empty()
        || pids
            .iter()
            .any(|p| dvmlab_harness::procs::stat(*p).map(|st| st.pgrp) == Some(group))
}

/// Local and peer addresses of the TCP and UDP sockets of the daemon on `host` and the
/// processes of its group. Other programs' sockets in the host's network (Docker's DNS
/// resolver has some in every container) are not the DVM's.
fn local_addrs(dvm: &Dvm, host: &str) -> Result<Vec<String>, Problem> {
    let argv = ["ss", "-Htuanp"].map(String::from);
    let (code, out, err) = dvm.run_on(host, &argv, Duration::from_secs(10))?;
    if code != Some(0) {
        return Err(Problem::Unresolved(format!("ss on {host}: {err}")));
    }
    let group = dvm.cluster.pid(host);
    // Netid State Recv-Q Send-Q Local Peer [users]
    Ok(out
        .lines()
        .filter(|l| owned_by(l, group))
        .flat_map(|l| {
            let f: Vec<String> = l.split_whitespace().map(str::to_string).collect();
            f.into_iter().skip(4).take(2)
        })
        .filter(|a| !a.starts_with('*') && !a.starts_with("0.0.0.0:*") && a != "[::]:*")
        .collect())
}

/// Whether an `ss` address is IPv6 proper (an IPv4-mapped `[::ffff:a.b.c.d]` is IPv4
/// traffic on a dual-stack socket).
fn is_v6(addr: &str) -> bool {
    (addr.starts_with('[') && !addr.starts_with("[::ffff:")) || addr.starts_with('*')
}

pub fn ipv6_only_dvm_uses_no_ipv4_at_all(ctx: &Ctx) -> Verdict {
    ctx.need_own_networks("dual-stack hosts")?;
    ctx.need_feature("ipv6", ctx.profile.features.ipv6)?;
    let (nodes, hosts) = small();
    let c = conf(ctx, &nodes).set("DVMIPVersion", 6);
    let mut dvm = Dvm::with(ctx, "v6only", &hosts, &c, |s| s.ip = IpMode::Dual)?;
    dvm.start_all()?;
    let s = dvm.wait_formed(FORM)?;
    formed_with(&dvm, &s, &hosts)?;
    let ctl = dvm
        .cluster
        .host("ctl")
        .map_err(Problem::Unresolved)?
        .clone();
    // The contact the daemons use shows in their sockets (below); a status that reports
    // the contact must name the IPv6 address too.
    if let (Some(uri), Some(v4), Some(v6)) = (&s.controller_uri, ctl.v4, ctl.v6) {
        check(
            uri.contains(&v6.to_string()) && !uri.contains(&v4.to_string()),
            format!("the controller's contact names its IPv6 address {v6}"),
            uri.clone(),
        )?;
    }
    for h in &hosts {
        let addrs = local_addrs(&dvm, h)?;
        let v4: Vec<&String> = addrs.iter().filter(|a| !is_v6(a)).collect();
        check(
            v4.is_empty() && !addrs.is_empty(),
            format!("{h} uses IPv6 sockets only (DVMIPVersion=6 on dual-stack hosts)"),
            format!("local addresses: {addrs:?}"),
        )?;
    }
    dvm.stop()
}

pub fn ipv4_is_the_default_family_on_dual_stack_hosts(ctx: &Ctx) -> Verdict {
    ctx.need_own_networks("dual-stack hosts")?;
    let (nodes, hosts) = small();
    let c = conf(ctx, &nodes).unset("DVMIPVersion");
    let mut dvm = Dvm::with(ctx, "v4default", &hosts, &c, |s| s.ip = IpMode::Dual)?;
    dvm.start_all()?;
    dvm.wait_formed(FORM)?;
    for h in &hosts {
        let addrs = local_addrs(&dvm, h)?;
        check(
            !addrs.is_empty() && addrs.iter().all(|a| !is_v6(a)),
            format!("{h} uses IPv4 sockets only (DVMIPVersion defaults to 4)"),
            format!("local addresses: {addrs:?}"),
        )?;
    }
    dvm.stop()
}

pub fn ipv6_on_a_host_without_ipv6_aborts_with_a_diagnostic(ctx: &Ctx) -> Verdict {
    ctx.need_own_networks("a host with IPv6 switched off")?;
    let (nodes, hosts) = small();
    let c = conf(ctx, &nodes).set("DVMIPVersion", 6);
    // An implementation built without IPv6 must refuse DVMIPVersion=6 anywhere; one with
    // IPv6 must refuse it on a host whose kernel has IPv6 off.
    let built_with_v6 = ctx.profile.features.ipv6;
    let dvm = Dvm::with(ctx, "nov6", &hosts, &c, |s| {
        s.ip = IpMode::Dual;
        if built_with_v6 {
            s.no_ipv6 = vec!["n01".into()];
        }
    })?;
    let (code, out, err) = dvm.run_daemon_once("n01", Duration::from_secs(15))?;
    let said = format!("{out}{err}");
    check(
        matches!(code, Some(c) if c != 0) && said.to_lowercase().contains("ipv6"),
        "the daemon fails to start with a diagnostic about IPv6",
        format!("exit {code:?}, output {said:?}"),
    )
}

/// How `ss` prints a socket on `addr` (with the port following).
fn sock_form(addr: std::net::IpAddr) -> String {
    match addr {
        std::net::IpAddr::V4(a) => format!("{a}:"),
        std::net::IpAddr::V6(a) => format!("[{a}]:"),
    }
}

/// The subnet of the cluster's first or second network in the cell's family, and its prefix.
fn subnet_of(dvm: &Dvm, ctx: &Ctx, second: bool) -> Result<(String, String), Problem> {
    let cidr = dvm
        .cluster
        .subnet(second, ctx.cell.ip == 6)
        .ok_or_else(|| Problem::Unresolved("the cluster does not have that network".into()))?;
    let prefix = cidr.rsplit('/').next().unwrap_or_default().to_string();
    Ok((cidr, prefix))
}

/// Host `h`'s address on its first network and on its second, in the cell's family.
fn both_addrs(dvm: &Dvm, ctx: &Ctx, h: &str) -> Result<(String, String), Problem> {
    let info = dvm.cluster.host(h).map_err(Problem::Unresolved)?;
    let v6 = ctx.cell.ip == 6;
    let first = if v6 { info.v6 } else { info.v4 };
    let second = info.second.iter().copied().find(|a| a.is_ipv6() == v6);
    match (first, second) {
        (Some(a), Some(b)) => Ok((sock_form(a), sock_form(b))),
        _ => Err(Problem::Unresolved(format!(
            "{h} is not on two networks in IPv{}",
            ctx.cell.ip
        ))),
    }
}

pub fn dvmnetworks_picks_the_interconnect_address_on_dual_homed_hosts(ctx: &Ctx) -> Verdict {
    ctx.need_own_networks("dual-homed hosts")?;
    ctx.need_feature("dvmnetworks", ctx.profile.features.dvmnetworks)?;
    let (nodes, hosts) = small();
    let base = conf(ctx, &nodes);
    let mut dvm = Dvm::with(ctx, "dualhomed", &hosts, &base, |s| s.dual_homed = true)?;
    let (cidr, prefix) = subnet_of(&dvm, ctx, true)?;
    let firsts: Vec<String> = hosts
        .iter()
        .map(|h| both_addrs(&dvm, ctx, h).map(|(a, _)| a))
        .collect::<Result<_, _>>()?;
    // Aspects: `cidr` and `iface` (traffic stays on the network named by a CIDR subnet, by
    // an interface name), `mask` (the CIDR's prefix is the contact's mask).
    for (aspect, networks) in [("cidr", cidr.as_str()), ("iface", "eth1")] {
        dvm.cluster
            .set_conf(&base.clone().set("DVMNetworks", networks).render())
            .map_err(|e| Problem::Unresolved(e.to_string()))?;
        dvm.start_all()?;
        let s = dvm.wait_formed(FORM)?;
        formed_with(&dvm, &s, &hosts)?;
        if aspect == "cidr" {
            let (_, ctl_on) = both_addrs(&dvm, ctx, "ctl")?;
            let ctl_ip = ctl_on
                .trim_matches(|c| c == '[' || c == ']' || c == ':')
                .to_string();
            ctx.aspect(
                "mask",
                reported_contact(ctx, &s).and_then(|uri| {
                        check(
                            uri.contains(&ctl_ip) && uri.ends_with(&format!(":{prefix}")),
                            format!(
                                "DVMNetworks={networks}: the controller contact is on {ctl_ip} with the prefix's mask {prefix}"
                            ),
                            uri,
                        )
                    }),
            );
        }
        let mut on_network = Ok(());
        for h in &hosts {
            let socks = dvm.tcp_sockets(h)?;
            let (_, on) = both_addrs(&dvm, ctx, h)?;
            if on_network.is_ok() {
                on_network = check(
                    socks.contains(&on) && !firsts.iter().any(|a| socks.contains(a)),
                    format!("DVMNetworks={networks}: {h} talks on {on} only, never on {cidr}'s sibling network"),
                    socks,
                );
            }
        }
        ctx.aspect(aspect, on_network);
        dvm.stop()?;
    }
    Ok(())
}

pub fn an_ambiguous_multi_homed_host_is_refused_naming_the_host(ctx: &Ctx) -> Verdict {
    ctx.need_own_networks("dual-homed hosts")?;
    let (nodes, hosts) = small();
    let dvm = Dvm::with(ctx, "ambiguous", &hosts, &conf(ctx, &nodes), |s| {
        s.dual_homed = true
    })?;
    let (code, out, err) = dvm.run_daemon_once("n01", Duration::from_secs(15))?;
    let said = format!("{out}{err}");
    check(
        matches!(code, Some(c) if c != 0),
        "a daemon whose hosts resolve to two addresses, with no DVMNetworks, refuses to start",
        format!("exit {code:?}, output {said:?}"),
    )?;
    check(
        said.contains("n01") || said.contains("ctl"),
        "its diagnostic names the ambiguous host",
        said,
    )
}

pub fn dvmnetmask_overrides_the_mask_in_the_contact_uri(ctx: &Ctx) -> Verdict {
    ctx.need_own_networks("dual-homed hosts")?;
    ctx.need_feature("dvmnetworks", ctx.profile.features.dvmnetworks)?;
    ctx.need_report(Field::ControllerUri, "the controller contact's mask")?;
    let (nodes, hosts) = small();
    let (mask, want) = if ctx.cell.ip == 6 {
        ("112", ":112")
    } else {
        ("255.255.255.0", ":24")
    };
    let base = conf(ctx, &nodes);
    let mut dvm = Dvm::with(ctx, "netmask", &hosts, &base, |s| s.dual_homed = true)?;
    let (net, _) = subnet_of(&dvm, ctx, false)?;
    let c = base.set("DVMNetworks", net).set("DVMNetmask", mask);
    dvm.cluster
        .set_conf(&c.render())
        .map_err(|e| Problem::Unresolved(e.to_string()))?;
    dvm.start_all()?;
    let s = dvm.wait_formed(FORM)?;
    let uri = s.controller_uri.clone().unwrap_or_default();
    check(
        uri.ends_with(want),
        format!("DVMNetmask={mask} gives the contact's mask {want}"),
        uri,
    )?;
    dvm.stop()
}

fn fq_conf(ctx: &Ctx, nodes: &[String], domain: &str) -> dvmlab_harness::PrteConf {
    let fq: Vec<String> = nodes.iter().map(|n| format!("{n}.{domain}")).collect();
    conf(ctx, &fq).set("DVMControllerHost", format!("ctl.{domain}"))
}

pub fn names_match_short_by_default(ctx: &Ctx) -> Verdict {
    let nodes = node_names(3);
    let hosts = with_ctl(&nodes);
    // The configuration's domain is not the hosts': only short-name matching places them.
    let c = fq_conf(ctx, &nodes, "elsewhere.example");
    let mut dvm = Dvm::with(ctx, "fqdn-default", &hosts, &c, |s| {
        s.domain = Some("lab.example".into())
    })?;
    dvm.start_all()?;
    let s = dvm.wait_formed(FORM)?;
    formed_with(&dvm, &s, &hosts)?;
    dvm.stop()
}

pub fn keep_fqdn_hostnames_matches_fully_qualified_names_only(ctx: &Ctx) -> Verdict {
    ctx.need_feature("keep_fqdn", ctx.profile.features.keep_fqdn)?;
    let nodes = node_names(3);
    let hosts = with_ctl(&nodes);
    let good = fq_conf(ctx, &nodes, "lab.example").set("KeepFQDNHostnames", "true");
    let mut dvm = Dvm::with(ctx, "fqdn-keep", &hosts, &good, |s| {
        s.domain = Some("lab.example".into())
    })?;
    dvm.start_all()?;
    let s = dvm.wait_formed(FORM)?;
    let fq: Vec<String> = hosts.iter().map(|h| format!("{h}.lab.example")).collect();
    formed_with(&dvm, &s, &fq)?;
    dvm.stop()?;
    let other = fq_conf(ctx, &nodes, "elsewhere.example").set("KeepFQDNHostnames", "true");
    dvm.cluster
        .set_conf(&other.render())
        .map_err(|e| Problem::Unresolved(e.to_string()))?;
    let (code, out, err) = dvm.run_daemon_once("n01", Duration::from_secs(15))?;
    let said = format!("{out}{err}");
    if code == Some(0) || code.is_none() {
        return Err(fail(
            "with KeepFQDNHostnames=true, n01.lab.example does not match n01.elsewhere.example: the daemon aborts as a non-member",
            format!("exit {code:?}, output {said:?}"),
        ));
    }
    Ok(())
}
