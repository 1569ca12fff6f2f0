//! How full the kernel maps are that hold per-process state: entries against capacity, so an
//! alert can fire before evictions (counted in `fault_health`) begin; and the memory every
//! map of the session takes in the kernel, charged to the tracer's memory cgroup.

use std::{collections::HashMap, sync::OnceLock};

use aya::{
    Ebpf,
    maps::{Map, MapData},
};
use prometheus_client::{
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

type MapLabel = Vec<(&'static str, String)>;

#[derive(Default)]
pub struct MapMetrics {
    entries: Family<MapLabel, Gauge>,
    capacity: Family<MapLabel, Gauge>,
    memory: Family<MapLabel, Gauge>,
    /// The maps' memory is fixed at creation (preallocated), so it is read once.
    memory_read: OnceLock<()>,
}

impl MapMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "map_entries",
            "Entries in a kernel map of per-process state at the last refresh",
            m.entries.clone(),
        );
        registry.register(
            "map_max_entries",
            "Capacity of that kernel map (as sized for this machine at load)",
            m.capacity.clone(),
        );
        registry.register(
            "map_memory_bytes",
            "Kernel memory of each BPF map of the session (`memlock` in its fdinfo), fixed at \
             load; charged to the tracer's memory cgroup",
            m.memory.clone(),
        );
        m
    }

    /// The first time: every map's memory, from this process's fdinfo.
    pub fn update_memory(&self, ebpf: &Ebpf) {
        self.memory_read.get_or_init(|| {
            let names: HashMap<u32, &str> = ebpf
                .maps()
                .filter_map(|(name, map)| Some((data(map).info().ok()?.id(), name)))
                .collect();
            for (name, bytes) in map_memory(&names) {
                let label = vec![("map", name.to_ascii_lowercase())];
                self.memory
                    .get_or_create(&label)
                    .set(i64::try_from(bytes).unwrap_or(i64::MAX));
            }
        });
    }

    /// `used`: (map name, entries read back). Capacities come from the kernel.
    pub fn update(&self, ebpf: &Ebpf, used: &[(&str, usize)]) {
        for &(name, entries) in used {
            let label = vec![("map", name.to_ascii_lowercase())];
            self.entries
                .get_or_create(&label)
                .set(i64::try_from(entries).unwrap_or(i64::MAX));
            if let Some(max) = ebpf.map(name).and_then(max_entries) {
                self.capacity.get_or_create(&label).set(i64::from(max));
            }
        }
    }
}

fn max_entries(map: &Map) -> Option<u32> {
    match map {
        Map::HashMap(_) | Map::LruHashMap(_) | Map::PerCpuHashMap(_) | Map::PerCpuLruHashMap(_) => {
            data(map).info().ok().map(|info| info.max_entries())
        }
        _ => None,
    }
}

/// Every kind of map aya knows holds the same `MapData`; aya 0.14 offers no accessor for it.
fn data(map: &Map) -> &MapData {
    match map {
        Map::Array(d)
        | Map::ArrayOfMaps(d)
        | Map::BloomFilter(d)
        | Map::CgroupArray(d)
        | Map::CgroupStorage(d)
        | Map::CgrpStorage(d)
        | Map::CpuMap(d)
        | Map::DevMap(d)
        | Map::DevMapHash(d)
        | Map::HashMap(d)
        | Map::HashOfMaps(d)
        | Map::InodeStorage(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuCgroupStorage(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::ReusePortSockArray(d)
        | Map::RingBuf(d)
        | Map::SockHash(d)
        | Map::SockMap(d)
        | Map::SkStorage(d)
        | Map::Stack(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d)
        | Map::XskMap(d) => d,
    }
}

/// (name, `memlock:` bytes) of each BPF map this process holds an fd to, each once: named
/// from `names` by map id (the kernel keeps only 15 bytes of a name, and two of ours share
/// them), else by the kernel's name (a ring buffer taken out of `Ebpf` is still held here).
fn map_memory(names: &HashMap<u32, &str>) -> Vec<(String, u64)> {
    let mut bytes = std::collections::BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fdinfo") else {
        return Vec::new();
    };
    for entry in dir.flatten() {
        let Ok(info) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if let (Some(id), Some(memlock)) = (field("map_id:"), field("memlock:")) {
            bytes.insert(id, memlock);
        }
    }
    bytes
        .into_iter()
        .filter_map(|(id, memlock)| {
            let id = u32::try_from(id).ok()?;
            let name = match names.get(&id) {
                Some(name) => (*name).to_string(),
                None => aya::maps::MapInfo::from_id(id)
                    .ok()?
                    .name_as_str()?
                    .to_string(),
            };
            Some((name, memlock))
        })
        .collect()
}
