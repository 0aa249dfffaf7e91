//! Ports, address families, networks and host-name matching.

use std::time::Duration;

use dvmlab_harness::IpMode;

use super::{conf, membership, with_ctl, FORM};
use crate::outcome::{check, fail, Problem, Verdict};
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

/// Local and peer addresses of the TCP and UDP sockets on `host`.
fn local_addrs(dvm: &Dvm, host: &str) -> Result<Vec<String>, Problem> {
    let argv = ["ss", "-Htuan"].map(String::from);
    let (code, out, err) = dvm.run_on(host, &argv, Duration::from_secs(10))?;
    if code != Some(0) {
        return Err(Problem::Unresolved(format!("ss on {host}: {err}")));
    }
    // Netid State Recv-Q Send-Q Local Peer
    Ok(out
        .lines()
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
    ctx.need_netns("dual-stack hosts")?;
    ctx.need_feature("ipv6", ctx.profile.features.ipv6)?;
    let (nodes, hosts) = small();
    let c = conf(ctx, &nodes).set("DVMIPVersion", 6);
    let mut dvm = Dvm::with(ctx, "v6only", &hosts, &c, |s| s.ip = IpMode::Dual)?;
    dvm.start_all()?;
    let s = dvm.wait_formed(FORM)?;
    membership(&s, &hosts, ctx.cell.radix)?;
    let ctl = dvm
        .cluster
        .host("ctl")
        .map_err(Problem::Unresolved)?
        .clone();
    if let (Some(v4), Some(v6)) = (ctl.v4, ctl.v6) {
        check(
            s.controller_uri.contains(&v6.to_string())
                && !s.controller_uri.contains(&v4.to_string()),
            format!("the controller's contact names its IPv6 address {v6}"),
            s.controller_uri.clone(),
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
    ctx.need_netns("dual-stack hosts")?;
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
    ctx.need_netns("a host with IPv6 switched off")?;
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

fn dual_homed_nets(ip: u8) -> (&'static str, &'static str, &'static str, u8) {
    if ip == 6 {
        ("fd00:201::/64", "fd00:201::", "fd00:200::", 64)
    } else {
        ("10.201.0.0/16", "10.201.", "10.200.", 16)
    }
}

pub fn dvmnetworks_picks_the_interconnect_address_on_dual_homed_hosts(ctx: &Ctx) -> Verdict {
    ctx.need_netns("dual-homed hosts")?;
    ctx.need_feature("dvmnetworks", ctx.profile.features.dvmnetworks)?;
    let (nodes, hosts) = small();
    let (cidr, on, off, prefix) = dual_homed_nets(ctx.cell.ip);
    let base = conf(ctx, &nodes);
    let mut dvm = Dvm::with(ctx, "dualhomed", &hosts, &base, |s| s.dual_homed = true)?;
    for networks in [cidr, "eth1"] {
        dvm.cluster
            .set_conf(&base.clone().set("DVMNetworks", networks).render())
            .map_err(|e| Problem::Unresolved(e.to_string()))?;
        dvm.start_all()?;
        let s = dvm.wait_formed(FORM)?;
        check(
            s.controller_uri.contains(on) && s.controller_uri.ends_with(&format!(":{prefix}")),
            format!(
                "DVMNetworks={networks}: the controller contact is on {on} with the prefix's mask {prefix}"
            ),
            s.controller_uri.clone(),
        )?;
        for h in &hosts {
            let socks = dvm.tcp_sockets(h)?;
            check(
                socks.contains(on) && !socks.contains(off),
                format!("DVMNetworks={networks}: {h} talks on {on} only"),
                socks,
            )?;
        }
        dvm.stop()?;
    }
    Ok(())
}

pub fn an_ambiguous_multi_homed_host_is_refused_naming_the_host(ctx: &Ctx) -> Verdict {
    ctx.need_netns("dual-homed hosts")?;
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
    ctx.need_netns("dual-homed hosts")?;
    ctx.need_feature("dvmnetworks", ctx.profile.features.dvmnetworks)?;
    let (nodes, hosts) = small();
    let (net, mask, want) = if ctx.cell.ip == 6 {
        ("fd00:200::/64", "112", ":112")
    } else {
        ("10.200.0.0/16", "255.255.255.0", ":24")
    };
    let c = conf(ctx, &nodes)
        .set("DVMNetworks", net)
        .set("DVMNetmask", mask);
    let mut dvm = Dvm::with(ctx, "netmask", &hosts, &c, |s| s.dual_homed = true)?;
    dvm.start_all()?;
    let s = dvm.wait_formed(FORM)?;
    check(
        s.controller_uri.ends_with(want),
        format!("DVMNetmask={mask} gives the contact's mask {want}"),
        s.controller_uri.clone(),
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
    membership(&s, &hosts, ctx.cell.radix)?;
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
    membership(&s, &fq, ctx.cell.radix)?;
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
