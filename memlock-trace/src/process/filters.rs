//! The filters beyond `-p`: `--comm`, `--cgroup`, `--follow-children`, their validation,
//! and the fork/exit programs that keep the in-kernel target set in step with the
//! processes it names.

use std::{
    collections::BTreeMap,
    ffi::CString,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf,
    maps::{HashMap, IterableMap as _, MapData},
};
use memlock_trace_common::{
    TASK_COMM_LEN,
    process::{CgroupOffsets, ProcessConfig, ProcessKey, ProcessOffsets, counter, names},
};

use crate::{
    UsageError,
    btf::KernelBtf,
    object::{AttachContext, HookFamily, HookLine, attach_tp_btf},
    output::Outside,
};

/// `statfs.f_type` of cgroup v2 (include/uapi/linux/magic.h).
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// What to trace beyond the tgid set, validated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filters {
    /// The comm to match, at most 15 bytes.
    pub comm: Option<Vec<u8>>,
    pub cgroup: Option<Cgroup>,
    pub follow_children: bool,
    /// Capacity of the in-kernel target set (default `MAX_TARGETS`).
    pub max_targets: Option<u32>,
}

/// A cgroup v2 directory, as the kernel identifies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroup {
    pub path: PathBuf,
    /// The kernfs node id: what `bpf_get_current_cgroup_id` returns for tasks in it.
    pub id: u64,
    /// Depth below the cgroup2 root (the root is 0).
    pub level: u32,
}

impl Filters {
    /// Validates `--comm`; a name longer than the kernel keeps is truncated as the kernel
    /// truncates it, and `notice` is told so.
    pub fn set_comm(&mut self, name: &str, notice: &mut dyn FnMut(String)) -> Result<()> {
        let bytes = name.as_bytes();
        if bytes.is_empty() {
            return Err(UsageError("--comm needs a non-empty process name".into()).into());
        }
        if bytes.contains(&0) {
            return Err(UsageError("--comm must not contain a NUL byte".into()).into());
        }
        let max = TASK_COMM_LEN - 1;
        let kept = if bytes.len() > max {
            let kept = &bytes[..max];
            notice(format!(
                "--comm `{name}` is {} bytes but the kernel keeps only the first {max} of a \
                 process name: matching `{}`",
                bytes.len(),
                String::from_utf8_lossy(kept)
            ));
            kept
        } else {
            bytes
        };
        self.comm = Some(kept.to_vec());
        Ok(())
    }

    /// Builds the `PROCESS_CONFIG` global with this kernel's offsets.
    pub fn process_config(&self, btf: &KernelBtf) -> Result<ProcessConfig> {
        let mut config = ProcessConfig {
            follow_children: u32::from(self.follow_children),
            offsets: process_offsets(btf)?,
            ..Default::default()
        };
        if let Some(comm) = &self.comm {
            config.match_comm = 1;
            config.comm[..comm.len()].copy_from_slice(comm);
            // The name and its NUL (a 15-byte name ends at the array's end).
            let compared = (comm.len() + 1).min(TASK_COMM_LEN);
            config.comm_mask[..compared].fill(0xff);
        }
        if let Some(cgroup) = &self.cgroup {
            config.match_cgroup = 1;
            config.cgroup_id = cgroup.id;
            config.cgroup_level = cgroup.level;
            config.cgroup_offsets = cgroup_offsets(btf)?;
        }
        Ok(config)
    }

    /// Whether a process must match a comm or a cgroup to be traced.
    pub fn narrows(&self) -> bool {
        self.comm.is_some() || self.cgroup.is_some()
    }

    /// Words for the "tracing ..." line.
    pub fn describe(&self) -> Vec<String> {
        let mut parts = Vec::new();
        if let Some(comm) = &self.comm {
            parts.push(format!("comm `{}`", Outside::from(comm.as_slice())));
        }
        if let Some(cgroup) = &self.cgroup {
            parts.push(format!(
                "cgroup {} (id {})",
                Outside::from(cgroup.path.as_path()),
                cgroup.id
            ));
        }
        if self.follow_children {
            parts.push("and their children".into());
        }
        parts
    }
}

