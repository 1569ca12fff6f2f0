//! What the running kernel offers: BTF, struct offsets, privileges, tracefs.
//!
//! Everything here runs before any program is loaded, so that a missing piece is reported
//! as one clear sentence naming the fix instead of a verifier dump.

use std::{fs, path::Path};

use anyhow::{Context as _, Result, anyhow, bail};
use btf_rs::{Btf, Type};
use memlock_trace_common::KernelOffsets;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";
pub const TRACEFS: &str = "/sys/kernel/tracing";

/// The running kernel's type information.
pub struct KernelBtf {
    btf: Btf,
}

impl KernelBtf {
    pub fn load() -> Result<Self> {
        if !Path::new(VMLINUX_BTF).exists() {
            bail!(
                "this kernel has no BTF ({VMLINUX_BTF} is missing): memlock-trace needs a kernel \
                 built with CONFIG_DEBUG_INFO_BTF=y to find struct offsets"
            );
        }
        let btf = Btf::from_file(VMLINUX_BTF).with_context(|| format!("parsing {VMLINUX_BTF}"))?;
        Ok(Self { btf })
    }

    /// Byte offset of `field` in `struct name`, looking through anonymous struct/union
    /// members (e.g. `mm_struct` keeps most fields in an unnamed inner struct).
    pub fn field_offset(&self, name: &str, field: &str) -> Result<u32> {
        let types = self
            .btf
            .resolve_types_by_name(name)
            .with_context(|| format!("struct {name} is not in the kernel's BTF"))?;
        let s = types
            .iter()
            .find_map(|t| match t {
                Type::Struct(s) => Some(s),
                _ => None,
            })
            .ok_or_else(|| anyhow!("{name} is not a struct in the kernel's BTF"))?;
        self.find_member(s, field)?
            .ok_or_else(|| anyhow!("struct {name} has no field {field} in this kernel"))
    }

    fn find_member(&self, s: &btf_rs::Struct, field: &str) -> Result<Option<u32>> {
        for member in &s.members {
            let offset = member.bit_offset() / 8;
            let member_name = self.btf.resolve_name(member).unwrap_or_default();
            if member_name == field {
                return Ok(Some(offset));
            }
            if member_name.is_empty() {
                let inner = match self.btf.resolve_chained_type(member)? {
                    Type::Struct(inner) | Type::Union(inner) => inner,
                    _ => continue,
                };
                if let Some(inner_offset) = self.find_member(&inner, field)? {
                    return Ok(Some(offset + inner_offset));
                }
            }
        }
        Ok(None)
    }

    /// Whether the kernel has a function called `name` (a candidate for fentry/kprobe).
    pub fn has_function(&self, name: &str) -> bool {
        self.btf
            .resolve_types_by_name(name)
            .is_ok_and(|types| types.iter().any(|t| matches!(t, Type::Func(_))))
    }

    /// The parameters and return type of kernel function `name`, or `None` if this kernel
    /// has no such function (or it was inlined everywhere, so BTF does not list it).
    pub fn function_signature(&self, name: &str) -> Result<Option<Signature>> {
        let Ok(types) = self.btf.resolve_types_by_name(name) else {
            return Ok(None);
        };
        let Some(func) = types.iter().find_map(|t| match t {
            Type::Func(f) => Some(f.clone()),
            _ => None,
        }) else {
            return Ok(None);
        };
        let Type::FuncProto(proto) = self.btf.resolve_chained_type(&func)? else {
            bail!("BTF function {name} has no prototype");
        };
        let mut params = Vec::new();
        for param in &proto.parameters {
            let param_name = self.btf.resolve_name(param).unwrap_or_default();
            let shape = self.shape(self.btf.resolve_chained_type(param)?)?;
            params.push((param_name, shape));
        }
        let ret = match proto.return_type_id() {
            0 => TypeShape::Other,
            id => self.shape(self.btf.resolve_type_by_id(id)?)?,
        };
        Ok(Some(Signature { params, ret }))
    }

    /// What a C type is, for the purposes of reading it: a pointer to a named struct, a
    /// pointer to such a pointer, or something else.
    fn shape(&self, t: Type) -> Result<TypeShape> {
        let Type::Ptr(ptr) = self.strip(t)? else {
            return Ok(TypeShape::Other);
        };
        Ok(match self.strip(self.btf.resolve_chained_type(&ptr)?)? {
            Type::Struct(s) => TypeShape::PtrTo(self.btf.resolve_name(&s).unwrap_or_default()),
            Type::Ptr(inner) => match self.strip(self.btf.resolve_chained_type(&inner)?)? {
                Type::Struct(s) => {
                    TypeShape::PtrPtrTo(self.btf.resolve_name(&s).unwrap_or_default())
                }
                _ => TypeShape::Other,
            },
            _ => TypeShape::PtrToOther,
        })
    }

