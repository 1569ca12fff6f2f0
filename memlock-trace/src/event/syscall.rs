//! The mlock family's records: names, numbers, argument and flag decoding, errno names, and
//! the decoded [`SyscallEvent`].

use std::fmt::Write as _;

use memlock_trace_common::{SyscallEvent, lock_context, process::ProcessKey};

use super::{comm_of, comm_str};
use crate::output::Outside;

/// A traced system call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Syscall {
    Mlock,
    Mlock2,
    Munlock,
    Mlockall,
    Munlockall,
}

// Not in every libc release's constants yet; values from include/uapi/asm-generic/mman-common.h
// and include/uapi/asm-generic/mman.h.
pub const MLOCK_ONFAULT: u64 = 0x01;
pub const MCL_CURRENT: u64 = 1;
pub const MCL_FUTURE: u64 = 2;
pub const MCL_ONFAULT: u64 = 4;

impl Syscall {
    pub const ALL: [Syscall; 5] = [
        Syscall::Mlock,
        Syscall::Mlock2,
        Syscall::Munlock,
        Syscall::Mlockall,
        Syscall::Munlockall,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Syscall::Mlock => "mlock",
            Syscall::Mlock2 => "mlock2",
            Syscall::Munlock => "munlock",
            Syscall::Mlockall => "mlockall",
            Syscall::Munlockall => "munlockall",
        }
    }

    /// This architecture's number for the call (`__syscall_nr` in the tracepoint record).
    pub fn nr(self) -> u32 {
        let nr = match self {
            Syscall::Mlock => libc::SYS_mlock,
            Syscall::Mlock2 => libc::SYS_mlock2,
            Syscall::Munlock => libc::SYS_munlock,
            Syscall::Mlockall => libc::SYS_mlockall,
            Syscall::Munlockall => libc::SYS_munlockall,
        };
        nr as u32
    }

    pub fn from_nr(nr: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.nr() == nr)
    }

    /// `mlock(0x7f12..., 65536)`, with flags spelled out.
    pub fn describe(self, args: [u64; 3]) -> String {
        let [a0, a1, a2] = args;
        match self {
            Syscall::Mlock | Syscall::Munlock => format!("{}({a0:#x}, {a1})", self.name()),
            Syscall::Mlock2 => format!("mlock2({a0:#x}, {a1}, {})", mlock2_flags(a2)),
            Syscall::Mlockall => format!("mlockall({})", mlockall_flags(a0)),
            Syscall::Munlockall => "munlockall()".into(),
        }
    }
}

/// `PROT_READ|PROT_WRITE`, `MAP_PRIVATE|0x40000`: the bits of `flags` named by `known`, the
/// rest in hex (`0` when none is set).
pub fn flag_names(flags: u64, known: &[(u64, &str)]) -> String {
    if flags == 0 {
        return "0".into();
    }
    let mut out = String::new();
    let mut rest = flags;
    for &(bit, name) in known {
        if flags & bit != 0 {
            if !out.is_empty() {
                out.push('|');
            }
            out.push_str(name);
            rest &= !bit;
        }
    }
    if rest != 0 {
        if !out.is_empty() {
            out.push('|');
        }
        let _ = write!(out, "{rest:#x}");
    }
    out
}

pub fn mlock2_flags(flags: u64) -> String {
    flag_names(flags, &[(MLOCK_ONFAULT, "MLOCK_ONFAULT")])
}

pub fn mlockall_flags(flags: u64) -> String {
    flag_names(
        flags,
        &[
            (MCL_CURRENT, "MCL_CURRENT"),
            (MCL_FUTURE, "MCL_FUTURE"),
            (MCL_ONFAULT, "MCL_ONFAULT"),
        ],
    )
}

/// `ENOMEM` for a return value of `-12`; `None` for success.
pub fn errno_name(ret: i64) -> Option<String> {
    if ret >= 0 {
        return None;
    }
    let errno = i32::try_from(-ret).unwrap_or(i32::MAX);
    match nix::errno::Errno::from_raw(errno) {
        nix::errno::Errno::UnknownErrno => Some(format!("errno {errno}")),
        known => Some(format!("{known:?}")),
    }
}

