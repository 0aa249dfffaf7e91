//! Tests of the DVM bootstrap spec (`catalog/bootstrap.toml` maps them to its items).

use std::time::Duration;

use dvmlab_harness::PrteConf;

use crate::checks::{tests, TestDef};
use crate::outcome::{check, fail, Problem, Verdict};
use crate::status::{tree_parent, MemberState, Status};
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
        identical_command_on_every_host_forms_one_dvm,
        controller_listed_in_dvmnodes_is_rank_0_and_its_entry_is_skipped,
        ranks_follow_the_listed_order_of_dvmnodes_not_name_order,
        every_dvmnodes_syntax_gives_the_same_membership,
        every_daemon_derives_the_identity_the_controller_reports,
        default_cluster_name_gives_namespace_cluster_prte_dvm,
        formed_is_reported_only_after_every_dvmnodes_node_reported_in,
        radix_defaults_to_64,
        operational_keys_do_not_change_formation,
        dvmnodes_ip_literals_match_hosts_by_address,
        comments_blank_lines_and_unknown_keys_are_ignored,
        a_line_without_equals_aborts_bootstrap,
        an_empty_key_aborts_bootstrap,
        an_empty_value_aborts_bootstrap,
        a_missing_dvmnodes_aborts_bootstrap,
        a_missing_controller_host_aborts_bootstrap,
        a_malformed_node_range_aborts_bootstrap,
        a_duplicate_node_aborts_bootstrap,
        a_missing_conf_file_aborts_bootstrap,
        a_host_outside_dvmnodes_aborts_and_never_joins,
        conf_file_beats_mca_env_and_command_line_beats_both,
        every_daemon_listens_on_the_default_port_7817,
        dvmport_moves_every_daemon_to_that_port,
        ipv4_is_the_default_family_on_dual_stack_hosts,
        ipv6_only_dvm_uses_no_ipv4_at_all,
        ipv6_on_a_host_without_ipv6_aborts_with_a_diagnostic,
        dvmnetworks_picks_the_interconnect_address_on_dual_homed_hosts,
        an_ambiguous_multi_homed_host_is_refused_naming_the_host,
        dvmnetmask_overrides_the_mask_in_the_contact_uri,
        names_match_short_by_default,
        keep_fqdn_hostnames_matches_fully_qualified_names_only,
        controller_booted_20_seconds_late_still_forms_the_dvm,
        retries_to_the_controller_back_off_up_to_the_max_delay,
        radix_2_children_heal_past_never_booted_parents_and_the_dvm_forms_when_they_boot,
        radix_3_children_heal_past_a_never_booted_parent_and_the_dvm_forms_when_it_boots,
        a_child_whose_parent_cannot_answer_heals_to_the_next_ancestor,
        connect_max_time_zero_disables_healing,
        connect_max_time_defaults_to_30_seconds,
        a_partitioned_group_joins_once_the_partition_heals,
    ];
    v.push(TestDef {
        name: "formation_survives_delay_loss_and_duplication_on_links",
        run: formation_survives_delay_loss_and_duplication_on_links,
        seeded: true,
    });
    v.push(TestDef {
        name: "dvm_forms_under_a_seeded_random_fault_schedule",
        run: dvm_forms_under_a_seeded_random_fault_schedule,
        seeded: true,
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

/// Checks the status against the expected host of every rank (index = rank), everyone
/// joined through its tree parent at `radix`.
pub(crate) fn membership(s: &Status, by_rank: &[String], radix: u32) -> Verdict {
    check(
        s.expected as usize == by_rank.len() && s.members.len() == by_rank.len(),
        format!("{} daemons expected", by_rank.len()),
        format!(
            "expected {}, members listed {}",
            s.expected,
            s.members.len()
        ),
    )?;
    for (r, host) in by_rank.iter().enumerate() {
        let r = r as u32;
        let m = s
            .member(r)
            .ok_or_else(|| fail(format!("a member of rank {r}"), s.describe()))?;
        check(
            &m.host == host,
            format!("rank {r} is {host} (from the listed order of DVMNodes)"),
            format!("rank {r} is {}\n{}", m.host, s.describe()),
        )?;
        check(
            m.state == MemberState::Joined,
            format!("rank {r} joined"),
            s.describe(),
        )?;
        check(
            m.parent == tree_parent(r, radix),
            format!(
                "rank {r} joined through its radix-{radix} tree parent {:?}",
                tree_parent(r, radix)
            ),
            format!("its parent is {:?}\n{}", m.parent, s.describe()),
        )?;
    }
    Ok(())
}

/// Forms a DVM of `hosts` with `c`, checks its membership against `by_rank`, stops it.
pub(crate) fn form_and_check(
    ctx: &Ctx,
    label: &str,
    hosts: &[String],
    c: &PrteConf,
    by_rank: &[String],
    radix: u32,
) -> Result<Status, Problem> {
    let mut dvm = Dvm::new(ctx, label, hosts, c)?;
    dvm.start_all()?;
    let s = dvm.wait_formed(FORM)?;
    membership(&s, by_rank, radix)?;
    dvm.stop()?;
    Ok(s)
}

/// The nodes of the general tests: the cell's node count.
pub(crate) fn cell_nodes(ctx: &Ctx) -> Vec<String> {
    node_names(ctx.cell.nodes)
}
