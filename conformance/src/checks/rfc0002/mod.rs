//! Tests of PMIx RFC 0002, event notification (`catalog/pmix-rfc0002.toml` maps them to its
//! items). Listeners and notifications go through the profile's `[events]` commands only;
//! everything is judged from the JSON lines the listeners print.

use std::time::Duration;

use dvmlab_harness::PrteConf;
use serde_json::{json, Value};

use crate::checks::{tests, TestDef};
use crate::listeners::Line;
use crate::outcome::{check, fail, OrUnresolved, Problem, Verdict};
use crate::sut::{node_names, Ctx, Dvm};

const FORM: Duration = Duration::from_secs(30);
const READY: Duration = Duration::from_secs(15);

pub(crate) fn tests() -> Vec<TestDef> {
    tests![
        a_chain_runs_in_the_rfcs_order_and_each_handler_sees_every_earlier_result
            => ["specific_first", "fifo", "prepend", "results", "complete_stops", "waits", "info"],
        every_range_reaches_exactly_whom_it_names
            => ["local", "session", "global", "rm", "custom", "proc_local"],
        a_job_event_waits_on_its_node_for_processes_that_register_later,
        a_namespace_event_reaches_its_job_and_nobody_else => ["others", "source"],
        a_handler_that_deregistered_itself_is_not_called_again,
        a_default_handler_is_called_for_a_code_it_never_named,
        a_lost_node_is_an_environment_event_and_its_own_clients_hear_their_daemon_is_gone
            => ["environment", "job_only", "lost_server", "never_transmitted", "ring", "eviction", "rm_source"],
    ]
}

/// Where an events test runs: a formed DVM of `ctl` and `n` nodes (its conf given `extra`
/// keys), or, for a profile whose events are served by a server of their own, that
/// server's one host, if the test can be judged on `min` = 1 node.
fn site<'a>(
    ctx: &'a Ctx,
    label: &str,
    n: usize,
    min: usize,
    extra: &[(String, String)],
) -> Result<(Dvm<'a>, Vec<String>), Problem> {
    let Some(events) = &ctx.profile.events else {
        return Err(Problem::Unsupported(
            "the profile has no [events] section (how to listen and notify)".into(),
        ));
    };
    if events.server.is_some() {
        if min > 1 {
            return Err(Problem::Unsupported(format!(
                "needs {min} nodes, and the profile's events are served on one host ([events] server)"
            )));
        }
        return Ok((Dvm::events_server(ctx, label)?, vec!["n01".to_string()]));
    }
    let nodes = node_names(n);
    let mut hosts = vec!["ctl".to_string()];
    hosts.extend(nodes.iter().cloned());
    let mut conf = PrteConf::new()
        .set("DVMNodes", nodes.join(","))
        .set("DVMControllerHost", "ctl")
        .set("DVMRadix", ctx.cell.radix)
        .set("DVMIPVersion", ctx.cell.ip);
    for (k, v) in extra {
        conf = conf.set(k, v);
    }
    let mut dvm = Dvm::new(ctx, label, &hosts, &conf)?;
    dvm.start_all()?;
    dvm.wait_formed(FORM)?;
    Ok((dvm, nodes))
}

fn handler(name: &str, codes: &[i32]) -> Value {
    json!({"name": name, "codes": codes})
}

fn calls(lines: &[Line]) -> Vec<&Line> {
    lines.iter().filter(|l| l.is_call()).collect()
}

fn show(lines: &[Line]) -> String {
    lines
        .iter()
        .map(|l| format!("{:?} {}", l.proc, l.json))
        .collect::<Vec<_>>()
        .join("\n")
}

