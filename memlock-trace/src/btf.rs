//! The running kernel's BTF: struct field offsets, function signatures and enum values,
//! so that nothing is tied to one kernel build.

mod name_index;

use std::{io::Write as _, os::fd::AsRawFd as _, path::Path};

use anyhow::{Context as _, Result, anyhow, bail};
use btf_rs::{Backend, Btf, Type};
use memlock_trace_common::{
    KernelOffsets, lock_context,
    mapping::MappingConfig,
    rss::{self, RssConfig},
};

use name_index::NameIndex;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The running kernel's release, `uname -r`.
pub fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// A kernel release's major and minor version (`6.1.0-57-cloud-amd64`: 6, 1), for the
/// features a version brings; None when it does not start with both.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    Some((numbers.next()?.ok()?, numbers.next()?.ok()?))
}

/// The running kernel's type information.
pub struct KernelBtf {
    /// Memory-mapped: each type is parsed when it is asked for.
    btf: Btf,
    names: NameIndex,
}

impl KernelBtf {
    pub fn load() -> Result<Self> {
        if !Path::new(VMLINUX_BTF).exists() {
            bail!(
                "this kernel has no BTF ({VMLINUX_BTF} is missing): memlock-trace needs a kernel \
                 built with CONFIG_DEBUG_INFO_BTF=y to find struct offsets"
            );
        }
        let bytes = std::fs::read(VMLINUX_BTF).with_context(|| format!("reading {VMLINUX_BTF}"))?;
        let names = NameIndex::of(&bytes).with_context(|| format!("parsing {VMLINUX_BTF}"))?;
        let btf = mapped(&bytes).with_context(|| format!("parsing {VMLINUX_BTF}"))?;
        Ok(Self { btf, names })
    }

    /// The types called `name` (none when the kernel has none).
    fn types_named(&self, name: &str) -> Vec<Type> {
        self.names
            .ids(name)
            .filter_map(|id| self.btf.resolve_type_by_id(id).ok())
            .filter(|t| {
                t.as_btf_type()
                    .is_some_and(|t| self.btf.resolve_name(t).is_ok_and(|n| n == name))
            })
            .collect()
    }

    /// Byte offset of `field` in `struct name`, looking through anonymous struct/union
    /// members (e.g. `mm_struct` keeps most fields in an unnamed inner struct).
    pub fn field_offset(&self, name: &str, field: &str) -> Result<u32> {
        let s = self
            .types_named(name)
            .into_iter()
            .find_map(|t| match t {
                Type::Struct(s) => Some(s),
                _ => None,
            })
            .ok_or_else(|| anyhow!("struct {name} is not in the kernel's BTF"))?;
        self.find_member(&s, field)?
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
        self.types_named(name)
            .iter()
            .any(|t| matches!(t, Type::Func(_)))
    }

