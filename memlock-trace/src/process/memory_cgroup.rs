//! A process's memory cgroup: the limits its memory is charged against, and what they leave.
//!
//! A process in a container is limited by its memory cgroup long before the host runs out:
//! every page it faults in (and every page `mlock` or `MAP_POPULATE` brings in) is charged
//! to its cgroup and to each ancestor, and a charge past any level's limit makes the kernel
//! reclaim inside that cgroup, then OOM-kill in it. Locked pages stay charged and are never
//! reclaimed. So the room a process has is the least, over its cgroup and the ancestors,
//! of limit minus usage: the lowest wins.
//!
//! - cgroup v2 (the unified hierarchy): `memory.max` (the hard limit) and `memory.high`
//!   (above which the cgroup is throttled and reclaimed), against `memory.current`; the
//!   root has neither.
//! - cgroup v1 (`memory` controller mounted by itself, as on hybrid hosts):
//!   `memory.limit_in_bytes` against `memory.usage_in_bytes`; the root reports a limit of
//!   `PAGE_COUNTER_MAX` pages, i.e. none.
//!
//! The process's path comes from `/proc/PID/cgroup`, the mounts from `/proc/self/mountinfo`
//! (paths are relative to the reader's cgroup namespace on both, so they join).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::filters::find_mount;
use crate::output::Outside;

/// Limits at or above this are no limit: v1 reports `PAGE_COUNTER_MAX` pages
/// (`LONG_MAX / PAGE_SIZE`, 9223372036854771712 bytes with 4 KiB pages) for an unlimited
/// cgroup, and no host has 4 EiB.
const UNLIMITED_FROM: u64 = 1 << 62;

/// Which cgroup version's files were read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    V1,
    V2,
}

impl Version {
    /// `v1`, `v2`.
    pub fn name(self) -> &'static str {
        match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        }
    }

    /// The usage file of a level of this version.
    fn usage_file(self) -> &'static str {
        match self {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        }
    }

    /// The limit files of a level of this version.
    fn limit_files(self) -> &'static [&'static str] {
        match self {
            Version::V1 => &["memory.limit_in_bytes"],
            Version::V2 => &["memory.max", "memory.high"],
        }
    }
}

/// One limit of one cgroup on the way from the process's cgroup to the root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryLimit {
    /// That cgroup's path in the hierarchy (`/` for the root).
    pub path: Outside,
    /// The file the limit was read from (`memory.max`, `memory.high`,
    /// `memory.limit_in_bytes`).
    pub file: &'static str,
    pub limit_bytes: u64,
    /// What is charged to that cgroup now (its subtree's memory).
    pub usage_bytes: u64,
}

impl MemoryLimit {
    /// Bytes that can still be charged before this limit is reached.
    pub fn headroom(&self) -> u64 {
        self.limit_bytes.saturating_sub(self.usage_bytes)
    }
}

/// A process's memory cgroup and the limits on it and its ancestors.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryCgroup {
    pub version: Version,
    /// The process's own cgroup, as `/proc/PID/cgroup` shows it.
    pub path: Outside,
    /// Every limit set on it or an ancestor, innermost first (empty: none is limited).
    pub limits: Vec<MemoryLimit>,
}

impl MemoryCgroup {
    /// The limit that leaves the least room: the one any new charge meets first.
    pub fn binding(&self) -> Option<&MemoryLimit> {
        self.limits.iter().min_by_key(|l| l.headroom())
    }
}

/// The memory cgroup of `pid`, if it has one the tool can read: v1's `memory` controller
/// when it is mounted (a hybrid host keeps memory there, and the unified hierarchy then has
/// no memory files), else the unified hierarchy.
pub fn of_process(pid: u32) -> Option<MemoryCgroup> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let (version, path) = memory_line(&cgroups, &mounts)?;
    let mount = memory_mount(&mounts, version)?;
    read(&mount.point, &mount.root, &path, version)
}

/// The version and path of the memory controller's line in `/proc/PID/cgroup`
/// (`ID:CONTROLLERS:PATH`): the v1 line naming `memory` when v1 mounts it, else `0::PATH`.
fn memory_line(cgroups: &str, mounts: &str) -> Option<(Version, String)> {
    let v1 = cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    });
    if let Some(path) = v1
        && memory_mount(mounts, Version::V1).is_some()
    {
        return Some((Version::V1, path));
    }
    cgroups
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| (Version::V2, p.to_string()))
}

/// Where this machine's memory controller is mounted: v1's `memory` hierarchy where it is
/// (a hybrid host keeps memory there), else a cgroup2 mount whose root offers `memory`.
pub fn controller() -> Option<(Version, PathBuf)> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    if let Some(mount) = memory_mount(&mounts, Version::V1) {
        return Some((Version::V1, mount.point));
    }
    let mount = memory_mount(&mounts, Version::V2)?;
    let offered = std::fs::read_to_string(mount.point.join("cgroup.controllers")).ok()?;
    offered
        .split_whitespace()
        .any(|c| c == "memory")
        .then_some((Version::V2, mount.point))
}

