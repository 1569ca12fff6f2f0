//! verify's memory-pressure step: a locked and an unlocked region of equal size in a memory
//! cgroup below what they and a fourth allocation need, with swap. Under the pressure the
//! locked region stays resident (smaps `Swap` 0, the cgroup's `unevictable` holding it) and
//! the other goes out; munlock leaves the pages where they are, and the same pressure then
//! pushes them out too. The regions are aged alike first, as the memory-pressure scenario
//! does (see [`crate::lab::workload::memory_pressure`]).

use std::{path::PathBuf, sync::OnceLock};

use anyhow::{Context as _, Result};

use super::{
    ExpectCalls, PressureExpect,
    scenarios::{N, RW, Y, calls, no_calls},
    subject::Subject,
};
use crate::lab::{
    pressure::{Pressure, cgroup::stat_lag_kb},
    workload::{
        Region,
        memory_pressure::{madvise_cold, squeeze},
    },
};

pub(super) const NAME: &str = "memory-pressure";

/// Each region's size, the cgroup's limit and the pressure, in MiB: small, for the emulated
/// guests, and as the scenario's `--tiny` sizes.
const REGION_MIB: u64 = 8;
const LIMIT_MIB: u64 = 48;
const PRESSURE_MIB: usize = 96;

/// The cgroup the subject moves into, set by [`Environment::set_up`] before it is forked.
static CGROUP: OnceLock<PathBuf> = OnceLock::new();

/// The swap and the cgroup, held by the verifier while the subject runs.
pub(super) struct Environment(
    #[expect(
        dead_code,
        reason = "held for its drop: swap and the cgroup stay until the step ends"
    )]
    Pressure,
);

impl Environment {
    pub(super) fn set_up() -> Result<Self> {
        let pressure = Pressure::set_up(LIMIT_MIB << 20, 256 << 20)
            .context("verify's memory-pressure step")?;
        let _ = CGROUP.set(pressure.cgroup.dir.clone());
        Ok(Self(pressure))
    }
}

pub(super) fn scenario(s: &mut Subject) -> Result<()> {
    let cgroup = CGROUP
        .get()
        .context("no memory cgroup was made for the step")?;
    std::fs::write(cgroup.join("cgroup.procs"), "0")
        .with_context(|| format!("moving into {}", cgroup.display()))?;
    let pages = REGION_MIB * 256;
    let region_kb = REGION_MIB << 10;
    let some = (4, region_kb);
    // The cgroup's own count of unevictable memory trails smaps by a batch per CPU.
    let unevictable = (region_kb.saturating_sub(stat_lag_kb()), u64::MAX);
    let expect = |swap_kb, unevictable_kb| PressureExpect {
        swap_kb,
        cgroup: cgroup.clone(),
        unevictable_kb,
    };
    let locked = Region::guarded(pages as usize, RW)?;
    let unlocked = Region::guarded(pages as usize, RW)?;
    unlocked.touch(0..pages);
    super::scenarios::mlock(locked.start(), pages)?;
    madvise_cold(&unlocked)?;
    let pressure = squeeze(PRESSURE_MIB)?;

    let mut cp = locked.checkpoint(
        "pressure-locked",
        &format!(
            "mlock a {REGION_MIB} MiB region, then touch {PRESSURE_MIB} MiB more (twice) in a \
             {LIMIT_MIB} MiB memory cgroup with swap"
        ),
        &[(pages, "rw-p", Y, N)],
        region_kb,
    );
    cp.pressure = Some(expect((0, 0), unevictable));
    let mlock_call = ExpectCalls {
        locked_pages: Some(pages as i64),
        populated: Some(pages),
        ..calls(1)
    };
    s.check(&locked, cp.with_rss(region_kb).with_calls(mlock_call))?;

    let mut cp = unlocked.checkpoint(
        "pressure-unlocked",
        "the unlocked region of the same size, touched and aged alike, under the same pressure",
        &[(pages, "rw-p", N, N)],
        0,
    );
    cp.pressure = Some(expect(some, unevictable));
    s.check(&unlocked, cp.with_calls(no_calls()))?;
    drop(pressure);

    super::scenarios::munlock(locked.start(), pages)?;
    let mut cp = locked.checkpoint(
        "munlock-under-limit",
        "munlock the locked region: its pages stay resident, off the unevictable list",
        &[(pages, "rw-p", N, N)],
        0,
    );
    cp.pressure = Some(expect((0, 0), (0, stat_lag_kb())));
    let munlock_call = ExpectCalls {
        locked_pages: Some(-(pages as i64)),
        ..calls(1)
    };
    s.check(&locked, cp.with_rss(region_kb).with_calls(munlock_call))?;

    madvise_cold(&locked)?;
    let pressure = squeeze(PRESSURE_MIB)?;
    let mut cp = locked.checkpoint(
        "pressure-after-munlock",
        "the same pressure again: the formerly locked pages go out too",
        &[(pages, "rw-p", N, N)],
        0,
    );
    cp.pressure = Some(expect(some, (0, stat_lag_kb())));
    s.check(&locked, cp.with_calls(no_calls()))?;
    drop(pressure);
    Ok(())
}
