//! The advice rules `MEMLOCK_PRELOAD_RULES` gives: what to do to which mapping or block.

use crate::PAGE;

/// Rules a program can be given at once: more than `advise` ever writes.
const MAX_RULES: usize = 16;
/// Longest file path a rule can name (Linux's PATH_MAX).
pub(crate) const MAX_PATH: usize = 4096;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Action {
    Lock,
    Populate,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Anon,
    /// A mapping of this file.
    File(Vec<u8>),
    /// A block `malloc` or `calloc` returned.
    Alloc,
}

#[derive(Clone, Debug)]
pub(crate) struct Rule {
    pub(crate) action: Action,
    pub(crate) kind: Kind,
    pub(crate) len: usize,
}

/// `lock:anon:268435456;populate:file:4096:/data/table`; a malformed rule is left out and
/// logged.
pub(crate) fn parse_rules(text: &str) -> Vec<Rule> {
    let mut rules = Vec::new();
    for rule in text.split(';').filter(|r| !r.is_empty()).take(MAX_RULES) {
        let mut parts = rule.splitn(4, ':');
        let action = match parts.next() {
            Some("lock") => Action::Lock,
            Some("populate") => Action::Populate,
            _ => continue,
        };
        let kind = parts.next();
        let Some(len) = parts.next().and_then(|l| l.parse::<usize>().ok()) else {
            continue;
        };
        let kind = match (kind, parts.next()) {
            (Some("anon"), None) => Kind::Anon,
            (Some("alloc"), None) => Kind::Alloc,
            (Some("file"), Some(path)) if path.len() < MAX_PATH => {
                Kind::File(path.as_bytes().to_vec())
            }
            _ => continue,
        };
        rules.push(Rule {
            action,
            kind,
            len: round_up(len),
        });
    }
    rules
}

/// `len` rounded up to whole pages.
pub(crate) fn round_up(len: usize) -> usize {
    len.div_ceil(PAGE) * PAGE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_bad_ones_are_left_out() {
        let rules = parse_rules(
            "lock:anon:268435456;populate:file:5000:/a:b;bogus;lock:anon:x;populate:alloc:1048577",
        );
        assert_eq!(rules.len(), 3, "{rules:?}");
        assert_eq!((rules[0].action, rules[0].len), (Action::Lock, 268_435_456));
        assert_eq!(rules[1].kind, Kind::File(b"/a:b".to_vec()));
        assert_eq!(rules[1].len, 8192);
        assert_eq!(
            (rules[2].action, &rules[2].kind, rules[2].len),
            (Action::Populate, &Kind::Alloc, 1_052_672)
        );
    }
}
