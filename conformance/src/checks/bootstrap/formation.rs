//! Formation: one identical command everywhere makes one DVM, with the namespace, ranks,
//! controller and tree the configuration implies.

use std::time::Duration;

use dvmlab_harness::PrteConf;

use super::{cell_nodes, conf, form_and_check, membership, with_ctl, FORM};
use crate::outcome::{check, fail, OrUnresolved, Verdict};
use crate::status::MemberState;
use crate::sut::{node_names, Ctx, Dvm};

pub fn identical_command_on_every_host_forms_one_dvm(ctx: &Ctx) -> Verdict {
    let nodes = cell_nodes(ctx);
    let hosts = with_ctl(&nodes);
    let n = nodes.len();
    let c = conf(ctx, &nodes)
        .set("ClusterName", "conf1")
        .set("DVMNodes", format!("n[2:1-{n}]"));
    let mut dvm = Dvm::new(ctx, "uniform", &hosts, &c)?;
    dvm.start_all()?;
    // The harness starts the profile's one daemon command on every host: no host is told
    // its rank, role or peers.
    ctx.note(format!(
        "started {:?} on {} hosts",
        ctx.profile.daemon.command,
        hosts.len()
    ));
    let s = dvm.wait_formed(FORM)?;
    check(
        s.namespace == "conf1-prte-dvm",
        "namespace conf1-prte-dvm (ClusterName conf1)",
        s.namespace.clone(),
    )?;
    check(
        s.controller_uri.ends_with(":0"),
        "without DVMNetmask (or DVMNetworks) the controller contact is universally reachable: mask 0",
        s.controller_uri.clone(),
    )?;
    membership(&s, &hosts, ctx.cell.radix)?;
    dvm.stop()
}

pub fn operational_keys_do_not_change_formation(ctx: &Ctx) -> Verdict {
    let nodes = node_names(3);
    let hosts = with_ctl(&nodes);
    let c = conf(ctx, &nodes)
        .set("SessionTmpDir", "/tmp/dvl-conformance-%h")
        .set("ControllerLogJobState", "true")
        .set("ControllerLogProcState", "true")
        .set("PRTEDLogJobState", "true")
        .set("PRTEDLogProcState", "true");
    form_and_check(ctx, "opkeys", &hosts, &c, &hosts, ctx.cell.radix).map(|_| ())
}

pub fn dvmnodes_ip_literals_match_hosts_by_address(ctx: &Ctx) -> Verdict {
    let nodes = node_names(3);
    let hosts = with_ctl(&nodes);
    let mut dvm = Dvm::new(ctx, "ipliteral", &hosts, &conf(ctx, &nodes))?;
    let addr = |h: &str| -> Result<String, crate::outcome::Problem> {
        let info = dvm.cluster.host(h).or_unresolved("host address")?;
        let a = if ctx.cell.ip == 6 { info.v6 } else { info.v4 };
        a.map(|a| a.to_string())
            .ok_or_else(|| crate::outcome::Problem::Unresolved(format!("{h} has no address")))
    };
    let literals: Vec<String> = nodes.iter().map(|n| addr(n)).collect::<Result<_, _>>()?;
    let c = conf(ctx, &literals);
    dvm.cluster
        .set_conf(&c.render())
        .or_unresolved("writing prte.conf")?;
    dvm.start_all()?;
    let s = dvm.wait_formed(FORM)?;
    let mut by_rank = vec!["ctl".to_string()];
    by_rank.extend(literals);
    membership(&s, &by_rank, ctx.cell.radix)?;
    dvm.stop()
}

pub fn controller_listed_in_dvmnodes_is_rank_0_and_its_entry_is_skipped(ctx: &Ctx) -> Verdict {
    let nodes = node_names(ctx.cell.nodes.max(2));
    let mut listed = nodes.clone();
    listed.insert(listed.len() / 2, "ctl".into());
    let hosts = with_ctl(&nodes);
    let s = form_and_check(
        ctx,
        "listed",
        &hosts,
        &conf(ctx, &listed),
        &hosts,
        ctx.cell.radix,
    )?;
    check(
        s.expected as usize == listed.len(),
        format!(
            "{} daemons: the DVMNodes count, controller included",
            listed.len()
        ),
        format!("{}", s.expected),
    )
}

pub fn ranks_follow_the_listed_order_of_dvmnodes_not_name_order(ctx: &Ctx) -> Verdict {
    let mut order = node_names(ctx.cell.nodes.max(3));
    order.reverse();
    let k = order.len() / 3;
    order.rotate_left(k);
    let hosts = with_ctl(&order);
    form_and_check(
        ctx,
        "order",
        &hosts,
        &conf(ctx, &order),
        &hosts,
        ctx.cell.radix,
    )
    .map(|_| ())
}

