//! Log2 histograms in libbpf-tools' `print_log2_hist` shape (`usecs : count distribution`,
//! rows `low -> high : count |****|`), shared by every family that times something.
//!
//! Slot `i` holds the values whose `floor(log2(v))` is `i` once converted to the unit
//! (slot 0 holds 0 and 1), exactly as libbpf-tools' `log2l()` slots do.

use std::fmt::Write as _;

use super::Unit;

/// Counts per log2 slot of one latency distribution.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Log2Hist {
    pub slots: Vec<u64>,
}

/// The slot of a value in units.
fn slot(v: u64) -> usize {
    if v <= 1 {
        0
    } else {
        (63 - v.leading_zeros()) as usize
    }
}

impl Log2Hist {
    /// From `(ns, count)` pairs: each value is converted to `unit` (truncating, as
    /// libbpf-tools' `delta / 1000`), then slotted.
    pub fn of(unit: Unit, values: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let (per, _) = unit.scale();
        let mut slots = Vec::new();
        for (ns, count) in values {
            if count == 0 {
                continue;
            }
            let s = slot(ns / per);
            if slots.len() <= s {
                slots.resize(s + 1, 0);
            }
            slots[s] += count;
        }
        Self { slots }
    }

    pub fn total(&self) -> u64 {
        self.slots.iter().sum()
    }

    /// `print_log2_hist(vals, size, "usecs")`, each line prefixed with `indent`.
    pub fn render(&self, out: &mut String, unit: Unit, indent: &str) {
        let Some(idx_max) = self.slots.iter().rposition(|&n| n > 0) else {
            return;
        };
        let (_, name) = unit.scale();
        let val_max = self.slots.iter().copied().max().unwrap_or(1).max(1);
        let (pad, name_width, width, stars) = if idx_max <= 32 {
            (5, 19, 10, 40)
        } else {
            (15, 29, 20, 20)
        };
        let _ = writeln!(
            out,
            "{indent}{:pad$}{name:<name_width$} : count    distribution",
            ""
        );
        for (i, &val) in self.slots.iter().enumerate().take(idx_max + 1) {
            let high = (1u64 << (i + 1)) - 1;
            let low = if i == 0 { 0 } else { 1u64 << i };
            let n = (val.min(val_max) * stars / val_max) as usize;
            let _ = writeln!(
                out,
                "{indent}{low:>width$} -> {high:<width$} : {val:<8} |{}{}|",
                "*".repeat(n),
                " ".repeat(stars as usize - n),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_libbpf_tools_shape() {
        // 1 us, 2 us, 3 us, 3 us, 40 us, 999 ns (0 us).
        let h = Log2Hist::of(
            Unit::Us,
            [
                (1_000, 1),
                (2_000, 1),
                (3_999, 2),
                (40_000, 1),
                (999, 1),
                (5, 0),
            ],
        );
        assert_eq!(h.slots, [2, 3, 0, 0, 0, 1]);
        assert_eq!(h.total(), 6);
        let mut out = String::new();
        h.render(&mut out, Unit::Us, "  ");
        let expected = "       usecs               : count    distribution
           0 -> 1          : 2        |**************************              |
           2 -> 3          : 3        |****************************************|
           4 -> 7          : 0        |                                        |
           8 -> 15         : 0        |                                        |
          16 -> 31         : 0        |                                        |
          32 -> 63         : 1        |*************                           |
";
        assert_eq!(out, expected, "\n{out}");
        let mut empty = String::new();
        Log2Hist::default().render(&mut empty, Unit::Ms, "");
        assert!(empty.is_empty());
        assert_eq!(Log2Hist::of(Unit::Ms, [(2_500_000, 4)]).slots, [0, 4]);
    }
}
