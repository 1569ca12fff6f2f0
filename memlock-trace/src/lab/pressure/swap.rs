//! Swap for a memory-pressure experiment: the machine's own swap where it has some, else a
//! zram device set up here (swap in compressed RAM: no disk needed, and what it holds can be
//! read back through the block device while the process lives) and taken down afterwards.
//!
//! One experiment at a time holds swap: an exclusive `flock` on [`LOCK`] for as long as it
//! runs, so a second experiment (a test beside `verify`) waits instead of having swap turned
//! off under it. What this set up is written to [`MARK`]; a later holder of the lock finding
//! the mark takes down what a killed experiment left.

use std::{
    ffi::CString,
    fs::File,
    io::{Read as _, Seek as _, SeekFrom, Write as _},
    os::{fd::AsRawFd as _, unix::ffi::OsStrExt as _},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, anyhow, bail};
use memchr::memmem::Finder;
use serde::Serialize;

use crate::procfs::PAGE_SIZE;

const LOCK: &str = "/run/memlock-trace-pressure.lock";
const MARK: &str = "/run/memlock-trace-pressure.swap";

/// One area of `/proc/swaps`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SwapArea {
    pub path: PathBuf,
    pub size_kb: u64,
    pub used_kb: u64,
}

/// Swap on for as long as this lives.
pub struct Swap {
    /// The zram device this set up (`/dev/zramN`), taken down on drop.
    ours: Option<Zram>,
    /// Held until drop: the experiment's claim on swap.
    _lock: File,
}

struct Zram {
    index: u32,
    /// Made by `hot_add` (removed again), rather than the kernel's `zram0`.
    added: bool,
}

impl Zram {
    fn device(&self) -> PathBuf {
        PathBuf::from(format!("/dev/zram{}", self.index))
    }

    fn sys(&self, file: &str) -> PathBuf {
        PathBuf::from(format!("/sys/block/zram{}/{file}", self.index))
    }
}

