//! `--flamegraph`: the folded lines drawn by [inferno](https://docs.rs/inferno), the Rust
//! port of flamegraph.pl, as `flamegraph.pl --color=mem --countname=pages` draws a
//! page-fault flame graph. inferno is CDDL-1.0, used unmodified as a separately licensed
//! dependency (docs/reference.md, "Licences").

use anyhow::{Result, anyhow};
use inferno::flamegraph::{self, Options, Palette, color::BasicPalette};

use super::{Profile, Weight, folded};

/// The SVG of `profile` weighed by `weight`; `Ok(None)` when there is no stack to draw.
pub fn svg(profile: &Profile, weight: Weight) -> Result<Option<Vec<u8>>> {
    let lines = folded::lines(profile, weight);
    if lines.is_empty() {
        return Ok(None);
    }
    let mut options = Options::default();
    options.colors = Palette::Basic(BasicPalette::Mem);
    options.count_name = weight.count_name().to_string();
    options.title = match weight {
        Weight::Faults | Weight::FaultBytes => "Page faults".to_string(),
        Weight::Calls | Weight::LockedBytes => "mlock-family calls".to_string(),
    };
    options.subtitle = Some(match weight {
        Weight::Faults | Weight::FaultBytes if profile.sample_every > 1 => format!(
            "memlock-trace --stacks: one fault in {} kept its stack, counts scaled by it",
            profile.sample_every
        ),
        Weight::Faults | Weight::FaultBytes => "memlock-trace --stacks: every fault".to_string(),
        Weight::Calls | Weight::LockedBytes => "memlock-trace --stacks: every call".to_string(),
    });
    // Colours by name, so that one function has one colour from one graph to the next.
    options.hash = true;
    options.deterministic = true;
    let mut out = Vec::new();
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut out)
        .map_err(|e| anyhow!("drawing the flame graph: {e}"))?;
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_every_frame_with_its_count() {
        let svg = String::from_utf8(
            svg(&super::super::folded::tests::profile(), Weight::Faults)
                .unwrap()
                .unwrap(),
        )
        .unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..100]);
        for needle in [
            "<title>touch:All (1,024 pages, 97.71%)</title>",
            "<title>grow (1,024 pages",
            "<title>node (1,048 pages, 100.00%)</title>",
            "Page faults",
        ] {
            assert!(svg.contains(needle), "{needle} not in the SVG");
        }
        let empty = Profile {
            stacks: vec![],
            ..super::super::folded::tests::profile()
        };
        assert!(svg_is_none(&empty));
    }

    fn svg_is_none(p: &Profile) -> bool {
        svg(p, Weight::Faults).unwrap().is_none()
    }
}