/// One listener with handlers of every class, registered out of service order: a
/// default (d1), a group (g1), two for the code (s1, which completes late with a result,
/// and s2), one prepended for the code (p1), a default that completes the event (d2) and
/// one after it (d3). One event of the code: the calls, in order, judge the aspects.
pub fn a_chain_runs_in_the_rfcs_order_and_each_handler_sees_every_earlier_result(
    ctx: &Ctx,
) -> Verdict {
    let (dvm, nodes) = site(ctx, "chain", 1, 1, &[])?;
    let code = -3101;
    let chain = json!([
        handler("d1", &[]),
        handler("g1", &[code, code - 1]),
        {"name": "s1", "codes": [code], "status": "PARTIAL_ACTION_TAKEN",
         "results": [{"key": "s1.did", "value": 1}], "delay_ms": 300},
        handler("s2", &[code]),
        {"name": "p1", "codes": [code], "prepend": true},
        {"name": "d2", "status": "ACTION_COMPLETE"},
        handler("d3", &[]),
    ]);
    let l = dvm.listen(&nodes[0], "chain", &chain, 6)?;
    l.wait_ready(1, READY)?;
    dvm.notify(&nodes[0], code, "LOCAL", &[], &[("x", "7")])?;
    let lines = l.finish(Duration::from_secs(30))?;
    let c = calls(&lines);
    let order: Vec<&str> = c.iter().map(|l| l.handler()).collect();
    let pos = |n: &str| order.iter().position(|h| *h == n);
    let seen = format!("calls in order {order:?}\n{}", show(&lines));
    let before = |a: &str, b: &str| pos(a).zip(pos(b)).is_some_and(|(x, y)| x < y);
    // Each aspect is judged on what was called, in the order it was, so that one broken
    // rule does not fail the others: a library serving its classes last-in-first-out fails
    // fifo, not results or waits.
    let class = |h: &str| match h {
        "p1" | "s1" | "s2" => 0,
        "g1" => 1,
        _ => 2,
    };
    let classes: Vec<i32> = order.iter().map(|h| class(h)).collect();
    ctx.aspect(
        "specific_first",
        check(
            classes.windows(2).all(|w| w[0] <= w[1]) && (0..3).all(|k| classes.contains(&k)),
            "handlers for the code, then for a group containing it, then defaults",
            seen.clone(),
        ),
    );
    ctx.aspect(
        "fifo",
        check(
            before("s1", "s2"),
            "first come first served within a class (s1, registered before s2, called before it)",
            seen.clone(),
        ),
    );
    ctx.aspect(
        "prepend",
        check(
            order.first() == Some(&"p1"),
            "a handler registered with prepend first in its class (p1 first of all)",
            seen.clone(),
        ),
    );
    ctx.aspect(
        "complete_stops",
        check(
            order.last() == Some(&"d2") && (pos("d1").is_none() || pos("d3").is_none()),
            "ACTION_COMPLETE (d2) ends the chain: no handler after it, though another default remained",
            seen.clone(),
        ),
    );
    // What each handler returned, and so what later ones must be shown.
    let entry = |name: &str| {
        let (status, extra) = match name {
            "s1" => (-332, vec![json!({"key": "s1.did", "value": 1})]),
            "d2" => (-334, vec![]),
            _ => (-331, vec![]),
        };
        let mut inner = vec![json!({"key": name, "value": status})];
        inner.extend(extra);
        json!({"key": name, "value": inner})
    };
    let wrong: Vec<String> = c
        .iter()
        .enumerate()
        .filter_map(|(k, l)| {
            let want = Value::Array(order[..k].iter().map(|n| entry(n)).collect());
            (l.json["results"] != want).then(|| {
                format!(
                    "{} was given {} instead of {want}",
                    l.handler(),
                    l.json["results"]
                )
            })
        })
        .collect();
    ctx.aspect(
        "results",
        check(
            !c.is_empty() && wrong.is_empty(),
            "each handler is given one results entry per earlier handler, in order, keyed by its name, holding the status it returned and then its results",
            format!("{}\n{seen}", wrong.join("\n")),
        ),
    );
    let after_s1 = pos("s1").and_then(|i| c.get(i + 1));
    ctx.aspect(
        "waits",
        check(
            after_s1.is_some_and(|l| l.json["results"].to_string().contains("s1.did")),
            "the chain waits for a handler that completes later (s1, after 300 ms): the next one is given its result",
            seen.clone(),
        ),
    );
    let x7 = json!({"key": "x", "value": 7});
    ctx.aspect(
        "info",
        check(
            !c.is_empty()
                && c.iter().all(|l| {
                    l.json["code"] == code
                        && l.json["info"].as_array().is_some_and(|i| i.contains(&x7))
                }),
            "every handler is given the event's code and the info it was notified with",
            seen,
        ),
    );
    Ok(())
}

