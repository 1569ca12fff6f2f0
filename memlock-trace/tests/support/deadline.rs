//! Waiting for something another process does, with a bound: a guard against a hang, not a
//! measure of speed.

use std::time::{Duration, Instant};

/// Calls `attempt` every `every` until it returns `Ok`, and returns that; an `Err` once
/// `limit` has passed fails the test with the reason it gives.
pub fn poll_within<T>(
    limit: Duration,
    every: Duration,
    mut attempt: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        match attempt() {
            Ok(done) => return done,
            Err(why) => assert!(Instant::now() < deadline, "{why}"),
        }
        std::thread::sleep(every);
    }
}
