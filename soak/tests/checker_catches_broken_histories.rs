//! The checker must fail a history when exactly one of its promises is broken, and only
//! that one: a correct history of a small run passes every property, and each broken
//! variant (a job launched on a departing node, a lost job, a duplicated terminal event,
//! and one for every other property) fails exactly the property it breaks.

use dvmlab_soak::checker::{check, DVM_IS_READY, JOB_END, SOAK_CODE};
use dvmlab_soak::history::{
    Campaign, DaemonWhat, Entry, Expect, Fault, ListenerPhase, Member, Op, Record, NEVER_RETURNED,
};
use serde_json::json;

const S: u64 = 1_000_000;

fn m(rank: u32, host: &str, state: &str) -> Member {
    Member {
        rank,
        host: host.into(),
        state: state.into(),
    }
}

fn rec(t: u64, entry: Entry) -> Record {
    Record { t_us: t, entry }
}

fn job(id: u64, tag: &str, state: &str, status: Option<i32>) -> Entry {
    Entry::Job {
        id,
        tag: Some(tag.into()),
        state: state.into(),
        status,
        exception: None,
        hosts: vec!["n01".into()],
    }
}

fn daemon(host: &str, rank: u32, what: DaemonWhat) -> Entry {
    Entry::Daemon {
        host: host.into(),
        rank,
        what,
    }
}

/// A small run with nothing wrong: a DVM of ctl, n01 and n02 that grows onto s01 with a
/// requester, runs a job on n01, shrinks n02 away, and a notification that both listeners
/// hear.
fn good() -> Vec<Record> {
    let members = vec![
        m(0, "ctl", "joined"),
        m(1, "n01", "joined"),
        m(2, "n02", "joined"),
    ];
    let mut grown = members.clone();
    grown.push(m(3, "s01", "joined"));
    let mut shrunk = grown.clone();
    shrunk[2].state = "departed".into();
    vec![
        rec(
            0,
            Entry::Meta {
                seed: 7,
                backend: "netns".into(),
                controller: "ctl".into(),
                initial: vec!["n01".into(), "n02".into()],
                spares: vec!["s01".into()],
                duration_s: 60,
                runtime_fault: None,
            },
        ),
        rec(1, daemon("n01", 1, DaemonWhat::Started)),
        rec(2, daemon("n01", 1, DaemonWhat::Joined)),
        rec(1, daemon("n02", 2, DaemonWhat::Started)),
        rec(2, daemon("n02", 2, DaemonWhat::Joined)),
        rec(
            S,
            Entry::Status {
                formed: true,
                members: members.clone(),
                campaigns: vec![],
            },
        ),
        rec(
            S + 1,
            Entry::Listener {
                listener: 1,
                host: "n01".into(),
                phase: ListenerPhase::Started,
                line: None,
            },
        ),
        rec(
            S + 2,
            Entry::Listener {
                listener: 1,
                host: "n01".into(),
                phase: ListenerPhase::Ready,
                line: None,
            },
        ),
        rec(
            S + 1,
            Entry::Listener {
                listener: 2,
                host: "n02".into(),
                phase: ListenerPhase::Ready,
                line: None,
            },
        ),
        // The grow, with a requester.
        rec(
            2 * S,
            Entry::Invoke {
                op: 1,
                host: "ctl".into(),
                what: Op::Grow {
                    hosts: vec!["s01".into()],
                    requester: true,
                },
            },
        ),
        rec(
            2 * S + 10,
            Entry::Status {
                formed: false,
                members: grown.clone(),
                campaigns: vec![Campaign {
                    id: 1,
                    kind: "grow".into(),
                    targets: vec![3],
                }],
            },
        ),
        rec(2 * S + 20, daemon("s01", 3, DaemonWhat::Started)),
        rec(2 * S + 30, daemon("s01", 3, DaemonWhat::Joined)),
        rec(
            3 * S,
            Entry::Complete {
                op: 1,
                exit: Some(0),
                out: vec![
                    json!({"phase": "accepted", "changed": true, "alloc_id": "alloc.1"})
                        .to_string(),
                    json!({"phase": "event", "code": DVM_IS_READY, "alloc_id": "alloc.1"})
                        .to_string(),
                ],
                err: vec![],
            },
        ),
        rec(
            3 * S + 1,
            Entry::Status {
                formed: true,
                members: grown.clone(),
                campaigns: vec![],
            },
        ),
        // A job on n01.
        rec(
            8 * S,
            Entry::Invoke {
                op: 2,
                host: "ctl".into(),
                what: Op::Job {
                    tag: "soak-job-2".into(),
                    shape: "true".into(),
                    nprocs: 1,
                    expect: Expect::Exit(0),
                },
            },
        ),
        rec(8 * S + 10, job(1, "soak-job-2", "RUNNING", None)),
        rec(
            8 * S + 5,
            Entry::ProcStart {
                host: "n01".into(),
                rank: 1,
                job: 1,
                proc: 0,
                pid: 100,
            },
        ),
        rec(8 * S + 20, job(1, "soak-job-2", "INACTIVE", Some(0))),
        rec(
            8 * S + 30,
            Entry::Complete {
                op: 2,
                exit: Some(0),
                out: vec![],
                err: vec![],
            },
        ),
        rec(
            8 * S + 40,
            Entry::Listener {
                listener: 1,
                host: "n01".into(),
                phase: ListenerPhase::Event,
                line: Some(json!({"handler": "soak", "code": JOB_END,
                    "info": [{"key": "pmix.evaffected", "value": {"nspace": "dvm@1", "rank": 4294967294u32}}]})),
            },
        ),
        // A notification, heard by both listeners.
        rec(
            5 * S,
            Entry::Invoke {
                op: 3,
                host: "n01".into(),
                what: Op::Notify {
                    range: "GLOBAL".into(),
                    tag: "n3".into(),
                },
            },
        ),
        rec(
            5 * S + 10,
            Entry::Complete {
                op: 3,
                exit: Some(0),
                out: vec![],
                err: vec![],
            },
        ),
        rec(5 * S + 20, heard(1, "n01", "n3")),
        rec(5 * S + 21, heard(2, "n02", "n3")),
        // The shrink of n02, without a requester.
        rec(
            30 * S,
            Entry::Invoke {
                op: 4,
                host: "ctl".into(),
                what: Op::Shrink {
                    hosts: vec!["n02".into()],
                    requester: false,
                },
            },
        ),
        rec(30 * S + 10, daemon("n02", 2, DaemonWhat::Departing)),
        rec(
            31 * S,
            Entry::Complete {
                op: 4,
                exit: Some(0),
                out: vec![
                    json!({"phase": "accepted", "changed": true}).to_string(),
                    json!({"phase": "ended", "ok": true}).to_string(),
                ],
                err: vec![],
            },
        ),
        rec(
            31 * S + 1,
            Entry::Status {
                formed: true,
                members: shrunk.clone(),
                campaigns: vec![],
            },
        ),
        rec(40 * S, Entry::Held { ids: vec![] }),
        rec(
            60 * S,
            Entry::Final {
                formed: true,
                members: shrunk,
                campaigns: vec![],
                unended: vec![],
                held: vec![],
            },
        ),
    ]
}

