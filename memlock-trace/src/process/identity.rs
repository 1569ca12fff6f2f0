//! Who each counted process is, as the kernel recorded it (`PROCESS_IDENTITY`, keyed by pid
//! and start time): its name after its last exec, alive or exited, and its cgroup.

use std::collections::BTreeMap;

use anyhow::Result;
use aya::{
    Ebpf,
    maps::{HashMap, IterableMap as _, MapData},
};
use memlock_trace_common::process::{ProcessIdentity, ProcessKey, identity, names};

/// One process's identity, decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    pub comm: crate::output::Outside,
    pub cgroup_id: u64,
    /// The name was set by an exec the tracer saw (it is the program's, not its parent's).
    pub execed: bool,
    pub exited: bool,
    /// Once exited: the faults the kernel counted for the whole process over its life.
    pub exit_faults: Option<u64>,
}

/// Every identity the kernel holds (empty if the map is missing).
pub fn read(ebpf: &Ebpf) -> Result<BTreeMap<ProcessKey, Identity>> {
    let Some(map) = ebpf.map(names::PROCESS_IDENTITY) else {
        return Ok(BTreeMap::new());
    };
    let map: HashMap<&MapData, ProcessKey, ProcessIdentity> = HashMap::try_from(map)?;
    Ok(
        crate::map_batch::entries::<ProcessKey, ProcessIdentity>(map.map())?
            .into_iter()
            .map(|(key, id)| {
                (
                    key,
                    Identity {
                        comm: crate::event::comm_of(&id.comm),
                        cgroup_id: id.cgroup_id,
                        execed: id.flags & identity::EXECED != 0,
                        exited: id.flags & identity::EXITED != 0,
                        exit_faults: (id.flags & identity::EXITED != 0).then_some(id.exit_faults),
                    },
                )
            })
            .collect(),
    )
}
