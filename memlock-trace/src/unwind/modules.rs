//! The code a traced process has mapped, kept from when it is first read until the session
//! ends: every executable mapping, and for each mapped file an open handle (through
//! `/proc/PID/map_files`, which opens the very file mapped, even one deleted or replaced on
//! disk since), its identity (device, inode, GNU build id) and its unwind tables. The
//! stacks of a process that has exited, or of a file deleted since, are unwound and
//! symbolized from these.

use std::{
    collections::HashMap,
    fs::File,
    ops::{Deref, Range},
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::PathBuf,
    sync::Arc,
    time::Instant,
};

use framehop::Unwinder as _;
use memlock_trace_common::stacks::ModulesChanged;
use memmap2::Mmap;
use object::{Object as _, ObjectSection as _, ObjectSegment as _};

use crate::{output::Outside, procfs};

/// A mapped file's identity: the same file mapped by many processes is read once.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev: u64,
    pub inode: u64,
}

/// One mapped ELF file, kept open.
pub struct ModuleFile {
    /// The path the process mapped it from (with ` (deleted)` if it was).
    pub name: Outside,
    pub id: FileId,
    /// The GNU build id, hex, where the file has one.
    pub build_id: Option<String>,
    /// Keeps the file (and its inode, if deleted) alive; read through `/proc/self/fd/N`.
    handle: File,
    data: Arc<Mmap>,
}