fn heard(listener: u64, host: &str, tag: &str) -> Entry {
    Entry::Listener {
        listener,
        host: host.into(),
        phase: ListenerPhase::Event,
        line: Some(json!({"handler": "soak", "code": SOAK_CODE,
            "info": [{"key": "soak.tag", "value": tag}]})),
    }
}

/// The properties `h` fails.
fn failing(h: &[Record]) -> Vec<&'static str> {
    check(h)
        .into_iter()
        .filter(|v| !v.violations.is_empty())
        .map(|v| v.property)
        .collect()
}

fn replace(h: &mut [Record], pred: impl Fn(&Entry) -> bool, with: Entry) {
    let r = h.iter_mut().find(|r| pred(&r.entry)).expect("no such line");
    r.entry = with;
}

#[test]
fn a_correct_history_passes_every_property() {
    let h = good();
    let verdicts = check(&h);
    for v in &verdicts {
        assert!(
            v.violations.is_empty(),
            "{}: {:?}",
            v.property,
            v.violations
        );
        assert!(v.checked > 0, "{} checked nothing", v.property);
    }
}

#[test]
fn a_job_launched_on_a_departing_node_is_flagged() {
    let mut h = good();
    // A second job, submitted after the shrink began, whose process starts on n02.
    h.push(rec(
        30 * S + 20,
        Entry::Invoke {
            op: 9,
            host: "ctl".into(),
            what: Op::Job {
                tag: "soak-job-9".into(),
                shape: "true".into(),
                nprocs: 1,
                expect: Expect::Exit(0),
            },
        },
    ));
    h.push(rec(30 * S + 30, job(2, "soak-job-9", "INACTIVE", Some(0))));
    h.push(rec(
        30 * S + 25,
        Entry::ProcStart {
            host: "n02".into(),
            rank: 2,
            job: 2,
            proc: 0,
            pid: 200,
        },
    ));
    h.push(rec(
        30 * S + 40,
        Entry::Complete {
            op: 9,
            exit: Some(0),
            out: vec![],
            err: vec![],
        },
    ));
    assert_eq!(failing(&h), ["starts-on-wired-daemons"]);
}

