//! Formation: one identical command everywhere makes one DVM, with the namespace, ranks,
//! controller and tree the configuration implies.

use std::time::Duration;

use dvmlab_harness::PrteConf;

use super::{
    cell_nodes, conf, form_and_check, formed_with, membership, ranks_are, reported_contact,
    rooted_at_controller, tree_is, wait_joined, with_ctl, FORM,
};
use crate::outcome::{check, fail, OrUnresolved, Problem, Verdict};
use crate::status::{tree_parent, Field, Identity};
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
    membership(ctx, &dvm, &s, &hosts, Some(ctx.cell.radix))?;
    ctx.aspect("root", rooted_at_controller(&dvm, &hosts));
    ctx.aspect(
        "namespace",
        ctx.need_report(Field::Namespace, "the DVM's namespace")
            .and_then(|()| {
                let ns = s.namespace.clone().unwrap_or_default();
                check(
                    ns == "conf1-prte-dvm",
                    "namespace conf1-prte-dvm (ClusterName conf1)",
                    ns,
                )
            }),
    );
    ctx.aspect(
        "mask",
        reported_contact(ctx, &s).and_then(|uri| {
                check(
                    uri.ends_with(":0"),
                    "without DVMNetmask (or DVMNetworks) the controller contact is universally reachable: mask 0",
                    uri,
                )
            }),
    );
    ctx.aspect(
        "conf_location",
        check(
            ctx.profile.daemon.conf_path == "/etc/prte.conf",
            "the daemon reads its configuration from /etc/prte.conf (the suite writes it only there)",
            format!(
                "profile {} places it at {}",
                ctx.profile.path.display(),
                ctx.profile.daemon.conf_path
            ),
        ),
    );
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
    let mut dvm = Dvm::new(ctx, "opkeys", &hosts, &c)?;
    dvm.start_all()?;
    let s = dvm.wait_formed(FORM)?;
    formed_with(&dvm, &s, &hosts)?;
    dvm.stop()
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
    formed_with(&dvm, &s, &by_rank)?;
    dvm.stop()
}

pub fn controller_listed_in_dvmnodes_is_rank_0_and_its_entry_is_skipped(ctx: &Ctx) -> Verdict {
    let nodes = node_names(ctx.cell.nodes.max(2));
    let mut listed = nodes.clone();
    listed.insert(listed.len() / 2, "ctl".into());
    let hosts = with_ctl(&nodes);
    // The premise (formed with exactly these members) is the count: the DVMNodes entries,
    // controller included.
    form_and_check(
        ctx,
        "listed",
        &hosts,
        &conf(ctx, &listed),
        &hosts,
        Some(ctx.cell.radix),
    )
    .map(|_| ())
}

pub fn ranks_follow_the_listed_order_of_dvmnodes_not_name_order(ctx: &Ctx) -> Verdict {
    let mut order = node_names(ctx.cell.nodes.max(3));
    order.reverse();
    let k = order.len() / 3;
    order.rotate_left(k);
    let hosts = with_ctl(&order);
    form_and_check(ctx, "order", &hosts, &conf(ctx, &order), &hosts, None).map(|_| ())
}

/// One DVMNodes syntax: forms a DVM whose DVMNodes is written that way; it must form with
/// exactly the hosts it names (`Err` otherwise). The ranks' order is the returned verdict.
fn forms_with_syntax(
    ctx: &Ctx,
    what: &str,
    value: &str,
    order: &[String],
) -> Result<Verdict, Problem> {
    let hosts = with_ctl(order);
    let mut c = conf(ctx, order).set("ClusterName", "syntax");
    let mut dvm = Dvm::new(ctx, &format!("syntax-{}", order[0]), &hosts, &c)?;
    if value.is_empty() {
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
        c = c.set("DVMNodes", value);
    }
    dvm.cluster
        .set_conf(&c.render())
        .or_unresolved("writing prte.conf")?;
    dvm.start_all()?;
    let label = |p: Problem| match p {
        Problem::Fail { expected, observed } => fail(
            format!("DVMNodes as {what} ({}): {expected}", c.render().trim()),
            observed,
        ),
        other => other,
    };
    let st = dvm.wait_formed(FORM).map_err(label)?;
    formed_with(&dvm, &st, &hosts).map_err(label)?;
    let ranks = ranks_are(ctx, &dvm, &st, &hosts).map_err(label);
    dvm.stop()?;
    Ok(ranks)
}

