//! The programs' own diagnostics (`-v`): which kernel fields a program failed to read.
//!
//! A failed read only sets the field's bit in its program's per-CPU [`ReadFailures`] slot (a
//! map value, which the verifier does not track, so a failure adds no verifier state that
//! later paths must be checked against); the program writes one aya-log record at its end
//! carrying the bits, and the loader turns them into field names with [`FIELDS`]. One table
//! for both sides, so they cannot disagree on what a bit means.

/// Name of the per-CPU `ReadFailures` array, one slot per [`program`].
pub const READ_FAILURES: &str = "DIAG_READ_FAILURES";

indices! {
    /// Slots of [`READ_FAILURES`]: the programs that read named kernel fields.
    pub mod program: u32, COUNT: u32 {
        SYS_ENTER_MLOCK,
        SYS_ENTER_MLOCK2,
        SYS_ENTER_MUNLOCK,
        SYS_ENTER_MLOCKALL,
        SYS_ENTER_MUNLOCKALL,
        SYS_EXIT_MLOCK_FAMILY,
        PROCESS_FORK,
        PROCESS_EXIT,
    }
}

indices! {
    /// Bits of [`ReadFailures::failed`] and [`ReadFailures::null_base`]: bit `i` is `FIELDS[i]`.
    pub mod field: u32, COUNT: usize {
        TASK_MM,
        TASK_MIN_FLT,
        TASK_MAJ_FLT,
        MM_LOCKED_VM,
        MM_MAP_COUNT,
        TASK_SIGNAL,
        SIGNAL_RLIM_MEMLOCK,
        TASK_CRED,
        CRED_CAP_EFFECTIVE,
        MM_TOTAL_VM,
        TASK_TGID,
        SIGNAL_LIVE,
    }
}

/// The field each bit stands for, as the kernel's sources name it.
pub const FIELDS: [&str; field::COUNT] = [
    "task_struct.mm",
    "task_struct.min_flt",
    "task_struct.maj_flt",
    "mm_struct.locked_vm",
    "mm_struct.map_count",
    "task_struct.signal",
    "signal_struct.rlim[RLIMIT_MEMLOCK]",
    "task_struct.cred",
    "cred.cap_effective",
    "mm_struct.total_vm",
    "task_struct.tgid",
    "signal_struct.live",
];

/// One program's failed reads on one CPU, since its last record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadFailures {
    /// Fields whose read failed (the helper returned an error).
    pub failed: u64,
    /// Fields not read because the struct holding them was NULL (an earlier pointer read
    /// gave 0, e.g. `task_struct.mm` of a task without an address space).
    pub null_base: u64,
    /// Non-zero once the current run of the program has had a failed read: cleared, and
    /// counted in `runs`, at its end.
    pub pending: u64,
    /// Runs of the program with at least one failed read, on this CPU.
    pub runs: u64,
}

/// The start of the record's text, up to the first number, as the eBPF side formats it:
/// `kernel reads failed: fields {:x}, NULL base {:x} ({} runs with a failure on this CPU)`.
pub const RECORD_PREFIX: &str = "kernel reads failed: fields ";

/// The names of the fields whose bits are set in `mask`, in table order (unknown bits as
/// `bit N`, should the two sides ever disagree).
pub fn field_names(mask: u64) -> impl Iterator<Item = FieldName> {
    (0..64u32)
        .filter(move |bit| mask & (1 << bit) != 0)
        .map(|bit| match FIELDS.get(bit as usize) {
            Some(name) => FieldName::Known(name),
            None => FieldName::Unknown(bit),
        })
}

/// A bit of a field mask, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldName {
    Known(&'static str),
    Unknown(u32),
}

impl core::fmt::Display for FieldName {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Known(name) => f.write_str(name),
            Self::Unknown(bit) => write!(f, "bit {bit}"),
        }
    }
}
