//! The `--web-config` file (exporter-toolkit YAML): whatever it holds, parsing it is an
//! error naming the key, or a configuration, never a panic. Its relative paths point into a
//! directory that does not exist, so no file is read.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use memlock_trace::metrics::web_config::WebConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // A bcrypt hash's cost is its own work factor (cost 31 is 2^31 rounds, by design): the
    // users' table is checked by the unit tests, not fuzzed for time.
    if text.contains("basic_auth_users") {
        return;
    }
    let _ = WebConfig::parse(text, Path::new("/nonexistent/memlock-trace-fuzz"));
});
