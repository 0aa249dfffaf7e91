//! Tests of PMIx RFC 0002, event notification (`catalog/pmix-rfc0002.toml` maps them to its
//! items). Listeners and notifications go through the profile's `[events]` commands only;
//! everything is judged from the JSON lines the listeners print.

use std::time::Duration;

use dvmlab_harness::PrteConf;
use serde_json::{json, Value};

use crate::checks::{tests, TestDef};
use crate::listeners::Line;
use crate::outcome::{check, fail, Problem, Verdict};
use crate::sut::{node_names, Ctx, Dvm};

const FORM: Duration = Duration::from_secs(30);
const READY: Duration = Duration::from_secs(15);

pub(crate) fn tests() -> Vec<TestDef> {
    tests![
        a_chain_runs_in_the_rfcs_order_and_each_handler_sees_every_earlier_result
            => ["specific_first", "fifo", "prepend", "results", "complete_stops", "waits", "info"],
        every_range_reaches_exactly_whom_it_names
            => ["local", "session", "global", "rm", "custom", "proc_local"],
    ]
}

/// A formed DVM of `ctl` and `n` nodes.
fn formed<'a>(ctx: &'a Ctx, label: &str, n: usize) -> Result<(Dvm<'a>, Vec<String>), Problem> {
    if ctx.profile.events.is_none() {
        return Err(Problem::Unsupported(
            "the profile has no [events] section (how to listen and notify)".into(),
        ));
    }
    let nodes = node_names(n);
    let mut hosts = vec!["ctl".to_string()];
    hosts.extend(nodes.iter().cloned());
    let conf = PrteConf::new()
        .set("DVMNodes", nodes.join(","))
        .set("DVMControllerHost", "ctl")
        .set("DVMRadix", ctx.cell.radix)
        .set("DVMIPVersion", ctx.cell.ip);
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
    let (dvm, nodes) = formed(ctx, "chain", 1)?;
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
    ctx.aspect(
        "specific_first",
        check(
            before("s2", "g1") && before("g1", "d1"),
            "handlers for the code, then for a group containing it, then defaults",
            seen.clone(),
        ),
    );
    ctx.aspect(
        "fifo",
        check(
            before("s1", "s2") && before("d1", "d2"),
            "first come first served within a class (s1 before s2, d1 before d2)",
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
            pos("d2").is_some() && pos("d3").is_none(),
            "ACTION_COMPLETE (d2) ends the chain: d3 is never called",
            seen.clone(),
        ),
    );
    // What the handler after s1 saw: every earlier handler, by name, with its status, and
    // s1's own results inside its entry.
    let results_of = |n: &str| pos(n).map(|i| c[i].json["results"].clone());
    let entry = |name: &str, status: i32, extra: &[Value]| {
        let mut inner = vec![json!({"key": name, "value": status})];
        inner.extend(extra.iter().cloned());
        json!({"key": name, "value": inner})
    };
    let want_for_s2 = json!([
        entry("p1", -331, &[]),
        entry("s1", -332, &[json!({"key": "s1.did", "value": 1})]),
    ]);
    ctx.aspect(
        "results",
        check(
            results_of("p1") == Some(json!([])) && results_of("s2") == Some(want_for_s2.clone()),
            format!(
                "one results entry per earlier handler, keyed by its name, holding its status and its results; s2 sees {want_for_s2}"
            ),
            seen.clone(),
        ),
    );
    ctx.aspect(
        "waits",
        check(
            results_of("s2").is_some_and(|r| r.to_string().contains("s1.did")),
            "the chain waits for a handler that completes later (s1, after 300 ms): the next one sees its result",
            seen.clone(),
        ),
    );
    ctx.aspect(
        "info",
        check(
            !c.is_empty()
                && c.iter().all(|l| {
                    l.json["code"] == code && l.json["info"] == json!([{"key": "x", "value": 7}])
                }),
            "every handler is given the event's code and info",
            seen,
        ),
    );
    Ok(())
}

