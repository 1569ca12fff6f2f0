//! Text that fits a terminal: long descriptions (hook sets with every refusal's reason)
//! wrapped at word boundaries, continuation lines indented. A dozen lines rather than a
//! dependency: only ASCII text the tool writes itself is wrapped.

/// The width every text report keeps to.
pub const COLUMNS: usize = 100;

/// `first` followed by `text`, wrapped to `width` columns; continuation lines start with
/// `indent` spaces. A word longer than a line is cut.
pub fn wrap(first: &str, text: &str, width: usize, indent: usize) -> Vec<String> {
    let len = |s: &str| s.chars().count();
    let mut lines = Vec::new();
    let mut line = first.to_string();
    let mut empty = first.is_empty();
    for word in text.split_whitespace() {
        if !empty && len(&line) + 1 + len(word) > width {
            lines.push(std::mem::replace(&mut line, " ".repeat(indent)));
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        let mut rest = word;
        while len(&line) + len(rest) > width {
            let take = width.saturating_sub(len(&line)).max(1);
            let cut = rest.char_indices().nth(take).map_or(rest.len(), |(i, _)| i);
            line.push_str(&rest[..cut]);
            lines.push(std::mem::replace(&mut line, " ".repeat(indent)));
            rest = &rest[cut..];
        }
        line.push_str(rest);
        empty = false;
    }
    lines.push(line);
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_descriptions_wrap_under_an_indent() {
        let text = "tracepoint syscalls:sys_enter_mlock (fentry refused: BPF_PROG_LOAD: \
                    Operation not permitted (os error 1))";
        let lines = wrap("hooks syscalls:", text, 40, 4);
        assert!(lines.iter().all(|l| l.len() <= 40), "{lines:#?}");
        assert_eq!(lines[0], "hooks syscalls: tracepoint");
        assert!(
            lines[1..].iter().all(|l| l.starts_with("    ")),
            "{lines:#?}"
        );
        assert_eq!(
            lines.join(" ").split_whitespace().collect::<Vec<_>>(),
            format!("hooks syscalls: {text}")
                .split_whitespace()
                .collect::<Vec<_>>()
        );
        assert_eq!(wrap("a", "b", 40, 2), ["a b"]);
        let cut = wrap("x", &"y".repeat(50), 20, 2);
        assert!(cut.iter().all(|l| l.len() <= 20), "{cut:#?}");
        assert_eq!(cut.concat().matches('y').count(), 50);
    }
}
