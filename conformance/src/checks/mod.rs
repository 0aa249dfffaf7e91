//! The tests, registered by name: the catalogs refer to them by these names.

use crate::outcome::Verdict;
use crate::sut::Ctx;

mod bootstrap;
mod elastic;
mod rfc0002;
mod rfc33;

/// One registered test.
///
/// A test's verdict is its **premise** (the DVM it builds forms, its daemons stop): a
/// catalog entry `TEST` is judged by that alone. Facts the test also judges on the same
/// DVM are its **aspects**, each with a verdict of its own ([`Ctx::aspect`]): an entry
/// `TEST/ASPECT` is judged by the premise and that aspect only, so an item names exactly the
/// facts it states and is never failed, nor left unsupported, by another item's fact.
#[derive(Clone, Copy)]
pub struct TestDef {
    pub name: &'static str,
    pub run: fn(&Ctx) -> Verdict,
    /// Whether it draws from the run's seed (a failure then says how to replay it).
    pub seeded: bool,
    /// The aspects it judges.
    pub aspects: &'static [&'static str],
}

/// Registers functions as tests under their own names, each with the aspects it judges
/// (`f => ["ranks", "tree"]`).
macro_rules! tests {
    ($($f:path $(=> [$($a:literal),* $(,)?])?),* $(,)?) => {
        vec![$($crate::checks::TestDef {
            name: stringify!($f),
            run: $f,
            seeded: false,
            aspects: &[$($($a),*)?],
        }),*]
    };
}
pub(crate) use tests;

/// Every registered test.
pub fn all() -> Vec<TestDef> {
    let mut v = bootstrap::tests();
    v.extend(rfc33::tests());
    v.extend(rfc0002::tests());
    v.extend(elastic::tests());
    v
}
