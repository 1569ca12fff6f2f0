//! Value parsers for every number on the command line: a number out of range is refused by
//! clap with one line naming the flag, the value and what is accepted, instead of reaching
//! a timer or an allocation that panics (`Duration::from_secs_f64(2e19)`).

use std::{fmt::Display, str::FromStr};

/// Longest duration or interval: about 31 years, far below what the timers can hold.
pub const MAX_SECS: f64 = 1e9;

/// Most processes a target set or the summary can need: the kernel's `PID_MAX_LIMIT` on
/// 64-bit, the most pids that can exist at once. The target map is sized by it, so a larger
/// value only makes the kernel refuse the map.
pub const MAX_PIDS: u32 = 1 << 22;

/// A number of seconds: finite, above 0 and at most [`MAX_SECS`].
pub fn secs(s: &str) -> Result<f64, String> {
    secs_up_to(MAX_SECS)(s)
}

/// A number of seconds above 0 and at most `max`.
pub fn secs_up_to(max: f64) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync {
    move |s| match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= max => Ok(v),
        _ => Err(format!(
            "give a number of seconds greater than 0 and at most {max}"
        )),
    }
}

/// A whole number from `min` to `max`.
pub fn int<T>(min: T, max: T) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync
where
    T: FromStr + PartialOrd + Display + Copy + Send + Sync,
{
    move |s| match s.parse::<T>() {
        Ok(v) if v >= min && v <= max => Ok(v),
        _ => Err(format!("give a whole number from {min} to {max}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_numbers_are_refused() {
        for bad in ["2e19", "1e300", "inf", "NaN", "0", "-1", "", "x"] {
            assert!(secs(bad).is_err(), "{bad}");
        }
        assert_eq!(secs("0.5"), Ok(0.5));
        assert_eq!(secs("1e9"), Ok(1e9));
        let n = int(1u32, MAX_PIDS);
        for bad in ["0", "4294967295", "4294967296", "-1", "1.5"] {
            assert!(n(bad).is_err(), "{bad}");
        }
        assert_eq!(n("4194304"), Ok(MAX_PIDS));
        assert_eq!(n("0").unwrap_err(), "give a whole number from 1 to 4194304");
    }
}
