//! memory-pressure and secret-in-swap (reference 000, section 1 and its introduction; 001):
//! what locking guarantees when memory runs short. Inside a memory cgroup limited below the
//! working set, with swap, three equal regions: touched lazily, `MAP_POPULATE`d, and
//! `mlock`ed; a fourth allocation then pushes memory out; each region is touched again and
//! timed. Then the locked region is unlocked and the pressure repeated: its pages swap too
//! (000: munlock puts them back on the LRU lists for reclaim).
//!
//! Every page carries a stamp: a random key (one for the locked region, one for the other
//! two) and the page's index. With the regions pushed out, the swap device is searched for
//! each key while this process lives: the unlocked key must be found (the positive control,
//! as many times as smaps says pages went to swap), the locked one never. The keys live only
//! in a locked page of their own: a copy anywhere swappable could reach the device and be
//! found for the wrong reason, and they are never printed.
//!
//! The parent ([`run`] without a variant) makes the swap and the cgroup
//! ([`crate::lab::pressure`]) and runs the experiment (variant `measure`) inside it.

use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use serde_json::{Value, json};

use super::{Faults, PAGE_SIZE, Region, SmapsFigures, args::ScenarioArgs, syscall_ok};
use crate::lab::pressure::{Pressure, cgroup::read_stat, swap};

/// The experiment's cgroup directory, for the process inside it to read its `memory.stat`.
const CGROUP_ENV: &str = "MEMLOCK_TRACE_PRESSURE_CGROUP";
const KEY_LEN: usize = 16;
const RW: i32 = libc::PROT_READ | libc::PROT_WRITE;

pub fn run(variant: &str, args: &ScenarioArgs) -> Result<Value> {
    match variant {
        "" => in_its_cgroup(args),
        "measure" => measure(args),
        other => bail!("unknown memory-pressure variant {other}"),
    }
}

/// Makes the pressure, runs the experiment in it, and puts everything back.
fn in_its_cgroup(args: &ScenarioArgs) -> Result<Value> {
    let limit = (args.pressure_limit_mib as u64) << 20;
    // Room for everything the experiment could push out, twice.
    let swap_bytes = ((3 * args.pressure_region_mib + args.pressure_mib) as u64 * 2) << 20;
    let pressure = Pressure::set_up(limit, swap_bytes.max(256 << 20))?;
    let mut command = Command::new(std::env::current_exe().context("finding our executable")?);
    command
        .args(["scenario", "memory-pressure"])
        .args(args.to_args())
        .args(["--variant", "measure"])
        .env(CGROUP_ENV, &pressure.cgroup.dir)
        .stderr(Stdio::inherit());
    let ended = pressure.run(&mut command)?;
    let out = ended.output;
    if !out.status.success() {
        bail!("the memory-pressure experiment failed ({})", out.status);
    }
    let mut result: Value = serde_json::from_slice(&out.stdout)
        .context("the memory-pressure experiment printed no JSON result")?;
    result["environment"] = pressure.describe();
    // Its own count stops before it prints and exits, where it can still fault its evicted
    // code back in: the kernel's count of its whole life is what the tracer's must equal.
    result["faults_at_exit"] = json!(ended.faults);
    result["delays_at_exit"] = match ended.delays {
        Ok(delays) => json!(delays),
        Err(why) => json!({ "not_measured": why }),
    };
    Ok(result)
}

/// A region's figures at one point of the experiment.
#[derive(Clone, Copy, Debug, Serialize)]
struct Seen {
    rss_kb: u64,
    swap_kb: u64,
    locked_kb: u64,
}

impl Seen {
    fn of(region: &Region) -> Result<Self> {
        let s = SmapsFigures::of_region(region)?;
        Ok(Self {
            rss_kb: s.rss_kb,
            swap_kb: s.swap_kb,
            locked_kb: s.locked_kb,
        })
    }
}

/// A pass over memory: how long it took, the thread's CPU time in it (what a tracer adds,
/// without the waits for a CPU on a shared machine), and the faults the thread took in it.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct Pass {
    ns: u64,
    cpu_ns: u64,
    faults: Faults,
}

