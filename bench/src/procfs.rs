//! What the kernel says a process did, read from `/proc` and `getrusage`: the CPU time of
//! each thread (the scheduler's count in nanoseconds, not ticks), its context switches, the
//! TCP segments of its network namespace, and the CPU of the processes this one waited for.

use std::collections::HashMap;
use std::hash::Hash;

use nix::sys::resource::{getrusage, Usage, UsageWho};
use nix::sys::time::TimeVal;

/// The CPU time each thread of process `pid` has run so far, ns.
pub fn thread_cpu_ns(pid: u32) -> Result<HashMap<u32, u64>, String> {
    per_thread(pid, "schedstat", |text| {
        text.split_whitespace().next()?.parse().ok()
    })
}

/// How much counters that only grow (per thread, say) grew between two readings, summed: a
/// key first seen in `after` counts whole, and one gone from it is left out with what it
/// ran after `before` (summing whole processes instead would lose all a thread that ended
/// ever ran).
pub fn grown<K: Eq + Hash>(before: &HashMap<K, u64>, after: &HashMap<K, u64>) -> u64 {
    after
        .iter()
        .map(|(k, v)| v.saturating_sub(before.get(k).copied().unwrap_or(0)))
        .sum()
}

/// The context switches (voluntary and not) each thread of process `pid` made so far.
pub fn thread_switches(pid: u32) -> Result<HashMap<u32, u64>, String> {
    per_thread(pid, "status", switches_of)
}

/// Reads `file` of every thread of `pid` and takes a number from it; a thread that ended
/// since the listing is left out.
fn per_thread(
    pid: u32,
    file: &str,
    take: impl Fn(&str) -> Option<u64>,
) -> Result<HashMap<u32, u64>, String> {
    let dir = format!("/proc/{pid}/task");
    let mut threads = HashMap::new();
    for t in std::fs::read_dir(&dir).map_err(|e| format!("{dir}: {e}"))? {
        let t = t.map_err(|e| format!("{dir}: {e}"))?;
        let Some(tid) = t.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(t.path().join(file)) else {
            continue;
        };
        let n = take(&text).ok_or_else(|| format!("{dir}/{tid}/{file}: {text:?}"))?;
        threads.insert(tid, n);
    }
    Ok(threads)
}

/// The sum of a `status` file's voluntary and involuntary context switches.
fn switches_of(status: &str) -> Option<u64> {
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    Some(field("voluntary_ctxt_switches:")? + field("nonvoluntary_ctxt_switches:")?)
}

/// TCP segments sent and received so far in the network namespace of process `pid`.
pub fn tcp_segments(pid: u32) -> Result<(u64, u64), String> {
    let path = format!("/proc/{pid}/net/snmp");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    segments_of(&text).ok_or_else(|| format!("{path}: no Tcp OutSegs and InSegs"))
}

fn segments_of(snmp: &str) -> Option<(u64, u64)> {
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next()?, tcp.next()?);
    let counts: HashMap<&str, &str> = names
        .split_whitespace()
        .zip(values.split_whitespace())
        .collect();
    let get = |k: &str| counts.get(k)?.parse().ok();
    Some((get("OutSegs")?, get("InSegs")?))
}

/// The network namespace of process `pid`, as the kernel names it (`net:[…]`).
pub fn netns(pid: u32) -> Result<String, String> {
    let path = format!("/proc/{pid}/ns/net");
    std::fs::read_link(&path)
        .map(|p| p.display().to_string())
        .map_err(|e| format!("{path}: {e}"))
}

fn ms(t: TimeVal) -> f64 {
    t.tv_sec() as f64 * 1e3 + t.tv_usec() as f64 / 1e3
}

fn cpu_ms(u: &Usage) -> f64 {
    ms(u.user_time()) + ms(u.system_time())
}

/// The CPU time of this process's children that were waited for, and of theirs, ms.
pub fn children_cpu_ms() -> Result<f64, String> {
    getrusage(UsageWho::RUSAGE_CHILDREN)
        .map(|u| cpu_ms(&u))
        .map_err(|e| format!("getrusage(RUSAGE_CHILDREN): {e}"))
}

/// This process's own CPU time so far, ms.
pub fn own_cpu_ms() -> Result<f64, String> {
    getrusage(UsageWho::RUSAGE_SELF)
        .map(|u| cpu_ms(&u))
        .map_err(|e| format!("getrusage(RUSAGE_SELF): {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_and_switches_are_read_by_name() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                    Tcp: RtoAlgorithm ActiveOpens InSegs OutSegs\nTcp: 1 7 120 98\n\
                    Udp: InDatagrams\nUdp: 3\n";
        assert_eq!(segments_of(snmp), Some((98, 120)));
        assert_eq!(segments_of("Tcp: InSegs\nTcp: 5\n"), None);
        let status = "Name:\tprted\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n";
        assert_eq!(switches_of(status), Some(15));
        assert_eq!(switches_of("Name:\tprted\n"), None);
    }

    #[test]
    fn what_grew_counts_threads_that_began_whole_and_leaves_out_those_that_ended() {
        let before: HashMap<u32, u64> = [(1, 100), (2, 50)].into();
        let after: HashMap<u32, u64> = [(1, 130), (3, 7)].into();
        assert_eq!(grown(&before, &after), 37);
    }

    #[test]
    fn this_process_reads_its_own_counts() {
        let me = std::process::id();
        assert!(!thread_cpu_ns(me).expect("schedstat").is_empty());
        assert!(thread_switches(me)
            .expect("status")
            .values()
            .any(|&n| n > 0));
        tcp_segments(me).expect("snmp");
        assert!(netns(me).expect("ns").starts_with("net:["));
        assert!(own_cpu_ms().expect("rusage") > 0.0);
        assert!(children_cpu_ms().expect("rusage") >= 0.0);
    }
}
