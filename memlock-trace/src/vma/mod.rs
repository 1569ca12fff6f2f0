//! The VMA hook family: what mlock-family calls do to the address space.
//!
//! The semantics come from diffing the two snapshots the kernel side takes around each call
//! (the VMAs covering the call's range and its neighbours, at `sys_enter` and `sys_exit`), so
//! they are the same on every kernel ([`diff`]). The `ma_write` stores and fentry/fexit
//! function events are the mechanism, shown alongside ([`attach`], [`render`]).

pub mod attach;
pub mod diff;
pub mod render;
pub mod tracker;

pub use attach::{HookedFunction, VmaHooks};
pub use diff::{Change, ChangeCounts, diff};
pub use render::{activity_json, activity_lines, flags_str, summary_json, summary_line};
pub use tracker::{Activity, Tracker, VmaCall};