/// Tools listening on two nodes and a job with a listener on each, then a tool on the first
/// node notifies one event per range; who hears which judges each range's aspect. On a
/// profile that serves events on one host, everything is on that host.
pub fn every_range_reaches_exactly_whom_it_names(ctx: &Ctx) -> Verdict {
    let (dvm, nodes) = site(ctx, "ranges", 2, 1, &[])?;
    let (first, last) = (&nodes[0], &nodes[nodes.len() - 1]);
    // Registered for the codes themselves: whether a default handler hears everything is
    // an item of its own.
    let all = json!([handler("all", &[-3201, -3202, -3203, -3204, -3205, -3206])]);
    let tool1 = dvm.listen(first, "tool1", &all, 8)?;
    let tool2 = dvm.listen(last, "tool2", &all, 8)?;
    tool1.wait_ready(1, READY)?;
    tool2.wait_ready(1, READY)?;
    // Two processes over the nodes, one per listed host in order: 0 on the first, 1 on
    // the last.
    let job = dvm.listen_in_job(&nodes, 2, "job", &all, 8)?;
    let ready = job.wait_ready(2, READY)?;
    let p1 = me(&ready, 1)?;
    // RM last: a notification that never completes holds back none of the others.
    let ranges: [(&str, i32, Vec<String>); 6] = [
        ("LOCAL", -3201, vec![]),
        ("SESSION", -3202, vec![]),
        ("GLOBAL", -3203, vec![]),
        ("CUSTOM", -3205, vec![target(&p1)]),
        ("PROC_LOCAL", -3206, vec![]),
        ("RM", -3204, vec![]),
    ];
    let notified: Vec<Verdict> = ranges
        .iter()
        .map(|(range, code, targets)| dvm.notify(first, *code, range, targets, &[]))
        .collect();
    let t1 = tool1.finish(Duration::from_secs(30))?;
    let t2 = tool2.finish(Duration::from_secs(30))?;
    let j = job.finish(Duration::from_secs(30))?;
    let listeners: [(String, &[Line], Option<u32>, &String); 4] = [
        (format!("tool on {first}"), &t1, None, first),
        (format!("tool on {last}"), &t2, None, last),
        (format!("job process 0 on {first}"), &j, Some(0), first),
        (format!("job process 1 on {last}"), &j, Some(1), last),
    ];
    let heard = |code: i32| {
        listeners
            .iter()
            .filter(|(_, lines, proc, _)| !code_calls(lines, *proc, code).is_empty())
            .map(|(name, ..)| name.clone())
            .collect::<Vec<_>>()
    };
    let everyone: Vec<String> = listeners.iter().map(|(name, ..)| name.clone()).collect();
    let local: Vec<String> = listeners
        .iter()
        .filter(|(.., node)| *node == first)
        .map(|(name, ..)| name.clone())
        .collect();
    let expect: [(&str, &str, i32, Vec<String>); 6] = [
        (
            "local",
            "LOCAL: every client on the notifier's node, nobody elsewhere",
            -3201,
            local,
        ),
        ("session", "SESSION: every client", -3202, everyone.clone()),
        ("global", "GLOBAL: every client", -3203, everyone),
        (
            "custom",
            "CUSTOM: exactly the target processes",
            -3205,
            vec![format!("job process 1 on {last}")],
        ),
        (
            "proc_local",
            "PROC_LOCAL: only the notifying process's own handlers (it has none)",
            -3206,
            vec![],
        ),
        ("rm", "RM: the runtime only, no client", -3204, vec![]),
    ];
    let everything = format!(
        "tool 1:\n{}\ntool 2:\n{}\njob:\n{}",
        show(&t1),
        show(&t2),
        show(&j)
    );
    for (i, (aspect, what, code, want)) in expect.into_iter().enumerate() {
        let got = heard(code);
        // On one host "nobody elsewhere" has nobody to be: half of LOCAL cannot be shown.
        let one_host = aspect == "local" && first == last;
        ctx.aspect(
            aspect,
            notified[i].clone().and_then(|()| {
                if one_host && got == want {
                    return Err(Problem::Unsupported(
                        "LOCAL reached everyone on the notifier's node, but with one host there is nobody elsewhere to leave out".into(),
                    ));
                }
                check(
                    got == want,
                    format!("{what}: {want:?}"),
                    format!("heard by {got:?}\n{everything}"),
                )
            }),
        );
    }
    Ok(())
}