/// A hierarchy's mount: where it is, and which of its cgroups is mounted there.
struct Mount {
    point: PathBuf,
    root: String,
}

/// The mount of the v1 `memory` controller, or the first cgroup2 mount.
fn memory_mount(mounts: &str, version: Version) -> Option<Mount> {
    let (root, point) = find_mount(mounts, |fstype, options| match version {
        Version::V1 => fstype == "cgroup" && options.split(',').any(|o| o == "memory"),
        Version::V2 => fstype == "cgroup2",
    })?;
    Some(Mount { point, root })
}

/// The limits on cgroup `path` (as `/proc/PID/cgroup` names it) and its ancestors, read
/// from the hierarchy of `version` mounted at `point` (with the hierarchy's `root` there).
/// None when the path is outside the mount or the cgroup has no memory files (a v2
/// hierarchy without the memory controller).
pub fn read(point: &Path, root: &str, path: &str, version: Version) -> Option<MemoryCgroup> {
    let root = root.trim_end_matches('/');
    let relative = path.strip_prefix(root)?;
    if !relative.is_empty() && !relative.starts_with('/') {
        return None;
    }
    let mut dirs: Vec<(PathBuf, String)> = Vec::new();
    let mut shown = path.trim_end_matches('/').to_string();
    let mut dir = point.join(relative.trim_start_matches('/'));
    loop {
        dirs.push((
            dir.clone(),
            if shown.is_empty() {
                "/".into()
            } else {
                shown.clone()
            },
        ));
        if shown.len() <= root.len() || !dir.starts_with(point) || dir == point {
            break;
        }
        dir.pop();
        shown.truncate(shown.rfind('/').unwrap_or(0));
    }
    // The process's own cgroup must be one the controller accounts: v1 always is; on v2
    // the memory files exist where the parent enabled the controller (not at the root).
    let (own, _) = &dirs[0];
    let accounted = match version {
        Version::V1 => own.join(version.usage_file()).is_file(),
        Version::V2 => dirs
            .iter()
            .any(|(d, _)| d.join(version.usage_file()).is_file()),
    };
    if !accounted {
        return None;
    }
    let mut limits = Vec::new();
    for (dir, shown) in &dirs {
        let Some(usage) = number(&dir.join(version.usage_file())) else {
            continue;
        };
        for file in version.limit_files() {
            if let Some(limit) = number(&dir.join(file)).filter(|&l| l < UNLIMITED_FROM) {
                limits.push(MemoryLimit {
                    path: Outside::from(shown.as_str()),
                    file,
                    limit_bytes: limit,
                    usage_bytes: usage,
                });
            }
        }
    }
    Some(MemoryCgroup {
        version,
        path: Outside::from(if path.is_empty() { "/" } else { path }),
        limits,
    })
}

