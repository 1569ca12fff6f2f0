//! The BPF stack budget, checked on the object itself: the verifier refuses a program whose
//! deepest chain of BPF-to-BPF calls uses more than 512 bytes of stack, each frame rounded up
//! to 32 bytes (`check_max_stack_depth`, kernel/bpf/verifier.c). An overrun shows only as a
//! refused program on the kernels where it happens (5.10's raw `sys_exit` program and 6.1's
//! mlock fexit program at 544 once, while the host loaded them), so this test adds the frames
//! up on the host, from each function's deepest stack slot and its calls.

use std::collections::{BTreeMap, HashMap};

use object::{Object as _, ObjectSection as _, ObjectSymbol as _, RelocationTarget, SectionKind};

/// `MAX_BPF_STACK`.
const MAX_STACK: u64 = 512;
const INSN: u64 = 8;
/// The frame pointer, `r10`.
const FP: u8 = 10;

/// One function of the object: its section, where it starts, its frame and whom it calls.
struct Function {
    name: String,
    program: bool,
    frame: u64,
    /// (section index, byte offset) of each function called.
    calls: Vec<(usize, u64)>,
}

/// The deepest slot below `r10` the instructions touch: stores and loads at `r10 - N`, and
/// `rX = r10; rX += -N` (an address handed to a helper or a callee).
fn frame(code: &[u8]) -> u64 {
    let mut deepest = 0u64;
    let mut from_fp = [false; 11];
    for insn in code.chunks_exact(INSN as usize) {
        let (op, dst, src) = (insn[0], insn[1] & 0xf, insn[1] >> 4);
        let off = i16::from_le_bytes([insn[2], insn[3]]);
        let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
        let class = op & 0x07;
        let touches = match class {
            // LDX: src is the base; ST/STX: dst is.
            0x01 => src == FP,
            0x02 | 0x03 => dst == FP,
            _ => false,
        };
        if touches && off < 0 {
            deepest = deepest.max(u64::from(off.unsigned_abs()));
        }
        let dst = usize::from(dst.min(10));
        match op {
            // MOV64 X, r10
            0xbf if src == FP => from_fp[dst] = true,
            // ADD64 X, imm
            0x07 if from_fp[dst] && imm < 0 => deepest = deepest.max(u64::from(imm.unsigned_abs())),
            _ if class == 0x04 || class == 0x07 || class == 0x01 => from_fp[dst] = false,
            _ => {}
        }
    }
    deepest
}

/// Every function of the object by (section index, offset), its calls resolved through the
/// relocations (a call to another section's function) or its own offset (within a section).
fn functions(elf: &object::File<'_>) -> BTreeMap<(usize, u64), Function> {
    let mut out = BTreeMap::new();
    let mut relocations: HashMap<(usize, u64), (usize, u64)> = HashMap::new();
    for section in elf.sections() {
        if section.kind() != SectionKind::Text {
            continue;
        }
        for (at, relocation) in section.relocations() {
            if let RelocationTarget::Symbol(index) = relocation.target()
                && let Ok(symbol) = elf.symbol_by_index(index)
                && let Some(target) = symbol.section_index()
            {
                relocations.insert((section.index().0, at), (target.0, symbol.address()));
            }
        }
    }
    for symbol in elf.symbols() {
        let Some(section) = symbol
            .section_index()
            .and_then(|i| elf.section_by_index(i).ok())
        else {
            continue;
        };
        if section.kind() != SectionKind::Text || !symbol.is_definition() || symbol.size() == 0 {
            continue;
        }
        let data = section.data().expect("section bytes");
        let start = symbol.address() as usize;
        let code = &data[start..start + symbol.size() as usize];
        let mut calls = Vec::new();
        for (i, insn) in code.chunks_exact(INSN as usize).enumerate() {
            // CALL with src_reg BPF_PSEUDO_CALL: a BPF function, not a helper.
            if insn[0] != 0x85 || insn[1] >> 4 != 1 {
                continue;
            }
            let at = symbol.address() + i as u64 * INSN;
            let imm = i64::from(i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]));
            let (target_section, base) = relocations
                .get(&(section.index().0, at))
                .copied()
                .unwrap_or((section.index().0, at));
            calls.push((
                target_section,
                base.wrapping_add_signed((imm + 1) * INSN as i64),
            ));
        }
        out.insert(
            (section.index().0, symbol.address()),
            Function {
                name: symbol.name().unwrap_or("?").to_string(),
                program: section.name().is_ok_and(|n| n != ".text"),
                frame: frame(code),
                calls,
            },
        );
    }
    out
}

/// The deepest chain from `at`: bytes (frames rounded to 32) and the functions on it.
fn deepest(
    at: (usize, u64),
    functions: &BTreeMap<(usize, u64), Function>,
    on_path: &mut Vec<(usize, u64)>,
) -> (u64, Vec<String>) {
    let Some(f) = functions.get(&at) else {
        return (0, Vec::new());
    };
    if on_path.contains(&at) {
        return (0, Vec::new());
    }
    on_path.push(at);
    let below = f
        .calls
        .iter()
        .map(|&callee| deepest(callee, functions, on_path))
        .max_by_key(|(bytes, _)| *bytes)
        .unwrap_or_default();
    on_path.pop();
    let mut chain = vec![format!("{} ({} bytes)", f.name, f.frame)];
    chain.extend(below.1);
    (f.frame.max(1).next_multiple_of(32) + below.0, chain)
}

#[test]
fn every_program_s_call_chain_fits_the_verifier_s_stack() {
    let elf = object::File::parse(super::EBPF_OBJECT).expect("the eBPF object parses");
    let functions = functions(&elf);
    assert!(
        functions.values().filter(|f| f.program).count() > 50,
        "the object's programs were not found"
    );
    let mut over = Vec::new();
    let mut most = 0;
    for (&at, _) in functions.iter().filter(|(_, f)| f.program) {
        let (bytes, chain) = deepest(at, &functions, &mut Vec::new());
        most = most.max(bytes);
        if bytes > MAX_STACK {
            over.push(format!("{bytes} bytes: {}", chain.join(" -> ")));
        }
    }
    // The fault programs alone hold over 300 bytes: less means the frames were not read.
    assert!(most >= 384, "deepest chain {most} bytes: frames not read");
    assert!(
        over.is_empty(),
        "programs over the verifier's {MAX_STACK}-byte stack:\n{}",
        over.join("\n")
    );
}
