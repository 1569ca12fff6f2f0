//! Cgroup v2 ids (what the kernel records with each process) turned into paths, and paths
//! into what operators group by: a systemd unit, a container id, a Kubernetes pod.
//!
//! Ids are looked up by walking the cgroup2 mount (the unified hierarchy also on hybrid hosts,
//! `/sys/fs/cgroup/unified`): a cgroup directory's inode number is its kernfs node id, the
//! value `bpf_get_current_cgroup_id` returns (64-bit kernels since 5.5).

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::Path,
    time::{Duration, Instant},
};

use serde::Serialize;

use super::filters::{Cgroup2Mount, cgroup2_mount};

/// At most one walk of the hierarchy per this long for ids not found: a busy host creates
/// and removes cgroups all the time, and the walk reads every directory.
const REWALK_AFTER: Duration = Duration::from_secs(1);

/// A process's cgroup, as the summary and the metrics show it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CgroupInfo {
    /// The path in the cgroup v2 hierarchy, `/` for the root (as `/proc/PID/cgroup` shows it);
    /// `None` when the cgroup was removed before it could be looked up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The kernel's id of the cgroup.
    pub id: u64,
    /// The innermost systemd unit (`nginx.service`, `session-3.scope`, `docker-<id>.scope`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The container runtime that made the cgroup (`docker`, `containerd`, `cri-o`,
    /// `podman`), and the container's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// A Kubernetes pod's uid (`kubepods` hierarchy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

impl CgroupInfo {
    /// The short form for a text line: the path, or `cgroup id N` when it is gone.
    pub fn label(&self) -> String {
        self.path
            .clone()
            .unwrap_or_else(|| format!("cgroup id {}", self.id))
    }
}

/// Cgroup ids to paths, cached.
pub struct CgroupPaths {
    mount: Option<Cgroup2Mount>,
    paths: HashMap<u64, String>,
    walked: Option<Instant>,
}

impl Default for CgroupPaths {
    fn default() -> Self {
        Self {
            mount: cgroup2_mount().ok().flatten(),
            paths: HashMap::new(),
            walked: None,
        }
    }
}

impl CgroupPaths {
    /// What cgroup `id` is; its path is looked up in the hierarchy if not known yet.
    pub fn info(&mut self, id: u64) -> CgroupInfo {
        let path = self.path(id);
        let mut info = path.as_deref().map(parse).unwrap_or_default();
        info.path = path;
        info.id = id;
        info
    }

    fn path(&mut self, id: u64) -> Option<String> {
        if let Some(p) = self.paths.get(&id) {
            return Some(p.clone());
        }
        if self.walked.is_some_and(|t| t.elapsed() < REWALK_AFTER) {
            return None;
        }
        self.walk();
        self.paths.get(&id).cloned()
    }

    fn walk(&mut self) {
        self.walked = Some(Instant::now());
        let Some(mount) = &self.mount else { return };
        let root = mount.root.trim_end_matches('/').to_string();
        let mut stack = vec![(mount.point.clone(), root.clone())];
        while let Some((dir, path)) = stack.pop() {
            if let Ok(meta) = std::fs::metadata(&dir) {
                let shown = if path.is_empty() {
                    "/".into()
                } else {
                    path.clone()
                };
                self.paths.insert(meta.ino(), shown);
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    stack.push((entry.path(), format!("{path}/{name}")));
                }
            }
        }
    }

    /// The cgroup2 mount point, if the host has one.
    pub fn mount_point(&self) -> Option<&Path> {
        self.mount.as_ref().map(|m| m.point.as_path())
    }
}

/// Suffixes of systemd unit names that a cgroup can carry.
const UNIT_SUFFIXES: [&str; 3] = [".service", ".scope", ".socket"];

/// Reads the unit, container and pod out of a cgroup path, for the layouts systemd, Docker,
/// containerd (CRI), CRI-O, Podman and the kubelet (systemd and cgroupfs drivers) make.
pub fn parse(path: &str) -> CgroupInfo {
    let mut info = CgroupInfo::default();
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    for (i, part) in parts.iter().enumerate() {
        // The innermost unit wins: later parts overwrite.
        if UNIT_SUFFIXES.iter().any(|s| part.ends_with(s)) {
            info.unit = Some((*part).to_string());
        }
        if let Some(uid) = pod_uid(part) {
            info.pod_uid = Some(uid);
        }
        if let Some((runtime, id)) = container_scope(part) {
            info.runtime = Some(runtime);
            info.container_id = Some(id);
        } else if is_container_id(part) {
            // cgroupfs drivers: `/docker/<id>`, `/kubepods/burstable/pod<uid>/<id>`.
            info.container_id = Some((*part).to_string());
            info.runtime = match i.checked_sub(1).map(|p| parts[p]) {
                Some("docker") => Some("docker"),
                Some("containerd") => Some("containerd"),
                _ => info.runtime,
            };
        }
    }
    info
}

