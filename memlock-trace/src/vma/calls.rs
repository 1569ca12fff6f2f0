//! The calls outside the mlock family that change VMAs, as strace writes them: each with
//! the arguments it has (`munmap(0x7f.., 16384)`, not a third register it never reads),
//! protections and advice by name. The kernel side keeps a call's first three arguments;
//! a call with more shows those and `...`.

use memlock_trace_common::vma::NR_UNKNOWN;

use crate::event::{Syscall, flag_names};

/// `mprotect(0x7f.., 4096, PROT_READ)`: a syscall number with its first arguments.
pub fn syscall_str(nr: u32, args: [u64; 3]) -> String {
    if nr == NR_UNKNOWN {
        return "(no syscall: page fault or kernel)".into();
    }
    if let Some(s) = Syscall::from_nr(nr) {
        return s.describe(args);
    }
    let [a0, a1, a2] = args;
    let Some(name) = syscall_name(nr) else {
        // Unknown arity: the three kept, as raw values.
        return format!("syscall {nr}({a0:#x}, {a1:#x}, {a2:#x}, ...)");
    };
    match name {
        "munmap" => format!("munmap({a0:#x}, {a1})"),
        "mprotect" => format!("mprotect({a0:#x}, {a1}, {})", prot(a2)),
        "madvise" => format!("madvise({a0:#x}, {a1}, {})", advice(a2)),
        "mmap" => format!("mmap({a0:#x}, {a1}, {}, ...)", prot(a2)),
        "mremap" => format!("mremap({a0:#x}, {a1}, {a2}, ...)"),
        "brk" => format!("brk({a0:#x})"),
        "clone3" => format!("clone3({a0:#x}, {a1})"),
        "exit_group" => format!("exit_group({})", a0 as i32),
        // clone's order differs per architecture, execve's are pointers: named only.
        other => format!("{other}(...)"),
    }
}

/// The syscall's name alone (`munmap`), for events whose arguments are a kernel
/// function's, not the call's.
pub fn syscall_only(nr: u32) -> String {
    if nr == NR_UNKNOWN {
        return "(no syscall: page fault or kernel)".into();
    }
    Syscall::from_nr(nr)
        .map(Syscall::name)
        .or_else(|| syscall_name(nr))
        .map_or_else(|| format!("syscall {nr}"), str::to_string)
}

/// Names of the other calls that change VMAs (this architecture's numbers, via libc).
fn syscall_name(nr: u32) -> Option<&'static str> {
    let nr = i64::from(nr);
    Some(match nr {
        n if n == libc::SYS_mmap => "mmap",
        n if n == libc::SYS_munmap => "munmap",
        n if n == libc::SYS_mprotect => "mprotect",
        n if n == libc::SYS_madvise => "madvise",
        n if n == libc::SYS_mremap => "mremap",
        n if n == libc::SYS_brk => "brk",
        n if n == libc::SYS_clone => "clone",
        n if n == libc::SYS_clone3 => "clone3",
        n if n == libc::SYS_execve => "execve",
        n if n == libc::SYS_exit_group => "exit_group",
        _ => return None,
    })
}

/// `PROT_READ|PROT_WRITE`, `PROT_NONE`.
fn prot(p: u64) -> String {
    if p == 0 {
        return "PROT_NONE".into();
    }
    flag_names(
        p,
        &[
            (libc::PROT_READ as u64, "PROT_READ"),
            (libc::PROT_WRITE as u64, "PROT_WRITE"),
            (libc::PROT_EXEC as u64, "PROT_EXEC"),
        ],
    )
}

/// `MADV_DONTNEED`, as strace names the advice (a number it does not know as is).
fn advice(a: u64) -> String {
    let name = match i32::try_from(a).unwrap_or(-1) {
        libc::MADV_NORMAL => "MADV_NORMAL",
        libc::MADV_RANDOM => "MADV_RANDOM",
        libc::MADV_SEQUENTIAL => "MADV_SEQUENTIAL",
        libc::MADV_WILLNEED => "MADV_WILLNEED",
        libc::MADV_DONTNEED => "MADV_DONTNEED",
        libc::MADV_FREE => "MADV_FREE",
        libc::MADV_REMOVE => "MADV_REMOVE",
        libc::MADV_DONTFORK => "MADV_DONTFORK",
        libc::MADV_DOFORK => "MADV_DOFORK",
        libc::MADV_MERGEABLE => "MADV_MERGEABLE",
        libc::MADV_UNMERGEABLE => "MADV_UNMERGEABLE",
        libc::MADV_HUGEPAGE => "MADV_HUGEPAGE",
        libc::MADV_NOHUGEPAGE => "MADV_NOHUGEPAGE",
        libc::MADV_DONTDUMP => "MADV_DONTDUMP",
        libc::MADV_DODUMP => "MADV_DODUMP",
        libc::MADV_WIPEONFORK => "MADV_WIPEONFORK",
        libc::MADV_KEEPONFORK => "MADV_KEEPONFORK",
        libc::MADV_COLD => "MADV_COLD",
        libc::MADV_PAGEOUT => "MADV_PAGEOUT",
        libc::MADV_POPULATE_READ => "MADV_POPULATE_READ",
        libc::MADV_POPULATE_WRITE => "MADV_POPULATE_WRITE",
        _ => return a.to_string(),
    };
    name.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_call_has_its_own_arguments() {
        let nr = |n: i64| u32::try_from(n).unwrap();
        assert_eq!(
            syscall_str(nr(libc::SYS_munmap), [0x7f3c_df3b_e000, 16384, 0x4000]),
            "munmap(0x7f3cdf3be000, 16384)"
        );
        assert_eq!(
            syscall_str(nr(libc::SYS_mprotect), [0x1000, 4096, 3]),
            "mprotect(0x1000, 4096, PROT_READ|PROT_WRITE)"
        );
        assert_eq!(
            syscall_str(nr(libc::SYS_madvise), [0x1000, 4096, 4]),
            "madvise(0x1000, 4096, MADV_DONTNEED)"
        );
        assert_eq!(
            syscall_str(nr(libc::SYS_mmap), [0, 65536, 0]),
            "mmap(0x0, 65536, PROT_NONE, ...)"
        );
        assert_eq!(
            syscall_str(nr(libc::SYS_brk), [0x5000, 7, 9]),
            "brk(0x5000)"
        );
        assert_eq!(syscall_only(nr(libc::SYS_munmap)), "munmap");
    }
}
