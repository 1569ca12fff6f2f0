//! User call stacks made readable, for every family that records them (`--stacks`: faults
//! and mlock-family calls).
//!
//! An address is symbolized through the executable mapping that held it, as kept by
//! [`crate::unwind::modules`]: the mapped file, through the handle kept open since it was
//! first seen, and the address's offset in it, resolved by
//! [blazesym](https://docs.rs/blazesym) from the file's ELF symbols (and DWARF, when
//! present, for file:line and inlined functions). So the stacks of a command that has
//! exited, or of a file deleted or replaced since, are still symbolized from the very file
//! that ran. A frame that cannot be resolved is shown as `module+0xoffset` (or the bare
//! address when no mapping held it). Generated (JIT) code is named from the perf map its
//! runtime wrote ([`perf_map`]).

pub mod perf_map;

use blazesym::symbolize::{
    CodeInfo, Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};
use serde::Serialize;

use self::perf_map::PerfMaps;
use crate::{output::Outside, unwind::ProcessModules};

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
    /// The GNU build id of `module`, hex, where it has one.
    pub build_id: Option<String>,
    /// Offset of the address in `module`'s file.
    pub offset: Option<String>,
    /// Source file and line, when the module has DWARF.
    pub file: Option<Outside>,
    pub line: Option<u32>,
}

/// Frames of a stack shown in the text summary (the JSON has them all).
pub const TEXT_FRAMES: usize = 16;

impl Frame {
    /// The frame as a text summary line ends: its function, whether it was inlined, and
    /// its source file and line where known.
    pub fn text(&self) -> String {
        let place = match (&self.file, self.line) {
            (Some(file), Some(line)) => format!("  {file}:{line}"),
            (Some(file), None) => format!("  {file}"),
            _ => String::new(),
        };
        let inlined = if self.inlined { " (inlined)" } else { "" };
        format!("{}{inlined}{place}", self.symbol)
    }

    /// A frame at `addr` that no mapping held: its address stands in for the function.
    pub fn unmapped(addr: String) -> Frame {
        Frame {
            symbol: Outside::from(addr.as_str()),
            addr,
            resolved: false,
            inlined: false,
            module: None,
            build_id: None,
            offset: None,
            file: None,
            line: None,
        }
    }
}

/// Symbolizes frames through a mapping snapshot; keeps parsed files between summaries.
pub struct StackSymbolizer {
    symbolizer: Symbolizer,
    /// The perf maps of processes that run generated code, kept after they exit.
    pub perf_maps: PerfMaps,
}

impl Default for StackSymbolizer {
    fn default() -> Self {
        Self {
            symbolizer: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .enable_demangling(true)
                .build(),
            perf_maps: PerfMaps::default(),
        }
    }
}

impl StackSymbolizer {
    /// Every frame of a stack (instruction pointers innermost first), inlined functions
    /// included.
    pub fn stack(&self, ips: &[u64], modules: Option<&ProcessModules>) -> Vec<Frame> {
        ips.iter()
            .enumerate()
            .flat_map(|(i, &ip)| self.frames(ip, i > 0, modules))
            .collect()
    }

    /// The frames at `ip` of a process with these `modules`: the function, preceded by the
    /// functions inlined into it there (innermost first). `return_address`: every frame but
    /// the innermost holds the address after a call, looked up one byte back so that a call
    /// at a function's very end resolves to that function and its line.
    pub fn frames(
        &self,
        ip: u64,
        return_address: bool,
        modules: Option<&ProcessModules>,
    ) -> Vec<Frame> {
        let lookup_ip = if return_address {
            ip.saturating_sub(1)
        } else {
            ip
        };
        let (mut frame, offset) = Self::unresolved(ip, lookup_ip, modules);
        // Files are symbolized from their ELF symbols; anonymous (generated) code from its
        // runtime's perf map, if it wrote one.
        let Some(file) = modules
            .and_then(|m| m.at(lookup_ip))
            .and_then(|m| m.file.as_ref())
        else {
            let jit = modules.and_then(|m| Some((m, m.at(lookup_ip)?)));
            if let Some(name) = jit
                .filter(|(_, mapping)| !mapping.name.starts_with("["))
                .and_then(|(m, _)| self.perf_maps.get(m.tgid)?.lookup(lookup_ip))
            {
                frame.symbol = Outside::from(name);
                frame.resolved = true;
            }
            return vec![frame];
        };
        let Some(lookup) = offset else {
            return vec![frame];
        };
        let source = Source::Elf(Elf::new(file.read_path()));
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

    /// The unresolved frame at `ip` (module and offset, or the bare address) and the file
    /// offset of `lookup_ip` (`ip`, or one byte back for a return address).
    fn unresolved(
        ip: u64,
        lookup_ip: u64,
        modules: Option<&ProcessModules>,
    ) -> (Frame, Option<u64>) {
        let addr = format!("{ip:#x}");
        let Some(m) = modules.and_then(|p| p.at(lookup_ip)) else {
            return (Frame::unmapped(addr), None);
        };
        let offset = ip - m.start + m.offset;
        let frame = Frame {
            addr,
            symbol: Outside::from([m.name.as_bytes(), format!("+{offset:#x}").as_bytes()].concat()),
            resolved: false,
            inlined: false,
            module: Some(m.name.clone()),
            build_id: m.file.as_ref().and_then(|f| f.build_id.clone()),
            offset: Some(format!("{offset:#x}")),
            file: None,
            line: None,
        };
        (frame, Some(lookup_ip - m.start + m.offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::ModuleRegistry;

    #[inline(never)]
    fn a_function_to_find() -> u64 {
        std::hint::black_box(7)
    }

    /// This test binary's own function, found through its kept module and ELF symbols; an
    /// address in no executable mapping stays a bare address.
    #[test]
    fn symbolizes_through_the_kept_modules() {
        let ip = a_function_to_find as *const () as u64;
        assert_eq!(a_function_to_find(), 7);
        let pid = std::process::id();
        let mut modules = ModuleRegistry::default();
        modules.ensure(pid, ip);
        let s = StackSymbolizer::default();
        let frames = s.frames(ip, false, modules.get(pid));
        let f = frames.last().unwrap();
        assert!(f.resolved && !f.inlined, "{f:?}");
        assert!(
            f.symbol.as_bytes().ends_with(b"a_function_to_find"),
            "{f:?}"
        );
        let f = &s.frames(0x10, false, modules.get(pid))[0];
        assert_eq!(
            (f.symbol.to_str(), f.resolved, &f.module),
            (Some("0x10"), false, &None)
        );
        assert_eq!(s.frames(0x1234, true, None)[0].symbol, "0x1234");
    }
}
