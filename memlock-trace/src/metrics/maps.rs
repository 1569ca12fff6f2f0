//! How full the kernel maps are that hold per-process state: entries against capacity, so an
//! alert can fire before evictions (counted in `fault_health`) begin.

use aya::{Ebpf, maps::Map};
use prometheus_client::{
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

type MapLabel = Vec<(&'static str, String)>;

#[derive(Default)]
pub struct MapMetrics {
    entries: Family<MapLabel, Gauge>,
    capacity: Family<MapLabel, Gauge>,
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
        m
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
    let data = match map {
        Map::HashMap(d) | Map::LruHashMap(d) | Map::PerCpuHashMap(d) | Map::PerCpuLruHashMap(d) => {
            d
        }
        _ => return None,
    };
    data.info().ok().map(|info| info.max_entries())
}
