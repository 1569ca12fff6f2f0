//! The memory controller of the host's cgroups, v1's where it is mounted (hybrid hosts,
//! this one), else the unified hierarchy's (where the root offers `memory`); a host with
//! neither fails loudly.

use std::path::{Path, PathBuf};

/// Where the memory controller is, and the names of its files there.
pub struct Controller {
    pub point: PathBuf,
    pub v1: bool,
}

impl Controller {
    pub fn find() -> Self {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mount = |fstype: &str, option: Option<&str>| {
            mounts.lines().find_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                let right: Vec<&str> = right.split_whitespace().collect();
                let ok = right.first() == Some(&fstype)
                    && option
                        .is_none_or(|o| right.get(2).is_some_and(|s| s.split(',').any(|x| x == o)));
                ok.then(|| PathBuf::from(left.split_whitespace().nth(4).unwrap()))
            })
        };
        if let Some(point) = mount("cgroup", Some("memory")) {
            return Self { point, v1: true };
        }
        let point = mount("cgroup2", None).filter(|p| {
            std::fs::read_to_string(p.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
        });
        let Some(point) = point else {
            panic!(
                "no memory controller: neither a cgroup v1 `memory` mount nor a cgroup2 mount \
                 offering `memory` in /proc/self/mountinfo:\n{mounts}"
            );
        };
        Self { point, v1: false }
    }

    pub fn limit_file(&self) -> &'static str {
        if self.v1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        }
    }

    /// Makes the cgroup `name` under `parent` (v2: with the memory controller enabled for
    /// the parent's children, which get its files only then).
    pub fn make(&self, parent: &Path, name: &str) -> PathBuf {
        if !self.v1 {
            write(&parent.join("cgroup.subtree_control"), "+memory");
        }
        let dir = parent.join(name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        dir
    }

    /// Sets the memory limit of the cgroup `dir`.
    pub fn limit(&self, dir: &Path, bytes: u64) {
        write(&dir.join(self.limit_file()), &bytes.to_string());
    }

    pub fn peak_file(&self) -> &'static str {
        if self.v1 {
            "memory.max_usage_in_bytes"
        } else {
            "memory.peak"
        }
    }
}

/// Removes the cgroup `dir` once it is empty. A tracer that ran inside it leaves behind, for
/// about a second and a half, the child that closes its hooks (`detach`'s hand-off), and
/// the kernel refuses to remove a cgroup with a task in it (EBUSY): wait for it, up to 10 s.
pub fn remove(dir: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match std::fs::remove_dir(dir) {
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50))
            }
            _ => return,
        }
    }
}

/// Writes `value` to a cgroup file, failing the test with the file's name.
fn write(file: &Path, value: &str) {
    std::fs::write(file, value)
        .unwrap_or_else(|e| panic!("writing {value} to {}: {e}", file.display()));
}
