//! The one escaping function for what others control, and the type that applies it.
//!
//! A traced process chooses its name (`prctl(PR_SET_NAME)`), its threads' names, the names
//! of the files and memfds it maps; an ELF file chooses its symbol names, whatever their
//! length. Printed raw, a name holding ESC retitles or clears the user's terminal and a
//! newline forges a line of output. [`Outside`] holds such a string as the bytes it was, and
//! its `Display` is [`escape`]: every text renderer that formats one escapes it without
//! having to remember to. JSON keeps the value (see [`Outside`]'s `Serialize`).

use std::{
    borrow::Cow,
    ffi::OsStr,
    fmt::{self, Write as _},
    os::unix::ffi::OsStrExt as _,
    path::Path,
};

use serde::{Serialize, Serializer};

/// Longest part of an outside string shown in text (bytes of the original): the rest is
/// replaced by a marker saying how much was cut. Names and paths fit (a comm is 15 bytes);
/// a symbol of a deeply nested C++ template, or a crafted ELF's megabyte-long one, does not.
pub const MAX_SHOWN: usize = 256;

/// `text` as it may reach a terminal or a text file: printable characters as they are,
/// `\\` for a backslash, `\n`, `\t`, `\r`, `\xNN` for any other control byte and for each
/// byte that is not UTF-8, `\u{NNNN}` for Unicode controls (C1, such as the one-byte CSI
/// U+009B) and the bidirectional overrides that reorder what a line seems to say. Since a
/// backslash is always doubled, the form reads back to the exact bytes. Past
/// [`MAX_SHOWN`] bytes the text is cut, with `...[+N bytes]` saying so.
pub fn escape(text: &[u8]) -> String {
    escape_up_to(text, MAX_SHOWN)
}

/// [`escape`] never cut: for the tool's own sentences that quote outside names (advise's
/// reasons), longer than [`MAX_SHOWN`] by themselves and bounded by what they quote.
pub fn escape_uncut(text: &[u8]) -> String {
    escape_up_to(text, usize::MAX)
}

fn escape_up_to(text: &[u8], max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 2);
    let shown = &text[..text.len().min(max)];
    // A cut may land inside a character: its bytes are then shown as `\xNN`.
    for chunk in shown.utf8_chunks() {
        for c in chunk.valid().chars() {
            escape_char(&mut out, c);
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    if text.len() > shown.len() {
        let _ = write!(out, "...[+{} bytes]", text.len() - shown.len());
    }
    out
}

fn escape_char(out: &mut String, c: char) {
    match c {
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        '\r' => out.push_str("\\r"),
        c if c.is_ascii_control() => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c if c.is_control() || is_bidi_control(c) => {
            let _ = write!(out, "\\u{{{:04x}}}", c as u32);
        }
        c => out.push(c),
    }
}

/// Unicode's explicit directional formatting characters (UAX #9): invisible, and they make
/// a terminal show a line's characters in another order than they are.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A string a traced process or a file on disk controls: a comm, a thread name, a mapped
/// file's path or a memfd's name, a symbol, a cgroup path. Kept as the bytes it was (it
/// need not be UTF-8).
///
/// - `Display` is [`escape`], and honours width and alignment (`{:<16}`), so text output
///   is escaped wherever one is formatted.
/// - `Serialize` (JSON) is the exact string when it is UTF-8; bytes that are not are each
///   replaced by U+FFFD (`\ufffd` in JSON), a documented lossy form.
/// - `Debug` is the escaped form in quotes, so a test's failure message is safe too.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Outside(Vec<u8>);

impl Outside {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value with each non-UTF-8 byte replaced by U+FFFD: for JSON and Prometheus
    /// labels, whose encoders escape it themselves; never for text.
    pub fn to_str_lossy(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.0)
    }

    /// The value when it is UTF-8.
    pub fn to_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// The value as a path (for opening the file it names).
    pub fn as_path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.0))
    }

    pub fn starts_with(&self, prefix: &str) -> bool {
        self.0.starts_with(prefix.as_bytes())
    }
}

impl fmt::Display for Outside {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&escape(&self.0))
    }
}

impl fmt::Debug for Outside {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", escape(&self.0))
    }
}

impl Serialize for Outside {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_str_lossy())
    }
}

impl From<Vec<u8>> for Outside {
    fn from(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }
}

impl From<&[u8]> for Outside {
    fn from(bytes: &[u8]) -> Self {
        Self(bytes.to_vec())
    }
}

impl From<String> for Outside {
    fn from(text: String) -> Self {
        Self(text.into_bytes())
    }
}

impl From<&str> for Outside {
    fn from(text: &str) -> Self {
        Self(text.as_bytes().to_vec())
    }
}

impl From<&Path> for Outside {
    fn from(path: &Path) -> Self {
        Self(path.as_os_str().as_bytes().to_vec())
    }
}

impl From<&OsStr> for Outside {
    fn from(text: &OsStr) -> Self {
        Self(text.as_bytes().to_vec())
    }
}

impl PartialEq<str> for Outside {
    fn eq(&self, other: &str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl PartialEq<&str> for Outside {
    fn eq(&self, other: &&str) -> bool {
        self.0 == other.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_bytes_and_invalid_utf8_are_shown_visibly() {
        assert_eq!(escape(b"plain name-1.so"), "plain name-1.so");
        assert_eq!(
            escape(b"ev\x1b]0;PWN\x07\nFAKE line\t\\"),
            "ev\\x1b]0;PWN\\x07\\nFAKE line\\t\\\\"
        );
        assert_eq!(escape(b"bad\xff\xfeutf8\x7f"), "bad\\xff\\xfeutf8\\x7f");
        assert_eq!(
            escape("caf\u{e9} \u{9b}2J \u{202e}txt".as_bytes()),
            "caf\u{e9} \\u{009b}2J \\u{202e}txt"
        );
        assert_eq!(escape(b"\0\r"), "\\x00\\r");
    }

    #[test]
    fn long_text_is_cut_with_a_marker() {
        let long = "x".repeat(10_000);
        let shown = escape(long.as_bytes());
        assert!(shown.starts_with(&"x".repeat(MAX_SHOWN)), "{shown}");
        assert!(
            shown.ends_with(&format!("...[+{} bytes]", 10_000 - MAX_SHOWN)),
            "{shown}"
        );
        // A character cut in two shows its bytes.
        let mut cut = "x".repeat(MAX_SHOWN - 1).into_bytes();
        cut.extend("\u{e9}z".as_bytes());
        assert!(
            escape(&cut).ends_with("x\\xc3...[+2 bytes]"),
            "{}",
            escape(&cut)
        );
        // The tool's own sentence quoting a name: escaped, whole.
        let sentence = format!("{} \x1b[2J{}", "y".repeat(300), "z".repeat(100));
        assert_eq!(
            escape_uncut(sentence.as_bytes()),
            format!("{} \\x1b[2J{}", "y".repeat(300), "z".repeat(100))
        );
    }

    #[test]
    fn display_pads_the_escaped_form_and_json_keeps_the_value() {
        let name = Outside::from(&b"a\nb"[..]);
        assert_eq!(format!("[{name:<6}]"), "[a\\nb  ]");
        assert_eq!(format!("{name:?}"), "\"a\\nb\"");
        assert_eq!(serde_json::to_string(&name).unwrap(), "\"a\\nb\"");
        let bad = Outside::from(&b"x\xffy"[..]);
        assert_eq!(serde_json::to_string(&bad).unwrap(), "\"x\u{fffd}y\"");
        assert_eq!(bad.to_string(), "x\\xffy");
        assert!(name == "a\nb" && name.starts_with("a\n"));
    }
}
