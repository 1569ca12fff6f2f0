//! Ring-buffer records to typed events: a length check, the kind tag, then an unaligned
//! read of the `#[repr(C)]` struct (never a transmute into an enum).

use bytes::Buf as _;
use memlock_trace_common::{
    EventKind, SyscallEvent,
    faults::{FaultEvent, fault_flags, populate},
};

use crate::{syscall::Syscall, vma};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Syscall(SyscallRecord),
    /// Snapshots, stores and function events of the VMA family (see [`crate::vma`]).
    Vma(vma::VmaRecord),
    Fault(FaultRecord),
}

/// A sampled fault (`--events`), or the pages one call populated (tracepoint hooks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRecord {
    pub raw: FaultEvent,
}

impl FaultRecord {
    pub fn comm(&self) -> String {
        comm_str(&self.raw.comm)
    }

    pub fn has(&self, flag: u32) -> bool {
        self.raw.flags & flag != 0
    }

    /// `minor`, `major`, `failed`.
    pub fn kind(&self) -> &'static str {
        if self.has(fault_flags::FAILED) {
            "failed"
        } else if self.has(fault_flags::MAJOR) {
            "major"
        } else {
            "minor"
        }
    }

    pub fn latency_ns(&self) -> Option<u64> {
        self.has(fault_flags::HAS_LATENCY)
            .then_some(self.raw.latency_ns)
    }

    /// The call that populated the page, for populated faults.
    pub fn syscall(&self) -> Option<&'static str> {
        populate::NAMES.get(self.raw.syscall as usize).copied()
    }

    /// Whether the faulting VMA was VM_LOCKED / VM_LOCKONFAULT, when the hook saw it.
    pub fn locked(&self) -> Option<(bool, bool)> {
        self.has(fault_flags::HAS_VMA).then(|| {
            (
                self.has(fault_flags::VM_LOCKED),
                self.has(fault_flags::VM_LOCKONFAULT),
            )
        })
    }
}

/// A [`SyscallEvent`] with its number resolved to a [`Syscall`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyscallRecord {
    pub syscall: Syscall,
    pub raw: SyscallEvent,
}

impl SyscallRecord {
    pub fn comm(&self) -> String {
        comm_str(&self.raw.comm)
    }

    /// Pages the kernel faulted in on the task's behalf during the call.
    pub fn pages_populated(&self) -> u64 {
        self.raw.min_flt + self.raw.maj_flt
    }

    /// Change of `mm->locked_vm` across the call, in pages (negative for unlocks).
    pub fn pages_locked(&self) -> i64 {
        self.raw
            .locked_vm_after
            .wrapping_sub(self.raw.locked_vm_before) as i64
    }
}

#[cfg(test)]
impl SyscallRecord {
    /// A record as the kernel would write it, for unit tests of the layers above decoding.
    pub fn fixture(
        syscall: Syscall,
        tgid: u32,
        ret: i64,
        duration_ns: u64,
        min_flt: u64,
        locked_vm_after: u64,
        comm: &str,
    ) -> Self {
        let mut name = [0u8; memlock_trace_common::TASK_COMM_LEN];
        name[..comm.len()].copy_from_slice(comm.as_bytes());
        Self {
            syscall,
            raw: SyscallEvent {
                kind: EventKind::Syscall as u32,
                nr: syscall.nr(),
                tgid,
                tid: tgid,
                duration_ns,
                ret,
                min_flt,
                locked_vm_after,
                comm: name,
                ..Default::default()
            },
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    Short { kind: u32, len: usize, need: usize },
    UnknownKind(u32),
    UnknownSyscall(u32),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Short { kind, len, need } => {
                write!(f, "record of kind {kind} is {len} bytes, expected {need}")
            }
            DecodeError::UnknownKind(kind) => write!(f, "unknown record kind {kind}"),
            DecodeError::UnknownSyscall(nr) => write!(f, "unexpected syscall number {nr}"),
        }
    }
}

impl std::error::Error for DecodeError {}

pub fn decode(record: &[u8]) -> Result<Event, DecodeError> {
    let mut peek = record;
    if peek.remaining() < 4 {
        return Err(DecodeError::Short {
            kind: 0,
            len: record.len(),
            need: 4,
        });
    }
    let kind = peek.get_u32_ne();
    match EventKind::from_u32(kind) {
        Some(EventKind::Syscall) => {
            let raw: SyscallEvent = read_struct(kind, record)?;
            let syscall = Syscall::from_nr(raw.nr).ok_or(DecodeError::UnknownSyscall(raw.nr))?;
            Ok(Event::Syscall(SyscallRecord { syscall, raw }))
        }
        Some(EventKind::Snapshot | EventKind::Store | EventKind::Func) => {
            vma::decode(kind, record).map(Event::Vma)
        }
        Some(EventKind::Fault) => Ok(Event::Fault(FaultRecord {
            raw: read_struct(kind, record)?,
        })),
        None => Err(DecodeError::UnknownKind(kind)),
    }
}

