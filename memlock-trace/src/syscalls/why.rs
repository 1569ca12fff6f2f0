//! Why an mlock-family call failed: the figures the kernel checked it against, read in the
//! kernel at the call's entry (`RLIMIT_MEMLOCK`, `locked_vm`, `CAP_IPC_LOCK`, whether its
//! range was mapped) and the bytes the call asked for, so "ENOMEM" comes with the check that
//! failed.

use memlock_trace_common::{PAGE_MASK, PAGE_SIZE, lock_context};
use serde::Serialize;

use crate::event::{MCL_CURRENT, MCL_FUTURE, MCL_ONFAULT, MLOCK_ONFAULT, Syscall, SyscallRecord};

const EPERM: i64 = -1;
const EINTR: i64 = -4;
const EAGAIN: i64 = -11;
const ENOMEM: i64 = -12;
const EINVAL: i64 = -22;

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
    /// `mlock`, `mlock2`, `munlock`: whether every page of the range was mapped at entry;
    /// `None`: not checked (the mmap lock was busy, or the kernel lacks the lookup).
    pub range_mapped: Option<bool>,
    /// The first address of the range no VMA held at entry.
    pub first_unmapped: Option<u64>,
    /// A failed call: the kernel check that failed, as far as the figures tell (see
    /// [`FailedCheck`]); `None` for a call that succeeded.
    pub failed_check: Option<FailedCheck>,
    /// A failed `mlock`/`mlock2` that still raised `locked_vm`: the bytes it left locked
    /// (`apply_vma_lock_flags()` locks the VMAs before a hole, then fails; nothing undoes
    /// them). `None` for a call that succeeded or left nothing locked.
    pub left_locked_bytes: Option<u64>,
    /// Such a call's hole when the range was not looked up at entry: no lower than the
    /// start plus what it locked (each byte it locked lies before the hole).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hole_at_or_after: Option<u64>,
}

/// Which of the kernel's checks (mm/mlock.c) a failed call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailedCheck {
    /// `RLIMIT_MEMLOCK` would be exceeded, without `CAP_IPC_LOCK` (ENOMEM).
    Limit,
    /// A limit of 0 without `CAP_IPC_LOCK`: `can_do_mlock()` refuses any lock (EPERM).
    NoPermission,
    /// A page of the range is not mapped (ENOMEM, from `apply_vma_lock_flags()`).
    Unmapped,
    /// Mapped and within the limit, yet ENOMEM: populating it failed (`-EFAULT` turned into
    /// ENOMEM by `__mlock_posix_error_return()`).
    Populate,
    /// Populating ran out of memory (EAGAIN).
    OutOfMemory,
    /// Unknown flag bits (EINVAL).
    Flags,
    /// `start + len` wraps around (EINVAL).
    RangeWraps,
    /// A fatal signal while waiting for the mmap lock (EINTR).
    Interrupted,
    /// The figures read do not tell which.
    Unknown,
}

