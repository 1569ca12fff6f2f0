//! What `-p PID` and `-t TID` name: the kernel filters by thread group, so a thread id given
//! to `-p` means its process, and a kernel thread (no user memory, no mlock calls, no user
//! page faults) is refused rather than traced to no effect.

use anyhow::Result;

use crate::UsageError;

/// `PF_KTHREAD` (include/linux/sched.h), in the flags of `/proc/PID/stat` (field 9).
const PF_KTHREAD: u64 = 0x0020_0000;

/// The process `-p pid` stands for: `pid` itself if it leads its thread group, else its
/// thread group, said on stderr. Kernel threads are refused (exit 2).
pub fn process_of(pid: u32) -> Result<u32> {
    refuse_kernel_thread("-p", pid)?;
    let tgid = tgid_of(pid).unwrap_or(pid);
    if tgid != pid {
        eprintln!(
            "memlock-trace: -p {pid} is a thread of pid {tgid}: tracing pid {tgid} \
             (use -t {pid} for that thread alone)"
        );
    }
    Ok(tgid)
}

/// Refuses (exit 2) a kernel thread given to `option`, saying why.
pub fn refuse_kernel_thread(option: &str, id: u32) -> Result<()> {
    if is_kernel_thread(id) {
        let comm = crate::procfs::read_comm(id).unwrap_or_default();
        return Err(UsageError(format!(
            "{option} {id} is a kernel thread ({comm}): it has no user memory, makes no \
             mlock-family calls and takes no user page faults, so there is nothing to trace"
        ))
        .into());
    }
    Ok(())
}

/// `Tgid:` of `/proc/ID/status` (readable for any thread id, listed or not).
pub fn tgid_of(id: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{id}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

fn is_kernel_thread(id: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{id}/stat"))
        .ok()
        .and_then(|stat| flags(&stat))
        .is_some_and(|f| f & PF_KTHREAD != 0)
}

/// Field 9 (`flags`) of a `/proc/PID/stat` line; the comm (field 2) may hold spaces and
/// parentheses, so fields are counted from its last `)`.
fn flags(stat: &str) -> Option<u64> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(6)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kthreadd_is_a_kernel_thread_and_we_are_not() {
        assert!(is_kernel_thread(2), "pid 2 is kthreadd");
        assert!(!is_kernel_thread(std::process::id()));
        let e = process_of(2).unwrap_err();
        assert!(e.downcast_ref::<UsageError>().is_some(), "{e:#}");
        assert!(e.to_string().contains("kernel thread"), "{e:#}");
    }

    #[test]
    fn flags_are_field_nine_even_with_odd_comms() {
        let stat = "42 (a b) c)) S 1 42 42 0 -1 4194560 100 0 0 0";
        assert_eq!(flags(stat), Some(4_194_560));
    }

    #[test]
    fn a_thread_id_stands_for_its_process() {
        let me = std::process::id();
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid takes no arguments and touches no memory.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            done_rx.recv().ok();
        });
        let tid = rx.recv().unwrap();
        assert_eq!(process_of(tid).unwrap(), me);
        assert_eq!(process_of(me).unwrap(), me);
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }
}