pub(crate) fn read_struct<T: Copy>(kind: u32, record: &[u8]) -> Result<T, DecodeError> {
    let need = size_of::<T>();
    if record.len() < need {
        return Err(DecodeError::Short {
            kind,
            len: record.len(),
            need,
        });
    }
    // SAFETY: length checked above; T is a plain #[repr(C)] integer struct from the common
    // crate, for which any bit pattern is valid.
    Ok(unsafe { record.as_ptr().cast::<T>().read_unaligned() })
}

pub fn comm_str(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of<T: Copy>(value: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a plain #[repr(C)] struct without padding holes.
        unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
            .to_vec()
    }

    fn sample() -> SyscallEvent {
        let mut comm = [0u8; 16];
        comm[..5].copy_from_slice(b"hello");
        SyscallEvent {
            kind: EventKind::Syscall as u32,
            nr: Syscall::Mlock2.nr(),
            tgid: 10,
            tid: 11,
            enter_ns: 1,
            duration_ns: 2500,
            args: [0x7000, 8192, 1],
            ret: -12,
            min_flt: 3,
            maj_flt: 1,
            locked_vm_before: 10,
            locked_vm_after: 8,
            map_count_before: 5,
            map_count_after: 7,
            comm,
            process_start_ns: 12_345,
        }
    }

    #[test]
    fn syscall_round_trip() {
        let raw = sample();
        let Ok(Event::Syscall(rec)) = decode(&bytes_of(&raw)) else {
            panic!("not a syscall event");
        };
        assert_eq!(rec.raw, raw);
        assert_eq!(rec.syscall, Syscall::Mlock2);
        assert_eq!(rec.comm(), "hello");
        assert_eq!(rec.pages_populated(), 4);
        assert_eq!(rec.pages_locked(), -2);
    }

    #[test]
    fn unaligned_record_decodes() {
        let mut buf = vec![0u8];
        buf.extend(bytes_of(&sample()));
        let Ok(Event::Syscall(rec)) = decode(&buf[1..]) else {
            panic!("not a syscall event");
        };
        assert_eq!(rec.raw, sample());
    }

    #[test]
    fn fault_round_trip() {
        let raw = FaultEvent {
            kind: EventKind::Fault as u32,
            flags: fault_flags::MAJOR
                | fault_flags::HAS_LATENCY
                | fault_flags::HAS_VMA
                | fault_flags::VM_LOCKED,
            tgid: 5,
            tid: 6,
            address: 0x7f00_0000_1000,
            latency_ns: 1234,
            time_ns: 99,
            count: 1,
            syscall: u32::MAX,
            cpu: 1,
            comm: *b"faulty\0\0\0\0\0\0\0\0\0\0",
        };
        let Ok(Event::Fault(rec)) = decode(&bytes_of(&raw)) else {
            panic!("not a fault")
        };
        assert_eq!(rec.raw, raw);
        assert_eq!(rec.kind(), "major");
        assert_eq!(rec.latency_ns(), Some(1234));
        assert_eq!(rec.locked(), Some((true, false)));
        assert_eq!(rec.syscall(), None);
        assert_eq!(rec.comm(), "faulty");
        let populated = FaultEvent {
            flags: fault_flags::POPULATED,
            syscall: populate::MLOCK as u32,
            ..raw
        };
        let Ok(Event::Fault(rec)) = decode(&bytes_of(&populated)) else {
            panic!("not a fault")
        };
        assert_eq!(
            (rec.kind(), rec.syscall(), rec.latency_ns(), rec.locked()),
            ("minor", Some("mlock"), None, None)
        );
        assert!(matches!(
            decode(&bytes_of(&raw)[..40]),
            Err(DecodeError::Short { kind, .. }) if kind == EventKind::Fault as u32
        ));
    }

    #[test]
    fn bad_records_are_errors() {
        let bytes = bytes_of(&sample());
        assert!(matches!(
            decode(&bytes[..20]),
            Err(DecodeError::Short { .. })
        ));
        assert_eq!(
            decode(&[1, 2]),
            Err(DecodeError::Short {
                kind: 0,
                len: 2,
                need: 4
            })
        );
        assert_eq!(
            decode(&99u32.to_ne_bytes()),
            Err(DecodeError::UnknownKind(99))
        );
        let mut bad = sample();
        bad.nr = 0;
        assert_eq!(decode(&bytes_of(&bad)), Err(DecodeError::UnknownSyscall(0)));
    }
}