/// The `me` (namespace and rank) job process `p` printed in its ready or connected line.
fn me(lines: &[Line], p: u32) -> Result<Value, Problem> {
    lines
        .iter()
        .find(|l| l.proc == Some(p) && l.json["me"].is_object())
        .map(|l| l.json["me"].clone())
        .ok_or_else(|| fail(format!("job process {p} says who it is"), show(lines)))
}

/// `NSPACE:RANK` of a process's `me`.
fn target(m: &Value) -> String {
    format!("{}:{}", m["nspace"].as_str().unwrap_or(""), m["rank"])
}

fn code_calls(lines: &[Line], proc: Option<u32>, code: i32) -> Vec<&Line> {
    lines
        .iter()
        .filter(|l| l.is_call() && l.proc == proc && l.json["code"] == code)
        .collect()
}

/// A job of two processes on one node: process 0 registers at once, process 1 only well
/// after connecting. A tool sends an event to both in between: process 1 must still get it
/// when it registers, although process 0 had it long before.
pub fn a_job_event_waits_on_its_node_for_processes_that_register_later(ctx: &Ctx) -> Verdict {
    let (dvm, nodes) = site(ctx, "kept", 1, 1, &[])?;
    let code = -3401;
    let chain = json!([
        {"name": "now", "codes": [code], "rank": 0},
        {"name": "late", "codes": [code], "rank": 1, "register_delay_ms": 3000},
    ]);
    let job = dvm.listen_in_job(&nodes[..1], 2, "job", &chain, 30)?;
    let lines = job.wait_lines("process 0 ready and process 1 connected", READY, |ls| {
        ls.iter()
            .any(|l| l.proc == Some(0) && l.json["ready"] == true)
            && ls
                .iter()
                .any(|l| l.proc == Some(1) && l.json["connected"] == true)
    })?;
    let targets = vec![target(&me(&lines, 0)?), target(&me(&lines, 1)?)];
    dvm.notify(&nodes[0], code, "CUSTOM", &targets, &[])?;
    let sent = job.lines();
    if sent
        .iter()
        .any(|l| l.proc == Some(1) && l.json["ready"] == true)
    {
        return Err(Problem::Unresolved(format!(
            "process 1 registered before the event was sent; nothing was proven\n{}",
            show(&sent)
        )));
    }
    let lines = job
        .wait_lines("both processes hear the event", Duration::from_secs(20), |ls| {
            !code_calls(ls, Some(0), code).is_empty() && !code_calls(ls, Some(1), code).is_empty()
        })
        .map_err(|p| match p {
            Problem::Fail { observed, .. } => Problem::Fail {
                expected: "a job event kept on the node until every local process of the job had it: process 1, registering 3 s after it was sent, still hears it".into(),
                observed,
            },
            other => other,
        })?;
    job.stop();
    check(
        code_calls(&lines, Some(1), code)
            .iter()
            .all(|l| l.handler() == "late"),
        "process 1 hears it through the handler it registered late",
        show(&lines),
    )
}