#[test]
fn a_process_started_before_its_daemon_joined_is_flagged() {
    let mut h = good();
    for r in h.iter_mut() {
        if let Entry::Daemon {
            host,
            what: DaemonWhat::Joined,
            ..
        } = &r.entry
        {
            if host == "n01" {
                r.t_us = 8 * S + 6;
            }
        }
    }
    assert_eq!(failing(&h), ["starts-on-wired-daemons"]);
}

#[test]
fn a_lost_job_is_flagged() {
    let mut h = good();
    replace(
        &mut h,
        |e| matches!(e, Entry::Job { state, .. } if state == "INACTIVE"),
        job(1, "soak-job-2", "RUNNING", None),
    );
    assert_eq!(failing(&h), ["jobs-end-once"]);
}

#[test]
fn a_prun_never_answered_is_flagged_though_a_controller_restart_hid_the_jobs_end() {
    let mut h = good();
    replace(
        &mut h,
        |e| matches!(e, Entry::Job { state, .. } if state == "INACTIVE"),
        job(1, "soak-job-2", "RUNNING", None),
    );
    h.push(rec(
        8 * S + 1,
        Entry::Fault {
            id: 1,
            start: true,
            fault: Fault::ControllerRestart { host: "ctl".into() },
        },
    ));
    assert_eq!(
        failing(&h),
        Vec::<&str>::new(),
        "a job seen running and not seen ending may have ended while the controller restarted"
    );
    replace(
        &mut h,
        |e| matches!(e, Entry::Complete { op: 2, .. }),
        Entry::Complete {
            op: 2,
            exit: None,
            out: vec![],
            err: vec![NEVER_RETURNED.into()],
        },
    );
    assert_eq!(
        failing(&h),
        ["jobs-end-once"],
        "but its prun would have heard"
    );
}

#[test]
fn a_job_that_ended_wrong_with_no_fault_is_flagged_and_with_a_fault_is_not() {
    let mut h = good();
    replace(
        &mut h,
        |e| matches!(e, Entry::Complete { op: 2, .. }),
        Entry::Complete {
            op: 2,
            exit: Some(1),
            out: vec![],
            err: vec![],
        },
    );
    replace(
        &mut h,
        |e| matches!(e, Entry::Job { state, .. } if state == "INACTIVE"),
        job(1, "soak-job-2", "INACTIVE", Some(256)),
    );
    assert_eq!(failing(&h), ["jobs-end-once"]);
    h.push(rec(
        8 * S + 1,
        Entry::Fault {
            id: 1,
            start: true,
            fault: Fault::Kill {
                host: "n01".into(),
                late: false,
            },
        },
    ));
    assert_eq!(failing(&h), Vec::<&str>::new(), "a fault explains it");
}

#[test]
fn prun_and_the_dvm_disagreeing_on_a_status_is_flagged() {
    let mut h = good();
    replace(
        &mut h,
        |e| matches!(e, Entry::Job { state, .. } if state == "INACTIVE"),
        job(1, "soak-job-2", "INACTIVE", Some(5 << 8)),
    );
    assert_eq!(failing(&h), ["jobs-end-once"]);
}

#[test]
fn a_duplicated_terminal_event_is_flagged() {
    let mut h = good();
    let ev = json!({"phase": "event", "code": DVM_IS_READY, "alloc_id": "alloc.1"}).to_string();
    replace(
        &mut h,
        |e| matches!(e, Entry::Complete { op: 1, .. }),
        Entry::Complete {
            op: 1,
            exit: Some(0),
            out: vec![
                json!({"phase": "accepted", "changed": true}).to_string(),
                ev.clone(),
                ev,
            ],
            err: vec![],
        },
    );
    assert_eq!(failing(&h), ["one-terminal-event"]);
}

