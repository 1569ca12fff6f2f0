//! User call stacks made readable, for every family that records them (`--stacks`: faults
//! and mlock-family calls).
//!
//! An address is symbolized through the mapping that held it in the process's last
//! `/proc/PID/smaps` snapshot ([`MappingCache`](crate::procfs::MappingCache)): the mapped
//! file and the address's offset in it, resolved by [blazesym](https://docs.rs/blazesym) from
//! the file's ELF symbols (and DWARF, when present, for file:line). Working from the snapshot
//! rather than the live process means the stacks of a command that has already exited are
//! still symbolized. A frame that cannot be resolved is shown as `module+0xoffset` (or the
//! bare address when no mapping held it), never dropped.

use blazesym::symbolize::{
    CodeInfo, Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};
use serde::Serialize;

use crate::{output::Outside, procfs::Mapping};

/// One frame of a stack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Frame {
    /// The instruction pointer (a return address for every frame but the first).
    pub addr: String,
    /// The function (demangled); when it could not be resolved, `module+0xoffset`, or the
    /// address when no mapping held it. Named by the ELF file: outside text, of any length.
    pub symbol: Outside,
    /// Whether `symbol` names a function.
    pub resolved: bool,
    /// A function the compiler inlined into the next frame (same `addr`; DWARF only).
    pub inlined: bool,
    /// The mapped file (or `[vdso]`, `anonymous`, ...); null when no mapping held the address.
    pub module: Option<Outside>,
    /// Offset of the address in `module`'s file.
    pub offset: Option<String>,
    /// Source file and line, when the module has DWARF.
    pub file: Option<Outside>,
    pub line: Option<u32>,
}

/// Symbolizes frames through a mapping snapshot; keeps parsed files between summaries.
pub struct StackSymbolizer {
    symbolizer: Symbolizer,
}

impl Default for StackSymbolizer {
    fn default() -> Self {
        Self {
            symbolizer: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .enable_demangling(true)
                .build(),
        }
    }
}

impl StackSymbolizer {
    /// Every frame of a stack (instruction pointers innermost first), inlined functions
    /// included.
    pub fn stack(&self, ips: &[u64], maps: Option<&[Mapping]>) -> Vec<Frame> {
        ips.iter()
            .enumerate()
            .flat_map(|(i, &ip)| self.frames(ip, i > 0, maps))
            .collect()
    }

    /// The frames at `ip` of a process whose mappings were `maps`: the function, preceded by
    /// the functions inlined into it there (innermost first). `return_address`: every frame
    /// but the innermost holds the address after a call, looked up one byte back so that a
    /// call at a function's very end resolves to that function and its line.
    pub fn frames(&self, ip: u64, return_address: bool, maps: Option<&[Mapping]>) -> Vec<Frame> {
        let (mut frame, offset) = Self::unresolved(ip, maps);
        // Only files can be symbolized: not [vdso], [heap], anonymous (JIT code), nor a
        // file deleted since it was mapped.
        let (Some(module), Some(offset)) = (frame.module.clone(), offset) else {
            return vec![frame];
        };
        let path = module.as_path();
        if !module.starts_with("/") || !path.is_file() {
            return vec![frame];
        }
        let lookup = if return_address && offset > 0 {
            offset - 1
        } else {
            offset
        };
        let source = Source::Elf(Elf::new(path));
        let Ok(Symbolized::Sym(sym)) = self
            .symbolizer
            .symbolize_single(&source, Input::FileOffset(lookup))
        else {
            return vec![frame];
        };
        let place = |code: Option<&CodeInfo>| match code {
            Some(code) => (Some(Outside::from(code.to_path().as_ref())), code.line),
            None => (None, None),
        };
        let mut out = Vec::with_capacity(sym.inlined.len() + 1);
        for inlined in sym.inlined.iter().rev() {
            let (file, line) = place(inlined.code_info.as_ref());
            out.push(Frame {
                symbol: Outside::from(&*inlined.name),
                resolved: true,
                inlined: true,
                file,
                line,
                ..frame.clone()
            });
        }
        (frame.file, frame.line) = place(sym.code_info.as_deref());
        frame.symbol = Outside::from(&*sym.name);
        frame.resolved = true;
        out.push(frame);
        out
    }

    /// The unresolved frame at `ip` (module and offset, or the bare address) and the offset.
    fn unresolved(ip: u64, maps: Option<&[Mapping]>) -> (Frame, Option<u64>) {
        let addr = format!("{ip:#x}");
        let Some(m) = maps.and_then(|maps| maps.iter().find(|m| m.start <= ip && ip < m.end))
        else {
            let frame = Frame {
                symbol: Outside::from(addr.as_str()),
                addr,
                resolved: false,
                inlined: false,
                module: None,
                offset: None,
                file: None,
                line: None,
            };
            return (frame, None);
        };
        let offset = ip - m.start + m.offset;
        let frame = Frame {
            addr,
            symbol: Outside::from([m.name.as_bytes(), format!("+{offset:#x}").as_bytes()].concat()),
            resolved: false,
            inlined: false,
            module: Some(m.name.clone()),
            offset: Some(format!("{offset:#x}")),
            file: None,
            line: None,
        };
        (frame, Some(offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procfs::MappingCache;

    #[test]
    fn unresolvable_frames_keep_their_module_and_offset() {
        let maps = [
            Mapping {
                start: 0x1000,
                end: 0x3000,
                offset: 0x5000,
                name: "[vdso]".into(),
                locked: false,
                lockonfault: None,
            },
            Mapping {
                start: 0x8000,
                end: 0x9000,
                offset: 0,
                name: "/nonexistent/lib.so".into(),
                locked: false,
                lockonfault: None,
            },
        ];
        let s = StackSymbolizer::default();
        let one = |ip, ret, maps| {
            let mut frames = s.frames(ip, ret, maps);
            assert_eq!(frames.len(), 1, "{frames:?}");
            frames.remove(0)
        };
        let f = one(0x1234, false, Some(&maps));
        assert_eq!(
            (f.symbol.to_str().unwrap(), f.resolved, f.offset.as_deref()),
            ("[vdso]+0x5234", false, Some("0x5234"))
        );
        let f = one(0x8010, true, Some(&maps));
        assert_eq!(f.symbol, "/nonexistent/lib.so+0x10");
        let f = one(0x20000, false, Some(&maps));
        assert_eq!((f.symbol.to_str().unwrap(), f.module), ("0x20000", None));
        assert_eq!(one(0x1234, false, None).symbol, "0x1234");
    }

    #[inline(never)]
    fn a_function_to_find() -> u64 {
        std::hint::black_box(7)
    }

    /// This test binary's own function, found through its own smaps and ELF symbols.
    #[test]
    fn symbolizes_through_the_mapping_snapshot() {
        let ip = a_function_to_find as *const () as u64;
        assert_eq!(a_function_to_find(), 7);
        let pid = std::process::id();
        let mut cache = MappingCache::default();
        cache.refresh(pid, std::time::Duration::ZERO);
        let frames = StackSymbolizer::default().frames(ip, false, cache.get(pid));
        let f = frames.last().unwrap();
        assert!(f.resolved && !f.inlined, "{f:?}");
        assert!(
            f.symbol.as_bytes().ends_with(b"a_function_to_find"),
            "{f:?}"
        );
    }
}
