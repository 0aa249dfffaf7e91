//! The observer: reads the DVM's status and jobs through `pctl` twice a second and records
//! every change (membership, campaigns, each job's state, the held jobs), and keeps the
//! workload's and nemesis's picture of the DVM current.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;

use crate::driver::Ctx;
use crate::history::{Campaign, Entry, Member};

/// The held state's name in `pctl jobs --json` (PRRTE's state 17).
pub const HELD: &str = "WAITING FOR DAEMON CAMPAIGN";

pub fn members_of(s: &Value) -> Vec<Member> {
    s["members"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| Member {
                    rank: m["rank"].as_u64().unwrap_or(0) as u32,
                    host: m["host"].as_str().unwrap_or("").to_string(),
                    state: m["state"].as_str().unwrap_or("").to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

pub fn campaigns_of(s: &Value) -> Vec<Campaign> {
    s["campaigns"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| Campaign {
                    id: c["id"].as_u64().unwrap_or(0),
                    kind: c["kind"].as_str().unwrap_or("").to_string(),
                    targets: c["targets"]
                        .as_array()
                        .map(|t| {
                            t.iter()
                                .filter_map(|x| x.as_u64())
                                .map(|x| x as u32)
                                .collect()
                        })
                        .unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A job's tag: the `$0` the soak gave its `sh -c`.
pub fn tag_of(job: &Value) -> Option<String> {
    let argv = job["argv"].as_array()?;
    argv.iter()
        .filter_map(|a| a.as_str())
        .find(|a| a.starts_with("soak-job-"))
        .map(str::to_string)
}

fn job_entry(j: &Value) -> Entry {
    let mut hosts: BTreeSet<String> = BTreeSet::new();
    if let Some(p) = j["placement"].as_array() {
        hosts.extend(
            p.iter()
                .filter_map(|x| x["host"].as_str())
                .map(str::to_string),
        );
    }
    Entry::Job {
        id: j["id"].as_u64().unwrap_or(0),
        tag: tag_of(j),
        state: j["state"].as_str().unwrap_or("").to_string(),
        status: j["status"].as_i64().map(|s| s as i32),
        exception: j["exception"].as_str().map(str::to_string),
        hosts: hosts.into_iter().collect(),
    }
}

/// Observes until `stop` is set.
pub fn run(ctx: &Ctx, stop: &AtomicBool) {
    let mut last_status: Option<(bool, Vec<Member>, Vec<Campaign>)> = None;
    let mut last_jobs: BTreeMap<u64, Entry> = BTreeMap::new();
    let mut last_held: Option<Vec<u64>> = None;
    // One more read after the stop, so that what the final heal waited for is recorded.
    let mut last_round = false;
    while !last_round {
        last_round = stop.load(Ordering::Relaxed);
        if let Some(s) = ctx.status() {
            let now = (s["formed"] == true, members_of(&s), campaigns_of(&s));
            if last_status.as_ref() != Some(&now) {
                ctx.hist.record(Entry::Status {
                    formed: now.0,
                    members: now.1.clone(),
                    campaigns: now.2.clone(),
                });
                if let Ok(mut w) = ctx.world.lock() {
                    let mut live: BTreeMap<&str, &str> = BTreeMap::new();
                    for m in &now.1 {
                        if m.state != "departed" {
                            live.insert(&m.host, &m.state);
                        }
                    }
                    w.joined = live
                        .iter()
                        .filter(|(h, st)| **st == "joined" && **h != ctx.ctl)
                        .map(|(h, _)| h.to_string())
                        .collect();
                }
                last_status = Some(now);
            }
        }
        if let Some(jobs) = ctx.jobs() {
            let mut held = Vec::new();
            let busy_hosts: BTreeSet<String> = jobs
                .iter()
                .filter(|j| j["state"] != "INACTIVE")
                .flat_map(|j| {
                    j["placement"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|p| p["host"].as_str().map(str::to_string))
                })
                .collect();
            if let Ok(mut w) = ctx.world.lock() {
                w.running_on = busy_hosts;
            }
            for j in &jobs {
                let e = job_entry(j);
                let Entry::Job { id, tag, state, .. } = &e else {
                    continue;
                };
                if state == HELD {
                    held.push(*id);
                }
                if let (Some(t), Ok(mut w)) = (tag, ctx.world.lock()) {
                    w.jobs.insert(t.clone(), (*id, state.clone()));
                }
                if last_jobs.get(id) != Some(&e) {
                    last_jobs.insert(*id, e.clone());
                    ctx.hist.record(e);
                }
            }
            if last_held.as_ref() != Some(&held) {
                ctx.hist.record(Entry::Held { ids: held.clone() });
                last_held = Some(held);
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
