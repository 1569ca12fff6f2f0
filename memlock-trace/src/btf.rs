//! The running kernel's BTF: struct field offsets, function signatures and enum values,
//! so that nothing is tied to one kernel build.

mod name_index;
mod offsets;

use std::{io::Write as _, os::fd::AsRawFd as _, path::Path};

use anyhow::{Context as _, Result, anyhow, bail};
use btf_rs::{Backend, Btf, Type};

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

    /// Whether the kernel has `bpf_find_vma` (5.17): else VMA lookups walk the rbtree.
    pub fn has_find_vma(&self) -> bool {
        self.has_enum_member("bpf_func_id", "BPF_FUNC_find_vma")
    }

    /// Whether a process's VMAs are a maple tree (6.1), not an rbtree.
    pub fn has_maple_tree(&self) -> bool {
        self.field_offset("mm_struct", "mm_mt").is_ok()
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
}
