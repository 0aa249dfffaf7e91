//! Tests of the DVM bootstrap spec (`catalog/bootstrap.toml` maps them to its items).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use dvmlab_harness::PrteConf;

use crate::checks::{tests, TestDef};
use crate::outcome::{check, fail, Problem, Verdict};
use crate::status::{tree_parent, Field, MemberState, Status};
use crate::sut::{node_names, Ctx, Dvm};

mod conf;
mod formation;
mod network;
mod wireup;

use conf::*;
use formation::*;
use network::*;
use wireup::*;

/// How long a healthy DVM of test size may take to form (generous: shared CI machines).
pub(crate) const FORM: Duration = Duration::from_secs(30);

pub(crate) fn tests() -> Vec<TestDef> {
    let mut v = tests![
        identical_command_on_every_host_forms_one_dvm
            => ["ranks", "tree", "root", "namespace", "mask", "conf_location"],
        controller_listed_in_dvmnodes_is_rank_0_and_its_entry_is_skipped => ["ranks", "tree"],
        ranks_follow_the_listed_order_of_dvmnodes_not_name_order => ["ranks"],
        every_dvmnodes_syntax_gives_the_same_membership
            => ["list", "ranges", "several_ranges", "regex", "file", "order"],
        every_daemon_derives_the_identity_the_controller_reports
            => ["derived", "election", "ranks"],
        default_cluster_name_gives_namespace_cluster_prte_dvm,
        formed_is_reported_only_after_every_dvmnodes_node_reported_in,
        radix_defaults_to_64,
        operational_keys_do_not_change_formation,
        dvmnodes_ip_literals_match_hosts_by_address,
        comments_and_blank_lines_are_ignored,
        an_unknown_key_is_ignored,
        a_line_without_equals_aborts_bootstrap => ["diagnostic"],
        an_empty_key_aborts_bootstrap => ["diagnostic"],
        an_empty_value_aborts_bootstrap => ["diagnostic"],
        a_missing_dvmnodes_aborts_bootstrap => ["diagnostic"],
        a_missing_controller_host_aborts_bootstrap => ["diagnostic"],
        a_malformed_node_range_aborts_bootstrap => ["diagnostic"],
        a_duplicate_node_aborts_bootstrap => ["diagnostic"],
        a_missing_conf_file_aborts_bootstrap => ["diagnostic"],
        a_host_outside_dvmnodes_aborts_and_never_joins,
        conf_file_beats_mca_env_and_command_line_beats_both => ["file_over_mca", "cli_over_all"],
        every_daemon_listens_on_the_default_port_7817,
        dvmport_moves_every_daemon_to_that_port,
        ipv4_is_the_default_family_on_dual_stack_hosts,
        ipv6_only_dvm_uses_no_ipv4_at_all,
        ipv6_on_a_host_without_ipv6_aborts_with_a_diagnostic,
        dvmnetworks_picks_the_interconnect_address_on_dual_homed_hosts => ["cidr", "iface", "mask"],
        an_ambiguous_multi_homed_host_is_refused_naming_the_host,
        dvmnetmask_overrides_the_mask_in_the_contact_uri,
        names_match_short_by_default,
        keep_fqdn_hostnames_matches_fully_qualified_names_only,
        controller_booted_20_seconds_late_still_forms_the_dvm,
        retries_to_the_controller_back_off_up_to_the_max_delay => ["backoff", "default_cap"],
        radix_2_children_heal_past_never_booted_parents_and_the_dvm_forms_when_they_boot
            => ["heal", "not_formed"],
        radix_3_children_heal_past_a_never_booted_parent_and_the_dvm_forms_when_it_boots
            => ["heal", "not_formed"],
        a_child_whose_parent_cannot_answer_heals_to_the_next_ancestor,
        connect_max_time_zero_disables_healing,
        connect_max_time_defaults_to_30_seconds,
        a_partitioned_group_joins_once_the_partition_heals,
    ];
    v.push(TestDef {
        name: "formation_survives_delay_loss_and_duplication_on_links",
        run: formation_survives_delay_loss_and_duplication_on_links,
        seeded: true,
        aspects: &[],
    });
    v.push(TestDef {
        name: "dvm_forms_under_a_seeded_random_fault_schedule",
        run: dvm_forms_under_a_seeded_random_fault_schedule,
        seeded: true,
        aspects: &[],
    });
    v
}

/// `ctl` followed by `nodes`.
pub(crate) fn with_ctl(nodes: &[String]) -> Vec<String> {
    let mut h = vec!["ctl".to_string()];
    h.extend(nodes.iter().cloned());
    h
}

/// A configuration for controller `ctl` and `nodes` (comma list), in the cell's IP family and
/// radix.
pub(crate) fn conf(ctx: &Ctx, nodes: &[String]) -> PrteConf {
    PrteConf::new()
        .set("DVMNodes", nodes.join(","))
        .set("DVMControllerHost", "ctl")
        .set("DVMRadix", ctx.cell.radix)
        .set("DVMIPVersion", ctx.cell.ip)
}