/// Tools listening on two nodes and a job with a listener on each, then a tool on the first
/// node notifies one event per range; who hears which judges each range's aspect.
pub fn every_range_reaches_exactly_whom_it_names(ctx: &Ctx) -> Verdict {
    let (dvm, nodes) = formed(ctx, "ranges", 2)?;
    let all = json!([handler("all", &[])]);
    let tool1 = dvm.listen(&nodes[0], "tool1", &all, 8)?;
    let tool2 = dvm.listen(&nodes[1], "tool2", &all, 8)?;
    tool1.wait_ready(1, READY)?;
    tool2.wait_ready(1, READY)?;
    let job = dvm.listen_in_job(&nodes, 2, "job", &all, 8)?;
    let ready = job.wait_ready(2, READY)?;
    let me = |p: u32| {
        ready
            .iter()
            .find(|l| l.proc == Some(p))
            .map(|l| l.json["me"].clone())
            .ok_or_else(|| fail(format!("job process {p} ready"), show(&ready)))
    };
    let (p0, p1) = (me(0)?, me(1)?);
    let target = |m: &Value| format!("{}:{}", m["nspace"].as_str().unwrap_or(""), m["rank"]);
    let ranges: [(&str, i32, Vec<String>); 6] = [
        ("LOCAL", -3201, vec![]),
        ("SESSION", -3202, vec![]),
        ("GLOBAL", -3203, vec![]),
        ("RM", -3204, vec![]),
        ("CUSTOM", -3205, vec![target(&p1)]),
        ("PROC_LOCAL", -3206, vec![]),
    ];
    for (range, code, targets) in &ranges {
        dvm.notify(&nodes[0], *code, range, targets, &[])?;
    }
    let t1 = tool1.finish(Duration::from_secs(30))?;
    let t2 = tool2.finish(Duration::from_secs(30))?;
    let j = job.finish(Duration::from_secs(30))?;
    // Where each job process runs: process p's placement, from the `me` it printed and
    // the host its line came from is not shown; the job places process 0 on the first
    // node and 1 on the second (one per listed host, in order).
    let heard = |lines: &[Line], proc: Option<u32>, code: i32| {
        lines
            .iter()
            .any(|l| l.is_call() && l.proc == proc && l.json["code"] == code)
    };
    let who = |code: i32| {
        let mut w = Vec::new();
        if heard(&t1, None, code) {
            w.push("tool on node 1");
        }
        if heard(&t2, None, code) {
            w.push("tool on node 2");
        }
        if heard(&j, Some(0), code) {
            w.push("job process 0 (node 1)");
        }
        if heard(&j, Some(1), code) {
            w.push("job process 1 (node 2)");
        }
        w
    };
    let all_four = [
        "tool on node 1",
        "tool on node 2",
        "job process 0 (node 1)",
        "job process 1 (node 2)",
    ];
    let expect: [(&str, &str, i32, Vec<&str>); 6] = [
        (
            "local",
            "LOCAL: every client on the notifier's node, nobody elsewhere",
            -3201,
            vec!["tool on node 1", "job process 0 (node 1)"],
        ),
        (
            "session",
            "SESSION: every client of the DVM",
            -3202,
            all_four.to_vec(),
        ),
        (
            "global",
            "GLOBAL: every client of the DVM",
            -3203,
            all_four.to_vec(),
        ),
        ("rm", "RM: the runtime only, no client", -3204, vec![]),
        (
            "custom",
            "CUSTOM: exactly the target processes",
            -3205,
            vec!["job process 1 (node 2)"],
        ),
        (
            "proc_local",
            "PROC_LOCAL: only the notifying process's own handlers (it has none)",
            -3206,
            vec![],
        ),
    ];
    let everything = format!(
        "tool 1:\n{}\ntool 2:\n{}\njob ({p0} and {p1}):\n{}",
        show(&t1),
        show(&t2),
        show(&j)
    );
    for (aspect, what, code, want) in expect {
        let got = who(code);
        ctx.aspect(
            aspect,
            check(
                got == want,
                format!("{what}: {want:?}"),
                format!("heard by {got:?}\n{everything}"),
            ),
        );
    }
    Ok(())
}