impl Pass {
    /// One access per page of `region`: a write, or a read.
    fn over(region: &Region, write: bool) -> Self {
        let before = Faults::thread();
        let cpu_before = crate::output::thread_cpu_ns();
        let t = Instant::now();
        for page in 0..region.len / PAGE_SIZE {
            let at = region.page(page);
            // SAFETY: `page` is inside the region, mapped readable and writable.
            unsafe {
                if write {
                    at.add(KEY_LEN + 8).write_volatile(1);
                } else {
                    std::hint::black_box(at.read_volatile());
                }
            }
        }
        Self {
            ns: t.elapsed().as_nanos() as u64,
            cpu_ns: crate::output::thread_cpu_ns() - cpu_before,
            faults: Faults::thread().since(before),
        }
    }

    /// A read of each page of `region` after the pressure. The counts are the thread's, and
    /// the pressure may have pushed out the measuring code's own pages too (its text, read
    /// back from the file, and its stack): a pass over a page of no region brings those back
    /// first, so the count is the region's own.
    fn after_pressure(region: &Region) -> Result<Self> {
        Self::over(&Region::guarded(1, RW)?, false);
        Ok(Self::over(region, false))
    }
}

/// The two keys, in a locked page of their own: the locked region's and the others'.
struct Keys(Region);

impl Keys {
    fn new() -> Result<Self> {
        let page = Region::guarded(1, RW)?;
        mlock(&page)?;
        let mut filled = 0;
        while filled < 2 * KEY_LEN {
            // SAFETY: writes the rest of the first 32 bytes of the page just mapped.
            let got =
                unsafe { libc::getrandom(page.addr.add(filled).cast(), 2 * KEY_LEN - filled, 0) };
            if got < 0 {
                bail!("getrandom: {}", std::io::Error::last_os_error());
            }
            filled += got as usize;
        }
        Ok(Self(page))
    }

    fn locked(&self) -> &[u8] {
        // SAFETY: the first 16 bytes of the keys' page, filled by `new`, alive with `self`.
        unsafe { std::slice::from_raw_parts(self.0.addr, KEY_LEN) }
    }

    fn unlocked(&self) -> &[u8] {
        // SAFETY: bytes 16..32 of the keys' page, as above.
        unsafe { std::slice::from_raw_parts(self.0.addr.add(KEY_LEN), KEY_LEN) }
    }
}

/// Writes `key` and the page's index at the start of page `index` of `region`.
fn stamp(region: &Region, index: usize, key: &[u8]) {
    let at = region.page(index);
    // SAFETY: 24 bytes at the start of a page of the region, mapped writable; `key` is
    // another mapping's (the keys' page), so they do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(key.as_ptr(), at, KEY_LEN);
        std::ptr::copy_nonoverlapping((index as u64).to_ne_bytes().as_ptr(), at.add(KEY_LEN), 8);
    }
}

pub(crate) fn madvise_cold(region: &Region) -> Result<()> {
    // SAFETY: MADV_COLD changes no contents, only where the pages sit on the LRU lists.
    syscall_ok("madvise(MADV_COLD)", unsafe {
        libc::madvise(region.addr.cast(), region.len, libc::MADV_COLD)
    })
}

fn mlock(region: &Region) -> Result<()> {
    // SAFETY: mlock changes no memory contents, only whether the pages stay resident.
    syscall_ok("mlock", unsafe {
        libc::mlock(region.addr.cast(), region.len)
    })
}

fn munlock(region: &Region) -> Result<()> {
    // SAFETY: munlock changes no memory contents.
    syscall_ok("munlock", unsafe {
        libc::munlock(region.addr.cast(), region.len)
    })
}

/// Passes over the fourth allocation, each pushing the regions' worth of memory out again.
const PRESSURE_PASSES: usize = 2;

/// The fourth allocation: mapped and written page by page [`PRESSURE_PASSES`] times, kept
/// until dropped.
pub(crate) fn squeeze(mib: usize) -> Result<(Region, Vec<Pass>)> {
    let region = Region::anonymous(mib * 256, RW, 0)?;
    let passes = (0..PRESSURE_PASSES)
        .map(|_| Pass::over(&region, true))
        .collect();
    Ok((region, passes))
}

fn cgroup_stat() -> Result<BTreeMap<String, u64>> {
    let dir = std::env::var_os(CGROUP_ENV).with_context(|| {
        format!("{CGROUP_ENV} is not set: run memory-pressure without --variant")
    })?;
    read_stat(std::path::Path::new(&dir))
}

