//! What every hook family's text and JSON output shares: the JSON schema version, the
//! latency units ([`Unit`]), the wall clock ([`WallClock`]), log2 histograms ([`hist`]) and
//! where the output goes ([`Sink`]), and [`Outside`]: every string a traced process or a file
//! on disk controls, escaped whenever it is shown as text ([`escape`]). Each family renders its
//! own records and summary with these; the session puts them together.

mod escape;
pub mod hist;
mod sink;
mod time;
mod wrap;

pub use escape::{MAX_SHOWN, Outside, escape, escape_uncut};
pub use sink::{Sink, WriteError, create_private, write_private};
pub use time::{WallClock, hms, process_cpu_ns, thread_cpu_ns};
pub use wrap::{COLUMNS, wrap};

/// Version of the JSON lines (`"schema"` in every line). Adding a field keeps it; renaming,
/// removing or retyping one bumps it. Documented in the README.
pub const JSON_SCHEMA: u32 = 1;

/// `us` with one decimal below 10 ms, then ms: for a value printed alone (an event line).
pub fn duration(ns: u64) -> String {
    Unit::Auto.fit([ns]).format(ns)
}

/// `64 KiB`, `1.5 MiB`, `100 B`: exact when the unit divides it, else one decimal.
pub fn size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 5] = [
        (1 << 60, "EiB"),
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (unit, name) in UNITS {
        if bytes >= unit {
            return if bytes.is_multiple_of(unit) {
                format!("{} {name}", bytes / unit)
            } else {
                format!("{:.1} {name}", bytes as f64 / unit as f64)
            };
        }
    }
    format!("{bytes} B")
}

/// A count the hook set may not observe: `n/a` when it cannot.
pub fn or_na(v: Option<u64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| v.to_string())
}

/// Frames of a stack shown on one line (the JSON has them all).
const LINE_FRAMES: usize = 4;

/// A stack on one line, innermost first: `touch <- grow <- main <- loop <- ... (9 frames)`;
/// `names` already escaped (a symbol is outside text).
pub fn stack_line(names: &[impl std::fmt::Display]) -> String {
    if names.is_empty() {
        return "(stack not found)".into();
    }
    let mut line = names
        .iter()
        .take(LINE_FRAMES)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" <- ");
    if names.len() > LINE_FRAMES {
        line.push_str(&format!(" <- ... ({} frames)", names.len()));
    }
    line
}

/// How text summaries are drawn: the latency unit and whether log2 histograms (`--hist`)
/// follow the latency tables.
#[derive(Clone, Copy, Debug, Default)]
pub struct TextStyle {
    pub unit: Unit,
    pub hist: bool,
}

/// The unit latencies are shown in: chosen per column (`Auto`), or fixed by `-m` / `-u`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Unit {
    #[default]
    Auto,
    Us,
    Ms,
}

/// Columns whose largest value reaches this are shown in ms.
const MS_FROM_NS: u64 = 10_000_000;

impl Unit {
    /// The one unit for a column holding `values` (ns): `Auto` picks ms when the largest
    /// reaches 10 ms, so `5677.1us` never sits above `63.6ms`.
    pub fn fit(self, values: impl IntoIterator<Item = u64>) -> Unit {
        match self {
            Unit::Auto => {
                if values.into_iter().max().unwrap_or(0) >= MS_FROM_NS {
                    Unit::Ms
                } else {
                    Unit::Us
                }
            }
            fixed => fixed,
        }
    }

    /// `21.8us`, `63.600ms` (ms keep three decimals, so no column loses its microseconds).
    pub fn format(self, ns: u64) -> String {
        match self {
            Unit::Ms => format!("{:.3}ms", ns as f64 / 1e6),
            Unit::Us | Unit::Auto => format!("{:.1}us", ns as f64 / 1e3),
        }
    }

    /// How many ns one unit is, and its name in a histogram header (`usecs`, `msecs`).
    pub fn scale(self) -> (u64, &'static str) {
        match self {
            Unit::Ms => (1_000_000, "msecs"),
            Unit::Us | Unit::Auto => (1_000, "usecs"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stack_line_shows_four_frames_then_how_many() {
        assert_eq!(stack_line(&["a", "b"]), "a <- b");
        assert_eq!(
            stack_line(&["a", "b", "c", "d", "e", "f"]),
            "a <- b <- c <- d <- ... (6 frames)"
        );
        let none: [&str; 0] = [];
        assert_eq!(stack_line(&none), "(stack not found)");
    }

    #[test]
    fn one_unit_per_column() {
        let column = [5_677_100, 63_600_000];
        let unit = Unit::Auto.fit(column);
        assert_eq!(unit, Unit::Ms);
        assert_eq!(
            column.map(|ns| unit.format(ns)),
            ["5.677ms".to_string(), "63.600ms".to_string()]
        );
        assert_eq!(Unit::Auto.fit([21_800, 9_999_999]), Unit::Us);
        assert_eq!(Unit::Us.fit(column).format(63_600_000), "63600.0us");
        assert_eq!(Unit::Ms.fit([1]).format(21_800), "0.022ms");
        assert_eq!(duration(21_800), "21.8us");
        assert_eq!(duration(63_600_000), "63.600ms");
    }
}
