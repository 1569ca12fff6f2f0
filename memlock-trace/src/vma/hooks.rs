//! The VMA family's hook set as decided on this kernel (read by `probe`, `-v`, the hook line
//! and the JSON report), kept apart from the code that attaches it (`attach`, `functions`).

use serde::Serialize;

use crate::object::Refused;

/// The hook set the VMA family uses on this kernel, and why.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VmaHooks {
    /// Functions hooked with fentry/fexit; the index is the event's `hook` number.
    pub functions: Vec<HookedFunction>,
    /// Why fentry/fexit is not used at all, when the kernel refused it.
    pub fentry_refused: Option<Refused>,
    /// Candidates this kernel's BTF does not have (renamed, removed or inlined).
    pub missing: Vec<&'static str>,
    /// Candidates the kernel refused one by one: (function, reason).
    pub refused: Vec<(String, Refused)>,
    /// Snapshots walk the VMA rbtree and list: a kernel before 6.1 (no maple tree, so no
    /// `maple_tree:ma_write` stores either).
    pub rb_walk: bool,
}

/// One hooked kernel function and what its event slots hold.
#[derive(Clone, Debug, Serialize)]
pub struct HookedFunction {
    pub name: String,
    /// Parameter names, in order (the event's `args`).
    pub params: Vec<String>,
    /// Label of each used event slot, e.g. `vma`, `*prev`, `vmg->middle`, `ret`.
    pub slots: Vec<String>,
}
