//! The tests, registered by name: the catalogs refer to them by these names.

use crate::outcome::Verdict;
use crate::sut::Ctx;

mod bootstrap;
mod rfc33;

/// One registered test.
#[derive(Clone, Copy)]
pub struct TestDef {
    pub name: &'static str,
    pub run: fn(&Ctx) -> Verdict,
    /// Whether it draws from the run's seed (a failure then says how to replay it).
    pub seeded: bool,
}

/// Registers functions as tests under their own names.
macro_rules! tests {
    ($($f:path),* $(,)?) => {
        vec![$($crate::checks::TestDef {
            name: stringify!($f),
            run: $f,
            seeded: false,
        }),*]
    };
}
pub(crate) use tests;

/// Every registered test.
pub fn all() -> Vec<TestDef> {
    let mut v = bootstrap::tests();
    v.extend(rfc33::tests());
    v
}
