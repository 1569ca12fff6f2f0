//! Ring-buffer records as the kernel could write them (any length, any kind, any bytes): the
//! decoder returns an event or an error, never a panic or an out-of-bounds read; and a
//! decoded event's name is shown escaped.

#![no_main]

use libfuzzer_sys::fuzz_target;
use memlock_trace::event::{Event, decode};

fuzz_target!(|data: &[u8]| {
    match decode(data) {
        Ok(Event::Syscall(rec)) => {
            let shown = rec.name().to_string();
            assert!(!shown.chars().any(char::is_control), "{shown:?}");
            let _ = rec.syscall.describe(rec.raw.args);
        }
        Ok(Event::Fault(rec)) => {
            let _ = (rec.kind(), rec.syscall(), rec.name().to_string());
        }
        Ok(Event::Vma(_)) | Err(_) => {}
    }
});