pub fn every_dvmnodes_syntax_gives_the_same_membership(ctx: &Ctx) -> Verdict {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let cases: Vec<(&str, String, Vec<String>)> = vec![
        ("list", "b2,a1,c3".into(), s(&["b2", "a1", "c3"])),
        (
            "padded range with suffix",
            "rack[3:1-2,7]-ib".into(),
            s(&["rack001-ib", "rack002-ib", "rack007-ib"]),
        ),
        (
            "several ranges",
            "n[1:1-3],n[2:10-11]".into(),
            s(&["n1", "n2", "n3", "n10", "n11"]),
        ),
        (
            "PMIx native regex",
            "pmix[x[2:1-2],y]".into(),
            s(&["x01", "x02", "y"]),
        ),
        ("file", String::new(), s(&["f3", "f1", "f2"])),
    ];
    for (what, value, order) in cases {
        let hosts = with_ctl(&order);
        let mut c = conf(ctx, &order).set("ClusterName", "syntax");
        let mut dvm = Dvm::new(ctx, &format!("syntax-{}", order[0]), &hosts, &c)?;
        if what == "file" {
            for h in &hosts {
                let dir = dvm.cluster.etc_dir(h);
                std::fs::write(
                    dir.join("dvmnodes.txt"),
                    format!("# nodes\n{}\n", order.join("\n")),
                )
                .or_unresolved("writing the node file")?;
            }
            let on_host = dvm
                .cluster
                .conf_path("ctl")
                .parent()
                .map(|p| p.join("dvmnodes.txt"))
                .unwrap_or_default();
            c = c.set("DVMNodes", format!("file:{}", on_host.display()));
        } else {
            c = c.set("DVMNodes", &value);
        }
        dvm.cluster
            .set_conf(&c.render())
            .or_unresolved("writing prte.conf")?;
        dvm.start_all()?;
        let st = dvm.wait_formed(FORM).map_err(|p| match p {
            crate::outcome::Problem::Fail { expected, observed } => fail(
                format!("DVMNodes as {what} ({}): {expected}", c.render().trim()),
                observed,
            ),
            other => other,
        })?;
        membership(&st, &hosts, ctx.cell.radix)?;
        dvm.stop()?;
    }
    Ok(())
}

pub fn every_daemon_derives_the_identity_the_controller_reports(ctx: &Ctx) -> Verdict {
    if ctx.profile.identity.is_none() {
        return Err(crate::outcome::Problem::Unsupported(
            "the profile has no [identity] command".into(),
        ));
    }
    let nodes = node_names(6);
    let hosts = with_ctl(&nodes);
    let c = conf(ctx, &nodes)
        .set("ClusterName", "ident")
        .set("DVMNodes", "n[2:4-6],n[2:1-3]");
    let by_rank: Vec<String> = ["ctl", "n04", "n05", "n06", "n01", "n02", "n03"]
        .map(String::from)
        .to_vec();
    let mut dvm = Dvm::new(ctx, "identity", &hosts, &c)?;
    let mut controllers = Vec::new();
    for h in &hosts {
        let id = dvm.identity(h)?;
        let want = by_rank.iter().position(|x| x == h).unwrap_or(usize::MAX) as u32;
        check(
            id.namespace == "ident-prte-dvm" && id.rank == want,
            format!("{h} derives ident-prte-dvm rank {want}"),
            format!("{id:?}"),
        )?;
        if id.role == "controller" {
            controllers.push(h.clone());
        }
    }
    check(
        controllers == ["ctl"],
        "exactly one daemon, the one on DVMControllerHost, elects itself controller",
        format!("controllers: {controllers:?}"),
    )?;
    dvm.start_all()?;
    let s = dvm.wait_formed(FORM)?;
    membership(&s, &by_rank, ctx.cell.radix)?;
    dvm.stop()
}

pub fn default_cluster_name_gives_namespace_cluster_prte_dvm(ctx: &Ctx) -> Verdict {
    let nodes = node_names(2);
    let hosts = with_ctl(&nodes);
    let s = form_and_check(
        ctx,
        "nsdefault",
        &hosts,
        &conf(ctx, &nodes),
        &hosts,
        ctx.cell.radix,
    )?;
    check(
        s.namespace == "cluster-prte-dvm",
        "namespace cluster-prte-dvm when ClusterName is not set",
        s.namespace,
    )
}

pub fn formed_is_reported_only_after_every_dvmnodes_node_reported_in(ctx: &Ctx) -> Verdict {
    let nodes = node_names(ctx.cell.nodes.max(2));
    let hosts = with_ctl(&nodes);
    let last = nodes.last().cloned().unwrap_or_default();
    let mut dvm = Dvm::new(ctx, "withhold", &hosts, &conf(ctx, &nodes))?;
    let others: Vec<String> = hosts.iter().filter(|h| **h != last).cloned().collect();
    dvm.start_many(&others)?;
    ctx.note(format!("started all but {last}"));
    dvm.wait_status(FORM, "every started daemon joined", |s| {
        s.joined() == others.len()
    })?;
    dvm.holds_for(
        Duration::from_secs(3),
        &format!("formed stays false while {last} has not reported in"),
        |s| !s.formed,
    )?;
    dvm.start(&last)?;
    ctx.note(format!("started {last}"));
    let s = dvm.wait_formed(FORM)?;
    membership(&s, &hosts, ctx.cell.radix)?;
    dvm.stop()
}

pub fn radix_defaults_to_64(ctx: &Ctx) -> Verdict {
    let nodes = node_names(66);
    let hosts = with_ctl(&nodes);
    let c = PrteConf::new()
        .set("DVMNodes", "n[2:1-66]")
        .set("DVMControllerHost", "ctl")
        .set("DVMIPVersion", ctx.cell.ip);
    let mut dvm = Dvm::new(ctx, "radix64", &hosts, &c)?;
    dvm.start_all()?;
    let s = dvm.wait_formed(Duration::from_secs(60))?;
    membership(&s, &hosts, 64)?;
    check(
        s.member(65).and_then(|m| m.parent) == Some(1)
            && s.members.iter().all(|m| m.state == MemberState::Joined),
        "rank 65 under rank 1, as radix 64 puts it",
        s.describe(),
    )?;
    dvm.stop()
}
