//! The kernel's side of a check: the region as /proc/PID/task/TID/{maps,smaps} (and, under
//! pressure, the memory cgroup) show it, compared with the checkpoint and put in words.

use anyhow::Result;

use super::{Checkpoint, Piece, table::layout_str};
use crate::{lab::pressure::cgroup::read_stat, procfs::read_smaps};

/// The kernel's own account of the region against the checkpoint.
pub(super) fn compare_proc(
    cp: &Checkpoint,
    view: &ProcView,
    shows_lf: bool,
    bad: &mut Vec<String>,
) {
    let mut expected = cp.layout.clone();
    let mut got = view.layout.clone();
    if !shows_lf {
        // No `lf` in this kernel's smaps: compare the rest.
        for p in expected.iter_mut().chain(got.iter_mut()) {
            p.onfault = false;
        }
    }
    if got != expected {
        bad.push(format!(
            "/proc VMAs {} != expected {}",
            layout_str(cp.window, &view.layout),
            layout_str(cp.window, &cp.layout)
        ));
    }
    if view.maps_ranges
        != view
            .layout
            .iter()
            .map(|p| (p.start, p.end, p.perms.clone()))
            .collect::<Vec<_>>()
    {
        bad.push("/proc/PID/maps and smaps disagree about the region's VMAs".into());
    }
    if view.locked_kb != cp.locked_kb {
        bad.push(format!(
            "smaps Locked {} kB != expected {} kB",
            view.locked_kb, cp.locked_kb
        ));
    }
    if let Some(rss) = cp.rss_kb
        && view.rss_kb != rss
    {
        bad.push(format!("smaps Rss {} kB != expected {rss} kB", view.rss_kb));
    }
    if let Some(thp) = cp.thp_kb
        && view.thp_kb != thp
    {
        bad.push(format!(
            "smaps AnonHugePages {} kB != expected {thp} kB",
            view.thp_kb
        ));
    }
    if let Some(want) = &cp.pressure {
        if !within(view.swap_kb, want.swap_kb) {
            bad.push(format!(
                "smaps Swap {}k, expected {}",
                view.swap_kb,
                bounds(want.swap_kb)
            ));
        }
        match view.unevictable_kb {
            Some(kb) if within(kb, want.unevictable_kb) => {}
            Some(kb) => bad.push(format!(
                "memory cgroup unevictable {kb}k, expected {}",
                bounds(want.unevictable_kb)
            )),
            None => bad.push(format!(
                "no unevictable in {}/memory.stat",
                want.cgroup.display()
            )),
        }
    }
}

fn within(kb: u64, (low, high): (u64, u64)) -> bool {
    (low..=high).contains(&kb)
}

/// `0k`, `4-8192k`, `>=8192k`, as the other figures of a step are written.
pub(super) fn bounds((low, high): (u64, u64)) -> String {
    match (low, high) {
        (low, high) if low == high => format!("{low}k"),
        (low, u64::MAX) => format!(">={low}k"),
        (low, high) => format!("{low}-{high}k"),
    }
}

/// The region as /proc/PID/task/TID/{maps,smaps} show it.
pub(super) struct ProcView {
    pub(super) layout: Vec<Piece>,
    maps_ranges: Vec<(u64, u64, String)>,
    locked_kb: u64,
    rss_kb: u64,
    thp_kb: u64,
    swap_kb: u64,
    /// The memory cgroup's `unevictable`, for a step under pressure.
    unevictable_kb: Option<u64>,
}

impl ProcView {
    pub(super) fn read(cp: &Checkpoint, shows_lf: bool) -> Result<Self> {
        let dir = format!("/proc/{}/task/{}", cp.pid, cp.tid);
        let smaps = read_smaps(&format!("{dir}/smaps"), shows_lf)?;
        let maps = read_smaps(&format!("{dir}/maps"), shows_lf)?;
        let mut view = ProcView {
            layout: Vec::new(),
            maps_ranges: Vec::new(),
            locked_kb: 0,
            rss_kb: 0,
            thp_kb: 0,
            swap_kb: 0,
            unevictable_kb: None,
        };
        for e in smaps.iter().filter(|e| e.mapping.overlaps(cp.window)) {
            view.layout.push(Piece {
                start: e.mapping.start,
                end: e.mapping.end,
                perms: e.perms.clone(),
                locked: e.mapping.locked,
                onfault: e.mapping.lockonfault == Some(true),
            });
            view.locked_kb += e.locked_kb;
            view.rss_kb += e.rss_kb;
            view.thp_kb += e.mapping.pages.thp_kb;
            view.swap_kb += e.swap_kb;
        }
        if let Some(p) = &cp.pressure {
            view.unevictable_kb = read_stat(&p.cgroup)?
                .get("unevictable")
                .map(|bytes| bytes / 1024);
        }
        view.maps_ranges = maps
            .into_iter()
            .filter(|e| e.mapping.overlaps(cp.window))
            .map(|e| (e.mapping.start, e.mapping.end, e.perms))
            .collect();
        Ok(view)
    }
}

/// What /proc says, in words.
pub(super) fn proc_words(cp: &Checkpoint, proc: &Result<ProcView>, shows_lf: bool) -> String {
    match proc {
        Ok(v) => format!(
            "{} Locked {}k Rss {}k{}{}{}",
            layout_str(cp.window, &v.layout),
            v.locked_kb,
            v.rss_kb,
            cp.thp_kb
                .map_or(String::new(), |_| format!(" AnonHugePages {}k", v.thp_kb)),
            cp.pressure.as_ref().map_or(String::new(), |_| format!(
                " Swap {}k; cgroup unevictable {}",
                v.swap_kb,
                v.unevictable_kb
                    .map_or_else(|| "unknown".into(), |kb| format!("{kb}k"))
            )),
            if shows_lf {
                ""
            } else {
                " (no lf in this kernel's smaps)"
            }
        ),
        Err(_) => "(unreadable)".into(),
    }
}
