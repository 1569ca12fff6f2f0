//! What differs between the guests' architectures, in one place: the emulator and its
//! machine, the serial console, Debian's name for the architecture, and where a guest's
//! userland comes from. An x86_64 guest runs this machine's own binaries and libraries; an
//! aarch64 guest runs cross-built ones with the arm64 glibc of `libc6-arm64-cross` and an
//! arm64 busybox fetched with its kernel.

/// The architecture a guest emulates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestArch {
    X86_64,
    Aarch64,
}

impl GuestArch {
    /// The Rust target to cross-build for, `None` where this machine's own build runs.
    pub fn rust_target(self) -> Option<&'static str> {
        match self {
            Self::X86_64 => None,
            Self::Aarch64 => Some("aarch64-unknown-linux-gnu"),
        }
    }

    /// The C compiler for this architecture's programs (Debian's cross gcc, which
    /// `cargo xtask dist --target` and the test stage install).
    pub fn gcc(self) -> &'static str {
        match self {
            Self::X86_64 => "gcc",
            Self::Aarch64 => "aarch64-linux-gnu-gcc",
        }
    }

    /// The hooks a guest of this architecture exists to exercise, which its `probe` must
    /// find. Debian 12's arm64 kernel has no ftrace direct calls (6.4), so no trampolines:
    /// kprobes are what every arm64 guest has (test:probe checks fentry by kernel version).
    pub fn hooks_needed(self) -> &'static [&'static str] {
        match self {
            Self::X86_64 => &["fentry", "kprobe"],
            Self::Aarch64 => &["kprobe"],
        }
    }

    /// Debian's name, as in `linux-image-cloud-arm64`.
    pub(super) fn debian(self) -> &'static str {
        match self {
            Self::X86_64 => "amd64",
            Self::Aarch64 => "arm64",
        }
    }

    /// The host package providing [`Self::qemu`].
    pub(super) fn qemu_package(self) -> &'static str {
        match self {
            Self::X86_64 => "qemu-system-x86",
            Self::Aarch64 => "qemu-system-arm",
        }
    }

    pub(super) fn qemu(self) -> &'static str {
        match self {
            Self::X86_64 => "qemu-system-x86_64",
            Self::Aarch64 => "qemu-system-aarch64",
        }
    }

    /// The machine and CPU. arm64: qemu's generic `virt` board; `max` has pointer
    /// authentication (the unwinder strips its bits from return addresses), computed with
    /// qemu's own cheap algorithm rather than QARMA, which costs emulation dearly.
    pub(super) fn machine(self) -> &'static [&'static str] {
        match self {
            Self::X86_64 => &["-cpu", "max"],
            Self::Aarch64 => &["-M", "virt", "-cpu", "max,pauth-impdef=on"],
        }
    }

    /// The kernel's name for the serial console qemu puts on its stdout.
    pub(super) fn console(self) -> &'static str {
        match self {
            Self::X86_64 => "ttyS0",
            Self::Aarch64 => "ttyAMA0",
        }
    }

    /// Strips the DWARF of a binary of this architecture.
    pub(super) fn strip(self) -> &'static str {
        match self {
            Self::X86_64 => "strip",
            Self::Aarch64 => "aarch64-linux-gnu-strip",
        }
    }

    /// This machine's static busybox where the guest can run it as is; `None`: the guest's
    /// own is fetched with its kernel.
    pub(super) fn host_busybox(self) -> Option<&'static str> {
        match self {
            Self::X86_64 => Some("/bin/busybox"),
            Self::Aarch64 => None,
        }
    }

    /// Where the guest's shared libraries come from: `None`, this machine's (`ldd`
    /// resolves them); else the cross glibc's directory, searched for each `NEEDED` entry.
    pub(super) fn cross_libraries(self) -> Option<&'static str> {
        match self {
            Self::X86_64 => None,
            Self::Aarch64 => Some("/usr/aarch64-linux-gnu/lib"),
        }
    }
}