/// `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope`.
fn container_scope(part: &str) -> Option<(&'static str, String)> {
    let stem = part.strip_suffix(".scope")?;
    for (prefix, runtime) in [
        ("docker-", "docker"),
        ("cri-containerd-", "containerd"),
        ("crio-", "cri-o"),
        ("libpod-", "podman"),
    ] {
        if let Some(id) = stem.strip_prefix(prefix).filter(|id| is_container_id(id)) {
            return Some((runtime, id.to_string()));
        }
    }
    None
}

/// A container id: 64 hex digits.
fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `kubepods-burstable-pod<uid with _>.slice` (systemd driver) or `pod<uid>` (cgroupfs).
fn pod_uid(part: &str) -> Option<String> {
    let uid = match part.strip_suffix(".slice") {
        Some(stem) => stem
            .starts_with("kubepods")
            .then(|| stem.rsplit_once("-pod"))
            .flatten()?
            .1
            .replace('_', "-"),
        None => part.strip_prefix("pod")?.to_string(),
    };
    (uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')).then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f6b2c3a1e0d9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b";

    #[test]
    fn systemd_services_and_sessions() {
        let s = parse("/system.slice/nginx.service");
        assert_eq!(s.unit.as_deref(), Some("nginx.service"));
        assert_eq!((s.runtime, s.container_id), (None, None));
        let s = parse("/user.slice/user-1000.slice/session-3.scope");
        assert_eq!(s.unit.as_deref(), Some("session-3.scope"));
        let s = parse("/user.slice/user-1000.slice/user@1000.service/app.slice/foo.service");
        assert_eq!(s.unit.as_deref(), Some("foo.service"));
        assert_eq!(parse("/").unit, None);
        assert_eq!(parse("/init.scope").unit.as_deref(), Some("init.scope"));
    }

    #[test]
    fn docker_with_either_driver() {
        let s = parse(&format!("/system.slice/docker-{ID}.scope"));
        assert_eq!(s.runtime, Some("docker"));
        assert_eq!(s.container_id.as_deref(), Some(ID));
        assert_eq!(s.unit, Some(format!("docker-{ID}.scope")));
        let s = parse(&format!("/docker/{ID}"));
        assert_eq!(
            (s.runtime, s.container_id.as_deref()),
            (Some("docker"), Some(ID))
        );
    }

    #[test]
    fn kubernetes_pods_with_containerd_and_cri_o() {
        let s = parse(&format!(
            "/kubepods.slice/kubepods-burstable.slice/\
             kubepods-burstable-pod1a2b3c4d_5e6f_7a8b_9c0d_1e2f3a4b5c6d.slice/\
             cri-containerd-{ID}.scope"
        ));
        assert_eq!(s.runtime, Some("containerd"));
        assert_eq!(s.container_id.as_deref(), Some(ID));
        assert_eq!(
            s.pod_uid.as_deref(),
            Some("1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d")
        );
        let s = parse(&format!(
            "/kubepods.slice/kubepods-pod1a2b3c4d_5e6f_7a8b_9c0d_1e2f3a4b5c6d.slice/crio-{ID}.scope"
        ));
        assert_eq!(s.runtime, Some("cri-o"));
        assert!(s.pod_uid.is_some());
        // cgroupfs driver: no runtime in the path, the id still is.
        let s = parse(&format!(
            "/kubepods/besteffort/pod1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d/{ID}"
        ));
        assert_eq!(s.container_id.as_deref(), Some(ID));
        assert_eq!(
            s.pod_uid.as_deref(),
            Some("1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d")
        );
    }

    #[test]
    fn podman_and_things_that_only_look_alike() {
        let s = parse(&format!(
            "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"
        ));
        assert_eq!(s.runtime, Some("podman"));
        // Too short for an id, not a pod uid.
        let s = parse("/system.slice/docker-abc.scope");
        assert_eq!((s.runtime, s.container_id), (None, None));
        assert_eq!(parse("/podcast.slice").pod_uid, None);
    }

    #[test]
    fn this_process_cgroup_is_found_by_its_id() {
        // /proc/self/cgroup's v2 line is `0::PATH`.
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let Some(path) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
            panic!("no cgroup v2 line in /proc/self/cgroup: {own}");
        };
        let mut paths = CgroupPaths::default();
        let mount = paths.mount_point().expect("a cgroup2 mount").to_path_buf();
        let dir = mount.join(path.trim_start_matches('/'));
        let id = super::super::filters::cgroup_id(&dir).unwrap();
        assert_eq!(paths.info(id).path.as_deref(), Some(path));
    }
}