/// A job of two processes over the nodes, and, on the last node, a tool and another job's
/// process listening. Process 0 of the first job notifies NAMESPACE when told to: its job's
/// other process hears it; the tool and the other job do not.
pub fn a_namespace_event_reaches_its_job_and_nobody_else(ctx: &Ctx) -> Verdict {
    let (dvm, nodes) = site(ctx, "namespace", 2, 1, &[])?;
    let last = &nodes[nodes.len() - 1];
    let (trigger, code, marker) = (-3501, -3502, -3503);
    let all = json!([handler("all", &[trigger, code, marker])]);
    let tool = dvm.listen(last, "tool", &all, 30)?;
    let other = dvm.listen_in_job(std::slice::from_ref(last), 1, "other", &all, 30)?;
    tool.wait_ready(1, READY)?;
    other.wait_ready(1, READY)?;
    let chain = json!([
        handler("all", &[trigger, code]),
        {"notify": {"code": code, "range": "NAMESPACE", "rank": 0, "on": trigger}},
    ]);
    let job = dvm.listen_in_job(&nodes, 2, "job", &chain, 30)?;
    let ready = job.wait_ready(2, READY)?;
    dvm.notify(
        &nodes[0],
        trigger,
        "CUSTOM",
        &[target(&me(&ready, 0)?)],
        &[],
    )?;
    let heard = job.wait_lines(
        "process 1 of the notifier's job hears the NAMESPACE event",
        Duration::from_secs(20),
        |ls| !code_calls(ls, Some(1), code).is_empty(),
    );
    // A marker sent after it on the others' node: once they have it, a NAMESPACE event that
    // leaked to them would have come before (one client's events arrive in order).
    dvm.notify(last, marker, "LOCAL", &[], &[])?;
    tool.wait_lines("the marker", Duration::from_secs(20), |ls| {
        !code_calls(ls, None, marker).is_empty()
    })?;
    other.wait_lines("the marker", Duration::from_secs(20), |ls| {
        !code_calls(ls, Some(0), marker).is_empty()
    })?;
    let (t, o, j) = (tool.stop(), other.stop(), job.stop());
    let seen = format!(
        "tool on {last}:\n{}\nanother job's process on {last}:\n{}\nthe job:\n{}",
        show(&t),
        show(&o),
        show(&j)
    );
    heard.map_err(|_| {
        fail(
            "NAMESPACE reaches every process of the notifier's job (process 1 on the last node)",
            seen.clone(),
        )
    })?;
    ctx.aspect(
        "others",
        check(
            code_calls(&t, None, code).is_empty() && code_calls(&o, Some(0), code).is_empty(),
            "NAMESPACE reaches no tool and no process of another job",
            seen.clone(),
        ),
    );
    let notifier = me(&ready, 0)?;
    let sources: Vec<Value> = j
        .iter()
        .filter(|l| l.proc == Some(1) && l.is_call() && l.json["code"] == code)
        .map(|l| l.json["source"].clone())
        .collect();
    ctx.aspect(
        "source",
        check(
            !sources.is_empty() && sources.iter().all(|s| *s == notifier),
            format!("the handlers are told the process that notified: {notifier}"),
            format!("process 1's handlers were told {sources:?}\n{seen}"),
        ),
    );
    Ok(())
}