/// The fields the eBPF side's process filters and start time read, from the running
/// kernel's BTF.
pub fn process_offsets(btf: &KernelBtf) -> Result<ProcessOffsets> {
    Ok(ProcessOffsets {
        task_tgid: btf.field_offset("task_struct", "tgid")?,
        task_group_leader: btf.field_offset("task_struct", "group_leader")?,
        task_start_boottime: btf.field_offset("task_struct", "start_boottime")?,
        task_comm: btf.field_offset("task_struct", "comm")?,
        task_signal: btf.field_offset("task_struct", "signal")?,
        signal_live: btf.field_offset("signal_struct", "live")?,
        signal_min_flt: btf.field_offset("signal_struct", "min_flt")?,
        signal_maj_flt: btf.field_offset("signal_struct", "maj_flt")?,
        task_min_flt: btf.field_offset("task_struct", "min_flt")?,
        task_maj_flt: btf.field_offset("task_struct", "maj_flt")?,
        task_btf: u32::from(btf.has_enum_member("bpf_func_id", "BPF_FUNC_get_current_task_btf")),
    })
}

/// The fields that find a task's cgroup ancestors without the helper, on kernels that have
/// `cgroup.ancestor_ids` (before 6.0); zeros elsewhere (see [`CgroupOffsets`]).
fn cgroup_offsets(btf: &KernelBtf) -> Result<CgroupOffsets> {
    let Ok(cgroup_ancestor_ids) = btf.field_offset("cgroup", "ancestor_ids") else {
        return Ok(CgroupOffsets::default());
    };
    Ok(CgroupOffsets {
        task_cgroups: btf.field_offset("task_struct", "cgroups")?,
        css_set_dfl_cgrp: btf.field_offset("css_set", "dfl_cgrp")?,
        cgroup_level: btf.field_offset("cgroup", "level")?,
        cgroup_ancestor_ids,
    })
}

impl Cgroup {
    /// Resolves `--cgroup PATH`: a directory on the cgroup2 filesystem, given as a full path
    /// or relative to the cgroup2 mount (`system.slice/foo.service`).
    pub fn resolve(arg: &Path) -> Result<Self> {
        let mount = cgroup2_mount()?;
        let candidate = if arg.exists() {
            arg.to_path_buf()
        } else {
            match &mount {
                Some(m) if arg.is_relative() || !arg.starts_with(&m.point) => {
                    m.point.join(arg.strip_prefix("/").unwrap_or(arg))
                }
                _ => arg.to_path_buf(),
            }
        };
        let path = candidate
            .canonicalize()
            .map_err(|e| UsageError(format!("no cgroup at `{}`: {e}", arg.display())))?;
        if !path.is_dir() {
            return Err(
                UsageError(format!("`{}` is not a cgroup directory", path.display())).into(),
            );
        }
        let fs_type = nix::sys::statfs::statfs(&path)
            .with_context(|| format!("statfs {}", path.display()))?
            .filesystem_type()
            .0;
        if fs_type != CGROUP2_SUPER_MAGIC {
            return Err(UsageError(format!(
                "`{}` is not on a cgroup v2 filesystem (cgroup v1 is not supported)",
                path.display()
            ))
            .into());
        }
        let mount =
            mount.ok_or_else(|| anyhow!("no cgroup2 filesystem in /proc/self/mountinfo"))?;
        let relative = path.strip_prefix(&mount.point).map_err(|_| {
            UsageError(format!(
                "`{}` is not below the cgroup2 mount {}",
                path.display(),
                mount.point.display()
            ))
        })?;
        let level = mount.root_depth + relative.components().count() as u32;
        Ok(Self {
            id: cgroup_id(&path)?,
            path,
            level,
        })
    }
}

pub(crate) struct Cgroup2Mount {
    pub(crate) point: PathBuf,
    /// The mount's root inside the cgroup2 hierarchy (`/` unless a subtree is mounted).
    pub(crate) root: String,
    /// Depth of the mount's root inside the cgroup2 hierarchy (0 unless a subtree is
    /// bind-mounted).
    root_depth: u32,
}