/// Every DVMNodes syntax, each an aspect of its own (`list`, `ranges`, `several_ranges`,
/// `regex`, `file`): each forms the DVM of the hosts it names. Aspect `order`: with every
/// syntax the ranks follow the order it lists them in.
pub fn every_dvmnodes_syntax_gives_the_same_membership(ctx: &Ctx) -> Verdict {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let cases: Vec<(&str, &str, Vec<String>)> = vec![
        ("list", "b2,a1,c3", s(&["b2", "a1", "c3"])),
        (
            "ranges",
            "rack[3:1-2,7]-ib",
            s(&["rack001-ib", "rack002-ib", "rack007-ib"]),
        ),
        (
            "several_ranges",
            "n[1:1-3],n[2:10-11]",
            s(&["n1", "n2", "n3", "n10", "n11"]),
        ),
        ("regex", "pmix[x[2:1-2],y]", s(&["x01", "x02", "y"])),
        ("file", "", s(&["f3", "f1", "f2"])),
    ];
    // A syntax the runtime does not form with fails its own aspect, not the others'.
    let mut ordered = Ok(());
    for (what, value, order) in cases {
        match forms_with_syntax(ctx, what, value, &order) {
            Ok(ranks) => {
                ctx.aspect(what, Ok(()));
                if ordered.is_ok() {
                    ordered = ranks;
                }
            }
            Err(p) => ctx.aspect(what, Err(p)),
        }
    }
    ctx.aspect("order", ordered);
    Ok(())
}

/// Aspects `derived` (each host derives the namespace and the rank DVMNodes gives it, by
/// the profile's identity command), `election` (exactly one daemon, the one on
/// DVMControllerHost, derives the controller role) and `ranks` (the controller reports the
/// ranks the daemons derived).
pub fn every_daemon_derives_the_identity_the_controller_reports(ctx: &Ctx) -> Verdict {
    let nodes = node_names(6);
    let hosts = with_ctl(&nodes);
    let c = conf(ctx, &nodes)
        .set("ClusterName", "ident")
        .set("DVMNodes", "n[2:4-6],n[2:1-3]");
    let by_rank: Vec<String> = ["ctl", "n04", "n05", "n06", "n01", "n02", "n03"]
        .map(String::from)
        .to_vec();
    let mut dvm = Dvm::new(ctx, "identity", &hosts, &c)?;
    let ids: Result<Vec<(String, Identity)>, Problem> = hosts
        .iter()
        .map(|h| dvm.identity(h).map(|id| (h.clone(), id)))
        .collect();
    let (derived, election) = match ids {
        Err(p) => (Err(p.clone()), Err(p)),
        Ok(ids) => {
            let derived = ids.iter().try_for_each(|(h, id)| {
                let want = by_rank.iter().position(|x| x == h).unwrap_or(usize::MAX) as u32;
                check(
                    id.namespace == "ident-prte-dvm" && id.rank == want,
                    format!("{h} derives ident-prte-dvm rank {want}"),
                    format!("{id:?}"),
                )
            });
            let controllers: Vec<&String> = ids
                .iter()
                .filter(|(_, id)| id.role == "controller")
                .map(|(h, _)| h)
                .collect();
            let election = check(
                controllers == ["ctl"],
                "exactly one daemon, the one on DVMControllerHost, elects itself controller",
                format!("controllers: {controllers:?}"),
            );
            (derived, election)
        }
    };
    ctx.aspect("derived", derived);
    ctx.aspect("election", election);
    dvm.start_all()?;
    let s = dvm.wait_formed(FORM)?;
    formed_with(&dvm, &s, &by_rank)?;
    ctx.aspect("ranks", ranks_are(ctx, &dvm, &s, &by_rank));
    dvm.stop()
}

pub fn default_cluster_name_gives_namespace_cluster_prte_dvm(ctx: &Ctx) -> Verdict {
    ctx.need_report(Field::Namespace, "the DVM's namespace")?;
    let nodes = node_names(2);
    let hosts = with_ctl(&nodes);
    let mut dvm = Dvm::new(ctx, "nsdefault", &hosts, &conf(ctx, &nodes))?;
    dvm.start_all()?;
    let s = dvm.wait_formed(FORM)?;
    let ns = s.namespace.clone().unwrap_or_default();
    check(
        ns == "cluster-prte-dvm",
        "namespace cluster-prte-dvm when ClusterName is not set",
        ns,
    )?;
    dvm.stop()
}

pub fn formed_is_reported_only_after_every_dvmnodes_node_reported_in(ctx: &Ctx) -> Verdict {
    let nodes = node_names(ctx.cell.nodes.max(2));
    let hosts = with_ctl(&nodes);
    let last = nodes.last().cloned().unwrap_or_default();
    let mut dvm = Dvm::new(ctx, "withhold", &hosts, &conf(ctx, &nodes))?;
    let others: Vec<String> = hosts.iter().filter(|h| **h != last).cloned().collect();
    dvm.start_many(&others)?;
    ctx.note(format!("started all but {last}"));
    wait_joined(&dvm, &others[1..], "every started daemon joined")?;
    dvm.holds_for(
        Duration::from_secs(3),
        &format!("formed stays false while {last} has not reported in"),
        |s| !s.formed,
    )?;
    dvm.start(&last)?;
    ctx.note(format!("started {last}"));
    let s = dvm.wait_formed(FORM)?;
    formed_with(&dvm, &s, &hosts)?;
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
    formed_with(&dvm, &s, &hosts)?;
    // Ranks 1-64 under the controller and 65 under rank 1 is radix 64, whatever the
    // status reports: the network shows it.
    let ranks: Vec<u32> = (1..hosts.len() as u32).collect();
    tree_is(&dvm, &s, &hosts, &ranks, &|r| tree_parent(r, 64))?;
    dvm.stop()
}