/// One listener: `once` deregisters itself when called, `always` stays. Two events of the
/// code, the second after `always` served the first: `once` is called for the first only.
pub fn a_handler_that_deregistered_itself_is_not_called_again(ctx: &Ctx) -> Verdict {
    let (dvm, nodes) = site(ctx, "dereg", 1, 1, &[])?;
    let (code, marker) = (-3601, -3602);
    let chain = json!([
        {"name": "once", "codes": [code], "deregister": true},
        handler("always", &[code]),
        handler("marker", &[marker]),
    ]);
    let l = dvm.listen(&nodes[0], "dereg", &chain, 30)?;
    l.wait_ready(1, READY)?;
    let always = |n: usize| {
        move |ls: &[Line]| {
            code_calls(ls, None, code)
                .iter()
                .filter(|c| c.handler() == "always")
                .count()
                >= n
        }
    };
    dvm.notify(&nodes[0], code, "LOCAL", &[], &[])?;
    l.wait_lines("the first event served", Duration::from_secs(20), always(1))?;
    dvm.notify(&nodes[0], code, "LOCAL", &[], &[])?;
    l.wait_lines(
        "the second event served",
        Duration::from_secs(20),
        always(2),
    )?;
    // A marker after it: once it is served, the second event's whole chain has run,
    // whatever order the handlers were called in.
    dvm.notify(&nodes[0], marker, "LOCAL", &[], &[])?;
    l.wait_lines("the marker", Duration::from_secs(20), |ls| {
        !code_calls(ls, None, marker).is_empty()
    })?;
    let lines = l.stop();
    let once = code_calls(&lines, None, code)
        .iter()
        .filter(|c| c.handler() == "once")
        .count();
    check(
        once == 1,
        "a handler that deregistered itself while it ran is called for that event only",
        format!("called {once} times\n{}", show(&lines)),
    )
}

/// `PMIX_EVENT_NODE_DOWN`, the specs README's name for a lost daemon's event.
const NODE_DOWN: i32 = -231;
/// `PMIX_ERR_LOST_CONNECTION`, and its older name `PMIX_ERR_LOST_CONNECTION_TO_SERVER`.
const LOST: [i32; 2] = [-61, -101];

fn lost_calls(lines: &[Line]) -> Vec<&Line> {
    lines
        .iter()
        .filter(|l| l.is_call() && LOST.iter().any(|c| l.json["code"] == *c))
        .collect()
}

