//! The eBPF objects a process holds, from its file descriptors' fdinfo, and whether the
//! kernel still has them.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

/// The ids of the eBPF programs, maps and links a process holds file descriptors to,
/// from `/proc/PID/fdinfo` (`prog_id:`, `map_id:`, `link_id:` lines).
#[derive(Debug, Default, Clone)]
pub struct BpfIds {
    pub programs: BTreeSet<u32>,
    pub maps: BTreeSet<u32>,
    pub links: BTreeSet<u32>,
}

pub fn bpf_ids(pid: i32) -> BpfIds {
    let mut ids = BpfIds::default();
    for info in fdinfos(pid) {
        let id = |key: &str| fdinfo_field(&info, key).and_then(|v| u32::try_from(v).ok());
        if let Some(link) = id("link_id:") {
            // A link's fdinfo also names its program, which the program's own fd covers.
            ids.links.insert(link);
        } else if let Some(program) = id("prog_id:") {
            ids.programs.insert(program);
        }
        if let Some(map) = id("map_id:") {
            ids.maps.insert(map);
        }
    }
    ids
}

/// The fdinfo text of each file descriptor process `pid` holds (`/proc/PID/fdinfo`).
pub fn fdinfos(pid: i32) -> Vec<String> {
    let dir = format!("/proc/{pid}/fdinfo");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .filter_map(|entry| std::fs::read_to_string(entry.ok()?.path()).ok())
        .collect()
}

/// The number after `key` (`map_id:`, `memlock:`, `run_cnt:`...) in one fd's fdinfo text.
pub fn fdinfo_field(info: &str, key: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
}

/// Which of `ids` still exist in the kernel (by walking every loaded program, map and link).
pub fn still_loaded(ids: &BpfIds) -> BpfIds {
    let programs = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| p.id())
        .filter(|id| ids.programs.contains(id))
        .collect();
    let maps = aya::maps::loaded_maps()
        .filter_map(Result::ok)
        .map(|m| m.id())
        .filter(|id| ids.maps.contains(id))
        .collect();
    let links = aya::programs::loaded_links()
        .filter_map(Result::ok)
        .map(|l| l.id())
        .filter(|id| ids.links.contains(id))
        .collect();
    BpfIds {
        programs,
        maps,
        links,
    }
}

impl BpfIds {
    pub fn is_empty(&self) -> bool {
        self.programs.is_empty() && self.maps.is_empty() && self.links.is_empty()
    }
}

/// Polls until none of `ids` is loaded; the kernel frees programs and maps after an RCU
/// grace period, so "gone" may take a moment. Returns how long it took.
pub fn wait_all_unloaded(ids: &BpfIds) -> Duration {
    let start = Instant::now();
    loop {
        let left = still_loaded(ids);
        if left.is_empty() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still in the kernel 10 s after the tracer exited: {left:?} (of {ids:?})"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The BPF maps process `pid` holds, from its fds' fdinfo: each map once (however many fds
/// refer to it) as (name, `memlock:` bytes, what the kernel charges for it), largest first.
/// Names are the kernel's, cut to 15 bytes.
pub fn map_memory(pid: i32) -> Vec<(String, u64)> {
    let mut bytes = std::collections::BTreeMap::new();
    for info in fdinfos(pid) {
        let field = |key: &str| fdinfo_field(&info, key);
        if let (Some(id), Some(memlock)) = (field("map_id:"), field("memlock:")) {
            bytes.insert(id as u32, memlock);
        }
    }
    let mut maps: Vec<(String, u64)> = aya::maps::loaded_maps()
        .filter_map(Result::ok)
        .filter_map(|m| {
            let memlock = *bytes.get(&m.id())?;
            Some((m.name_as_str().unwrap_or("?").to_string(), memlock))
        })
        .collect();
    maps.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    maps
}
