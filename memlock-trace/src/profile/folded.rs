//! Folded stacks, one line per distinct stack: the process name, then the frames root
//! first, `;`-separated, a space and the weight, as `stackcollapse-perf.pl` writes them
//! from `perf script` (and flamegraph.pl, inferno and speedscope read them).

use std::collections::BTreeMap;

use super::{Profile, Weight};
use crate::symbolize::Frame;

/// A frame's exact name, as stackcollapse-perf.pl names perf's frames: the function; an
/// unresolved frame of a file as `[file name]`, of anonymous code as `[unknown]`. The
/// pprof profile keeps it as it is.
pub fn exact_name(frame: &Frame) -> String {
    if frame.resolved {
        return frame.symbol.to_str_lossy().into_owned();
    }
    match &frame.module {
        Some(m) if m.starts_with("/") => {
            let path = m.to_str_lossy();
            format!("[{}]", path.rsplit('/').next().unwrap_or(&path))
        }
        Some(m) if m.starts_with("[") => m.to_str_lossy().into_owned(),
        _ => "[unknown]".to_string(),
    }
}

/// A name made fit for one folded line: a `;` (the separator) becomes `:`, as
/// stackcollapse-perf.pl makes it, and a line break or other control character `?`, so
/// that every stack stays one line.
pub fn folded_name(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ';' => ':',
            c if c.is_control() => '?',
            c => c,
        })
        .collect()
}

/// A frame's name in a folded line ([`exact_name`] through [`folded_name`]).
pub fn frame_name(frame: &Frame) -> String {
    folded_name(&exact_name(frame))
}

/// The folded lines of `profile` weighed by `weight`, identical stacks summed (frames in
/// one function at different addresses fold together, as in perf's), sorted as
/// stackcollapse-perf.pl sorts them; stacks of weight 0 are left out.
pub fn lines(profile: &Profile, weight: Weight) -> Vec<String> {
    let mut folded: BTreeMap<String, u64> = BTreeMap::new();
    for stack in &profile.stacks {
        let n = stack.weight(weight);
        if n == 0 {
            continue;
        }
        // The process name as stackcollapse-perf.pl gives it: spaces as `_`.
        let mut line = folded_name(&stack.comm.replace(' ', "_"));
        for frame in stack.frames.iter().rev() {
            line.push(';');
            line.push_str(&frame_name(frame));
        }
        *folded.entry(line).or_default() += n;
    }
    folded
        .into_iter()
        .map(|(stack, n)| format!("{stack} {n}"))
        .collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::profile::ProfileStack;

    pub fn frame(symbol: &str, module: Option<&str>, resolved: bool) -> Frame {
        Frame {
            // One address per function, for the pprof test's locations.
            addr: format!("{:#x}", symbol.bytes().map(u64::from).sum::<u64>()),
            symbol: symbol.into(),
            resolved,
            module: module.map(Into::into),
            ..Frame::unmapped(String::new())
        }
    }

    pub fn profile() -> Profile {
        let stack = |pid, comm: &str, frames: Vec<Frame>, count, bytes| ProfileStack {
            pid,
            comm: comm.into(),
            frames,
            count,
            bytes,
        };
        let node_main = || {
            vec![
                frame("touch;All", Some("anonymous"), true),
                frame("grow", Some("anonymous"), true),
                frame("main", Some("/usr/bin/node"), true),
            ]
        };
        Profile {
            weight: Weight::Faults,
            sample_every: 1,
            stacks: vec![
                stack(7, "node", node_main(), 1000, 4_096_000),
                stack(
                    7,
                    "node",
                    vec![
                        frame("anonymous+0x10", Some("anonymous"), false),
                        frame(
                            "libc.so.6+0x29d90",
                            Some("/lib/x86_64-linux-gnu/libc.so.6"),
                            false,
                        ),
                    ],
                    24,
                    98_304,
                ),
                // The same functions again: folds into the first line.
                stack(7, "node", node_main(), 24, 98_304),
                stack(8, "a\nb", vec![frame("f", None, true)], 0, 4096),
            ],
        }
    }

    #[test]
    fn folds_root_first_under_the_process_name() {
        assert_eq!(
            lines(&profile(), Weight::Faults),
            [
                "node;[libc.so.6];[unknown] 24",
                "node;main;grow;touch:All 1024",
            ]
        );
        assert_eq!(
            lines(&profile(), Weight::FaultBytes)[2],
            "node;main;grow;touch:All 4194304"
        );
        assert_eq!(lines(&profile(), Weight::FaultBytes)[0], "a?b;f 4096");
    }
}
