//! Verdicts over several points: a published claim about a series holds here only if every
//! point of its shape does. Some points holding is "partly agrees", and the verdict names
//! the points that do not.

/// One checked point of a claim, in words either way.
#[derive(Debug)]
pub(super) struct Point {
    pub holds: bool,
    pub words: String,
}

/// `agrees` when every point holds, `partly agrees` when some do, `disagrees` when none do;
/// `not checked` when there is no point to check. With the reason in words.
pub(super) fn verdict(points: &[Point]) -> (&'static str, String) {
    let held: Vec<&str> = points
        .iter()
        .filter(|p| p.holds)
        .map(|p| p.words.as_str())
        .collect();
    let failed: Vec<&str> = points
        .iter()
        .filter(|p| !p.holds)
        .map(|p| p.words.as_str())
        .collect();
    match (held.is_empty(), failed.is_empty()) {
        (true, true) => ("not checked", "no point to compare".into()),
        (false, true) => ("agrees", held.join("; ")),
        (true, false) => ("disagrees", failed.join("; ")),
        (false, false) => (
            "partly agrees",
            format!("{}, but {}", held.join("; "), failed.join("; ")),
        ),
    }
}

/// Each step between consecutive measured points (process count, value) must go the way the
/// published series goes (it falls, or it rises, at every published step).
pub(super) fn steps_like(published: &[f64], measured: &[(u64, f64)]) -> Vec<Point> {
    let falls = published.windows(2).all(|w| w[1] < w[0]);
    let rises = published.windows(2).all(|w| w[1] > w[0]);
    if !(falls || rises) {
        return Vec::new();
    }
    measured
        .windows(2)
        .map(|w| {
            let ((p0, x0), (p1, x1)) = (w[0], w[1]);
            let fell = x1 < x0;
            Point {
                holds: if falls { fell } else { x1 > x0 },
                words: format!(
                    "{} from {x0:.2} at P={p0} to {x1:.2} at P={p1}",
                    if fell { "falls" } else { "rises" }
                ),
            }
        })
        .collect()
}

/// Each measured point within `range` (e.g. a ratio near 1).
pub(super) fn within(range: std::ops::Range<f64>, measured: &[(u64, f64)]) -> Vec<Point> {
    measured
        .iter()
        .map(|&(p, x)| Point {
            holds: range.contains(&x),
            words: format!(
                "{x:.2} at P={p} is {} {:.2}..{:.2}",
                if range.contains(&x) {
                    "within"
                } else {
                    "outside"
                },
                range.start,
                range.end
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference 000's MCL_FUTURE / off ratios for P = 1, 2, 4, 8.
    const PUBLISHED: [f64; 4] = [0.97, 0.89, 0.61, 0.35];

    #[test]
    fn a_rise_between_two_points_is_only_partly_agreeing() {
        // What `cargo xtask run` measured and once called "agrees".
        let measured = [(1, 0.77), (2, 0.43), (4, 0.59)];
        let (verdict, why) = verdict(&steps_like(&PUBLISHED, &measured));
        assert_eq!(verdict, "partly agrees");
        assert_eq!(
            why,
            "falls from 0.77 at P=1 to 0.43 at P=2, but rises from 0.43 at P=2 to 0.59 at P=4"
        );
    }

    #[test]
    fn the_published_series_agrees_with_itself_and_a_rising_one_does_not() {
        let published: Vec<(u64, f64)> = [1, 2, 4, 8].into_iter().zip(PUBLISHED).collect();
        assert_eq!(verdict(&steps_like(&PUBLISHED, &published)).0, "agrees");
        let rising = [(1, 0.5), (2, 0.6), (4, 0.7)];
        let (v, why) = verdict(&steps_like(&PUBLISHED, &rising));
        assert_eq!(v, "disagrees");
        assert!(
            why.contains("rises from 0.50 at P=1 to 0.60 at P=2"),
            "{why}"
        );
        // One point has no shape.
        assert_eq!(
            verdict(&steps_like(&PUBLISHED, &[(1, 0.77)])).0,
            "not checked"
        );
    }

    #[test]
    fn every_point_of_a_flat_claim_is_checked() {
        let (v, why) = verdict(&within(0.75..1.33, &[(1, 0.99), (2, 0.70)]));
        assert_eq!(v, "partly agrees");
        assert!(
            why.ends_with("but 0.70 at P=2 is outside 0.75..1.33"),
            "{why}"
        );
    }
}
