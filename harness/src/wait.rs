//! Waiting for conditions instead of sleeping and hoping.

use std::time::{Duration, Instant};

/// Polls `probe` every `every` until it yields `Some`, or fails after `within` with the
/// last thing `probe` said.
pub fn wait_until<T>(
    within: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + within;
    loop {
        match probe() {
            Ok(v) => return Ok(v),
            Err(last) if Instant::now() >= deadline => {
                return Err(format!("condition not met within {within:?}: {last}"))
            }
            Err(_) => std::thread::sleep(every),
        }
    }
}
