//! The ids of a BTF blob's types by name, in one pass over the raw type section.
//!
//! btf-rs finds a type by name either from its cached parse (every type and string of a
//! 5.5 MB vmlinux BTF turned into owned values: 85 ms and ~300,000 allocations here, then
//! 20 ms to free them, the longest step of a session's start) or, memory-mapped, by reading
//! every type's name again at each lookup. This index holds a hash and an id per named type
//! (one sorted vector); btf-rs, memory-mapped, then parses only the types asked for.

use std::hash::{BuildHasher as _, BuildHasherDefault, DefaultHasher};

use anyhow::{Result, bail, ensure};

/// BTF's magic number, as the first two bytes read little-endian.
const BTF_MAGIC: u16 = 0xeb9f;

pub struct NameIndex {
    /// (hash of the name, type id), sorted.
    entries: Vec<(u64, u32)>,
}

impl NameIndex {
    /// Indexes the types of `btf`, a little-endian BTF blob without a base (vmlinux).
    pub fn of(btf: &[u8]) -> Result<Self> {
        let u16_at = |at: usize| {
            btf.get(at..at + 2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
        };
        let u32_at = |at: usize| {
            btf.get(at..at + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        ensure!(
            u16_at(0) == Some(BTF_MAGIC),
            "not little-endian BTF (magic)"
        );
        let header = |field: usize| u32_at(8 + 4 * field).map(|v| v as usize);
        let (Some(hdr_len), Some(type_off), Some(type_len), Some(str_off), Some(str_len)) = (
            u32_at(4).map(|v| v as usize),
            header(0),
            header(1),
            header(2),
            header(3),
        ) else {
            bail!("BTF header cut short");
        };
        let types = hdr_len + type_off..hdr_len + type_off + type_len;
        let strings = btf
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or_else(|| anyhow::anyhow!("BTF string section out of bounds"))?;
        let hasher = BuildHasherDefault::<DefaultHasher>::default();
        let mut entries = Vec::with_capacity(type_len / 24);
        let (mut at, mut id) = (types.start, 1u32);
        while at < types.end {
            let (Some(name_off), Some(info)) = (u32_at(at), u32_at(at + 4)) else {
                bail!("BTF type {id} cut short");
            };
            if name_off != 0 {
                let name = strings
                    .get(name_off as usize..)
                    .and_then(|s| s.split(|&b| b == 0).next())
                    .ok_or_else(|| anyhow::anyhow!("BTF type {id} names no string"))?;
                entries.push((hasher.hash_one(name), id));
            }
            at += 12 + trailing_bytes(info)?;
            id += 1;
        }
        ensure!(at == types.end, "BTF type section ends inside a type");
        entries.sort_unstable();
        Ok(Self { entries })
    }

    /// The ids of the types that may be called `name` (the caller checks the name: two
    /// names can share a hash).
    pub fn ids(&self, name: &str) -> impl Iterator<Item = u32> + '_ {
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(name.as_bytes());
        let first = self.entries.partition_point(|&(h, _)| h < hash);
        self.entries[first..]
            .iter()
            .take_while(move |&&(h, _)| h == hash)
            .map(|&(_, id)| id)
    }
}

/// The bytes a type's 12-byte header is followed by, by kind (`include/uapi/linux/btf.h`).
fn trailing_bytes(info: u32) -> Result<usize> {
    let vlen = (info & 0xffff) as usize;
    Ok(match (info >> 24) & 0x1f {
        // int: one u32 of encoding; array: struct btf_array; var: its linkage;
        // decl_tag: its component index
        1 | 14 | 17 => 4,
        3 => 12,
        // ptr, fwd, typedef, volatile, const, restrict, func, float, type_tag
        2 | 7..=12 | 16 | 18 => 0,
        // struct, union (btf_member), datasec (btf_var_secinfo), enum64 (btf_enum64)
        4 | 5 | 15 | 19 => 12 * vlen,
        // enum (btf_enum), func_proto (btf_param)
        6 | 13 => 8 * vlen,
        kind => bail!("unknown BTF kind {kind}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_btf_rs_finds_in_the_running_kernel() {
        let bytes = std::fs::read(super::super::VMLINUX_BTF).expect("kernel BTF");
        let index = NameIndex::of(&bytes).expect("index");
        let btf = btf_rs::Btf::from_bytes(&bytes).expect("btf-rs");
        for name in [
            "task_struct",
            "mm_struct",
            "handle_mm_fault",
            "bpf_func_id",
            "u64",
        ] {
            let mut ours: Vec<u32> = index
                .ids(name)
                .filter(|&id| {
                    let t = btf.resolve_type_by_id(id).expect("type");
                    t.as_btf_type()
                        .is_some_and(|t| btf.resolve_name(t).is_ok_and(|n| n == name))
                })
                .collect();
            ours.sort_unstable();
            let mut theirs = btf.resolve_ids_by_name(name).expect("ids");
            theirs.sort_unstable();
            assert!(!theirs.is_empty(), "{name}");
            assert_eq!(ours, theirs, "{name}");
        }
        assert_eq!(index.ids("no_such_type_anywhere").count(), 0);
    }
}