impl Swap {
    /// Swap on: the machine's if it has some, else `size_bytes` of zram set up here.
    pub fn ensure(size_bytes: u64) -> Result<Self> {
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK)
            .with_context(|| format!("opening {LOCK}"))?;
        // SAFETY: flock on a descriptor this function owns. A signal ends the wait (EINTR).
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!(
                "waiting for another memory-pressure experiment to end (flock {LOCK}): {}",
                std::io::Error::last_os_error()
            );
        }
        let areas = areas()?;
        if let Some(left) = left_behind() {
            if areas.iter().any(|a| a.path == left.device()) {
                return Ok(Self {
                    ours: Some(left),
                    _lock: lock,
                });
            }
            take_down(&left);
        }
        if !areas.is_empty() {
            return Ok(Self {
                ours: None,
                _lock: lock,
            });
        }
        let zram = set_up_zram(size_bytes)?;
        Ok(Self {
            ours: Some(zram),
            _lock: lock,
        })
    }

    /// Who provides swap, in words: `zram1 (1 GiB, set up by memlock-trace)` or the
    /// machine's areas.
    pub fn describe(&self) -> String {
        match &self.ours {
            Some(z) => format!(
                "{} ({} MiB of zram, set up for the experiment)",
                z.device().display(),
                std::fs::read_to_string(z.sys("disksize"))
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .unwrap_or(0)
                    >> 20
            ),
            None => format!(
                "the machine's own: {}",
                areas()
                    .unwrap_or_default()
                    .iter()
                    .map(|a| a.path.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

impl Drop for Swap {
    fn drop(&mut self) {
        if let Some(zram) = self.ours.take() {
            take_down(&zram);
        }
    }
}

/// The active swap areas, from `/proc/swaps`.
pub fn areas() -> Result<Vec<SwapArea>> {
    let text = std::fs::read_to_string("/proc/swaps").context("reading /proc/swaps")?;
    Ok(parse_swaps(&text))
}

/// `Filename Type Size Used Priority`, a header then one line per area; spaces in a path
/// are `\040`.
fn parse_swaps(text: &str) -> Vec<SwapArea> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(SwapArea {
                path: PathBuf::from(f.first()?.replace("\\040", " ")),
                size_kb: f.get(2)?.parse().ok()?,
                used_kb: f.get(3)?.parse().ok()?,
            })
        })
        .collect()
}

/// How many times each needle occurs in what the active swap areas hold, read through
/// their device or file now (a zram slot is freed when its page is read back in, so search
/// while the process whose pages they are still lives).
pub fn occurrences(needles: &[&[u8]]) -> Result<Vec<u64>> {
    let finders: Vec<Finder> = needles.iter().map(Finder::new).collect();
    let longest = needles.iter().map(|n| n.len()).max().unwrap_or(0);
    let mut counts = vec![0; needles.len()];
    const CHUNK: usize = 4 << 20;
    for area in areas()? {
        let mut file =
            File::open(&area.path).with_context(|| format!("opening {}", area.path.display()))?;
        // The area's size excludes its header page; a swap file may be longer than its area.
        let mut left = (area.size_kb + PAGE_SIZE / 1024) * 1024;
        let mut buf = vec![0u8; CHUNK + longest];
        // Bytes kept from the previous chunk, so a needle across two chunks is found once.
        let mut kept = 0;
        let mut offset = 0;
        while left > 0 {
            let want = CHUNK.min(left as usize);
            let got = file
                .read(&mut buf[kept..kept + want])
                .with_context(|| format!("reading {}", area.path.display()))?;
            if got == 0 {
                break;
            }
            left -= got as u64;
            // The pages read are charged to the reader's memory cgroup: dropped at once, they
            // make the next chunk no reclaim there (the kernel's reclaim time stays the
            // experiment's faults', for the tracer's to be checked against).
            // SAFETY: advice on a range of our own open file.
            unsafe {
                libc::posix_fadvise(
                    file.as_raw_fd(),
                    offset,
                    got as i64,
                    libc::POSIX_FADV_DONTNEED,
                )
            };
            offset += got as i64;
            let seen = kept + got;
            for (finder, count) in finders.iter().zip(&mut counts) {
                // A match wholly inside the kept bytes was counted with the last chunk.
                *count += finder
                    .find_iter(&buf[..seen])
                    .filter(|&at| at + finder.needle().len() > kept)
                    .count() as u64;
            }
            let keep = longest.saturating_sub(1).min(seen);
            buf.copy_within(seen - keep..seen, 0);
            kept = keep;
        }
    }
    Ok(counts)
}

/// What an earlier experiment set up and did not take down (killed first).
fn left_behind() -> Option<Zram> {
    let text = std::fs::read_to_string(MARK).ok()?;
    let (index, added) = text.trim().split_once(' ')?;
    Some(Zram {
        index: index.parse().ok()?,
        added: added == "added",
    })
}

fn set_up_zram(size_bytes: u64) -> Result<Zram> {
    let zram = free_zram()?;
    // Written before the device is touched: a kill from here on leaves a mark to clean up by.
    std::fs::write(
        MARK,
        format!(
            "{} {}\n",
            zram.index,
            if zram.added { "added" } else { "kernel" }
        ),
    )
    .with_context(|| format!("writing {MARK}"))?;
    let set_up = || -> Result<()> {
        std::fs::write(zram.sys("disksize"), size_bytes.to_string())
            .with_context(|| format!("writing {}", zram.sys("disksize").display()))?;
        let device = zram.device();
        make_node(&zram, &device)?;
        write_swap_header(&device, size_bytes)?;
        let path = CString::new(device.as_os_str().as_bytes())?;
        // SAFETY: a NUL-terminated path; swapon reads it and the header just written.
        if unsafe { libc::swapon(path.as_ptr(), 0) } != 0 {
            bail!(
                "swapon {}: {}",
                device.display(),
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    };
    if let Err(e) = set_up() {
        take_down(&zram);
        return Err(e);
    }
    Ok(zram)
}

/// A zram device with no disk size yet: the kernel's `zram0`, or one added by `hot_add`.
fn free_zram() -> Result<Zram> {
    let unused = |index: u32| {
        std::fs::read_to_string(format!("/sys/block/zram{index}/disksize"))
            .is_ok_and(|s| s.trim() == "0")
    };
    if !Path::new("/sys/block/zram0").exists() {
        // A kernel with zram as a module: load it (quietly; what is missing is said below).
        let _ = std::process::Command::new("modprobe")
            .arg("zram")
            .stderr(std::process::Stdio::null())
            .status();
    }
    if unused(0) {
        return Ok(Zram {
            index: 0,
            added: false,
        });
    }
    let hot_add = "/sys/class/zram-control/hot_add";
    if let Ok(index) = std::fs::read_to_string(hot_add) {
        let index: u32 = index
            .trim()
            .parse()
            .with_context(|| format!("{hot_add} said {index:?}"))?;
        return Ok(Zram { index, added: true });
    }
    bail!(
        "no swap and no zram device to make some: the experiment needs swap (swapon a device \
         or file), or a kernel with zram (CONFIG_ZRAM, or its module: modprobe zram)"
    )
}

/// `/dev/zramN`, made from its `dev` numbers where no devtmpfs made it.
fn make_node(zram: &Zram, device: &Path) -> Result<()> {
    if device.exists() {
        return Ok(());
    }
    let numbers = std::fs::read_to_string(zram.sys("dev"))?;
    let (major, minor) = numbers
        .trim()
        .split_once(':')
        .ok_or_else(|| anyhow!("bad {}: {numbers:?}", zram.sys("dev").display()))?;
    let dev = libc::makedev(major.parse()?, minor.parse()?);
    let path = CString::new(device.as_os_str().as_bytes())?;
    // SAFETY: a NUL-terminated path; mknod creates a block device node and nothing else.
    if unsafe { libc::mknod(path.as_ptr(), libc::S_IFBLK | 0o600, dev) } != 0 {
        bail!(
            "mknod {}: {}",
            device.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// What `mkswap` writes (include/linux/swap.h, `union swap_header`): version 1, the last
/// page, no bad pages, and the magic `SWAPSPACE2` at the end of the first page.
fn write_swap_header(device: &Path, size_bytes: u64) -> Result<()> {
    let page = PAGE_SIZE as usize;
    let mut header = vec![0u8; page];
    let last_page = (size_bytes / PAGE_SIZE - 1) as u32;
    header[1024..1028].copy_from_slice(&1u32.to_ne_bytes());
    header[1028..1032].copy_from_slice(&last_page.to_ne_bytes());
    header[page - 10..].copy_from_slice(b"SWAPSPACE2");
    let mut file = File::options()
        .write(true)
        .open(device)
        .with_context(|| format!("opening {}", device.display()))?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(&header)?;
    file.sync_all()
        .with_context(|| format!("writing the swap header on {}", device.display()))
}

/// Swap off the device, reset it (its memory back to the machine) and remove the mark.
fn take_down(zram: &Zram) {
    let device = zram.device();
    if let Ok(path) = CString::new(device.as_os_str().as_bytes()) {
        // SAFETY: a NUL-terminated path. Failing (it was not on) is fine.
        unsafe { libc::swapoff(path.as_ptr()) };
    }
    if let Err(e) = std::fs::write(zram.sys("reset"), "1") {
        eprintln!(
            "memlock-trace: could not reset {} ({e}): `swapoff {0}; echo 1 > {}` puts it back",
            device.display(),
            zram.sys("reset").display()
        );
    }
    if zram.added {
        let _ = std::fs::write("/sys/class/zram-control/hot_remove", zram.index.to_string());
    }
    let _ = std::fs::remove_file(MARK);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_swaps_lines_become_areas() {
        let text = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
                    /dev/zram0                              partition\t1048572\t\t2048\t\t-2\n\
                    /var/my\\040swap                         file\t\t4096\t\t0\t\t-3\n";
        assert_eq!(
            parse_swaps(text),
            [
                SwapArea {
                    path: "/dev/zram0".into(),
                    size_kb: 1_048_572,
                    used_kb: 2048
                },
                SwapArea {
                    path: "/var/my swap".into(),
                    size_kb: 4096,
                    used_kb: 0
                },
            ]
        );
        assert!(parse_swaps("Filename Type Size Used Priority\n").is_empty());
    }
}