impl ModuleFile {
    /// A path that opens this very file while the session runs, whatever happened to its
    /// name (the symbolizer reads it by path).
    pub fn read_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.handle.as_raw_fd()))
    }

    fn open(handle: File, name: &Outside) -> Option<Self> {
        let meta = handle.metadata().ok()?;
        // SAFETY: a private read-only mapping of a file kept open; a file changed on disk
        // while mapped is what the traced process itself runs, and the unwinder only reads.
        let data = unsafe { Mmap::map(&handle) }.ok()?;
        let build_id = object::File::parse(&*data)
            .ok()
            .and_then(|elf| elf.build_id().ok().flatten().map(hex));
        Some(Self {
            name: name.clone(),
            id: FileId {
                dev: meta.dev(),
                inode: meta.ino(),
            },
            build_id,
            handle,
            data: Arc::new(data),
        })
    }

    /// The unwinder's view of the file: its unwind tables and the addresses they use.
    fn sections(&self) -> Option<framehop::ExplicitModuleSectionInfo<Section>> {
        let elf = object::File::parse(&**self.data).ok()?;
        let section = |name: &str| -> Option<(Range<u64>, Section)> {
            let s = elf.section_by_name(name)?;
            let (offset, size) = s.file_range()?;
            let svma = s.address()..s.address() + s.size();
            Some((
                svma,
                Section {
                    data: Arc::clone(&self.data),
                    range: offset as usize..(offset + size) as usize,
                },
            ))
        };
        let (text_svma, text) = section(".text").unzip();
        let (eh_frame_svma, eh_frame) = section(".eh_frame").unzip();
        let (eh_frame_hdr_svma, eh_frame_hdr) = section(".eh_frame_hdr").unzip();
        Some(framehop::ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma,
            text,
            stubs_svma: None,
            stub_helper_svma: None,
            got_svma: section(".got").map(|(svma, _)| svma),
            unwind_info: None,
            eh_frame_svma,
            eh_frame,
            eh_frame_hdr_svma,
            eh_frame_hdr,
            debug_frame: section(".debug_frame").map(|(_, data)| data),
            text_segment_svma: None,
            text_segment: None,
        })
    }

    /// The load bias of an executable mapping of this file at `start` from file offset
    /// `offset`: the address minus the ELF virtual address of that file offset, in the
    /// executable segment (linkers such as lld end the read-only segment in the same page).
    fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        const PF_X: u32 = 1;
        let elf = object::File::parse(&**self.data).ok()?;
        let executable = |seg: &object::Segment<'_, '_>| matches!(seg.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & PF_X != 0);
        elf.segments().filter(executable).find_map(|seg| {
            let (file_start, file_size) = seg.file_range();
            // A mapping starts at the page holding the segment's first byte.
            let page_start = file_start & !(procfs::PAGE_SIZE - 1);
            let svma = seg.address().wrapping_add(offset).wrapping_sub(file_start);
            (page_start <= offset && offset < file_start + file_size.max(1))
                .then(|| start.wrapping_sub(svma))
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes of a kept file, as the unwinder takes them.
#[derive(Clone)]
pub struct Section {
    data: Arc<Mmap>,
    range: Range<usize>,
}

impl Deref for Section {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.data.get(self.range.clone()).unwrap_or(&[])
    }
}

/// An executable mapping of a process.
#[derive(Clone)]
pub struct CodeMapping {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start`.
    pub offset: u64,
    /// The path, `[vdso]`, or `anonymous` (generated code).
    pub name: Outside,
    /// The file, when it could be opened and read as ELF.
    pub file: Option<Arc<ModuleFile>>,
}

/// What one process has mapped executable, and its unwinder.
pub struct ProcessModules {
    pub tgid: u32,
    pub code: Vec<CodeMapping>,
    pub unwinder: crate::arch::Unwinder<Section>,
    pub cache: crate::arch::UnwindCache,
    read_at: Instant,
}

impl ProcessModules {
    /// Whether it runs code from no file (a JIT's): code its runtime's perf map may name.
    pub fn runs_generated_code(&self) -> bool {
        self.code
            .iter()
            .any(|m| m.file.is_none() && !m.name.starts_with("/") && !m.name.starts_with("["))
    }

    /// The executable mapping holding `addr`.
    pub fn at(&self, addr: u64) -> Option<&CodeMapping> {
        let i = self.code.partition_point(|m| m.end <= addr);
        self.code.get(i).filter(|m| m.start <= addr)
    }
}

/// Every traced process's modules, and the files they map.
#[derive(Default)]
pub struct ModuleRegistry {
    processes: HashMap<u32, ProcessModules>,
    files: HashMap<FileId, Arc<ModuleFile>>,
    /// `/proc/PID/maps` reads.
    pub reads: u64,
}

impl ModuleRegistry {
    pub fn get(&self, tgid: u32) -> Option<&ProcessModules> {
        self.processes.get(&tgid)
    }

    /// The processes that run generated code ([`ProcessModules::runs_generated_code`]).
    pub fn with_generated_code(&self) -> impl Iterator<Item = u32> + '_ {
        self.processes
            .iter()
            .filter(|(_, p)| p.runs_generated_code())
            .map(|(&tgid, _)| tgid)
    }

    pub fn get_mut(&mut self, tgid: u32) -> Option<&mut ProcessModules> {
        self.processes.get_mut(&tgid)
    }

    /// Reads `tgid`'s executable mappings again if it was never read, or if `addr` is in
    /// none of them and the last read is older than a millisecond (a module loaded since).
    /// A process that has exited keeps what was read last.
    pub fn ensure(&mut self, tgid: u32, addr: u64) {
        let stale = match self.processes.get(&tgid) {
            None => true,
            Some(p) => p.at(addr).is_none() && p.read_at.elapsed().as_micros() > 1000,
        };
        if stale {
            self.refresh(tgid);
        }
    }

    /// Reads `tgid`'s executable mappings again if `addr` is in none of them and the last
    /// read is older than `age`; whether they were read.
    pub fn ensure_within(&mut self, tgid: u32, addr: u64, age: std::time::Duration) -> bool {
        let stale = self
            .processes
            .get(&tgid)
            .is_some_and(|p| p.at(addr).is_none() && p.read_at.elapsed() > age);
        stale && self.refresh(tgid)
    }

    /// Reads `/proc/PID/maps`, opening each executable file mapping through
    /// `/proc/PID/map_files` (its path when that fails); false, and no change, if the
    /// process is gone.
    pub fn refresh(&mut self, tgid: u32) -> bool {
        let Ok(text) = std::fs::read(format!("/proc/{tgid}/maps")) else {
            return false;
        };
        let Ok(entries) = procfs::parse_smaps(&text, false) else {
            return false;
        };
        self.reads += 1;
        let mut code = Vec::new();
        for e in entries.iter().filter(|e| e.perms.contains('x')) {
            let m = &e.mapping;
            let file = if m.name.starts_with("/") {
                self.file(tgid, e)
            } else {
                None
            };
            code.push(CodeMapping {
                start: m.start,
                end: m.end,
                offset: m.offset,
                name: m.name.clone(),
                file,
            });
        }
        if code.is_empty() {
            // A zombie's maps are empty: keep what it had.
            return false;
        }
        self.install(tgid, code);
        true
    }

    /// A traced process mapped code (the kernel's notices, all of one process): its maps
    /// are read now, or, if it has already exited, each mapping is added from its notice,
    /// the file found by identity among the files seen so far (in any process, this one
    /// included).
    pub fn mapped(&mut self, notices: &[ModulesChanged]) {
        let Some(first) = notices.first() else { return };
        if self.refresh(first.tgid) {
            return;
        }
        for notice in notices {
            self.mapped_from_notice(notice);
        }
    }

    fn mapped_from_notice(&mut self, notice: &ModulesChanged) {
        let id = FileId {
            // The kernel's dev_t is major << 20 | minor; stat's is glibc's encoding.
            dev: libc::makedev((notice.dev >> 20) as u32, (notice.dev & 0xf_ffff) as u32),
            inode: notice.inode,
        };
        let file = (notice.inode != 0)
            .then(|| self.files.get(&id).cloned())
            .flatten();
        let mapping = CodeMapping {
            start: notice.start,
            end: notice.start + notice.len.div_ceil(procfs::PAGE_SIZE) * procfs::PAGE_SIZE,
            offset: notice.offset,
            name: file
                .as_ref()
                .map_or_else(|| "unknown file".into(), |f| f.name.clone()),
            file,
        };
        let mut code: Vec<CodeMapping> = self
            .processes
            .get(&notice.tgid)
            .map(|p| p.code.clone())
            .unwrap_or_default();
        code.retain(|m| m.end <= mapping.start || m.start >= mapping.end);
        code.push(mapping);
        self.install(notice.tgid, code);
    }

    /// Every executable file this process (the tracer) maps: the C library, the dynamic
    /// loader..., which a short-lived traced process may map and leave before its maps are
    /// read.
    pub fn know_own_files(&mut self) {
        let me = std::process::id();
        if self.refresh(me) {
            self.processes.remove(&me);
        }
    }

    /// Sets a process's executable mappings and builds its unwinder.
    fn install(&mut self, tgid: u32, mut code: Vec<CodeMapping>) {
        code.sort_by_key(|m| m.start);
        let mut unwinder = crate::arch::Unwinder::new();
        for m in &code {
            let Some(file) = &m.file else { continue };
            let (Some(bias), Some(info)) = (file.bias(m.start, m.offset), file.sections()) else {
                continue;
            };
            unwinder.add_module(framehop::Module::new(
                file.name.to_str_lossy().into_owned(),
                m.start..m.end,
                bias,
                info,
            ));
        }
        self.processes.insert(
            tgid,
            ProcessModules {
                tgid,
                code,
                unwinder,
                cache: crate::arch::UnwindCache::new(),
                read_at: Instant::now(),
            },
        );
    }

    /// The file of a mapping, opened once per identity: a file already open is known by the
    /// device and inode the maps show (a process that is exiting can no longer be opened
    /// through, and its file may be deleted), and a path opened instead of the mapping must
    /// be that very file (not one put in its place since).
    fn file(&mut self, tgid: u32, entry: &procfs::SmapsEntry) -> Option<Arc<ModuleFile>> {
        let shown = (entry.inode != 0).then_some(FileId {
            dev: entry.dev,
            inode: entry.inode,
        });
        if let Some(known) = shown.as_ref().and_then(|id| self.files.get(id)) {
            return Some(Arc::clone(known));
        }
        let m = &entry.mapping;
        let mapped = File::open(format!("/proc/{tgid}/map_files/{:x}-{:x}", m.start, m.end));
        let by_path = mapped.is_err();
        let handle = mapped.or_else(|_| File::open(m.name.as_path())).ok()?;
        let meta = handle.metadata().ok()?;
        let id = FileId {
            dev: meta.dev(),
            inode: meta.ino(),
        };
        // (The inode alone: btrfs and overlayfs show another device in the maps than stat.)
        if by_path && shown.as_ref().is_some_and(|shown| shown.inode != id.inode) {
            return None;
        }
        if let Some(known) = self.files.get(&id) {
            return Some(Arc::clone(known));
        }
        let file = Arc::new(ModuleFile::open(handle, &m.name)?);
        self.files.insert(id, Arc::clone(&file));
        Some(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn here() -> u64 {
        std::hint::black_box(here as *const () as u64)
    }

    /// This test process's own executable mappings: the test binary is among them, opened,
    /// with its identity.
    #[test]
    fn reads_own_code_with_identity() {
        let mut registry = ModuleRegistry::default();
        let pid = std::process::id();
        registry.ensure(pid, here());
        let p = registry.get(pid).expect("own maps read");
        let m = p.at(here()).expect("own function in an executable mapping");
        let file = m.file.as_ref().expect("test binary opened");
        let exe = std::fs::metadata("/proc/self/exe").unwrap();
        assert_eq!(
            file.id,
            FileId {
                dev: exe.dev(),
                inode: exe.ino()
            }
        );
        assert!(std::fs::metadata(file.read_path()).is_ok());
        assert!(p.at(0x10).is_none());
    }
}
