//! The one escaping function: for any bytes, no control character comes out, and (below the
//! cut) the escaped text reads back to the exact bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use memlock_trace::output::{MAX_SHOWN, escape};

/// The reverse of `escape` for text it did not cut.
fn unescape(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0; 4];
            out.extend(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        match chars.next() {
            Some('\\') => out.push(b'\\'),
            Some('n') => out.push(b'\n'),
            Some('t') => out.push(b'\t'),
            Some('r') => out.push(b'\r'),
            Some('x') => {
                let hex: String = chars.by_ref().take(2).collect();
                out.push(u8::from_str_radix(&hex, 16).expect("two hex digits"));
            }
            Some('u') => {
                assert_eq!(chars.next(), Some('{'));
                let hex: String = chars.by_ref().take_while(|&c| c != '}').collect();
                let c = char::from_u32(u32::from_str_radix(&hex, 16).unwrap()).unwrap();
                let mut buf = [0; 4];
                out.extend(c.encode_utf8(&mut buf).as_bytes());
            }
            other => panic!("a lone backslash before {other:?} in {text:?}"),
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let shown = escape(data);
    assert!(!shown.chars().any(char::is_control), "{shown:?}");
    if data.len() <= MAX_SHOWN {
        assert_eq!(unescape(&shown), data, "{shown:?}");
    } else {
        assert!(shown.ends_with(" bytes]"), "{shown:?}");
    }
});
