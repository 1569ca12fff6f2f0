//! What the shared types know about the CPU: the numbers of the mlock-family calls, which
//! the programs on the raw syscall tracepoints dispatch on (the loader's own come from
//! `libc`, and a test checks the two agree). One module per architecture; the eBPF build
//! knows its architecture by aya-build's `bpf_target_arch`, user space by its target's.

/// x86-64's numbers (arch/x86/entry/syscalls/syscall_64.tbl).
#[cfg(not(any(bpf_target_arch = "aarch64", target_arch = "aarch64")))]
pub mod syscall_nr {
    pub const MLOCK: u32 = 149;
    pub const MUNLOCK: u32 = 150;
    pub const MLOCKALL: u32 = 151;
    pub const MUNLOCKALL: u32 = 152;
    pub const MLOCK2: u32 = 325;
}

/// arm64's numbers (include/uapi/asm-generic/unistd.h).
#[cfg(any(bpf_target_arch = "aarch64", target_arch = "aarch64"))]
pub mod syscall_nr {
    pub const MLOCK: u32 = 228;
    pub const MUNLOCK: u32 = 229;
    pub const MLOCKALL: u32 = 230;
    pub const MUNLOCKALL: u32 = 231;
    pub const MLOCK2: u32 = 284;
}
