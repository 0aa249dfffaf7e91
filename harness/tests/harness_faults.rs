//! The harness's faults take effect, are shown to, and go away again: partitions both ways
//! and one way, impaired links, freeze and thaw. No runtime is involved: probes and plain
//! shell commands observe the network.

use std::time::{Duration, Instant};

use dvmlab_harness::{BackendKind, Cluster, ClusterSpec, Direction, Impairment, IpMode};

fn cluster(test: &str, ip: IpMode) -> Option<Cluster> {
    if !dvmlab_harness::netns_available() {
        dvmlab_harness::skip(test, "needs network namespaces (run as root)");
        return None;
    }
    let hosts: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
    let mut spec = ClusterSpec::new(test, &hosts, vec!["sleep".into(), "600".into()]);
    spec.backend = BackendKind::Netns;
    spec.ip = ip;
    Some(Cluster::new(spec).unwrap())
}

/// Whether a TCP connection attempt from `src` to `dst`'s port 9 is answered (refused) rather
/// than lost.
fn answered(c: &Cluster, src: &str, dst: &str, v6: bool) -> bool {
    let h = c.host(dst).unwrap();
    let addr = if v6 { h.v6 } else { h.v4 }.unwrap();
    let argv = ["bash", "-c", &format!("exec 3<>/dev/tcp/{addr}/9")].map(String::from);
    let (st, _, _) = c
        .exec_within(src, &argv, Duration::from_millis(1500))
        .unwrap();
    st.is_some()
}

#[test]
fn partitions_block_both_ways_or_one_way_and_heal() {
    let Some(mut c) = cluster("partitions", IpMode::Dual) else {
        return;
    };
    for v6 in [false, true] {
        assert!(answered(&c, "a", "b", v6));
    }
    let p = c.partition(&["a"], &["b", "c"], Direction::Both).unwrap();
    for v6 in [false, true] {
        assert!(!answered(&c, "a", "b", v6), "a -> b blocked (v6 {v6})");
        assert!(!answered(&c, "c", "a", v6), "c -> a blocked (v6 {v6})");
        assert!(answered(&c, "b", "c", v6), "b -> c unaffected (v6 {v6})");
    }
    c.heal(p).unwrap();
    assert!(answered(&c, "a", "b", false));
    // One way: a's packets to b vanish, b's reach a (whose answers then vanish), which
    // shows as an unanswered probe both ways but is verified by the harness's counters.
    let p = c.partition(&["a"], &["b"], Direction::OneWay).unwrap();
    assert!(!answered(&c, "a", "b", false));
    assert!(answered(&c, "a", "c", false));
    c.heal_all().unwrap();
    assert!(answered(&c, "b", "a", false));
    assert!(
        c.heal(p).is_err(),
        "a healed partition cannot be healed twice"
    );
}

#[test]
fn an_impaired_link_delays_drops_and_duplicates_then_is_restored() {
    let Some(mut c) = cluster("impair", IpMode::V4) else {
        return;
    };
    let rtt = |c: &Cluster| {
        let t = Instant::now();
        assert!(answered(c, "a", "b", false));
        t.elapsed()
    };
    c.impair("a", Impairment::delay(Duration::from_millis(150)))
        .unwrap();
    let slow = rtt(&c);
    assert!(slow >= Duration::from_millis(300), "{slow:?}");
    c.impair(
        "a",
        Impairment {
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            loss: 0.3,
            duplicate: 0.3,
            seed: 11,
        },
    )
    .unwrap();
    for _ in 0..5 {
        let _ = answered(&c, "a", "c", false);
    }
    let (fwd, dropped, dup) = c.impairment_stats("a").unwrap();
    assert!(fwd > 0 && dropped > 0 && dup > 0, "{fwd} {dropped} {dup}");
    c.unimpair("a").unwrap();
    // Restored: the emulator is gone from the path (no counters), and packets still flow. How
    // fast they flow is the benchmarks' business, not a test's.
    assert!(c.impairment_stats("a").is_none());
    assert!(answered(&c, "a", "b", false));
}

#[test]
fn freeze_stops_a_host_daemon_and_thaw_resumes_it() {
    let Some(mut c) = cluster("freeze", IpMode::V4) else {
        return;
    };
    c.start("a").unwrap();
    c.freeze("a").unwrap();
    c.thaw("a").unwrap();
    assert!(c.is_running("a"));
    c.kill("a").unwrap();
    assert!(!c.is_running("a"));
    assert!(c.freeze("b").is_err(), "b was never started");
}
