//! Everything the programs know about the CPU they run on: where `struct pt_regs` keeps a
//! system call's arguments and number. One file per architecture, so a new architecture is
//! a new file here (and a `cfg` line below); user space's `memlock-trace/src/arch/` names
//! the kernel functions the per-call programs are attached to.

mod x86_64;
pub use self::x86_64::*;
