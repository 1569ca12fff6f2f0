//! What user space knows about the CPU it traces on: the names the kernel gives its system
//! call functions. One file per architecture, picked by the target the tracer is built for
//! (the eBPF object's side is `memlock-trace-ebpf/src/arch/`), so a new architecture is a
//! new file here. System call numbers come from `libc::SYS_*`, which are the target's own.

#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use self::x86_64::*;

#[cfg(not(target_arch = "x86_64"))]
compile_error!("memlock-trace knows x86_64: add a file to memlock-trace/src/arch/");