impl FailedCheck {
    fn describe(self, first_unmapped: Option<u64>) -> String {
        match self {
            Self::Limit => "over the limit".into(),
            Self::NoPermission => "a limit of 0 without CAP_IPC_LOCK".into(),
            Self::Unmapped => match first_unmapped {
                Some(addr) => format!("range not mapped at {addr:#x}"),
                None => "range not mapped".into(),
            },
            Self::Populate => "range mapped and within the limit, but populating it failed".into(),
            Self::OutOfMemory => "out of memory populating the range".into(),
            Self::Flags => "unknown flags".into(),
            Self::RangeWraps => "start + len wraps around".into(),
            Self::Interrupted => "interrupted waiting for the mmap lock".into(),
            Self::Unknown => String::new(),
        }
    }
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
        let ranged = matches!(
            rec.syscall,
            Syscall::Mlock | Syscall::Mlock2 | Syscall::Munlock
        );
        let range_mapped = (ranged && known(lock_context::RANGE_CHECKED))
            .then_some(!known(lock_context::RANGE_UNMAPPED));
        let mut figures = Self {
            rlimit_memlock_bytes: (unlimited == Some(false)).then_some(r.rlimit_memlock),
            rlimit_memlock_unlimited: unlimited,
            locked_bytes_before: r.locked_vm_before.saturating_mul(PAGE_SIZE),
            asked_bytes,
            cap_ipc_lock: known(lock_context::CAP_KNOWN)
                .then_some(known(lock_context::CAP_IPC_LOCK)),
            range_mapped,
            first_unmapped: (range_mapped == Some(false)).then_some(r.first_unmapped),
            failed_check: None,
            left_locked_bytes: None,
            hole_at_or_after: None,
        };
        if r.ret < 0 {
            let grew = rec.pages_locked();
            figures.left_locked_bytes = (matches!(rec.syscall, Syscall::Mlock | Syscall::Mlock2)
                && grew > 0)
                .then(|| grew.unsigned_abs().saturating_mul(PAGE_SIZE));
            figures.failed_check = Some(figures.check_failed(rec));
            if figures.failed_check == Some(FailedCheck::Unmapped)
                && figures.first_unmapped.is_none()
            {
                figures.hole_at_or_after = figures
                    .left_locked_bytes
                    .map(|left| (start & PAGE_MASK).saturating_add(left));
            }
        }
        figures
    }

    /// The check a failed call failed, in the kernel's order (`do_mlock()`, `do_mlockall()`).
    fn check_failed(&self, rec: &SyscallRecord) -> FailedCheck {
        let r = &rec.raw;
        let [start, len, flags] = r.args;
        // Over the limit without the capability: true, false, or unknown.
        let over_limit = match (self.cap_ipc_lock, self.rlimit_memlock_unlimited) {
            (Some(true), _) | (_, Some(true)) => Some(false),
            // mlockall compares the address space alone with the limit, mlock adds it to
            // what is locked already.
            (Some(false), Some(false)) => self.asked_bytes.map(|asked| {
                let locked = if rec.syscall == Syscall::Mlockall {
                    0
                } else {
                    self.locked_bytes_before
                };
                locked.saturating_add(asked) > self.rlimit_memlock_bytes.unwrap_or(0) & PAGE_MASK
            }),
            _ => None,
        };
        let no_permission =
            self.cap_ipc_lock == Some(false) && self.rlimit_memlock_bytes == Some(0);
        match (rec.syscall, r.ret) {
            (Syscall::Mlock2, EINVAL) if flags & !MLOCK_ONFAULT != 0 => FailedCheck::Flags,
            (Syscall::Mlockall, EINVAL)
                if start == 0
                    || start & !(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) != 0
                    || start == MCL_ONFAULT =>
            {
                FailedCheck::Flags
            }
            (Syscall::Mlock | Syscall::Mlock2 | Syscall::Munlock, EINVAL)
                if (start & PAGE_MASK).checked_add(len).is_none() =>
            {
                FailedCheck::RangeWraps
            }
            (Syscall::Mlock | Syscall::Mlock2 | Syscall::Mlockall, EPERM) if no_permission => {
                FailedCheck::NoPermission
            }
            (Syscall::Mlock | Syscall::Mlock2 | Syscall::Mlockall, ENOMEM)
                if over_limit == Some(true) =>
            {
                FailedCheck::Limit
            }
            (_, ENOMEM) if self.range_mapped == Some(false) => FailedCheck::Unmapped,
            // Not looked up at entry (more VMAs than the walk takes, or the mmap lock was
            // busy), yet the call locked some and failed: the limit check comes before any
            // locking (a call over it locks nothing), so `apply_vma_lock_flags()` met a hole
            // after the VMAs it locked, as for a range known to have one.
            (Syscall::Mlock | Syscall::Mlock2, ENOMEM)
                if self.range_mapped.is_none() && self.left_locked_bytes.is_some() =>
            {
                FailedCheck::Unmapped
            }
            (Syscall::Mlock | Syscall::Mlock2, ENOMEM)
                if self.range_mapped == Some(true) && over_limit == Some(false) =>
            {
                FailedCheck::Populate
            }
            (Syscall::Mlock | Syscall::Mlock2, EAGAIN) => FailedCheck::OutOfMemory,
            (_, EINTR) => FailedCheck::Interrupted,
            _ => FailedCheck::Unknown,
        }
    }

    /// `over the limit: RLIMIT_MEMLOCK 64 KiB, 60 KiB locked, asked 16 KiB, no
    /// CAP_IPC_LOCK`: the failed check when the figures tell it, then the figures.
    pub fn describe(&self) -> String {
        let figures = self.figures();
        match (self.failed_check, self.left_locked_bytes) {
            // The hole, and what the call left locked before it.
            (Some(FailedCheck::Unmapped), Some(left)) => {
                let hole = match (self.first_unmapped, self.hole_at_or_after) {
                    (Some(addr), _) => format!("at {addr:#x}"),
                    (None, Some(addr)) => format!("at or after {addr:#x}"),
                    (None, None) => "(not looked up at entry)".into(),
                };
                format!(
                    "a hole in the range {hole}: left {} locked before the hole; {figures}",
                    size(left)
                )
            }
            (Some(check), left) if check != FailedCheck::Unknown => {
                let left = left.map_or_else(String::new, |b| format!(" (left {} locked)", size(b)));
                format!("{}{left}: {figures}", check.describe(self.first_unmapped))
            }
            (_, Some(left)) => format!("left {} locked; {figures}", size(left)),
            _ => figures,
        }
    }

    /// `RLIMIT_MEMLOCK 64 KiB, 60 KiB locked, asked 16 KiB, no CAP_IPC_LOCK`; figures not
    /// read are left out (or said to be unknown, for the limit).
    fn figures(&self) -> String {
        let limit = match (self.rlimit_memlock_unlimited, self.rlimit_memlock_bytes) {
            (Some(true), _) => "unlimited".to_string(),
            (Some(false), Some(bytes)) => size(bytes),
            _ => "unknown".to_string(),
        };
        // With CAP_IPC_LOCK the limit is not checked: said first, so that its figure is not
        // read as the cause.
        if self.cap_ipc_lock == Some(true) {
            let mut parts = vec![
                format!("CAP_IPC_LOCK, so no limit applies (RLIMIT_MEMLOCK {limit})"),
                format!("{} locked before", size(self.locked_bytes_before)),
            ];
            if let Some(asked) = self.asked_bytes {
                parts.push(format!("asked {}", size(asked)));
            }
            return parts.join(", ");
        }
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

/// Sizes as every family shows them (kept here under its old name for its callers).
pub use crate::output::size;

#[cfg(test)]
mod tests {
    use memlock_trace_common::lock_context::{
        CAP_IPC_LOCK, CAP_KNOWN, RLIMIT_KNOWN, TOTAL_VM_KNOWN,
    };

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
            "over the limit: RLIMIT_MEMLOCK 64 KiB, 60 KiB locked, asked 16 KiB, no CAP_IPC_LOCK"
        );
        assert_eq!(figures.failed_check, Some(FailedCheck::Limit));
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
            "CAP_IPC_LOCK, so no limit applies (RLIMIT_MEMLOCK unlimited), 0 B locked before"
        );
    }

    #[test]
    fn an_unmapped_range_is_not_blamed_on_the_limit() {
        // mlock(0x10000, 4096) with CAP_IPC_LOCK, the range not mapped at entry.
        let mut rec = failed_mlock(0x10000, 4096);
        rec.raw.locked_vm_before = 0;
        rec.raw.locked_vm_after = 0;
        rec.raw.rlimit_memlock = 8 << 20;
        rec.raw.lock_context = RLIMIT_KNOWN
            | CAP_KNOWN
            | CAP_IPC_LOCK
            | lock_context::RANGE_CHECKED
            | lock_context::RANGE_UNMAPPED;
        rec.raw.first_unmapped = 0x10000;
        let figures = LockFigures::of(&rec);
        assert_eq!(figures.failed_check, Some(FailedCheck::Unmapped));
        assert_eq!(figures.range_mapped, Some(false));
        assert_eq!(
            figures.describe(),
            "range not mapped at 0x10000: CAP_IPC_LOCK, so no limit applies (RLIMIT_MEMLOCK \
             8 MiB), 0 B locked before, asked 4 KiB"
        );
        // Over the limit too: the kernel checks the limit first.
        rec.raw.lock_context &= !CAP_IPC_LOCK;
        rec.raw.rlimit_memlock = 0x1000 - 1;
        assert_eq!(LockFigures::of(&rec).failed_check, Some(FailedCheck::Limit));
        // Mapped and within the limit: the populate step failed.
        let mut mapped = failed_mlock(0x10000, 4096);
        mapped.raw.locked_vm_before = 0;
        mapped.raw.locked_vm_after = 0;
        mapped.raw.lock_context |= lock_context::RANGE_CHECKED;
        assert_eq!(
            LockFigures::of(&mapped).failed_check,
            Some(FailedCheck::Populate)
        );
        // Within the limit but not checked (lock busy): only the figures.
        let mut unchecked = failed_mlock(0x10000, 4096);
        unchecked.raw.locked_vm_before = 0;
        unchecked.raw.locked_vm_after = 0;
        let figures = LockFigures::of(&unchecked);
        assert_eq!(figures.range_mapped, None);
        assert_eq!(figures.failed_check, Some(FailedCheck::Unknown));
        assert!(figures.describe().starts_with("RLIMIT_MEMLOCK 64 KiB"));
    }

    #[test]
    fn einval_eperm_and_mlockall_say_their_check() {
        let mut rec = failed_mlock(0x1000, 4096);
        rec.syscall = Syscall::Mlock2;
        rec.raw.ret = EINVAL;
        rec.raw.args[2] = 0x8;
        assert_eq!(LockFigures::of(&rec).failed_check, Some(FailedCheck::Flags));
        rec.raw.args = [0xffff_ffff_ffff_f000, 0x2000, 0];
        assert_eq!(
            LockFigures::of(&rec).failed_check,
            Some(FailedCheck::RangeWraps)
        );
        let mut zero = failed_mlock(0x1000, 4096);
        zero.raw.ret = EPERM;
        zero.raw.rlimit_memlock = 0;
        assert_eq!(
            LockFigures::of(&zero).describe(),
            "a limit of 0 without CAP_IPC_LOCK: RLIMIT_MEMLOCK 0 B, 60 KiB locked, asked 4 KiB, no CAP_IPC_LOCK"
        );
        // mlockall(MCL_CURRENT): the address space alone against the limit.
        let mut all = SyscallRecord::fixture(Syscall::Mlockall, 7, ENOMEM, 1000, 0, 0, "t");
        all.raw.args = [MCL_CURRENT, 0, 0];
        all.raw.total_vm_before = 17;
        all.raw.locked_vm_before = 0;
        all.raw.rlimit_memlock = 64 << 10;
        all.raw.lock_context = RLIMIT_KNOWN | CAP_KNOWN | TOTAL_VM_KNOWN;
        assert_eq!(LockFigures::of(&all).failed_check, Some(FailedCheck::Limit));
        all.raw.ret = EINVAL;
        all.raw.args = [MCL_ONFAULT, 0, 0];
        assert_eq!(LockFigures::of(&all).failed_check, Some(FailedCheck::Flags));
    }

    /// mlock(addr, 1 TiB) as root over 12 MiB mapped, then a hole: apply_vma_lock_flags()
    /// locks the 12 MiB, then fails with ENOMEM (issue 47 point 5).
    fn past_a_hole(checked: bool) -> SyscallRecord {
        let mut rec = failed_mlock(0x7f00_0000_0000, 1 << 40);
        rec.raw.locked_vm_before = 0;
        rec.raw.locked_vm_after = 3072;
        rec.raw.rlimit_memlock = 8 << 20;
        rec.raw.lock_context = RLIMIT_KNOWN | CAP_KNOWN | CAP_IPC_LOCK;
        if checked {
            rec.raw.lock_context |= lock_context::RANGE_CHECKED | lock_context::RANGE_UNMAPPED;
            rec.raw.first_unmapped = 0x7f00_00c0_0000;
        }
        rec
    }

    #[test]
    fn a_failed_mlock_past_a_hole_names_the_hole_and_what_it_left_locked() {
        let figures = LockFigures::of(&past_a_hole(true));
        assert_eq!(figures.failed_check, Some(FailedCheck::Unmapped));
        assert_eq!(figures.left_locked_bytes, Some(12 << 20));
        assert_eq!(
            figures.describe(),
            "a hole in the range at 0x7f0000c00000: left 12 MiB locked before the hole; \
             CAP_IPC_LOCK, so no limit applies (RLIMIT_MEMLOCK 8 MiB), 0 B locked before, \
             asked 1 TiB"
        );
        // Not looked up at entry: what it locked still tells the hole, and where it can be.
        let figures = LockFigures::of(&past_a_hole(false));
        assert_eq!(figures.failed_check, Some(FailedCheck::Unmapped));
        assert_eq!(figures.hole_at_or_after, Some(0x7f00_00c0_0000));
        assert!(
            figures
                .describe()
                .starts_with("a hole in the range at or after 0x7f0000c00000: left 12 MiB"),
            "{}",
            figures.describe()
        );
        // A call that locked nothing is not said to have left anything.
        let mut none = past_a_hole(false);
        none.raw.locked_vm_after = 0;
        let figures = LockFigures::of(&none);
        assert_eq!(figures.left_locked_bytes, None);
        assert_eq!(figures.failed_check, Some(FailedCheck::Unknown));
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