    /// The parameters and return type of kernel function `name`, or `None` if this kernel
    /// has no such function (or it was inlined everywhere, so BTF does not list it).
    pub fn function_signature(&self, name: &str) -> Result<Option<Signature>> {
        let Some(func) = self.types_named(name).into_iter().find_map(|t| match t {
            Type::Func(f) => Some(f),
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

    /// Whether the kernel's BTF has an enum called `name` (e.g. `fault_flag`, an enum only on
    /// newer kernels).
    pub fn has_enum(&self, name: &str) -> bool {
        self.types_named(name)
            .iter()
            .any(|t| matches!(t, Type::Enum(_) | Type::Enum64(_)))
    }

    /// Whether enum `name` has `member` (e.g. `BPF_FUNC_find_vma` of `bpf_func_id`: whether
    /// this kernel has that helper).
    pub fn has_enum_member(&self, name: &str, member: &str) -> bool {
        self.enum_value(name, member).is_ok()
    }

    /// Value of `member` of `enum name` (e.g. `VM_FAULT_MAJOR` of `vm_fault_reason`).
    pub fn enum_value(&self, name: &str, member: &str) -> Result<u64> {
        let types = self.types_named(name);
        if types.is_empty() {
            bail!("enum {name} is not in the kernel's BTF");
        }
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
        // Why a lock failed is extra: a kernel without one of these fields still traces,
        // with that figure unknown (offset 0; a pointer and the field behind it go together).
        let optional = |name: &str, field: &str| self.field_offset(name, field).unwrap_or(0);
        let both = |a: u32, b: u32| if a == 0 || b == 0 { (0, 0) } else { (a, b) };
        let rlim = self
            .field_offset("signal_struct", "rlim")
            .map_or(0, |rlim| {
                rlim + lock_context::RLIMIT_MEMLOCK * lock_context::RLIMIT_SIZE
            });
        let (task_signal, signal_rlim_memlock) = both(optional("task_struct", "signal"), rlim);
        let (task_cred, cred_cap_effective) = both(
            optional("task_struct", "cred"),
            optional("cred", "cap_effective"),
        );
        Ok(KernelOffsets {
            task_mm: self.field_offset("task_struct", "mm")?,
            task_min_flt: self.field_offset("task_struct", "min_flt")?,
            task_maj_flt: self.field_offset("task_struct", "maj_flt")?,
            mm_locked_vm: self.field_offset("mm_struct", "locked_vm")?,
            mm_map_count: self.field_offset("mm_struct", "map_count")?,
            mm_def_flags: optional("mm_struct", "def_flags"),
            task_signal,
            signal_rlim_memlock,
            task_cred,
            cred_cap_effective,
            mm_total_vm: optional("mm_struct", "total_vm"),
            // x86 and arm64 keep `thread_info` in the task (first, offset 0); the compat
            // field (x86 `status`, arm64 `flags`) is read only when found.
            task_thread_status: match (
                self.field_offset("task_struct", "thread_info"),
                self.field_offset("thread_info", crate::arch::COMPAT_FIELD),
            ) {
                (Ok(info), Ok(status)) => info + status,
                _ => 0,
            },
        })
    }
}

impl KernelBtf {
    /// Size in bytes of `struct name`.
    pub fn struct_size(&self, name: &str) -> Result<u32> {
        self.types_named(name)
            .into_iter()
            .find_map(|t| match t {
                Type::Struct(s) => u32::try_from(s.size()).ok(),
                _ => None,
            })
            .ok_or_else(|| anyhow!("struct {name} is not in the kernel's BTF"))
    }

    /// Where this kernel keeps a process's RSS counters (`memlock_trace_common::rss`), for
    /// `nr_cpus` possible CPUs; [`rss::layout::NONE`] if neither layout is there.
    pub fn rss_config(&self, nr_cpus: u32) -> RssConfig {
        self.rss_config_of(nr_cpus).unwrap_or(RssConfig::ZERO)
    }

    fn rss_config_of(&self, nr_cpus: u32) -> Result<RssConfig> {
        let f = |name: &str, field: &str| self.field_offset(name, field);
        let mut config = RssConfig {
            nr_cpus,
            task_mm: f("task_struct", "mm")?,
            mm_rss_stat: f("mm_struct", "rss_stat")?,
            mm_hugetlb_usage: f("mm_struct", "hugetlb_usage").unwrap_or(0),
            ..RssConfig::ZERO
        };
        if let Ok(count) = f("mm_rss_stat", "count") {
            // To 6.1: `struct mm_rss_stat { atomic_long_t count[NR_MM_COUNTERS]; }`.
            config.layout = rss::layout::ATOMIC;
            config.mm_rss_stat += count;
            config.counter_size = 8;
            // `struct task_rss_stat { int events; int count[NR_MM_COUNTERS]; }`, with
            // SPLIT_RSS_COUNTING only.
            if let (Ok(task), Ok(count)) =
                (f("task_struct", "rss_stat"), f("task_rss_stat", "count"))
            {
                config.task_rss_count = task + count;
            }
        } else if nr_cpus <= rss::MAX_CPUS {
            config.layout = rss::layout::PERCPU;
            config.counter_size = self.struct_size("percpu_counter")?;
            config.counter_count = f("percpu_counter", "count")?;
            config.counter_counters = f("percpu_counter", "counters")?;
            config.bpf_array_pptrs = f("bpf_array", "pptrs")?;
        }
        Ok(config)
    }

    /// Whether the kernel has `bpf_find_vma` (5.17): else VMA lookups walk the rbtree.
    pub fn has_find_vma(&self) -> bool {
        self.has_enum_member("bpf_func_id", "BPF_FUNC_find_vma")
    }

    /// The offsets the in-kernel VMA lookups read (`memlock_trace_common::mapping`); an
    /// error names the first field this kernel lacks.
    pub fn mapping_config(&self) -> Result<MappingConfig> {
        let f = |name: &str, field: &str| self.field_offset(name, field);
        let vma = |field: &str| f("vm_area_struct", field);
        let mm = |field: &str| f("mm_struct", field);
        let mut config = MappingConfig {
            valid: 1,
            task_mm: f("task_struct", "mm")?,
            vma_start: vma("vm_start")?,
            vma_end: vma("vm_end")?,
            vma_flags: vma("vm_flags")?,
            vma_pgoff: vma("vm_pgoff")?,
            vma_file: vma("vm_file")?,
            vma_mm: vma("vm_mm")?,
            vma_ops: vma("vm_ops")?,
            vma_private_data: vma("vm_private_data")?,
            file_dentry: f("file", "f_path")? + f("path", "dentry")?,
            file_inode: f("file", "f_inode")?,
            dentry_name: f("dentry", "d_name")? + f("qstr", "name")?,
            inode_ino: f("inode", "i_ino")?,
            inode_sb: f("inode", "i_sb")?,
            sb_dev: f("super_block", "s_dev")?,
            mm_start_brk: mm("start_brk")?,
            mm_brk: mm("brk")?,
            mm_start_stack: mm("start_stack")?,
            ..MappingConfig::ZERO
        };
        // Before 6.1 the VMAs are an rbtree: what the lookups walk without `bpf_find_vma`.
        if let (Ok(mm_rb), Ok(vma_rb), Ok(rb_left), Ok(rb_right)) = (
            mm("mm_rb"),
            vma("vm_rb"),
            f("rb_node", "rb_left"),
            f("rb_node", "rb_right"),
        ) {
            config.rb_valid = 1;
            config.mm_rb = mm_rb;
            config.vma_rb = vma_rb;
            config.rb_left = rb_left;
            config.rb_right = rb_right;
        }
        // From 6.1 a maple tree: walked where `bpf_find_vma` cannot run (interrupts off).
        if let Ok(maple) = self.maple_offsets() {
            config = maple(config);
        }
        Ok(config)
    }
}

impl KernelBtf {
    /// The maple tree fields the lockless VMA walk reads (6.1+): offsets in words from a
    /// node's start, and the node types.
    fn maple_offsets(&self) -> Result<impl Fn(MappingConfig) -> MappingConfig> {
        let f = |name: &str, field: &str| self.field_offset(name, field);
        let word = |name: &str, field: &str| f(name, field).map(|o| o / 8);
        let kind = |member: &str| self.enum_value("maple_type", member).map(|v| v as u32);
        let (mm_mt_root, range_pivot, range_slot, arange_pivot, arange_slot) = (
            f("mm_struct", "mm_mt")? + f("maple_tree", "ma_root")?,
            word("maple_range_64", "pivot")?,
            word("maple_range_64", "slot")?,
            word("maple_arange_64", "pivot")?,
            word("maple_arange_64", "slot")?,
        );
        let (leaf, range, arange) = (
            kind("maple_leaf_64")?,
            kind("maple_range_64")?,
            kind("maple_arange_64")?,
        );
        Ok(move |config| MappingConfig {
            maple_valid: 1,
            mm_mt_root,
            range_pivot,
            range_slot,
            arange_pivot,
            arange_slot,
            maple_leaf_64: leaf,
            maple_range_64: range,
            maple_arange_64: arange,
            ..config
        })
    }
}

/// btf-rs over `bytes` memory-mapped: the kernel's own file where sysfs maps it (recent
/// kernels, 6.18 here: no copy), else a copy in a memfd.
fn mapped(bytes: &[u8]) -> Result<Btf> {
    match Btf::from_file_with_backend(VMLINUX_BTF, Backend::Mmap) {
        Ok(btf) => Ok(btf),
        Err(_) => mapped_copy(bytes),
    }
}

/// btf-rs over a copy of `bytes` in a memfd, memory-mapped.
fn mapped_copy(bytes: &[u8]) -> Result<Btf> {
    let memfd =
        nix::sys::memfd::memfd_create("memlock-trace-btf", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
            .context("memfd_create")?;
    let mut copy = std::fs::File::from(memfd);
    copy.write_all(bytes)
        .context("copying the BTF to a memfd")?;
    // The mapping outlives the file.
    Ok(Btf::from_file_with_backend(
        format!("/proc/self/fd/{}", copy.as_raw_fd()),
        Backend::Mmap,
    )?)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_are_read_from_releases() {
        assert_eq!(kernel_version("6.18.44-fc-v1300"), Some((6, 18)));
        assert_eq!(kernel_version("5.10.0-32-cloud-amd64"), Some((5, 10)));
        assert_eq!(kernel_version("7.0"), Some((7, 0)));
        assert_eq!(kernel_version("unknown"), None);
        assert_eq!(kernel_version("6"), None);
        // The running kernel's, whatever it is.
        assert!(kernel_version(&kernel_release()).is_some());
    }

    #[test]
    fn a_copy_of_the_btf_resolves_as_the_kernels_file() {
        let bytes = std::fs::read(VMLINUX_BTF).expect("kernel BTF");
        let copy = KernelBtf {
            btf: mapped_copy(&bytes).expect("memfd copy"),
            names: NameIndex::of(&bytes).expect("index"),
        };
        let loaded = KernelBtf::load().expect("kernel BTF");
        assert_eq!(
            copy.offsets().expect("offsets"),
            loaded.offsets().expect("offsets")
        );
        assert_eq!(
            copy.function_signature("handle_mm_fault")
                .expect("signature"),
            loaded
                .function_signature("handle_mm_fault")
                .expect("signature")
        );
        assert!(
            copy.function_signature("handle_mm_fault")
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn offsets_resolve_from_running_kernel() {
        let btf = KernelBtf::load().expect("kernel BTF");
        let off = btf.offsets().expect("offsets");
        // min_flt and maj_flt are adjacent `unsigned long`s in task_struct.
        assert_eq!(off.task_maj_flt, off.task_min_flt + 8, "{off:?}");
        assert!(off.mm_locked_vm > 0 && off.mm_map_count > 0, "{off:?}");
        // Every kernel this runs on has them, none first in its struct.
        assert!(
            off.task_signal > 0 && off.task_cred > 0 && off.mm_total_vm > 0,
            "{off:?}"
        );
        assert!(off.cred_cap_effective > 0, "{off:?}");
        assert_eq!(
            off.signal_rlim_memlock,
            btf.field_offset("signal_struct", "rlim").unwrap() + 8 * 16,
            "rlim[RLIMIT_MEMLOCK].rlim_cur"
        );
        assert!(btf.field_offset("task_struct", "no_such_field").is_err());
    }

    #[test]
    fn mapping_offsets_resolve_from_running_kernel() {
        let btf = KernelBtf::load().expect("kernel BTF");
        let c = btf.mapping_config().expect("mapping offsets");
        // vm_start and vm_end are adjacent `unsigned long`s in every kernel.
        assert_eq!(c.vma_end, c.vma_start + 8, "{c:?}");
        assert_eq!(c.mm_brk, c.mm_start_brk + 8, "{c:?}");
        // Before 6.1 the rbtree, from 5.17 bpf_find_vma: every kernel has one of the two.
        assert!(c.rb_valid == 1 || btf.has_find_vma(), "{c:?}");
    }
}
