//! Base pages populated by a call, from the kernel's RSS counters (see
//! `memlock_trace_common::rss`): the loader's side, which tells the programs where the
//! counters are and, where they are per-CPU (6.2 on), has every CPU's per-CPU offset learnt
//! before any call is traced.

use std::os::fd::{AsFd as _, AsRawFd as _};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{Ebpf, EbpfLoader, maps::Array, programs::RawTracePoint};
use memlock_trace_common::rss::{CPU_OFFLINE, RssConfig, layout, names};

use crate::btf::KernelBtf;

const LEARN_PROGRAM: &str = "rss_learn_cpu";

/// This kernel's counters, for every possible CPU.
pub fn config(btf: &KernelBtf) -> RssConfig {
    let cpus = aya::util::nr_cpus().map_or(u32::MAX, |n| u32::try_from(n).unwrap_or(u32::MAX));
    btf.rss_config(cpus)
}

pub fn prepare_loader<'a>(loader: &mut EbpfLoader<'a>, config: &'a RssConfig) {
    loader.override_global(names::RSS_CONFIG, config, true);
}

/// Runs the learning program once on every online CPU. An error leaves the figure unknown:
/// the calls are traced all the same, with their faults standing in for pages.
pub fn learn_cpu_offsets(ebpf: &mut Ebpf, config: &RssConfig) -> Result<()> {
    match config.layout {
        layout::ATOMIC => return Ok(()),
        layout::PERCPU => {}
        _ => bail!("this kernel's mm_struct.rss_stat is of no layout known here"),
    }
    let program: &mut RawTracePoint = ebpf
        .program_mut(LEARN_PROGRAM)
        .ok_or_else(|| anyhow!("program {LEARN_PROGRAM} missing"))?
        .try_into()?;
    program.load().context("loading rss_learn_cpu")?;
    let fd = program.fd()?.as_fd().as_raw_fd();
    let online = aya::util::online_cpus().map_err(|(what, e)| anyhow!("{what}: {e}"))?;
    for &cpu in &online {
        test_run_on_cpu(fd, cpu).with_context(|| format!("learning CPU {cpu}'s per-CPU offset"))?;
    }
    let mut offsets: Array<_, u64> = Array::try_from(
        ebpf.map_mut(names::RSS_CPU_OFFSETS)
            .ok_or_else(|| anyhow!("map {} missing", names::RSS_CPU_OFFSETS))?,
    )?;
    for cpu in 0..config.nr_cpus {
        if online.contains(&cpu) {
            let offset = offsets
                .get(&cpu, 0)
                .context("reading a learnt per-CPU offset")?;
            if offset == 0 {
                bail!("CPU {cpu}'s per-CPU offset was not learnt (BPF_PROG_TEST_RUN ran)");
            }
        } else {
            offsets
                .set(cpu, CPU_OFFLINE, 0)
                .context("marking an offline CPU")?;
        }
    }
    Ok(())
}

/// `BPF_PROG_TEST_RUN` of a raw tracepoint program on `cpu` (`BPF_F_TEST_RUN_ON_CPU`, 5.10).
fn test_run_on_cpu(prog_fd: i32, cpu: u32) -> Result<()> {
    const BPF_PROG_TEST_RUN: libc::c_long = 10;
    const BPF_F_TEST_RUN_ON_CPU: u32 = 1;
    /// The `test` member of `union bpf_attr` (include/uapi/linux/bpf.h), up to `cpu`.
    #[repr(C)]
    #[derive(Default)]
    struct TestRun {
        prog_fd: u32,
        retval: u32,
        data_size_in: u32,
        data_size_out: u32,
        data_in: u64,
        data_out: u64,
        repeat: u32,
        duration: u32,
        ctx_size_in: u32,
        ctx_size_out: u32,
        ctx_in: u64,
        ctx_out: u64,
        flags: u32,
        cpu: u32,
        batch_size: u32,
        _pad: u32,
    }
    let attr = TestRun {
        prog_fd: u32::try_from(prog_fd)?,
        flags: BPF_F_TEST_RUN_ON_CPU,
        cpu,
        ..TestRun::default()
    };
    // SAFETY: `attr` is a valid, initialised `bpf_attr.test` of the size passed; the kernel
    // reads it and writes `retval`/`duration` back into it, nothing else.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &raw const attr,
            size_of::<TestRun>(),
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error()).context("BPF_PROG_TEST_RUN");
    }
    Ok(())
}
