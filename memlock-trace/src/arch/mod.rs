//! What user space knows about the CPU it traces on: the names the kernel gives its system
//! call functions, framehop's unwinder and the registers a stack sample starts from, where
//! the kernel keeps a task's 32-bit (compat) state, and the hook sets that exist on one
//! architecture only. One file per architecture, picked by the target the tracer is built
//! for (the eBPF object is built for the same one: aya-build's `bpf_target_arch`, see
//! `memlock-trace-ebpf/src/arch/`), so a new architecture is a new file here. System call
//! numbers come from `libc::SYS_*`, which are the target's own.

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "aarch64")]
pub use self::aarch64::*;

#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use self::x86_64::*;

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("memlock-trace knows x86_64 and aarch64: add a file to memlock-trace/src/arch/");
