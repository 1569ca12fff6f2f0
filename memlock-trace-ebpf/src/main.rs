//! memlock-trace's kernel side: one module per hook family.
#![no_std]
#![no_main]
// Every `unsafe` block says why it is sound; clippy runs on this crate with `-D warnings`.
#![warn(clippy::undocumented_unsafe_blocks)]
// The BPF target's `core` has no atomic read-modify-write types (no compare-and-swap), but
// LLVM lowers an atomic add whose result is unused to BPF's atomic add: the intrinsic.
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "core::intrinsics::atomic_xadd, see above")]

mod arch;
// Only in the benchmark's build: the product carries no floor programs.
#[cfg(feature = "bench")]
mod bench;
mod capabilities;
mod diag;
mod faults;
mod kernel_walk;
mod mapping;
mod process;
mod rss;
mod shared;
mod stacks;
mod syscall_dispatch;
mod syscall_hooks;
mod syscalls;
mod vma;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any path that could reach here; no program can panic at run time.
    loop {}
}

/// GPL-compatible: `bpf_probe_read_kernel` and the ring buffer helpers are GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