/// A [`SyscallEvent`] with its number resolved to a [`Syscall`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyscallRecord {
    pub syscall: Syscall,
    pub raw: SyscallEvent,
}

impl SyscallRecord {
    /// The process's name as a lossy string, for Prometheus labels; text and JSON use
    /// [`Self::name`].
    pub fn comm(&self) -> String {
        comm_str(&self.raw.comm)
    }

    /// The name the task had at the event (its comm), as outside text.
    pub fn name(&self) -> Outside {
        comm_of(&self.raw.comm)
    }

    /// Base pages the call populated: the growth of the process's RSS and hugetlb pages,
    /// whatever their size; where the kernel's counters could not be read, its faults.
    pub fn pages_populated(&self) -> u64 {
        match self.pages_mapped() {
            Some(pages) => pages.max(0).unsigned_abs(),
            None => self.faults_populated(),
        }
    }

    /// Growth of the base pages the process had mapped across the call (negative if
    /// another thread unmapped meanwhile), if read.
    pub fn pages_mapped(&self) -> Option<i64> {
        (self.raw.lock_context & lock_context::PAGES_MAPPED_KNOWN != 0)
            .then_some(self.raw.pages_mapped)
    }

    /// The faults the kernel took on the task's behalf during the call: one per page, or
    /// per huge page.
    pub fn faults_populated(&self) -> u64 {
        self.raw.min_flt + self.raw.maj_flt
    }

    /// Change of `mm->locked_vm` across the call, in pages (negative for unlocks).
    pub fn pages_locked(&self) -> i64 {
        self.raw
            .locked_vm_after
            .wrapping_sub(self.raw.locked_vm_before) as i64
    }
}

impl SyscallRecord {
    /// The calling process, for its whole life.
    pub fn process(&self) -> ProcessKey {
        ProcessKey {
            tgid: self.raw.tgid,
            _pad: 0,
            start_ns: self.raw.process_start_ns,
        }
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
                kind: memlock_trace_common::EventKind::Syscall as u32,
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
#[cfg(test)]
mod tests {
    use super::*;

    /// The programs on the raw syscall tracepoints dispatch on their own copy of the numbers.
    #[test]
    fn the_programs_numbers_are_this_architectures() {
        use memlock_trace_common::syscalls::nr;
        let programs = [
            nr::MLOCK,
            nr::MLOCK2,
            nr::MUNLOCK,
            nr::MLOCKALL,
            nr::MUNLOCKALL,
        ];
        assert_eq!(Syscall::ALL.map(Syscall::nr), programs);
    }

    #[test]
    fn numbers_round_trip() {
        for s in Syscall::ALL {
            assert_eq!(Syscall::from_nr(s.nr()), Some(s));
        }
        assert_eq!(Syscall::from_nr(0), None);
    }

    #[test]
    fn flags_are_spelled_out() {
        assert_eq!(mlockall_flags(3), "MCL_CURRENT|MCL_FUTURE");
        assert_eq!(mlockall_flags(7), "MCL_CURRENT|MCL_FUTURE|MCL_ONFAULT");
        assert_eq!(mlockall_flags(0x10 | 1), "MCL_CURRENT|0x10");
        assert_eq!(mlock2_flags(1), "MLOCK_ONFAULT");
        assert_eq!(mlock2_flags(0), "0");
        assert_eq!(MCL_ONFAULT, libc::MCL_ONFAULT as u64);
    }

    #[test]
    fn errno_names() {
        assert_eq!(errno_name(0), None);
        assert_eq!(errno_name(-12).as_deref(), Some("ENOMEM"));
        assert_eq!(errno_name(-1).as_deref(), Some("EPERM"));
        assert_eq!(errno_name(-11).as_deref(), Some("EAGAIN"));
    }

    #[test]
    fn describe_calls() {
        assert_eq!(
            Syscall::Mlock2.describe([0x1000, 4096, 1]),
            "mlock2(0x1000, 4096, MLOCK_ONFAULT)"
        );
        assert_eq!(Syscall::Munlockall.describe([0; 3]), "munlockall()");
    }
}
