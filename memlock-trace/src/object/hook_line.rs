//! What one family hooks on this kernel, as the user is told: kept typed from the attach to
//! the session's hook lines, `probe` (text and JSON), `-v` and the metrics' build info, so
//! no line is ever parsed back into a decision.

use super::refusal::Refused;

/// One family's hooks, or why it is not traced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookLine {
    Traced {
        /// The hook set's kind, for the build info's label: `tracepoint`, `tp_btf`, ...
        set: &'static str,
        /// The hooks in use, without refusals and limits: the session's line.
        brief: String,
        /// Every hook, refusal and limit with its reason: `-v` and `probe`.
        full: String,
        /// Better hooks the kernel refused here (their reasons are in `full`).
        refused: Vec<Refused>,
    },
    /// The family could not attach; the others carry on.
    NotTraced(Refused),
}

impl HookLine {
    /// A family with nothing refused and nothing left out: the brief line is the full one.
    pub fn plain(set: &'static str, hooks: String) -> Self {
        Self::Traced {
            set,
            brief: hooks.clone(),
            full: hooks,
            refused: Vec::new(),
        }
    }

    /// The family failed to attach with `error`.
    pub fn not_traced(error: &anyhow::Error) -> Self {
        Self::NotTraced(Refused::of(error))
    }

    /// The session's line: the hooks in use, a hint where better ones were refused.
    pub fn brief(&self) -> String {
        match self {
            Self::Traced { brief, refused, .. } if refused.is_empty() => brief.clone(),
            Self::Traced { brief, .. } => format!("{brief} (better hooks refused: -v says why)"),
            Self::NotTraced(why) => {
                let first = why.reason.lines().next().unwrap_or_default();
                format!("not traced: {first}")
            }
        }
    }

    /// Every detail: `-v`'s line and `probe`'s.
    pub fn full(&self) -> String {
        match self {
            Self::Traced { full, .. } => full.clone(),
            Self::NotTraced(why) => format!("not traced: {}", why.reason),
        }
    }

    /// The build info's label: the hook set's kind, `none` when not traced.
    pub fn set(&self) -> &'static str {
        match self {
            Self::Traced { set, .. } => set,
            Self::NotTraced(_) => "none",
        }
    }

    /// Whether the verifier gave up on one of this family's programs for complexity.
    pub fn too_complex(&self) -> bool {
        match self {
            Self::Traced { refused, .. } => refused.iter().any(|r| r.too_complex),
            Self::NotTraced(why) => why.too_complex,
        }
    }

    /// Appends a limit to the full line (`probe`: what a forced hook set would meet here).
    pub fn note(&mut self, note: &str) {
        if let Self::Traced { full, .. } = self {
            full.push_str(note);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brief_lines_name_the_set_and_hint_at_refusals() {
        let refused = HookLine::Traced {
            set: "tracepoint",
            brief: "tracepoint".into(),
            full: "tracepoint (tp_btf/page_fault_user); fentry refused: EPERM".into(),
            refused: vec![Refused {
                reason: "EPERM".into(),
                too_complex: false,
            }],
        };
        assert_eq!(
            refused.brief(),
            "tracepoint (better hooks refused: -v says why)"
        );
        assert!(!refused.too_complex());
        let plain = HookLine::plain("tp_btf", "tp_btf sched_process_exit".into());
        assert_eq!(plain.brief(), "tp_btf sched_process_exit");
        assert_eq!(plain.full(), plain.brief());
        let failed = HookLine::NotTraced(Refused {
            reason: "the kernel refused tp_btf program `x`: E2BIG\nverifier log (last lines):"
                .into(),
            too_complex: true,
        });
        assert_eq!(
            failed.brief(),
            "not traced: the kernel refused tp_btf program `x`: E2BIG"
        );
        assert!(failed.too_complex());
        assert_eq!(failed.set(), "none");
    }
}
