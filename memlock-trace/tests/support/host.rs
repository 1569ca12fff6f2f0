//! The machine around a test: scratch directories, the cgroup2 mount, other processes'
//! figures in /proc, raw libc results.

use std::time::Duration;

/// A scratch directory of this test process, `memlock-trace-NAME-PID` in the temporary
/// directory (the pid keeps concurrent test binaries apart).
pub fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("memlock-trace-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A raw libc call's return code as a `Result` (0 is success, else `errno`), for the
/// `pre_exec` closures that drop privileges, where only such calls may run.
pub fn os_result(rc: libc::c_int) -> std::io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The cgroup2 mount: the unified hierarchy, also on hybrid hosts.
pub fn cgroup2_mount() -> std::path::PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            if right.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            left.split_whitespace().nth(4).map(std::path::PathBuf::from)
        })
        .expect("this test needs a cgroup2 mount (cgroup v2, or the unified hierarchy)")
}

/// `read()` once it has stopped changing (two reads 200 ms apart agree, or 5 s gone): a
/// figure of another process read after it has gone quiet, not while it finishes what it
/// was doing (a connection being closed, a line written before the next read).
pub fn settled<T: PartialEq>(read: impl Fn() -> T) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut value = read();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = read();
        if now == value || std::time::Instant::now() > deadline {
            return now;
        }
        value = now;
    }
}

/// A figure of `/proc/PID/status` in kB, such as `VmRSS:` or `RssAnon:`.
pub fn status_kb(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// A new directory `memlock-trace-NAME-PID` in the temporary directory, with `mode`.
pub fn scratch_dir(name: &str, mode: u32) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = std::env::temp_dir().join(format!("memlock-trace-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    dir
}

/// A scratch directory of `name` (mode 0755) holding a program's `file` with `source`: the
/// directory and the file.
#[allow(dead_code, reason = "not every test binary runs a program of its own")]
pub fn scratch_program(
    name: &str,
    file: &str,
    source: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = scratch_dir(name, 0o755);
    let script = dir.join(file);
    std::fs::write(&script, source).unwrap();
    (dir, script)
}