/// The first cgroup2 mount in `/proc/self/mountinfo`.
pub(crate) fn cgroup2_mount() -> Result<Option<Cgroup2Mount>> {
    let info =
        std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    Ok(
        find_mount(&info, |fstype, _| fstype == "cgroup2").map(|(root, point)| Cgroup2Mount {
            root_depth: Path::new(&root).components().skip(1).count() as u32,
            point,
            root,
        }),
    )
}

/// The first mount in mountinfo text `mounts` whose filesystem type and super options
/// `wanted` accepts: its root inside the filesystem and its mount point, unescaped.
pub(crate) fn find_mount(
    mounts: &str,
    wanted: impl Fn(&str, &str) -> bool,
) -> Option<(String, PathBuf)> {
    mounts.lines().find_map(|line| {
        // `ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER`
        let (left, right) = line.split_once(" - ")?;
        let mut right = right.split_whitespace();
        let fstype = right.next()?;
        let super_options = right.nth(1).unwrap_or("");
        if !wanted(fstype, super_options) {
            return None;
        }
        let fields: Vec<&str> = left.split_whitespace().collect();
        Some((
            unescape_mountinfo(fields.get(3)?),
            PathBuf::from(unescape_mountinfo(fields.get(4)?)),
        ))
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(field: &str) -> String {
    let mut out = Vec::new();
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4].iter().all(u8::is_ascii_digit)
            && let Ok(v) = u8::from_str_radix(&field[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup's id: on cgroup2 the file handle of its directory is the 8-byte kernfs node
/// id, the value `bpf_get_current_cgroup_id` returns (the approach of systemd and bpftool).
pub fn cgroup_id(path: &Path) -> Result<u64> {
    #[repr(C)]
    struct Handle {
        handle_bytes: u32,
        handle_type: i32,
        f_handle: [u8; 64],
    }
    let cpath = CString::new(path.as_os_str().as_bytes()).context("cgroup path contains NUL")?;
    let mut handle = Handle {
        handle_bytes: 64,
        handle_type: 0,
        f_handle: [0; 64],
    };
    let mut mount_id = 0;
    // SAFETY: `handle` is a `struct file_handle` with 64 bytes of payload, as announced in
    // `handle_bytes`; both out-pointers are valid for the call.
    let rc = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            cpath.as_ptr(),
            (&raw mut handle).cast::<libc::file_handle>(),
            &mut mount_id,
            0,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("name_to_handle_at {}", path.display()));
    }
    if handle.handle_bytes != 8 {
        anyhow::bail!(
            "unexpected cgroup file handle of {} bytes for {}",
            handle.handle_bytes,
            path.display()
        );
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&handle.f_handle[..8]);
    Ok(u64::from_ne_bytes(id))
}

/// The fork/exit programs, attached.
#[derive(Clone, Debug)]
pub struct ProcessHooks {
    hooks: Vec<&'static str>,
}

impl HookFamily for ProcessHooks {
    const NAME: &'static str = "processes";
    type Options = Filters;

    /// Exec and exit always (a process's name after exec, its last name; an exited target
    /// must leave the tgid set before its pid is reused), fork with `--follow-children`.
    fn attach(cx: &mut AttachContext<'_>, filters: &Filters) -> Result<Self> {
        let (ebpf, btf) = cx.ebpf_and_btf()?;
        let mut hooks = vec!["tp_btf sched_process_exec", "tp_btf sched_process_exit"];
        let mut programs = vec![
            ("process_exec", "sched_process_exec"),
            ("process_exit", "sched_process_exit"),
        ];
        if filters.follow_children {
            programs.push(("process_fork", "sched_process_fork"));
            hooks.push("tp_btf sched_process_fork");
        }
        for (name, tracepoint) in programs {
            attach_tp_btf(ebpf, name, tracepoint, btf)?;
        }
        Ok(Self { hooks })
    }

    fn hook_line(&self) -> HookLine {
        HookLine::plain("tp_btf", self.hooks.join(", "))
    }
}

/// What fork/exit tracking did, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProcessHealth {
    /// Children of targets added to the trace (`--follow-children`).
    pub children_followed: u64,
    /// Children not traced because the target set was full.
    pub children_not_followed: u64,
    /// Processes evicted from the per-process table (`--max-processes`): their calls are
    /// still in the totals of Prometheus, not in the summary.
    pub evicted_processes: u64,
}

/// The name each traced process had when it exited (see `EXIT_COMMS`); empty when the
/// exit program is not attached (system-wide tracing).
pub fn exit_comms(ebpf: &Ebpf) -> Result<BTreeMap<ProcessKey, Outside>> {
    let Some(map) = ebpf.map(names::EXIT_COMMS) else {
        return Ok(BTreeMap::new());
    };
    let comms: HashMap<&MapData, ProcessKey, [u8; TASK_COMM_LEN]> = HashMap::try_from(map)?;
    Ok(
        crate::map_batch::entries::<ProcessKey, [u8; TASK_COMM_LEN]>(comms.map())?
            .into_iter()
            .map(|(key, comm)| (key, crate::event::comm_of(&comm)))
            .collect(),
    )
}

pub fn health(ebpf: &Ebpf) -> Result<ProcessHealth> {
    let counters = crate::per_cpu::CpuCounters::open(ebpf, names::PROCESS_COUNTERS)?;
    let sum = |index: u32| counters.sum(index);
    Ok(ProcessHealth {
        children_followed: sum(counter::CHILDREN_FOLLOWED)?,
        children_not_followed: sum(counter::CHILDREN_NOT_FOLLOWED)?,
        evicted_processes: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comm_is_checked_and_truncated_like_the_kernel() {
        let mut f = Filters::default();
        let mut notices = Vec::new();
        f.set_comm("postgres", &mut |n| notices.push(n)).unwrap();
        assert_eq!(f.comm.as_deref(), Some(&b"postgres"[..]));
        assert!(notices.is_empty());
        f.set_comm("a-very-long-process-name", &mut |n| notices.push(n))
            .unwrap();
        assert_eq!(f.comm.as_deref(), Some(&b"a-very-long-pro"[..]));
        assert_eq!(notices.len(), 1);
        assert!(
            notices[0].contains("24 bytes") && notices[0].contains("`a-very-long-pro`"),
            "{}",
            notices[0]
        );
        assert!(f.set_comm("", &mut |_| {}).is_err());
        assert!(f.set_comm("a\0b", &mut |_| {}).is_err());
    }

    #[test]
    fn comm_fills_the_config() {
        let mut f = Filters {
            follow_children: true,
            ..Default::default()
        };
        f.set_comm("sh", &mut |_| {}).unwrap();
        let btf = KernelBtf::load().expect("kernel BTF");
        let c = f.process_config(&btf).unwrap();
        assert_eq!((c.match_comm, c.follow_children, c.match_cgroup), (1, 1, 0));
        assert_eq!(&c.comm[..3], b"sh\0");
        assert_eq!(
            c.comm_mask,
            [0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        // tgid follows pid in task_struct; both are pid_t.
        assert!(
            c.offsets.task_tgid > 0 && c.offsets.signal_live > 0,
            "{:?}",
            c.offsets
        );
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(
            unescape_mountinfo(r"/sys/fs/my\040cgroup"),
            "/sys/fs/my cgroup"
        );
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }

    #[test]
    fn bad_cgroups_are_usage_errors() {
        let e = Cgroup::resolve(Path::new("/no/such/cgroup")).unwrap_err();
        assert!(e.downcast_ref::<UsageError>().is_some(), "{e:#}");
        assert!(e.to_string().contains("no cgroup at"), "{e:#}");
        let e = Cgroup::resolve(Path::new("/proc")).unwrap_err();
        assert!(
            e.to_string().contains("not on a cgroup v2 filesystem"),
            "{e:#}"
        );
    }
}
