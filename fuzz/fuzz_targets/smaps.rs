//! `/proc/PID/smaps` and `/proc/PID/maps` text, as bytes: whatever a file name holds, the
//! parser returns mappings or an error, never a panic; and a name it returns is shown
//! escaped.

#![no_main]

use libfuzzer_sys::fuzz_target;
use memlock_trace::procfs::parse_smaps;

fuzz_target!(|data: &[u8]| {
    for shows_lockonfault in [false, true] {
        if let Ok(entries) = parse_smaps(data, shows_lockonfault) {
            for e in entries {
                let shown = e.mapping.name.to_string();
                assert!(!shown.chars().any(char::is_control), "{shown:?}");
            }
        }
    }
});