/// The cluster host each of `names` stands for (a host name, address or FQDN as a runtime
/// may report it; unknown names stay as they are).
pub(crate) fn hosts_named(dvm: &Dvm, names: &[String]) -> Vec<String> {
    names
        .iter()
        .map(|n| dvm.host_named(n).unwrap_or_else(|| n.clone()))
        .collect()
}

/// The premise of every formation test: the DVM reported formed, and the members it lists
/// as joined are exactly the hosts of `by_rank` (a status that reports `expected` must count
/// them all). Ranks and tree are aspects ([`ranks_are`], [`tree_is`]): only the items that
/// state them are judged by them.
pub(crate) fn formed_with(dvm: &Dvm, s: &Status, by_rank: &[String]) -> Verdict {
    check(s.formed, "the DVM reported formed", s.describe())?;
    let want: BTreeSet<String> = hosts_named(dvm, by_rank).into_iter().collect();
    let got: BTreeSet<String> = s
        .members
        .iter()
        .filter(|m| m.state == MemberState::Joined)
        .map(|m| dvm.host_named(&m.host).unwrap_or_else(|| m.host.clone()))
        .collect();
    check(
        got == want && s.joined() == by_rank.len(),
        format!("the joined members are exactly {want:?}, once each"),
        s.describe(),
    )?;
    if let Some(e) = s.expected {
        check(
            e as usize == by_rank.len(),
            format!("{} daemons expected", by_rank.len()),
            s.describe(),
        )?;
    }
    Ok(())
}

/// The controller contact the status reports, for the contact-mask checks; unsupported for
/// a status that does not report it (the mask is seen nowhere else).
pub(crate) fn reported_contact(ctx: &Ctx, s: &Status) -> Result<String, Problem> {
    ctx.need_report(Field::ControllerUri, "the controller contact's mask")?;
    Ok(s.controller_uri.clone().unwrap_or_default())
}

/// Aspect `ranks`: rank `r` is the host `by_rank[r]` (the listed order of DVMNodes, the
/// controller at 0), as the status reports ranks.
pub(crate) fn ranks_are(ctx: &Ctx, dvm: &Dvm, s: &Status, by_rank: &[String]) -> Verdict {
    ctx.need_report(Field::Ranks, "which rank each daemon has")?;
    let hosts = hosts_named(dvm, by_rank);
    for (r, host) in hosts.iter().enumerate() {
        let r = r as u32;
        let m = s
            .member(r)
            .ok_or_else(|| fail(format!("a member of rank {r}"), s.describe()))?;
        check(
            dvm.host_named(&m.host).as_deref() == Some(host),
            format!("rank {r} is {host} (from the listed order of DVMNodes)"),
            format!("rank {r} is {}\n{}", m.host, s.describe()),
        )?;
    }
    Ok(())
}

