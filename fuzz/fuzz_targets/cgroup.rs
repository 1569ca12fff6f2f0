//! A cgroup v2 path, as a container runtime or a delegated user names it: whatever its
//! bytes, the parser returns what it recognises (unit, runtime, container id, pod uid) and
//! never panics; the label it gives is shown escaped.

#![no_main]

use libfuzzer_sys::fuzz_target;
use memlock_trace::{output::Outside, process::cgroup::parse};

fuzz_target!(|data: &[u8]| {
    // Paths come from walking the cgroup2 mount as UTF-8 (lossily where they are not).
    let path = String::from_utf8_lossy(data);
    let info = parse(&path);
    let shown = Outside::from(info.label()).to_string();
    assert!(!shown.chars().any(char::is_control), "{shown:?}");
});
