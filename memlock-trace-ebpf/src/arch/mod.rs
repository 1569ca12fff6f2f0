//! Everything the programs know about the CPU they run on: where `struct pt_regs` keeps a
//! system call's arguments and number and the user stack pointer, how a perf sample tells a
//! user-mode fault, where the user registers sit on the kernel stack, and how a 32-bit
//! (compat) task is told. One file per architecture, picked by aya-build's
//! `bpf_target_arch` (the loader's target), so a new architecture is a new file here.

#[cfg(bpf_target_arch = "aarch64")]
mod aarch64;
#[cfg(bpf_target_arch = "aarch64")]
pub use self::aarch64::*;

#[cfg(not(bpf_target_arch = "aarch64"))]
mod x86_64;
#[cfg(not(bpf_target_arch = "aarch64"))]
pub use self::x86_64::*;

/// The user registers a stack sample starts unwinding from.
#[derive(Clone, Copy)]
pub struct UserRegs {
    /// The instruction pointer (x86 `rip`, arm64 `pc`).
    pub ip: u64,
    pub sp: u64,
    /// The frame pointer (x86 `rbp`, arm64 `x29`).
    pub fp: u64,
    /// The link register (arm64 `x30`, the return address of a leaf); 0 on x86.
    pub lr: u64,
}