/// The network's view, one line per host, for failure messages.
fn describe_links(links: &BTreeMap<String, Vec<String>>) -> String {
    links
        .iter()
        .map(|(h, up)| {
            format!(
                "  {h} -> {}",
                if up.is_empty() {
                    "-".to_string()
                } else {
                    up.join(", ")
                }
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether the network shows each of `ranks` (of `by_rank`) connected up to the host of
/// `parent_of(rank)` and, unless that is the controller, not straight to the controller.
/// `Err` says the first that is not.
pub(crate) fn links_match(
    by_rank: &[String],
    links: &BTreeMap<String, Vec<String>>,
    ranks: &[u32],
    parent_of: &dyn Fn(u32) -> Option<u32>,
) -> Result<(), String> {
    let ctl = &by_rank[0];
    for &r in ranks {
        let h = &by_rank[r as usize];
        let up = links.get(h).cloned().unwrap_or_default();
        let Some(p) = parent_of(r) else { continue };
        let ph = &by_rank[p as usize];
        if !up.contains(ph) {
            return Err(format!("rank {r} ({h}) connected up to rank {p} ({ph})"));
        }
        if ph != ctl && up.contains(ctl) {
            return Err(format!(
                "rank {r} ({h}) connected up to rank {p} ({ph}), not straight to the controller"
            ));
        }
    }
    Ok(())
}

/// Aspect `tree`: every daemon connected up to the rank `parent_of` names (its radix tree
/// parent, or the ancestor it healed to), not straight to the controller — judged from the
/// network, for any runtime. A status that reports parents must say the same as the
/// sockets; one that says one parent while its sockets say another fails, with both shown.
pub(crate) fn tree_is(
    dvm: &Dvm,
    s: &Status,
    by_rank: &[String],
    ranks: &[u32],
    parent_of: &dyn Fn(u32) -> Option<u32>,
) -> Verdict {
    let hosts = hosts_named(dvm, by_rank);
    let links = dvm.observe()?;
    if let Err(what) = links_match(&hosts, &links, ranks, parent_of) {
        return Err(fail(
            format!("{what}, as the network shows it"),
            format!(
                "established connections to DVMPort:\n{}",
                describe_links(&links)
            ),
        ));
    }
    if dvm.reports(Field::Parents) {
        for &r in ranks {
            let h = &hosts[r as usize];
            let Some(m) = s
                .members
                .iter()
                .find(|m| dvm.host_named(&m.host).as_deref() == Some(h))
            else {
                continue;
            };
            let said = m
                .parent
                .and_then(|p| s.member(p))
                .and_then(|pm| dvm.host_named(&pm.host));
            let up = links.get(h).cloned().unwrap_or_default();
            check(
                said.as_ref().is_some_and(|p| up.contains(p)),
                format!("what the status says of {h}'s parent matches its sockets"),
                format!(
                    "the status says {h}'s parent is rank {:?} ({}); its sockets say it is connected up to {up:?}\n{}",
                    m.parent,
                    said.as_deref().unwrap_or("no member"),
                    s.describe()
                ),
            )?;
        }
    }
    Ok(())
}

/// Aspect `root`: the controller's host is the root of the tree the network shows: it
/// connects up to no one, and every other daemon's chain of upstream links ends there.
pub(crate) fn rooted_at_controller(dvm: &Dvm, by_rank: &[String]) -> Verdict {
    let hosts = hosts_named(dvm, by_rank);
    let links = dvm.observe()?;
    let ctl = &hosts[0];
    let shown = || {
        format!(
            "established connections to DVMPort:\n{}",
            describe_links(&links)
        )
    };
    check(
        links.get(ctl).is_none_or(|u| u.is_empty()),
        format!("the controller ({ctl}) connects up to no other daemon"),
        shown(),
    )?;
    for h in &hosts[1..] {
        let mut at = h.clone();
        let mut steps = 0;
        while &at != ctl {
            let next = links.get(&at).and_then(|u| u.first()).cloned();
            match next {
                Some(n) if steps <= hosts.len() => at = n,
                _ => {
                    return Err(fail(
                        format!("{h}'s chain of upstream links ends at the controller ({ctl})"),
                        shown(),
                    ))
                }
            }
            steps += 1;
        }
    }
    Ok(())
}

/// Whether `host` counts as joined now: its status says so when the status lists every
/// member's state; for a runtime that cannot say, the network shows it connected up to
/// another daemon of the DVM.
pub(crate) fn joined_now(
    dvm: &Dvm,
    s: &Status,
    links: &BTreeMap<String, Vec<String>>,
    host: &str,
) -> bool {
    if dvm.reports(Field::States) {
        s.members.iter().any(|m| {
            m.state == MemberState::Joined && dvm.host_named(&m.host).as_deref() == Some(host)
        })
    } else {
        links.get(host).is_some_and(|u| !u.is_empty())
    }
}

/// Waits until every one of `hosts` counts as joined ([`joined_now`]).
pub(crate) fn wait_joined(dvm: &Dvm, hosts: &[String], what: &str) -> Result<Status, Problem> {
    dvm.wait_status(FORM, what, |s| {
        dvm.observe()
            .is_ok_and(|links| hosts.iter().all(|h| joined_now(dvm, s, &links, h)))
    })
}

/// The premise, then aspect `ranks` and, when `radix` is given, aspect `tree` of a DVM that
/// formed with `by_rank`.
pub(crate) fn membership(
    ctx: &Ctx,
    dvm: &Dvm,
    s: &Status,
    by_rank: &[String],
    radix: Option<u32>,
) -> Verdict {
    formed_with(dvm, s, by_rank)?;
    ctx.aspect("ranks", ranks_are(ctx, dvm, s, by_rank));
    if let Some(radix) = radix {
        let ranks: Vec<u32> = (1..by_rank.len() as u32).collect();
        ctx.aspect(
            "tree",
            tree_is(dvm, s, by_rank, &ranks, &|r| tree_parent(r, radix)),
        );
    }
    Ok(())
}

/// Forms a DVM of `hosts` with `c`, judges it as [`membership`] does, stops it.
pub(crate) fn form_and_check(
    ctx: &Ctx,
    label: &str,
    hosts: &[String],
    c: &PrteConf,
    by_rank: &[String],
    radix: Option<u32>,
) -> Result<Status, Problem> {
    let mut dvm = Dvm::new(ctx, label, hosts, c)?;
    dvm.start_all()?;
    let s = dvm.wait_formed(FORM)?;
    membership(ctx, &dvm, &s, by_rank, radix)?;
    dvm.stop()?;
    Ok(s)
}

/// The nodes of the general tests: the cell's node count.
pub(crate) fn cell_nodes(ctx: &Ctx) -> Vec<String> {
    node_names(ctx.cell.nodes)
}
