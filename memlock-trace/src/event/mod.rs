//! Ring-buffer records to typed events: a length check, the kind tag, then an unaligned
//! read of the `#[repr(C)]` struct (never a transmute into an enum). Each record type and
//! what it means lives in its own module; the hook families consume them.

mod fault;
mod syscall;
mod vma;

use aya::Pod;
use bytes::Buf as _;
use memlock_trace_common::{EventKind, SyscallEvent};

use crate::output::Outside;

pub use fault::FaultRecord;
pub use syscall::{
    MCL_CURRENT, MCL_FUTURE, MCL_ONFAULT, MLOCK_ONFAULT, Syscall, SyscallRecord, errno_name,
    flag_names,
};
pub use vma::VmaRecord;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Syscall(SyscallRecord),
    /// Snapshots, stores and function events, which the VMA family pairs with their calls.
    Vma(VmaRecord),
    Fault(FaultRecord),
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

pub(crate) fn read_struct<T: Pod>(kind: u32, record: &[u8]) -> Result<T, DecodeError> {
    let need = size_of::<T>();
    if record.len() < need {
        return Err(DecodeError::Short {
            kind,
            len: record.len(),
            need,
        });
    }
    // SAFETY: the length is checked above, and `T: Pod` promises that any bit pattern is a
    // valid `T`; `read_unaligned` needs no alignment.
    Ok(unsafe { record.as_ptr().cast::<T>().read_unaligned() })
}

/// A kernel `comm` buffer (NUL-padded) as the name the process chose: outside text.
pub fn comm_of(comm: &[u8]) -> Outside {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    Outside::from(&comm[..end])
}

/// The same name as a lossy UTF-8 string: for Prometheus labels, whose encoder escapes it;
/// text output shows [`comm_of`] instead.
pub fn comm_str(comm: &[u8]) -> String {
    comm_of(comm).to_str_lossy().into_owned()
}

/// The bytes of a record as the kernel writes them, for decoder round trips.
#[cfg(test)]
pub(crate) fn bytes_of<T: Pod>(value: &T) -> Vec<u8> {
    // SAFETY: `T: Pod` is a plain `#[repr(C)]` struct with explicit padding: all of its
    // `size_of::<T>()` bytes are initialised and readable for the borrow's lifetime.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

#[cfg(test)]
mod tests {
    use memlock_trace_common::faults::{FaultEvent, fault_flags, populate};

    use super::*;

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
            rlimit_memlock: 65_536,
            total_vm_before: 100,
            lock_context: memlock_trace_common::lock_context::RLIMIT_KNOWN,
            _pad: 0,
            first_unmapped: 0x9000,
            pages_mapped: 2048,
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
            ip: 0x5555_0000_1234,
            latency_ns: 1234,
            time_ns: 99,
            count: 1,
            syscall: u32::MAX,
            cpu: 1,
            cause_ns: [0, 1000, 0, 0, 200],
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
        assert_eq!(rec.name(), "faulty");
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
