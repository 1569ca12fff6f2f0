//! VMA records from the ring buffer: snapshots around each mlock-family call, `ma_write`
//! stores and hooked-function events.

use memlock_trace_common::{
    EventKind,
    vma::{FuncEvent, SnapshotEvent, StoreEvent},
};

use super::{DecodeError, read_struct};

/// A decoded VMA record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmaRecord {
    Snapshot(Box<SnapshotEvent>),
    Store(StoreEvent),
    Func(Box<FuncEvent>),
}

pub fn decode(k: u32, record: &[u8]) -> Result<VmaRecord, DecodeError> {
    Ok(match EventKind::from_u32(k) {
        Some(EventKind::Snapshot) => {
            let s: SnapshotEvent = read_struct(k, record)?;
            if s.count as usize > s.vmas.len() {
                return Err(DecodeError::Short {
                    kind: k,
                    len: s.count as usize,
                    need: s.vmas.len(),
                });
            }
            VmaRecord::Snapshot(Box::new(s))
        }
        Some(EventKind::Store) => VmaRecord::Store(read_struct(k, record)?),
        Some(EventKind::Func) => VmaRecord::Func(Box::new(read_struct(k, record)?)),
        _ => return Err(DecodeError::UnknownKind(k)),
    })
}
