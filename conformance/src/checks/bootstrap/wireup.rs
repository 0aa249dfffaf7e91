//! Wireup under races and faults: late controllers, retry with backoff, healing past missing
//! parents, partitions, bad links, and seeded random fault schedules.

use std::time::{Duration, Instant};

use dvmlab_harness::schedule::{Schedule, ScheduleSpec};
use dvmlab_harness::{Direction, Impairment};

use super::{
    cell_nodes, conf, formed_with, joined_now, links_match, tree_is, wait_joined, with_ctl, FORM,
};
use crate::outcome::{check, fail, OrUnresolved, Problem, Verdict};
use crate::status::tree_parent;
use crate::sut::{node_names, Ctx, Dvm};

pub fn controller_booted_20_seconds_late_still_forms_the_dvm(ctx: &Ctx) -> Verdict {
    let nodes = node_names(4);
    let hosts = with_ctl(&nodes);
    let mut dvm = Dvm::new(ctx, "late-ctl", &hosts, &conf(ctx, &nodes))?;
    dvm.start_many(&nodes)?;
    let since = Instant::now();
    ctx.note("started every daemon but the controller");
    // The lateness is the test's premise, not a guess at how long something takes.
    while since.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(500));
        for h in &nodes {
            check(
                dvm.cluster.is_running(h),
                format!("the daemon on {h} keeps retrying while the controller is absent"),
                format!("it exited after {:?}", since.elapsed()),
            )?;
        }
    }
    dvm.start("ctl")?;
    ctx.note("started the controller 20 s late");
    let s = dvm.wait_formed(FORM)?;
    formed_with(&dvm, &s, &hosts)?;
    dvm.stop()
}