/// Tools on the first node listen for environment events (`env`) and with a job-level
/// default handler (`job`); a tool on the third node listens with a default handler. The
/// third node's daemon is killed, then the second's; once `env` heard both, a late tool
/// registers for environment events on the first node and is given what its daemon kept
/// (with a ring of one event, if the profile can set it: the newer alone).
pub fn a_lost_node_is_an_environment_event_and_its_own_clients_hear_their_daemon_is_gone(
    ctx: &Ctx,
) -> Verdict {
    let ring_key = ctx.profile.events.as_ref().and_then(|e| e.ring_key.clone());
    let extra: Vec<(String, String)> = ring_key.iter().map(|k| (k.clone(), "1".into())).collect();
    let (mut dvm, nodes) = site(ctx, "lost", 3, 3, &extra)?;
    let marker = -3701;
    let env = json!([
        {"name": "env", "codes": [NODE_DOWN], "enviro_level": true},
        handler("marker", &[marker]),
    ]);
    let job = json!([handler("job", &[NODE_DOWN, LOST[0], LOST[1]])]);
    let envl = dvm.listen(&nodes[0], "env", &env, 90)?;
    let jobl = dvm.listen(&nodes[0], "job", &job, 90)?;
    let lost = dvm.listen(&nodes[2], "lost", &job, 90)?;
    for l in [&envl, &jobl, &lost] {
        l.wait_ready(1, READY)?;
    }
    let downs = |n: usize| move |ls: &[Line]| code_calls(ls, None, NODE_DOWN).len() >= n;
    let within = Duration::from_secs(30);
    // Leaves first, whatever the radix: no other daemon loses its parent.
    dvm.cluster
        .kill(&nodes[2])
        .or_unresolved("killing the third node's daemon")?;
    let first = envl.wait_lines("NODE_DOWN for the third node", within, downs(1));
    let lost_heard = lost.wait_lines("its daemon's loss", within, |ls| !lost_calls(ls).is_empty());
    dvm.cluster
        .kill(&nodes[1])
        .or_unresolved("killing the second node's daemon")?;
    let second = envl.wait_lines("NODE_DOWN for the second node", within, downs(2));
    let late = dvm.listen(&nodes[0], "late", &env, 60)?;
    late.wait_ready(1, READY)?;
    // Whatever the daemon kept comes with the registration, before an event sent after it.
    dvm.notify(&nodes[0], marker, "LOCAL", &[], &[])?;
    let late_lines = late.wait_lines("the marker event sent after it registered", within, |ls| {
        ls.iter().any(|l| l.handler() == "marker")
    });
    let (e, j, lo, la) = (envl.stop(), jobl.stop(), lost.stop(), late.stop());
    let seen = format!(
        "env on {n1}:\n{}\njob on {n1}:\n{}\nlost on {n3}:\n{}\nlate on {n1}:\n{}",
        show(&e),
        show(&j),
        show(&lo),
        show(&la),
        n1 = nodes[0],
        n3 = nodes[2]
    );
    let env_downs: Vec<Value> = code_calls(&e, None, NODE_DOWN)
        .iter()
        .map(|l| l.json["info"].clone())
        .collect();
    ctx.aspect(
        "environment",
        check(
            first.is_ok() && second.is_ok() && env_downs.len() == 2,
            "a registration for environment events hears each lost node's NODE_DOWN, once",
            seen.clone(),
        ),
    );
    let rm_sources: Vec<Value> = code_calls(&e, None, NODE_DOWN)
        .iter()
        .map(|l| l.json["source"].clone())
        .collect();
    ctx.aspect(
        "rm_source",
        check(
            !rm_sources.is_empty() && rm_sources.iter().all(Value::is_null),
            "an event the runtime raised itself (NODE_DOWN) has no source",
            format!("sources {rm_sources:?}\n{seen}"),
        ),
    );
    ctx.aspect(
        "job_only",
        check(
            code_calls(&j, None, NODE_DOWN).is_empty(),
            "a job-level registration (the default) never sees the environment event NODE_DOWN",
            seen.clone(),
        ),
    );
    ctx.aspect(
        "lost_server",
        check(
            lost_heard.is_ok() && !lost_calls(&lo).is_empty(),
            "a client whose daemon died gets the lost-connection event (PMIX_ERR_LOST_CONNECTION, -61, or its older -101) from its own library",
            seen.clone(),
        ),
    );
    ctx.aspect(
        "never_transmitted",
        check(
            lost_calls(&e).is_empty() && lost_calls(&j).is_empty() && lost_calls(&la).is_empty(),
            "the lost-connection event is never sent to another client",
            seen.clone(),
        ),
    );
    let cached: Vec<Value> = match &late_lines {
        Ok(_) => code_calls(&la, None, NODE_DOWN)
            .iter()
            .map(|l| l.json["info"].clone())
            .collect(),
        Err(_) => Vec::new(),
    };
    ctx.aspect(
        "ring",
        check(
            !cached.is_empty() && env_downs.ends_with(&cached),
            "a registration for environment events after they happened is given the newest ones the daemon kept, in order",
            format!("given {cached:?}\n{seen}"),
        ),
    );
    ctx.aspect(
        "eviction",
        match &ring_key {
            None => Err(Problem::Unsupported(
                "the profile names no ring_key (how to set the ring's size)".into(),
            )),
            Some(k) => check(
                cached.len() == 1 && env_downs.last() == cached.last(),
                format!("with {k}=1 the ring keeps one event: the older NODE_DOWN was dropped, the newer given"),
                format!("given {cached:?}\n{seen}"),
            ),
        },
    );
    Ok(())
}

/// A listener with one default handler (no codes); a tool on its node notifies a code
/// nobody named.
pub fn a_default_handler_is_called_for_a_code_it_never_named(ctx: &Ctx) -> Verdict {
    let (dvm, nodes) = site(ctx, "default", 1, 1, &[])?;
    let code = -3801;
    let l = dvm.listen(&nodes[0], "default", &json!([handler("any", &[])]), 30)?;
    l.wait_ready(1, READY)?;
    dvm.notify(&nodes[0], code, "LOCAL", &[], &[])?;
    let heard = l.wait_lines(
        "the default handler called",
        Duration::from_secs(10),
        |ls| !code_calls(ls, None, code).is_empty(),
    );
    let lines = l.stop();
    heard.map(|_| ()).map_err(|_| {
        fail(
            "a handler registered for no code is called for every event (here one from another process)",
            show(&lines),
        )
    })
}
