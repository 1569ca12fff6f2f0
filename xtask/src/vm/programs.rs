//! Third-party programs the integration tests run (Debian's python3 with its standard
//! library, memcached), carried into the guest with the shared libraries they load, when the
//! host has them installed. A guest lacking one makes its test fail with the reason.
//!
//! They are packed once into a cpio archive in the cache, named by a hash of what goes in
//! (paths, sizes and modification times, and the dpkg database's, which changes whenever a
//! library they load does), and that archive is put in front of each run's own: the kernel
//! unpacks concatenated archives in order, so the run's files (libraries included) win.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    hash::{DefaultHasher, Hash, Hasher},
    io,
    path::{Path, PathBuf},
    process,
    sync::{Mutex, PoisonError},
    time::SystemTime,
};

use anyhow::{Context, Result};

use super::{
    ScratchDir,
    files::{install_file, pack, shared_libraries},
};

const PYTHON: &str = "/usr/bin/python3";
const MEMCACHED: &str = "/usr/bin/memcached";
/// Changes whenever a package's files change (upgrades of the libraries included).
const DPKG_STATUS: &str = "/var/lib/dpkg/status";
/// Bump when what goes into the archive changes, so older caches are not reused.
const FORMAT: u32 = 1;

/// Parts of the standard library no test imports, left out to keep the guest's RAM and
/// boot time down: the test suite, IDEs and GUIs, installers, the static libpython of
/// `config-*`, and byte code (compiled again in the guest on import; see
/// [`python_files`]).
const STDLIB_SKIPPED: [&str; 10] = [
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
    "distutils",
    "__pycache__",
    "config-",
];

/// Held while an archive is looked for or built. The guests of one `cargo xtask test` boot
/// side by side from threads of one process, which share its scratch directory's name:
/// on a machine without the archive they all built it at once, into the same directory,
/// removing each other's files (6.1 and 6.12 failed; 5.10 booted a python3 without
/// `ctypes`). Now the first builds and the others wait, then find it built.
static BUILDING: Mutex<()> = Mutex::new(());

/// The cached archive of the programs the host has, building it if needed; `None` when the
/// host has none of them.
pub(super) fn archive(cache_dir: &Path) -> Result<Option<PathBuf>> {
    let _one_at_a_time = BUILDING.lock().unwrap_or_else(PoisonError::into_inner);
    // (guest path, host path) of every file, libraries aside.
    let mut files: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut executables = Vec::new();
    if Path::new(PYTHON).is_file() {
        python_files(&mut files)?;
        executables.push(PathBuf::from(PYTHON));
    }
    if Path::new(MEMCACHED).is_file() {
        files.insert(MEMCACHED.into(), MEMCACHED.into());
        executables.push(PathBuf::from(MEMCACHED));
    }
    if files.is_empty() {
        return Ok(None);
    }
    let archive = cache_dir.join(format!("programs-{:016x}.cpio", key(&files)?));
    if archive.is_file() {
        return Ok(Some(archive));
    }

    // Every extension module's libraries too, so the whole carried stdlib imports.
    executables.extend(
        files
            .iter()
            .filter(|(guest, _)| guest.ends_with(".so"))
            .map(|(_, host)| host.clone()),
    );
    let mut libraries = BTreeSet::new();
    for executable in &executables {
        libraries.extend(shared_libraries(executable)?);
    }
    let scratch = ScratchDir::new(cache_dir.join(format!("programs-build-{}", process::id())))?;
    let root = scratch.0.join("root");
    for (guest, host) in &files {
        install_file(host, &root, guest)?;
    }
    for lib in &libraries {
        install_file(lib, &root, &lib.to_string_lossy())?;
    }
    // Written aside and renamed: another process (a second worktree) may build it too.
    let partial = scratch.0.join("programs.cpio");
    pack(&root, fs::File::create(&partial)?)?;
    fs::rename(&partial, &archive)
        .with_context(|| format!("moving the programs' archive to {}", archive.display()))?;
    remove_stale(cache_dir, &archive);
    Ok(Some(archive))
}

/// `python3` (the file its symlink names, installed under the name the tests run) and its
/// standard library, less [`STDLIB_SKIPPED`]. Symbolic links in it are carried as the files
/// they name (`sitecustomize.py` points into /etc); dangling ones are left out.
fn python_files(files: &mut BTreeMap<String, PathBuf>) -> Result<()> {
    let real = fs::canonicalize(PYTHON).with_context(|| format!("resolving {PYTHON}"))?;
    let version = real
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| n.starts_with("python3."))
        .with_context(|| format!("{PYTHON} names {}, not python3.N", real.display()))?;
    files.insert(PYTHON.into(), real.clone());
    let stdlib = PathBuf::from("/usr/lib").join(version);
    let mut dirs = vec![stdlib.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if (dir == stdlib && STDLIB_SKIPPED.iter().any(|s| name.starts_with(s)))
                || name == "__pycache__"
            {
                continue;
            }
            match fs::metadata(&path) {
                Ok(meta) if meta.is_dir() => dirs.push(path),
                Ok(meta) if meta.is_file() => {
                    files.insert(path.to_string_lossy().into_owned(), path);
                }
                _ => {}
            }
        }
    }
    let landmark = stdlib.join("os.py");
    if !files.contains_key(&*landmark.to_string_lossy()) {
        anyhow::bail!(
            "{} has no os.py: not a Python standard library",
            stdlib.display()
        );
    }
    Ok(())
}

/// A hash of the guest paths and the host files' sizes and modification times.
fn key(files: &BTreeMap<String, PathBuf>) -> Result<u64> {
    let mut hasher = DefaultHasher::new();
    FORMAT.hash(&mut hasher);
    let stamp = |path: &Path| -> Result<(u64, SystemTime)> {
        let meta = fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
        Ok((meta.len(), meta.modified()?))
    };
    for (guest, host) in files {
        (guest, stamp(host)?).hash(&mut hasher);
    }
    // A missing dpkg database (not Debian) just leaves it out.
    stamp(Path::new(DPKG_STATUS)).ok().hash(&mut hasher);
    Ok(hasher.finish())
}

/// Best effort: older archives in the cache are of programs since upgraded.
fn remove_stale(cache_dir: &Path, current: &Path) {
    let Ok(entries) = fs::read_dir(cache_dir) else {
        return;
    };
    for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if path != current && name.starts_with("programs-") && name.ends_with(".cpio") {
            match fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    eprintln!("xtask: warning: cannot remove {}: {e}", path.display());
                }
                _ => {}
            }
        }
    }
}
