//! The guest's root file system: busybox, the kernel modules it loads, the test binaries
//! with the shared libraries they load, extra files, `/etc/passwd` and `/etc/group`, the
//! third-party programs of [`super::programs`] when asked for, and an `/init` script that
//! loads the modules, runs each test between marker lines (see the parent module) and
//! powers off.

use std::{
    collections::BTreeMap,
    fs::{self, File},
    io,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use super::{
    BEGIN_MARK, DONE_MARK, KERNEL_MARK, RESULT_MARK, VmOptions,
    arch::GuestArch,
    assets::VmAssets,
    files::{install_file, pack, shared_libraries},
    programs,
};

/// Where the guest has busybox (statically linked, of the guest's architecture).
const BUSYBOX: &str = "/bin/busybox";
/// Where the guest has the kernel modules `/init` loads.
const MODULES: &str = "/modules";

/// Debian's entries for the two users a guest knows.
const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
                      nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";

/// Lays out the guest's root file system under `dir/root` and packs it into `dir/initramfs.cpio`.
pub(super) fn build(opts: &VmOptions, assets: &VmAssets, dir: &Path) -> Result<PathBuf> {
    let arch = opts.kernel.arch;
    let root = dir.join("root");
    // `/run`: where the memory-pressure scenario keeps its swap lock.
    for sub in [
        "bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "tmp", "run", "tests",
    ] {
        fs::create_dir_all(root.join(sub))?;
    }
    install_file(&assets.busybox, &root, BUSYBOX)?;
    let mut modules = Vec::new();
    for module in &assets.modules {
        let name = module
            .file_name()
            .with_context(|| format!("module {} has no file name", module.display()))?
            .to_string_lossy()
            .into_owned();
        install_file(module, &root, &format!("{MODULES}/{name}"))?;
        modules.push(name);
    }
    // Programs that look users up (`memcached -u nobody`) find root and nobody.
    fs::create_dir_all(root.join("etc"))?;
    fs::write(root.join("etc/passwd"), PASSWD)?;
    fs::write(root.join("etc/group"), GROUP)?;

    // Tests may share a binary (e.g. with different filters): copy each once.
    let mut binaries: BTreeMap<String, &Path> = BTreeMap::new();
    let mut script = init_script_prologue(&opts.env, &modules);
    for test in &opts.tests {
        if test.name.is_empty() || test.name.contains(char::is_whitespace) {
            bail!(
                "test name {:?} must be non-empty and free of whitespace",
                test.name
            );
        }
        let file_name = test
            .binary
            .file_name()
            .with_context(|| format!("test binary {} has no file name", test.binary.display()))?
            .to_string_lossy();
        let guest = format!("/tests/{file_name}");
        match binaries.get(&guest) {
            Some(&other) if other != test.binary => {
                bail!(
                    "test binaries {} and {} share a file name",
                    other.display(),
                    test.binary.display()
                )
            }
            Some(_) => {}
            None => {
                install_file(&test.binary, &root, &guest)?;
                strip_debug(arch, &root.join(&guest[1..]));
                install_libraries(arch, &test.binary, &root)?;
                binaries.insert(guest.clone(), &test.binary);
            }
        }
        let command: Vec<String> = std::iter::once(&guest)
            .chain(&test.args)
            .map(|s| sh_quote(s))
            .collect();
        let name = sh_quote(&test.name);
        script += &format!(
            "echo {BEGIN_MARK} {name}\n{} </dev/null 2>&1\necho {RESULT_MARK} {name} $?\n",
            command.join(" ")
        );
    }
    script += &format!("echo {DONE_MARK}\npoweroff -f\n");

    for (host, guest) in &opts.extra_files {
        install_file(host, &root, guest)?;
        strip_debug(arch, &root.join(guest.trim_start_matches('/')));
    }
    let init = root.join("init");
    fs::write(&init, script)?;
    fs::set_permissions(&init, fs::Permissions::from_mode(0o755))?;

    let initrd = dir.join("initramfs.cpio");
    let mut out = File::create(&initrd)?;
    // The programs' archive first: the kernel unpacks in order, so this run's files win.
    if opts.programs
        && let Some(programs) = programs::archive(&opts.cache_dir)?
    {
        io::copy(&mut File::open(&programs)?, &mut out)
            .with_context(|| format!("copying {}", programs.display()))?;
    }
    pack(&root, out)?;
    Ok(initrd)
}

/// `/tmp` stays on the initramfs root (RAM, writable already): a tmpfs there would hide
/// files installed under it, such as a workspace cloned into /tmp. cgroup2 is mounted as
/// systemd mounts it: the kernel lists a process's v2 cgroup only once the hierarchy is.
/// The `modules` (file names under [`MODULES`], in load order) are loaded, not used: a
/// failure is said on the console and the test needing zram then fails naming it.
fn init_script_prologue(env: &[(String, String)], modules: &[String]) -> String {
    let exports: String = env
        .iter()
        .map(|(name, value)| format!("export {name}={}\n", sh_quote(value)))
        .collect();
    let modules: Vec<String> = modules.iter().map(|m| sh_quote(m)).collect();
    let modules = modules.join(" ");
    format!(
        "#!{BUSYBOX} sh
{BUSYBOX} --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
loaded=
for m in {modules}; do
  if insmod {MODULES}/$m; then loaded=\"$loaded $m\"; else echo \"modules: insmod $m FAILED\"; fi
done
echo \"modules: loaded$loaded\"
if [ -e /sys/block/zram0 ]; then echo 'zram: /sys/block/zram0 ready'
else echo 'zram: no /sys/block/zram0: swap on zram is unavailable in this guest'; fi
ip link set lo up
ulimit -l unlimited
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/tmp RUST_BACKTRACE=1 MEMLOCK_TRACE_IN_VM=1
{exports}cd /tmp
echo {KERNEL_MARK} $(uname -r)
"
    )
}

/// The shared libraries `binary` loads, at the paths its loader looks for them: this
/// machine's, or for a foreign guest the cross glibc's, put where the guest's loader
/// searches (`/lib`, where its own path is, `/lib/ld-linux-aarch64.so.1`).
fn install_libraries(arch: GuestArch, binary: &Path, root: &Path) -> Result<()> {
    let Some(cross) = arch.cross_libraries() else {
        for lib in shared_libraries(binary)? {
            install_file(&lib, root, &lib.to_string_lossy())?;
        }
        return Ok(());
    };
    for lib in cross_shared_libraries(binary, Path::new(cross))? {
        let name = lib.file_name().expect("a library file").to_string_lossy();
        install_file(&lib, root, &format!("/lib/{name}"))?;
    }
    Ok(())
}

/// The interpreter and `NEEDED` libraries of a cross-built `binary`, transitively, found in
/// `dir` (`ldd` runs the binary's loader, which cannot run here).
fn cross_shared_libraries(binary: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = Vec::new();
    let mut pending = vec![binary.to_path_buf()];
    while let Some(file) = pending.pop() {
        let out = Command::new("readelf")
            .args(["--dynamic", "--program-headers", "--wide"])
            .arg(&file)
            .output()
            .context("cannot run `readelf` (binutils)")?;
        if !out.status.success() {
            bail!(
                "`readelf --dynamic {}` failed: {}",
                file.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let needed = text.lines().filter_map(|line| {
            // "[Requesting program interpreter: /lib/ld-linux-aarch64.so.1]" and
            // "0x…0001 (NEEDED)  Shared library: [libc.so.6]"
            let start = line
                .find("program interpreter: ")
                .map(|at| at + "program interpreter: ".len())
                .or_else(|| {
                    line.contains("(NEEDED)")
                        .then(|| line.find('[').map(|at| at + 1))
                        .flatten()
                })?;
            let name = line[start..].split(']').next()?;
            Path::new(name).file_name().map(PathBuf::from)
        });
        for name in needed.collect::<Vec<_>>() {
            let lib = dir.join(&name);
            if !lib.is_file() {
                bail!(
                    "{}: needs {}, which {} lacks (apt-get install libc6-arm64-cross)",
                    file.display(),
                    name.display(),
                    dir.display()
                );
            }
            if !found.contains(&lib) {
                found.push(lib.clone());
                pending.push(lib);
            }
        }
    }
    Ok(found)
}

/// Drops the DWARF of a copied binary (symbols stay, so backtraces still name functions):
/// a debug test binary is ~60 MB, mostly debug info, and the initramfs is unpacked into
/// guest RAM, where a dozen of them no longer fit. Best effort: a failure keeps the copy whole.
fn strip_debug(arch: GuestArch, path: &Path) {
    let stripped = Command::new(arch.strip())
        .arg("--strip-debug")
        .arg(path)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        eprintln!(
            "xtask: warning: could not strip {}; the guest may run out of memory",
            path.display()
        );
    }
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_loads_the_modules_in_order_once_cgroup2_is_mounted() {
        let modules = ["zsmalloc.ko", "zram.ko", "lzo-rle.ko"].map(String::from);
        let script = init_script_prologue(&[], &modules);
        let cgroup2 = script.find("mount -t cgroup2").unwrap();
        let list = script
            .find("for m in 'zsmalloc.ko' 'zram.ko' 'lzo-rle.ko'; do")
            .unwrap();
        let kernel_mark = script.find(KERNEL_MARK).unwrap();
        assert!(cgroup2 < list && list < kernel_mark, "{script}");
        assert!(script.contains("insmod /modules/$m"), "{script}");
        // Loading is all /init does with them: the scenario makes swap and cgroups itself.
        assert!(
            !script.contains("swapon") && !script.contains("mkdir"),
            "{script}"
        );
    }
}
