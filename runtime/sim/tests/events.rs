//! The events simulator's runs (`dvmlab_sim::events`): daemons' event hubs in a tree,
//! clients connecting, registering, notifying with every range, leaving and exiting in a
//! seeded random order, messages arriving in a random interleaving. Safety is checked after
//! every step, liveness once the network is drained. Links to parents break and come back
//! (`Step::Cut`, `Step::Rejoin`): once every link is back, every answer still comes and the
//! events made from then on reach everyone in their range.

use dvmlab_sim::events::{EventSim, Step};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(256),
        rng_seed: match std::env::var("DVMLAB_SIM_SEED").as_deref() {
            Ok("random") => RngSeed::Random,
            Ok(s) => RngSeed::Fixed(
                s.parse()
                    .unwrap_or_else(|_| panic!("DVMLAB_SIM_SEED={s}: a number, or random")),
            ),
            Err(_) => RngSeed::Fixed(0x000e_7e47),
        },
        ..ProptestConfig::default()
    }
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => any::<usize>().prop_map(Step::Connect),
        3 => any::<usize>().prop_map(Step::Register),
        1 => any::<usize>().prop_map(Step::Deregister),
        3 => (any::<usize>(), any::<usize>(), any::<usize>())
            .prop_map(|(c, range, target)| Step::Notify { c, range, target }),
        1 => any::<usize>().prop_map(Step::Disconnect),
        1 => any::<usize>().prop_map(Step::Exit),
        6 => any::<usize>().prop_map(Step::Deliver),
        1 => any::<u32>().prop_map(Step::Cut),
        1 => any::<u32>().prop_map(Step::Rejoin),
    ]
}

fn run(n: u32, radix: u32, procs: u32, placement: &[u32], steps: &[Step]) -> Result<(), String> {
    let mut sim = EventSim::new(n, radix, procs, placement);
    for s in steps {
        sim.step(s.clone());
        if let Some(v) = &sim.violation {
            return Err(format!("{v}\nafter {s:?}"));
        }
    }
    // Every link back, nothing in flight: every answer asked for has come.
    sim.calm();
    sim.check_answered();
    // Everyone still around registers and every one notifies once, then the network
    // drains: liveness.
    let clients = (2 * procs + n) as usize;
    for c in 0..clients {
        sim.step(Step::Connect(c));
        sim.step(Step::Register(c));
    }
    sim.drain();
    for c in 0..clients {
        sim.step(Step::Notify {
            c,
            range: c,
            target: c,
        });
    }
    sim.drain();
    sim.check_answered();
    sim.check_liveness();
    sim.violation.map_or(Ok(()), Err)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn events_reach_exactly_their_range_once_and_every_kept_one_arrives(
        n in 1u32..6,
        radix in 1u32..4,
        procs in 1u32..4,
        placement in prop::collection::vec(0u32..6, 8),
        steps in prop::collection::vec(step(), 0..80),
    ) {
        run(n, radix, procs, &placement, &steps).map_err(TestCaseError::fail)?;
    }
}