#[test]
fn a_missing_terminal_event_and_one_for_a_rejection_are_flagged() {
    let mut h = good();
    replace(
        &mut h,
        |e| matches!(e, Entry::Complete { op: 1, .. }),
        Entry::Complete {
            op: 1,
            exit: Some(1),
            out: vec![json!({"phase": "accepted", "changed": true}).to_string()],
            err: vec![],
        },
    );
    // The grow's outcome is unknown to the history now, so s01 may be either.
    assert_eq!(failing(&h), ["one-terminal-event"]);
    let mut h = good();
    replace(
        &mut h,
        |e| matches!(e, Entry::Complete { op: 1, .. }),
        Entry::Complete {
            op: 1,
            exit: Some(1),
            out: vec![
                json!({"phase": "rejected", "error": "no"}).to_string(),
                json!({"phase": "event", "code": DVM_IS_READY}).to_string(),
            ],
            err: vec![],
        },
    );
    assert!(failing(&h).contains(&"one-terminal-event"));
}

#[test]
fn a_process_started_twice_is_flagged() {
    let mut h = good();
    h.push(rec(
        8 * S + 7,
        Entry::ProcStart {
            host: "n01".into(),
            rank: 1,
            job: 1,
            proc: 0,
            pid: 101,
        },
    ));
    assert_eq!(failing(&h), ["no-job-runs-twice"]);
}

#[test]
fn a_job_id_given_to_two_jobs_is_flagged() {
    let mut h = good();
    h.push(rec(50 * S, job(1, "soak-job-77", "INACTIVE", Some(0))));
    let f = failing(&h);
    assert!(f.contains(&"job-ids-unique"), "{f:?}");
}

#[test]
fn a_job_parked_with_no_campaign_is_flagged() {
    let mut h = good();
    h.push(rec(35 * S, Entry::Held { ids: vec![1] }));
    h.push(rec(
        36 * S,
        Entry::Status {
            formed: true,
            members: vec![],
            campaigns: vec![],
        },
    ));
    h.push(rec(
        37 * S,
        Entry::Status {
            formed: true,
            members: vec![],
            campaigns: vec![],
        },
    ));
    h.sort_by_key(|r| r.t_us);
    assert_eq!(failing(&h), ["no-parked-job"]);
    let mut h = good();
    if let Some(Entry::Final { held, .. }) = h.last_mut().map(|r| &mut r.entry) {
        held.push(1);
    }
    assert_eq!(failing(&h), ["no-parked-job"]);
}

#[test]
fn a_leftover_job_process_is_flagged() {
    let mut h = good();
    h.push(rec(
        61 * S,
        Entry::Leftover {
            pid: 4242,
            job: Some(1),
            cmdline: "sleep 60".into(),
        },
    ));
    assert_eq!(failing(&h), ["no-leftover-process"]);
}

#[test]
fn a_final_membership_other_than_the_history_says_is_flagged() {
    for (host, state) in [("n02", "joined"), ("s01", "departed"), ("n01", "lost")] {
        let mut h = good();
        if let Some(Entry::Final { members, .. }) = h.last_mut().map(|r| &mut r.entry) {
            for m in members.iter_mut().filter(|m| m.host == host) {
                m.state = state.into();
            }
        }
        assert_eq!(failing(&h), ["final-membership"], "{host} {state}");
    }
    let mut h = good();
    if let Some(Entry::Final { formed, .. }) = h.last_mut().map(|r| &mut r.entry) {
        *formed = false;
    }
    assert_eq!(failing(&h), ["final-membership"]);
}

#[test]
fn an_event_outside_its_range_twice_or_missing_is_flagged() {
    let mut h = good();
    replace(
        &mut h,
        |e| matches!(e, Entry::Invoke { op: 3, .. }),
        Entry::Invoke {
            op: 3,
            host: "n01".into(),
            what: Op::Notify {
                range: "LOCAL".into(),
                tag: "n3".into(),
            },
        },
    );
    assert_eq!(
        failing(&h),
        ["event-ranges"],
        "n02 heard a LOCAL event of n01"
    );
    let mut h = good();
    h.push(rec(5 * S + 30, heard(1, "n01", "n3")));
    assert_eq!(failing(&h), ["event-ranges"], "heard twice");
    let mut h = good();
    h.retain(|r| r.entry != heard(2, "n02", "n3"));
    assert_eq!(failing(&h), ["event-ranges"], "a quiet listener missed it");
    h.push(rec(
        5 * S + 1,
        Entry::Fault {
            id: 1,
            start: true,
            fault: Fault::Freeze { host: "n02".into() },
        },
    ));
    assert_eq!(failing(&h), Vec::<&str>::new(), "not quiet: not required");
}
