//! Why an mlock-family call failed: the figures the kernel checked it against, read in the
//! kernel at the call's entry (`RLIMIT_MEMLOCK`, `locked_vm`, `CAP_IPC_LOCK`) and the bytes
//! the call asked for, so "ENOMEM" comes with its reason.

use memlock_trace_common::{PAGE_MASK, PAGE_SIZE, lock_context};
use serde::Serialize;

use crate::event::{MCL_CURRENT, Syscall, SyscallRecord};

/// One call's figures, as in its JSON event and the summary's failures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LockFigures {
    /// The soft `RLIMIT_MEMLOCK`, bytes; `None` when unlimited or not read (the two are told
    /// apart by `rlimit_memlock_unlimited`).
    pub rlimit_memlock_bytes: Option<u64>,
    /// `RLIM_INFINITY`; `None` when the limit was not read.
    pub rlimit_memlock_unlimited: Option<bool>,
    /// `mm->locked_vm` before the call, bytes.
    pub locked_bytes_before: u64,
    /// What the kernel compares with the limit: the page-aligned range of mlock, mlock2 and
    /// munlock, the whole address space (`total_vm`) of `mlockall(MCL_CURRENT)`; `None` for
    /// calls that ask for no size (`munlockall`, `mlockall` without `MCL_CURRENT`) or when
    /// `total_vm` was not read.
    pub asked_bytes: Option<u64>,
    /// Whether the task held `CAP_IPC_LOCK` (which lifts the limit); `None`: not read.
    pub cap_ipc_lock: Option<bool>,
}

impl LockFigures {
    pub fn of(rec: &SyscallRecord) -> Self {
        let r = &rec.raw;
        let known = |bit: u32| r.lock_context & bit != 0;
        let unlimited = known(lock_context::RLIMIT_KNOWN).then_some(r.rlimit_memlock == u64::MAX);
        let [start, len, _] = r.args;
        let asked_bytes = match rec.syscall {
            // The kernel's `len = PAGE_ALIGN(len + offset_in_page(start))`.
            Syscall::Mlock | Syscall::Mlock2 | Syscall::Munlock => Some(
                len.saturating_add(start & !PAGE_MASK)
                    .saturating_add(PAGE_SIZE - 1)
                    & PAGE_MASK,
            ),
            Syscall::Mlockall if start & MCL_CURRENT != 0 => known(lock_context::TOTAL_VM_KNOWN)
                .then(|| r.total_vm_before.saturating_mul(PAGE_SIZE)),
            Syscall::Mlockall | Syscall::Munlockall => None,
        };
        Self {
            rlimit_memlock_bytes: (unlimited == Some(false)).then_some(r.rlimit_memlock),
            rlimit_memlock_unlimited: unlimited,
            locked_bytes_before: r.locked_vm_before.saturating_mul(PAGE_SIZE),
            asked_bytes,
            cap_ipc_lock: known(lock_context::CAP_KNOWN)
                .then_some(known(lock_context::CAP_IPC_LOCK)),
        }
    }

    /// `RLIMIT_MEMLOCK 64 KiB, 60 KiB locked, asked 16 KiB, no CAP_IPC_LOCK`; figures not
    /// read are left out (or said to be unknown, for the limit).
    pub fn describe(&self) -> String {
        let limit = match (self.rlimit_memlock_unlimited, self.rlimit_memlock_bytes) {
            (Some(true), _) => "unlimited".to_string(),
            (Some(false), Some(bytes)) => size(bytes),
            _ => "unknown".to_string(),
        };
        let mut parts = vec![
            format!("RLIMIT_MEMLOCK {limit}"),
            format!("{} locked", size(self.locked_bytes_before)),
        ];
        if let Some(asked) = self.asked_bytes {
            parts.push(format!("asked {}", size(asked)));
        }
        match self.cap_ipc_lock {
            Some(true) => parts.push("CAP_IPC_LOCK".into()),
            Some(false) => parts.push("no CAP_IPC_LOCK".into()),
            None => {}
        }
        parts.join(", ")
    }
}