pub fn retries_to_the_controller_back_off_up_to_the_max_delay(ctx: &Ctx) -> Verdict {
    ctx.need_own_networks("counting connection attempts at the switch")?;
    let nodes = node_names(2);
    let hosts = with_ctl(&nodes);
    let base = conf(ctx, &nodes);
    let mut dvm = Dvm::new(ctx, "backoff", &hosts, &base)?;
    let port = dvm.port;
    // n01 keeps the default cap (5 s); n02 is capped at 1 s.
    dvm.cluster
        .set_host_conf("n02", &base.clone().set("DVMRetryMaxDelay", 1).render())
        .or_unresolved("writing n02's prte.conf")?;
    for h in &nodes {
        dvm.cluster
            .watch_connects(h, "ctl", port)
            .or_unresolved("counting connects")?;
    }
    let t0 = Instant::now();
    dvm.start_many(&nodes)?;
    // When each attempt was seen, to 100 ms: the counters are sampled over 32 s.
    let mut attempts: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut seen = [0u64; 2];
    while t0.elapsed() < Duration::from_secs(32) {
        for (i, h) in nodes.iter().enumerate() {
            let n = dvm
                .cluster
                .connects_seen(h, "ctl", port)
                .or_unresolved("reading connect counts")?;
            for _ in seen[i]..n {
                attempts[i].push(t0.elapsed());
            }
            seen[i] = n;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let gaps = |v: &[Duration]| -> Vec<f64> {
        v.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect()
    };
    let show = |v: &[Duration]| {
        v.iter()
            .map(|d| format!("{:.1}", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(" ")
    };
    ctx.note(format!(
        "n01 (default cap) attempts at s: {}",
        show(&attempts[0])
    ));
    ctx.note(format!(
        "n02 (cap 1 s) attempts at s: {}",
        show(&attempts[1])
    ));
    // Aspects: `backoff` (n02, capped at 1 s: frequent at first, then every second) and
    // `default_cap` (n01, no DVMRetryMaxDelay: then every 5 s).
    for (i, (aspect, h, cap)) in [("default_cap", "n01", 5.0), ("backoff", "n02", 1.0)]
        .into_iter()
        .enumerate()
    {
        let a = &attempts[i];
        let judged = (|| {
            let early = a.iter().filter(|t| **t < Duration::from_secs(2)).count();
            check(
                early >= 3,
                format!("{h} retries frequently at first (at least 3 attempts in its first 2 s)"),
                format!("{early} attempts: {}", show(a)),
            )?;
            let first = gaps(a).into_iter().next().unwrap_or(f64::MAX);
            check(
                first < 0.5,
                format!("{h}'s first retry comes quickly (well under a second)"),
                format!("first gap {first} s"),
            )?;
            // Once backed off (after 15 s), attempts come at the cap: never much slower,
            // and not much faster either.
            let late: Vec<Duration> = a
                .iter()
                .copied()
                .filter(|t| *t >= Duration::from_secs(15))
                .collect();
            let g = gaps(&late);
            let (lo, hi) = (cap * 0.6, cap * 1.3 + 0.4);
            check(
                late.len() >= 2 && g.iter().all(|x| (lo..=hi).contains(x)),
                format!(
                    "{h} retries every {cap} s once backed off (gaps between {lo:.1} and {hi:.1} s after 15 s)"
                ),
                format!("gaps {g:?}; attempts at {}", show(a)),
            )
        })();
        ctx.aspect(aspect, judged);
    }
    dvm.start("ctl")?;
    let s = dvm.wait_formed(FORM)?;
    formed_with(&dvm, &s, &hosts)?;
    dvm.stop()
}

/// The nearest ancestor of `r` that booted, at `radix`.
fn nearest_booted(r: u32, radix: u32, missing: &[u32]) -> Option<u32> {
    let mut p = tree_parent(r, radix);
    while let Some(q) = p {
        if !missing.contains(&q) {
            return Some(q);
        }
        p = tree_parent(q, radix);
    }
    None
}

/// Boots everything but the ranks in `missing` (which must be interior), checks every booted
/// daemon joined through its nearest booted ancestor and the DVM is not formed, then boots
/// the missing ones and checks it forms.
fn heal_past(ctx: &Ctx, radix: u32, n: usize, missing: &[u32]) -> Verdict {
    ctx.need_feature("healing", ctx.profile.features.healing)?;
    let nodes = node_names(n);
    let hosts = with_ctl(&nodes);
    let c = conf(ctx, &nodes)
        .set("DVMRadix", radix)
        .set("DVMConnectMaxTime", 1);
    let mut dvm = Dvm::new(ctx, &format!("heal-r{radix}"), &hosts, &c)?;
    let absent: Vec<String> = missing.iter().map(|&r| hosts[r as usize].clone()).collect();
    let booted: Vec<String> = hosts
        .iter()
        .filter(|h| !absent.contains(h))
        .cloned()
        .collect();
    dvm.start_many(&booted)?;
    ctx.note(format!("never booted (for now): {absent:?}"));
    let orphans: Vec<u32> = (1..=n as u32)
        .filter(|r| {
            !missing.contains(r) && tree_parent(*r, radix).is_some_and(|p| missing.contains(&p))
        })
        .collect();
    if orphans.is_empty() {
        return Err(Problem::Unresolved(
            "the missing ranks have no children".into(),
        ));
    }
    // Aspect `heal`: every booted daemon joined through its nearest booted ancestor (the
    // network shows the links; a status that reports states must say joined).
    let booted_ranks: Vec<u32> = (1..=n as u32).filter(|r| !missing.contains(r)).collect();
    let booted_hosts: Vec<String> = booted_ranks
        .iter()
        .map(|r| hosts[*r as usize].clone())
        .collect();
    let parent_of = |r: u32| nearest_booted(r, radix, missing);
    let healed = wait_joined(
        &dvm,
        &booted_hosts,
        &format!(
            "every booted daemon joined through its nearest booted ancestor (orphans {orphans:?} healed past {missing:?})"
        ),
    )
    .and_then(|_| {
        dvm.wait_status(FORM, "the booted daemons connected up to their nearest booted ancestors", |_| {
            dvm.observe()
                .is_ok_and(|l| links_match(&hosts, &l, &booted_ranks, &parent_of).is_ok())
        })
    })
    .and_then(|s| tree_is(&dvm, &s, &hosts, &booted_ranks, &parent_of));
    ctx.aspect("heal", healed);
    // Aspect `not_formed`: meanwhile the DVM is not reported formed.
    ctx.aspect(
        "not_formed",
        dvm.status_now("a status").and_then(|s| {
            check(
                !s.formed,
                "not formed while DVMNodes members are missing",
                s.describe(),
            )
        }),
    );
    for r in missing.iter().rev() {
        dvm.start(&hosts[*r as usize])?;
    }
    ctx.note("booted the missing daemons");
    let s = dvm.wait_formed(FORM)?;
    formed_with(&dvm, &s, &hosts)?;
    dvm.stop()
}

pub fn radix_2_children_heal_past_never_booted_parents_and_the_dvm_forms_when_they_boot(
    ctx: &Ctx,
) -> Verdict {
    // Rank 7's parent (3) and grandparent (1) are both missing: it climbs two levels.
    heal_past(ctx, 2, 14, &[1, 3])
}

pub fn radix_3_children_heal_past_a_never_booted_parent_and_the_dvm_forms_when_it_boots(
    ctx: &Ctx,
) -> Verdict {
    heal_past(ctx, 3, 14, &[1])
}

pub fn a_child_whose_parent_cannot_answer_heals_to_the_next_ancestor(ctx: &Ctx) -> Verdict {
    ctx.need_own_networks("a one-way partition")?;
    ctx.need_feature("healing", ctx.profile.features.healing)?;
    let nodes = node_names(6);
    let hosts = with_ctl(&nodes);
    let c = conf(ctx, &nodes)
        .set("DVMRadix", 2)
        .set("DVMConnectMaxTime", 1);
    let mut dvm = Dvm::new(ctx, "oneway", &hosts, &c)?;
    // n03 (rank 3) reaches its parent n01, but nothing n01 sends reaches n03.
    dvm.cluster
        .partition(&["n01"], &["n03"], Direction::OneWay)
        .or_unresolved("one-way partition n01 -> n03")?;
    ctx.note("partitioned n01 -x> n03 (one way) before boot");
    dvm.start_all()?;
    let s = dvm.wait_formed(FORM)?;
    formed_with(&dvm, &s, &hosts)?;
    // Rank 3 healed past its unanswering parent to the controller.
    tree_is(&dvm, &s, &hosts, &[3], &|_| Some(0))?;
    dvm.stop()
}

pub fn connect_max_time_zero_disables_healing(ctx: &Ctx) -> Verdict {
    let nodes = node_names(6);
    let hosts = with_ctl(&nodes);
    let c = conf(ctx, &nodes)
        .set("DVMRadix", 2)
        .set("DVMConnectMaxTime", 0);
    let mut dvm = Dvm::new(ctx, "noheal", &hosts, &c)?;
    let booted: Vec<String> = hosts.iter().filter(|h| *h != "n01").cloned().collect();
    dvm.start_many(&booted)?;
    let host = |r: usize| hosts[r].clone();
    wait_joined(&dvm, &[host(2), host(4), host(6)], "ranks 2, 4, 6 joined")?;
    // Longer than the 30 s default, so a 0 read as "use the default" shows.
    let waiting = [host(3), host(5)];
    dvm.holds_for(
        Duration::from_secs(36),
        "ranks 3 and 5 keep waiting for their parent 1 (DVMConnectMaxTime=0: no healing)",
        |s| {
            dvm.observe()
                .is_ok_and(|l| waiting.iter().all(|h| !joined_now(&dvm, s, &l, h)))
        },
    )?;
    dvm.start("n01")?;
    let s = dvm.wait_formed(FORM)?;
    formed_with(&dvm, &s, &hosts)?;
    dvm.stop()
}

pub fn connect_max_time_defaults_to_30_seconds(ctx: &Ctx) -> Verdict {
    ctx.need_feature("healing", ctx.profile.features.healing)?;
    let nodes = node_names(4);
    let hosts = with_ctl(&nodes);
    let c = conf(ctx, &nodes).set("DVMRadix", 2);
    let mut dvm = Dvm::new(ctx, "heal-default", &hosts, &c)?;
    let booted: Vec<String> = hosts.iter().filter(|h| *h != "n01").cloned().collect();
    let t0 = Instant::now();
    dvm.start_many(&booted)?;
    let n03 = hosts[3].clone();
    // The window starts once the controller answers (the booted ranks joined).
    wait_joined(
        &dvm,
        &[hosts[2].clone(), hosts[4].clone()],
        "ranks 2 and 4 joined",
    )?;
    dvm.holds_for(
        Duration::from_secs(20),
        "rank 3 does not heal past its missing parent 1 within 20 s (default 30 s)",
        |s| dvm.observe().is_ok_and(|l| !joined_now(&dvm, s, &l, &n03)),
    )?;
    let s = dvm.wait_status(
        Duration::from_secs(25),
        "rank 3 healed to the controller by about 30 s after it booted",
        |s| {
            dvm.observe().is_ok_and(|l| {
                joined_now(&dvm, s, &l, &n03) && links_match(&hosts, &l, &[3], &|_| Some(0)).is_ok()
            })
        },
    )?;
    tree_is(&dvm, &s, &hosts, &[3], &|_| Some(0))?;
    // When the network first showed n03's link to the controller, from its boot.
    let healed = dvm
        .first_seen(&n03, "ctl")
        .map(|at| (dvm.built_at() + at).saturating_duration_since(t0))
        .unwrap_or_else(|| t0.elapsed());
    ctx.note(format!(
        "rank 3 connected up to the controller {healed:?} after boot"
    ));
    check(
        healed >= Duration::from_secs(25),
        "healing no earlier than about DVMConnectMaxTime (30 s)",
        format!("healed after {healed:?}\n{}", s.describe()),
    )?;
    dvm.start("n01")?;
    dvm.wait_formed(FORM)?;
    dvm.stop()
}

pub fn a_partitioned_group_joins_once_the_partition_heals(ctx: &Ctx) -> Verdict {
    ctx.need_own_networks("a partition")?;
    let nodes = cell_nodes(ctx);
    if nodes.len() < 2 {
        return Err(Problem::Unresolved("needs at least 2 nodes".into()));
    }
    let hosts = with_ctl(&nodes);
    let c = conf(ctx, &nodes).set("DVMConnectMaxTime", 1);
    let mut dvm = Dvm::new(ctx, "partitioned", &hosts, &c)?;
    let (rest, cut) = hosts.split_at(hosts.len() - nodes.len() / 2);
    let p = dvm
        .cluster
        .partition(cut, rest, Direction::Both)
        .or_unresolved("partitioning")?;
    ctx.note(format!(
        "partitioned {cut:?} from {rest:?} (both ways) before boot"
    ));
    dvm.start_all()?;
    wait_joined(&dvm, &rest[1..], "everyone outside the cut joined")?;
    dvm.holds_for(
        Duration::from_secs(2),
        "not formed while hosts are cut off",
        |s| !s.formed,
    )?;
    dvm.cluster.heal(p).or_unresolved("healing the partition")?;
    ctx.note("healed the partition");
    let s = dvm.wait_formed(FORM)?;
    formed_with(&dvm, &s, &hosts)?;
    dvm.stop()
}

pub fn formation_survives_delay_loss_and_duplication_on_links(ctx: &Ctx) -> Verdict {
    ctx.need_netns("impaired links")?;
    let nodes = cell_nodes(ctx);
    let hosts = with_ctl(&nodes);
    let mut dvm = Dvm::new(ctx, "badlinks", &hosts, &conf(ctx, &nodes))?;
    let ms = Duration::from_millis;
    let plan = [
        (hosts[0].clone(), Impairment::delay(ms(40))),
        (
            hosts[1].clone(),
            Impairment {
                delay: ms(5),
                jitter: ms(3),
                loss: 0.05,
                duplicate: 0.05,
                seed: ctx.seed,
            },
        ),
    ];
    for (h, imp) in &plan {
        dvm.cluster
            .impair(h, *imp)
            .or_unresolved(&format!("impairing {h}'s link"))?;
        ctx.note(format!("{h}'s link: {imp:?}"));
    }
    dvm.start_all()?;
    let s = dvm.wait_formed(Duration::from_secs(60))?;
    formed_with(&dvm, &s, &hosts)?;
    for (h, _) in &plan {
        if let Some((fwd, dropped, dup)) = dvm.cluster.impairment_stats(h) {
            ctx.note(format!(
                "{h}: {fwd} frames forwarded, {dropped} dropped, {dup} duplicated"
            ));
        }
    }
    dvm.stop()
}

pub fn dvm_forms_under_a_seeded_random_fault_schedule(ctx: &Ctx) -> Verdict {
    ctx.need_own_networks("network faults")?;
    let nodes = cell_nodes(ctx);
    let hosts = with_ctl(&nodes);
    let c = conf(ctx, &nodes).set("DVMConnectMaxTime", 1);
    let mut dvm = Dvm::new(ctx, "schedule", &hosts, &c)?;
    let schedule = Schedule::generate(
        ctx.seed,
        &ScheduleSpec {
            hosts: hosts.clone(),
            boot_window: Duration::from_secs(3),
            freezable: nodes.clone(),
            partitions: true,
            // Impaired links need the netns backend; elsewhere the schedule draws none.
            impair: ctx.cell.backend == dvmlab_harness::BackendKind::Netns,
        },
    );
    ctx.note(schedule.to_string());
    let mut log = Vec::new();
    let r = schedule.run(&mut dvm.cluster, |l| log.push(l.to_string()));
    ctx.note("carried out:");
    for l in log {
        ctx.note(l);
    }
    r.map_err(Problem::Unresolved)?;
    let s = dvm
        .wait_formed(Duration::from_secs(60))
        .map_err(|p| match p {
            Problem::Fail { expected, observed } => fail(
                format!("{expected} after the fault schedule of seed {}", ctx.seed),
                observed,
            ),
            other => other,
        })?;
    formed_with(&dvm, &s, &hosts)?;
    dvm.stop()
}
