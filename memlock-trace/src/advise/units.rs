//! How advise writes its figures: counts with thousands apart, times in milliseconds.

pub use crate::output::count;

/// `12.3 ms`.
pub fn ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}