/// `64 KiB`, `1.5 MiB`, `100 B`: exact when the unit divides it, else one decimal.
pub fn size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 5] = [
        (1 << 60, "EiB"),
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (unit, name) in UNITS {
        if bytes >= unit {
            return if bytes.is_multiple_of(unit) {
                format!("{} {name}", bytes / unit)
            } else {
                format!("{:.1} {name}", bytes as f64 / unit as f64)
            };
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use memlock_trace_common::lock_context::{CAP_KNOWN, RLIMIT_KNOWN, TOTAL_VM_KNOWN};

    use super::*;

    fn failed_mlock(start: u64, len: u64) -> SyscallRecord {
        let mut rec = SyscallRecord::fixture(Syscall::Mlock, 7, -12, 1000, 0, 15, "t");
        rec.raw.args = [start, len, 0];
        rec.raw.locked_vm_before = 15;
        rec.raw.rlimit_memlock = 64 << 10;
        rec.raw.lock_context = RLIMIT_KNOWN | CAP_KNOWN;
        rec
    }

    #[test]
    fn a_failed_mlock_names_its_limit() {
        let figures = LockFigures::of(&failed_mlock(0x7f00_0000_1000, 16 << 10));
        assert_eq!(
            figures.describe(),
            "RLIMIT_MEMLOCK 64 KiB, 60 KiB locked, asked 16 KiB, no CAP_IPC_LOCK"
        );
        assert_eq!(figures.rlimit_memlock_bytes, Some(65_536));
        assert_eq!(figures.rlimit_memlock_unlimited, Some(false));
        assert_eq!(figures.cap_ipc_lock, Some(false));
    }

    #[test]
    fn asked_is_the_page_aligned_range() {
        // One byte straddling a page boundary is two pages.
        let figures = LockFigures::of(&failed_mlock(0x1fff, 2));
        assert_eq!(figures.asked_bytes, Some(2 * PAGE_SIZE));
        assert_eq!(
            LockFigures::of(&failed_mlock(0x1000, 0)).asked_bytes,
            Some(0)
        );
    }

    #[test]
    fn mlockall_asks_for_the_address_space_and_unknowns_stay_unknown() {
        let mut rec = SyscallRecord::fixture(Syscall::Mlockall, 7, -12, 1000, 0, 0, "t");
        rec.raw.args = [MCL_CURRENT, 0, 0];
        rec.raw.total_vm_before = 1000;
        rec.raw.lock_context = TOTAL_VM_KNOWN;
        let figures = LockFigures::of(&rec);
        assert_eq!(figures.asked_bytes, Some(1000 * PAGE_SIZE));
        assert_eq!(figures.rlimit_memlock_unlimited, None);
        assert_eq!(figures.cap_ipc_lock, None);
        assert_eq!(
            figures.describe(),
            "RLIMIT_MEMLOCK unknown, 0 B locked, asked 3.9 MiB"
        );
        rec.raw.args = [2, 0, 0];
        assert_eq!(LockFigures::of(&rec).asked_bytes, None, "MCL_FUTURE alone");
        rec.raw.rlimit_memlock = u64::MAX;
        rec.raw.lock_context =
            RLIMIT_KNOWN | CAP_KNOWN | memlock_trace_common::lock_context::CAP_IPC_LOCK;
        let figures = LockFigures::of(&rec);
        assert_eq!(figures.rlimit_memlock_bytes, None);
        assert_eq!(
            figures.describe(),
            "RLIMIT_MEMLOCK unlimited, 0 B locked, CAP_IPC_LOCK"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(65_536), "64 KiB");
        assert_eq!(size(3 << 19), "1.5 MiB");
        assert_eq!(size(8 << 30), "8 GiB");
        assert_eq!(size(1 << 60), "1 EiB");
    }
}