    /// Skips typedefs and qualifiers.
    fn strip(&self, mut t: Type) -> Result<Type> {
        loop {
            t = match &t {
                Type::Typedef(x) => self.btf.resolve_chained_type(x)?,
                Type::Const(x) | Type::Volatile(x) | Type::Restrict(x) => {
                    self.btf.resolve_chained_type(x)?
                }
                Type::TypeTag(x) => self.btf.resolve_chained_type(x)?,
                _ => return Ok(t),
            };
        }
    }

    /// Value of `member` of `enum name` (e.g. `VM_FAULT_MAJOR` of `vm_fault_reason`).
    pub fn enum_value(&self, name: &str, member: &str) -> Result<u64> {
        let types = self
            .btf
            .resolve_types_by_name(name)
            .with_context(|| format!("enum {name} is not in the kernel's BTF"))?;
        for t in &types {
            match t {
                Type::Enum(e) => {
                    for m in &e.members {
                        if self.btf.resolve_name(m).is_ok_and(|n| n == member) {
                            return Ok(u64::from(m.val()));
                        }
                    }
                }
                Type::Enum64(e) => {
                    for m in &e.members {
                        if self.btf.resolve_name(m).is_ok_and(|n| n == member) {
                            return Ok(m.val());
                        }
                    }
                }
                _ => {}
            }
        }
        bail!("enum {name} has no member {member} in this kernel")
    }

    pub fn offsets(&self) -> Result<KernelOffsets> {
        Ok(KernelOffsets {
            task_mm: self.field_offset("task_struct", "mm")?,
            task_min_flt: self.field_offset("task_struct", "min_flt")?,
            task_maj_flt: self.field_offset("task_struct", "maj_flt")?,
            mm_locked_vm: self.field_offset("mm_struct", "locked_vm")?,
            mm_map_count: self.field_offset("mm_struct", "map_count")?,
            _pad: 0,
        })
    }
}

/// A kernel function's parameters (name, shape) and return type, from BTF.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    pub params: Vec<(String, TypeShape)>,
    pub ret: TypeShape,
}

/// How to read a value of some C type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TypeShape {
    /// `struct NAME *`
    PtrTo(String),
    /// `struct NAME **`
    PtrPtrTo(String),
    /// A pointer to anything else (`unsigned long *`, ...).
    PtrToOther,
    /// Integers, enums, `void`, ...
    Other,
}

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Fails unless this process may load tracing programs: root, or CAP_BPF + CAP_PERFMON
/// (CAP_SYS_ADMIN implies both on older kernels).
pub fn check_privileges() -> Result<()> {
    let status = fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .ok_or_else(|| anyhow!("no CapEff line in /proc/self/status"))?;
    let has = |cap: u32| cap_eff & (1 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|(cap, _)| !has(*cap))
        .map(|(_, name)| name)
        .collect();
    bail!(
        "missing capabilities {}: run memlock-trace as root, or grant them with \
         `sudo setcap cap_bpf,cap_perfmon+ep $(which memlock-trace)`",
        missing.join(" and ")
    )
}

/// Mounts tracefs if it is not mounted yet (a fresh machine has it unmounted, and aya reads
/// tracepoint ids from it).
pub fn ensure_tracefs() -> Result<()> {
    match fs::metadata(Path::new(TRACEFS).join("events")) {
        Ok(_) => return Ok(()),
        // Mounted, but mode 0700: without root, reading tracepoint ids needs the capability.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => bail!(
            "cannot read tracefs at {TRACEFS} (mode 0700): run memlock-trace as root or grant \
             CAP_DAC_READ_SEARCH too (`setcap cap_bpf,cap_perfmon,cap_dac_read_search+ep`), \
             which it needs to read tracepoint ids"
        ),
        Err(_) => {}
    }
    nix::mount::mount(
        Some("tracefs"),
        TRACEFS,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .with_context(|| {
        format!("tracefs is not mounted and mounting it failed: run `mount -t tracefs tracefs {TRACEFS}`")
    })
}

/// `uname -r`.
pub fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_resolve_from_running_kernel() {
        let btf = KernelBtf::load().expect("kernel BTF");
        let off = btf.offsets().expect("offsets");
        // min_flt and maj_flt are adjacent `unsigned long`s in task_struct.
        assert_eq!(off.task_maj_flt, off.task_min_flt + 8, "{off:?}");
        assert!(off.mm_locked_vm > 0 && off.mm_map_count > 0, "{off:?}");
        assert!(btf.field_offset("task_struct", "no_such_field").is_err());
    }
}

/// Whether the running kernel lets us use one kind of hook, and if not, its reason.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Capability {
    pub name: &'static str,
    pub usable: bool,
    pub detail: String,
}

