//! VMA records from the ring buffer: snapshots around each mlock-family call, `ma_write`
//! stores and hooked-function events.

use memlock_trace_common::vma::{FuncEvent, SnapshotEvent, StoreEvent, kind};

use super::{DecodeError, read_struct};

/// A decoded VMA record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmaRecord {
    Snapshot(Box<SnapshotEvent>),
    Store(StoreEvent),
    Func(Box<FuncEvent>),
}

pub fn is_vma_kind(k: u32) -> bool {
    matches!(k, kind::SNAPSHOT | kind::STORE | kind::FUNC)
}

pub fn decode(k: u32, record: &[u8]) -> Result<VmaRecord, DecodeError> {
    Ok(match k {
        kind::SNAPSHOT => {
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
        kind::STORE => VmaRecord::Store(read_struct(k, record)?),
        kind::FUNC => VmaRecord::Func(Box::new(read_struct(k, record)?)),
        other => return Err(DecodeError::UnknownKind(other)),
    })
}