/// The experiment, inside its cgroup.
fn measure(args: &ScenarioArgs) -> Result<Value> {
    let pages = args.pressure_region_mib * 256;
    let keys = Keys::new()?;
    let lazy = Region::guarded(pages, RW)?;
    let populate = Region::hole(pages)?;
    let before = Faults::thread();
    populate.map(RW, libc::MAP_POPULATE)?;
    let populate_call = Faults::thread().since(before);
    let locked = Region::guarded(pages, RW)?;
    let before = Faults::thread();
    mlock(&locked)?;
    let mlock_call = Faults::thread().since(before);
    // Page by page across the three regions, so that none is older on the LRU lists than
    // the others: which pages reclaim takes first depends on their age.
    let before = Faults::thread();
    for index in 0..pages {
        stamp(&lazy, index, keys.unlocked());
        stamp(&populate, index, keys.unlocked());
        stamp(&locked, index, keys.locked());
    }
    let stamping = Faults::thread().since(before);
    // Equally old: pages faulted lazily start on the inactive LRU list, those MAP_POPULATE
    // brought in on the active one (get_user_pages marks them accessed), which reclaim
    // reaches only once the inactive list runs short: a stream of pressure never does.
    // MADV_COLD moves both to the inactive list; the kernel refuses it for locked pages.
    for region in [&lazy, &populate] {
        madvise_cold(region)?;
    }
    let locked_cold = madvise_cold(&locked).err().map(|e| e.to_string());
    let regions = [("lazy", &lazy), ("populate", &populate), ("mlock", &locked)];
    let seen = || -> Result<Value> {
        let mut out = serde_json::Map::new();
        for (name, region) in regions {
            out.insert(name.into(), json!(Seen::of(region)?));
        }
        Ok(Value::Object(out))
    };
    let resident = seen()?;

    let (pressure, squeezed) = squeeze(args.pressure_mib)?;
    let pushed_out = seen()?;
    let stat = cgroup_stat()?;
    let [unlocked_found, locked_found] = found(&[keys.unlocked(), keys.locked()])?;
    drop(pressure);
    let mut touched_again = serde_json::Map::new();
    for (name, region) in [("mlock", &locked), ("populate", &populate), ("lazy", &lazy)] {
        touched_again.insert(name.into(), json!(Pass::after_pressure(region)?));
    }

    // 000: munlock does not push pages out, it puts them back where reclaim can take them.
    munlock(&locked)?;
    let unlocked_now = Seen::of(&locked)?;
    // Aged as the other two were: unlocked, the kernel takes MADV_COLD for these pages too.
    madvise_cold(&locked)?;
    let (pressure, squeezed_again) = squeeze(args.pressure_mib)?;
    let after_munlock = Seen::of(&locked)?;
    let stat_after_munlock = cgroup_stat()?;
    let [formerly_locked_found] = found(&[keys.locked()])?;
    drop(pressure);
    let formerly_locked_touched = Pass::after_pressure(&locked)?;

    Ok(json!({
        "region_pages": pages,
        "windows": {
            "lazy": lazy.window(),
            "populate": populate.window(),
            "mlock": locked.window(),
        },
        "page_size": PAGE_SIZE,
        "limit_mib": args.pressure_limit_mib,
        "pressure_mib": args.pressure_mib,
        "populate_call": populate_call,
        "mlock_call": mlock_call,
        "stamping": stamping,
        "locked_madv_cold": locked_cold,
        "resident": resident,
        "pressure": squeezed,
        "pushed_out": pushed_out,
        "cgroup_stat": stat,
        "swap_search": {
            "unlocked_key_pages": unlocked_found,
            "locked_key_pages": locked_found,
        },
        "touched_again": touched_again,
        "munlock": {
            "right_after": unlocked_now,
            "pressure": squeezed_again,
            "pushed_out": after_munlock,
            "cgroup_stat": stat_after_munlock,
            "locked_key_pages": formerly_locked_found,
            "touched_again": formerly_locked_touched,
        },
        "faults": Faults::process(),
    }))
}

/// How many pages of the swap areas hold each key.
fn found<const N: usize>(keys: &[&[u8]; N]) -> Result<[u64; N]> {
    let counts = swap::occurrences(keys)?;
    let mut out = [0; N];
    out.copy_from_slice(&counts);
    Ok(out)
}