/// Loads and attaches one empty program of each kind (fentry, kprobe, tp_btf, tracepoint,
/// perf event) and reports what the kernel said.
pub fn capabilities() -> Result<Vec<Capability>> {
    use aya::{
        Btf,
        programs::{BtfTracePoint, FEntry, KProbe, PerfEvent, TracePoint, perf_event},
    };

    check_privileges()?;
    ensure_tracefs()?;
    let kernel_btf = KernelBtf::load()?;
    let mut caps = vec![Capability {
        name: "btf",
        usable: true,
        detail: VMLINUX_BTF.into(),
    }];
    let config = memlock_trace_common::Config {
        filter: memlock_trace_common::filter::TGIDS,
        offsets: kernel_btf.offsets()?,
        ..Default::default()
    };
    let mut ebpf = crate::tracer::load_object(&config)?;
    caps.push(Capability {
        name: "ring_buffer",
        usable: true,
        detail: "BPF_MAP_TYPE_RINGBUF created".into(),
    });
    let btf = Btf::from_sys_fs().context("reading the kernel BTF for aya")?;

    fn outcome<E: std::error::Error>(result: std::result::Result<(), E>) -> (bool, String) {
        match result {
            Ok(()) => (true, "loaded and attached".into()),
            Err(e) => {
                let mut reason = e.to_string();
                let mut source = e.source();
                while let Some(s) = source {
                    reason = format!("{reason}: {s}");
                    source = s.source();
                }
                (false, reason)
            }
        }
    }
    fn program<'a>(ebpf: &'a mut aya::Ebpf, name: &str) -> Result<&'a mut aya::programs::Program> {
        ebpf.program_mut(name)
            .ok_or_else(|| anyhow!("program {name} missing from the eBPF object"))
    }

    let fentry: &mut FEntry = program(&mut ebpf, "can_fentry")?.try_into()?;
    let (usable, detail) = outcome(
        fentry
            .load("handle_mm_fault", &btf)
            .and_then(|()| fentry.attach().map(drop)),
    );
    caps.push(Capability {
        name: "fentry",
        usable,
        detail: with_target(usable, detail, "fentry/fexit on handle_mm_fault"),
    });

    let kprobe: &mut KProbe = program(&mut ebpf, "can_kprobe")?.try_into()?;
    let (usable, detail) = outcome(
        kprobe
            .load()
            .and_then(|()| kprobe.attach("handle_mm_fault", 0).map(drop)),
    );
    caps.push(Capability {
        name: "kprobe",
        usable,
        detail: with_target(usable, detail, "kprobe on handle_mm_fault"),
    });

    let tp_btf: &mut BtfTracePoint = program(&mut ebpf, "can_tp_btf")?.try_into()?;
    let (usable, detail) = outcome(
        tp_btf
            .load("sched_process_exit", &btf)
            .and_then(|()| tp_btf.attach().map(drop)),
    );
    caps.push(Capability {
        name: "tp_btf",
        usable,
        detail: with_target(usable, detail, "tp_btf sched_process_exit"),
    });

    let tracepoint: &mut TracePoint = program(&mut ebpf, "can_tracepoint")?.try_into()?;
    let (usable, detail) = outcome(
        tracepoint
            .load()
            .and_then(|()| tracepoint.attach("exceptions", "page_fault_user").map(drop)),
    );
    caps.push(Capability {
        name: "tracepoint",
        usable,
        detail: with_target(usable, detail, "tracepoint exceptions:page_fault_user"),
    });

    let perf: &mut PerfEvent = program(&mut ebpf, "can_perf_event")?.try_into()?;
    let (usable, detail) = outcome(perf.load().and_then(|()| {
        perf.attach(
            perf_event::PerfEventConfig::Software(perf_event::SoftwareEvent::PageFaultsMin),
            perf_event::PerfEventScope::AllProcessesOneCpu { cpu: 0 },
            perf_event::SamplePolicy::Period(1),
            false,
        )
        .map(drop)
    }));
    caps.push(Capability {
        name: "perf_event",
        usable,
        detail: with_target(usable, detail, "software event PAGE_FAULTS_MIN"),
    });
    Ok(caps)
}

fn with_target(usable: bool, detail: String, target: &str) -> String {
    if usable {
        return format!("{target}: {detail}");
    }
    // The raw errors are terse; say what they mean on the kernels we know.
    let hint = if detail.contains("kprobe/type") {
        " (no kprobe PMU: the kernel is built without CONFIG_KPROBES)"
    } else if target.starts_with("fentry") && detail.contains("os error 1") {
        " (EPERM at load: this kernel forbids BPF trampolines / ftrace function hooks)"
    } else {
        ""
    };
    format!("{target}: refused: {detail}{hint}")
}