/// A file's number; `max` (v2's "no limit") as u64::MAX.
fn number(file: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    match text.trim() {
        "max" => Some(u64::MAX),
        n => n.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory tree laid out as a cgroup hierarchy, removed when dropped.
    struct Tree(PathBuf);

    impl Tree {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("memlock-trace-memcg-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn set(&self, cgroup: &str, file: &str, value: &str) {
            let dir = self.0.join(cgroup.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(file), format!("{value}\n")).unwrap();
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn v2_nested_limits_the_lowest_room_wins() {
        let t = Tree::new("v2");
        // The root has no memory files; a slice limits 1 GiB, the pod throttles at 512 MiB,
        // the container is unlimited itself.
        t.set("/", "cgroup.controllers", "cpu memory pids");
        t.set("/kubepods.slice", "memory.max", "1073741824");
        t.set("/kubepods.slice", "memory.high", "max");
        t.set("/kubepods.slice", "memory.current", "900000000");
        t.set("/kubepods.slice/pod", "memory.max", "max");
        t.set("/kubepods.slice/pod", "memory.high", "536870912");
        t.set("/kubepods.slice/pod", "memory.current", "100000000");
        t.set("/kubepods.slice/pod/app", "memory.max", "max");
        t.set("/kubepods.slice/pod/app", "memory.current", "90000000");
        let cg = read(&t.0, "/", "/kubepods.slice/pod/app", Version::V2).unwrap();
        assert_eq!(cg.version, Version::V2);
        assert_eq!(cg.path, "/kubepods.slice/pod/app");
        let shown: Vec<(String, &str, u64)> = cg
            .limits
            .iter()
            .map(|l| (l.path.to_string(), l.file, l.headroom()))
            .collect();
        assert_eq!(
            shown,
            [
                (
                    "/kubepods.slice/pod".into(),
                    "memory.high",
                    536_870_912 - 100_000_000
                ),
                (
                    "/kubepods.slice".into(),
                    "memory.max",
                    1_073_741_824 - 900_000_000
                ),
            ]
        );
        // The slice's 1 GiB is higher than the pod's 512 MiB but leaves less room.
        let b = cg.binding().unwrap();
        assert_eq!(
            (b.path.to_string().as_str(), b.file),
            ("/kubepods.slice", "memory.max")
        );
        // Raise the slice: now the pod's own throttle leaves the least.
        t.set("/kubepods.slice", "memory.max", "8589934592");
        let cg = read(&t.0, "/", "/kubepods.slice/pod/app", Version::V2).unwrap();
        assert_eq!(cg.binding().unwrap().file, "memory.high");
        // Usage past the limit leaves no room (not an underflow).
        t.set("/kubepods.slice/pod", "memory.current", "600000000");
        let cg = read(&t.0, "/", "/kubepods.slice/pod/app", Version::V2).unwrap();
        assert_eq!(cg.binding().unwrap().headroom(), 0);
    }

    #[test]
    fn v2_without_the_memory_controller_is_no_memory_cgroup() {
        let t = Tree::new("v2-none");
        t.set("/", "cgroup.controllers", "cpu pids");
        t.set("/app.service", "cgroup.procs", "1");
        assert_eq!(read(&t.0, "/", "/app.service", Version::V2), None);
        // Unlimited all the way up: a memory cgroup with no limit.
        t.set("/app.service", "memory.current", "4096");
        t.set("/app.service", "memory.max", "max");
        let cg = read(&t.0, "/", "/app.service", Version::V2).unwrap();
        assert_eq!((cg.limits.len(), cg.binding()), (0, None));
        // The root cgroup itself.
        let cg = read(&t.0, "/", "/", Version::V2);
        assert_eq!(cg, None, "the v2 root is not accounted");
    }

    #[test]
    fn v1_unlimited_levels_and_a_mounted_subtree() {
        let t = Tree::new("v1");
        // A container's view: the hierarchy's /docker/abc is mounted at the tree's top.
        t.set("/", "memory.limit_in_bytes", "268435456");
        t.set("/", "memory.usage_in_bytes", "200000000");
        t.set("/inner", "memory.limit_in_bytes", "9223372036854771712");
        t.set("/inner", "memory.usage_in_bytes", "150000000");
        let cg = read(&t.0, "/docker/abc", "/docker/abc/inner", Version::V1).unwrap();
        assert_eq!(cg.version, Version::V1);
        assert_eq!(cg.limits.len(), 1, "{cg:?}");
        let b = cg.binding().unwrap();
        assert_eq!(b.path, "/docker/abc");
        assert_eq!(b.file, "memory.limit_in_bytes");
        assert_eq!(b.headroom(), 268_435_456 - 200_000_000);
        // A path outside the mounted subtree cannot be read from it.
        assert_eq!(read(&t.0, "/docker/abc", "/docker/abcd", Version::V1), None);
    }

    #[test]
    fn the_memory_line_and_mount_are_found_on_hybrid_and_unified_hosts() {
        let hybrid_mounts = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                             41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        let hybrid = "5:devices:/\n4:memory:/process_api/x\n0::/\n";
        assert_eq!(
            memory_line(hybrid, hybrid_mounts),
            Some((Version::V1, "/process_api/x".into()))
        );
        let m = memory_mount(hybrid_mounts, Version::V1).unwrap();
        assert_eq!(m.point, Path::new("/sys/fs/cgroup/memory"));
        let unified_mounts = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            memory_line("0::/system.slice/nginx.service\n", unified_mounts),
            Some((Version::V2, "/system.slice/nginx.service".into()))
        );
        // A v1 line naming memory with no v1 memory mount: the unified line is the one.
        assert_eq!(
            memory_line("4:memory:/a\n0::/b\n", unified_mounts),
            Some((Version::V2, "/b".into()))
        );
    }

    #[test]
    fn our_own_memory_cgroup_is_read() {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let (version, path) =
            memory_line(&own, &mounts).expect("a memory controller's line in /proc/self/cgroup");
        match of_process(std::process::id()) {
            Some(cg) => {
                assert_eq!(cg.version, version, "{cg:?} in {own}");
                assert_eq!(cg.path.to_str(), Some(path.as_str()), "{cg:?} in {own}");
            }
            // v2 does not account the root cgroup (no memory.current there): a process in it,
            // as the test guests' init is, has no memory cgroup. Anywhere else it has one.
            None => assert!(
                version == Version::V2 && path == "/",
                "no memory cgroup read for {version:?} {path} in {own}"
            ),
        }
    }
}
