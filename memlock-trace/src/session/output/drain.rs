//! Reading the rings: each record decoded, fed to the families' aggregation and the
//! metrics, and, when asked for, rendered as an event line held for the time-ordered stream.

use std::{io::Write as _, os::fd::AsRawFd as _, time::Duration};

use aya::maps::{MapData, RingBuf};
use memlock_trace_common::vma::{VM_LOCKED, VM_LOCKONFAULT};

use super::Output;
use crate::{
    event::{Event, decode},
    faults::render as fault_render,
    output::{WallClock, hms},
    process::table::ProcessKey,
    procfs::Mapping,
    syscalls, vma,
};

/// How long one drain may read before the loop attends to its timers and signals.
const DRAIN_BUDGET: Duration = Duration::from_millis(50);

impl Output {
    /// Renders one event (JSON with its wall-clock `time_ns`, or text lines with `-T`'s
    /// time) and holds it for the time-ordered stream. Without a kernel stamp, the time it
    /// was read stands in.
    fn emit(&mut self, ktime_ns: Option<u64>, json: Option<serde_json::Value>, lines: &[String]) {
        let key = ktime_ns.unwrap_or_else(WallClock::monotonic_ns);
        let wall = self.clock.wall_ns(key);
        let mut text = Vec::new();
        if let Some(mut value) = json {
            value["time_ns"] = wall.into();
            let _ = writeln!(text, "{value}");
        } else {
            let stamp = if self.config.timestamps {
                format!("{} ", hms(wall))
            } else {
                String::new()
            };
            for line in lines {
                let _ = writeln!(text, "{stamp}{line}");
            }
        }
        self.order.push(key, text);
    }

    fn wanted(&self, tid: u32) -> bool {
        self.config.tid.is_none_or(|t| t == tid)
    }

    /// `--stacks`: unwinds the kept stacks waiting in their ring.
    pub(in crate::session) fn drain_stacks(&mut self, ring: &mut RingBuf<MapData>) {
        if let Some(stacks) = &mut self.stacks {
            stacks.drain(ring);
            // Generated code is named from its runtime's perf map, read while it runs.
            for tgid in stacks.modules.with_generated_code() {
                self.symbolizer.perf_maps.refresh(tgid);
            }
        }
    }

    /// Reads `ring` to its end, or for [`DRAIN_BUDGET`]. See [`Output::drain_for`].
    pub(in crate::session) fn drain(&mut self, ring: &mut RingBuf<MapData>) -> bool {
        self.drain_for(ring, DRAIN_BUDGET, 0)
    }

    /// Reads `ring` until it is empty, or `budget` has passed and at least `at_least_bytes`
    /// were read (records and their 8-byte headers); returns whether it was read to its end. A flood keeps a ring from
    /// ever emptying: unbounded, one drain would keep the loop from its timers and signals
    /// (`--duration` and SIGTERM then waited minutes).
    pub(in crate::session) fn drain_for(
        &mut self,
        ring: &mut RingBuf<MapData>,
        budget: Duration,
        at_least_bytes: u64,
    ) -> bool {
        let began = WallClock::monotonic_ns();
        let deadline = std::time::Instant::now() + budget;
        let (mut syscalls, mut vmas, undecodable_before) = (0, 0, self.undecodable);
        let mut read = 0u32;
        let mut bytes = 0u64;
        let mut complete = true;
        loop {
            // Checked before a record is taken (taking one consumes it), every 1024 records:
            // the clock is cheap against their decoding.
            read = read.wrapping_add(1);
            if read.is_multiple_of(1024)
                && bytes >= at_least_bytes
                && std::time::Instant::now() >= deadline
            {
                complete = false;
                break;
            }
            let Some(item) = ring.next() else { break };
            bytes += item.len() as u64 + 8;
            match decode(&item) {
                Ok(Event::Syscall(rec)) => {
                    if !self.wanted(rec.raw.tid) {
                        continue;
                    }
                    syscalls += 1;
                    self.order.saw_call(rec.raw.duration_ns);
                    self.aggregator.record_syscall(&rec);
                    if let Some(window) = &mut self.window {
                        window.aggregator.record_syscall(&rec);
                    }
                    if self.config.syscall_events {
                        let unit = self.config.style.unit;
                        let (json, lines) = if self.config.json {
                            (Some(syscalls::render::syscall_json(&rec)), vec![])
                        } else {
                            (None, vec![syscalls::render::syscall_line(&rec, unit)])
                        };
                        self.emit(Some(rec.raw.enter_ns), json, &lines);
                    }
                    if let Some(activity) = self.vma.tracker.syscall(&rec) {
                        self.vma_activity(&activity);
                    }
                }
                Ok(Event::Vma(record)) => {
                    vmas += 1;
                    if let Some(activity) = self.vma.tracker.record(record)
                        && self.wanted(activity_tid(&activity))
                    {
                        self.vma_activity(&activity);
                    }
                }
                Ok(Event::Fault(rec)) => {
                    if self.config.fault_events && self.wanted(rec.raw.tid) {
                        let place = fault_render::place(&rec, &mut self.event_maps);
                        let (json, lines) = if self.config.json {
                            (Some(fault_render::fault_json(&rec, &place)), vec![])
                        } else {
                            let unit = self.config.style.unit;
                            (None, vec![fault_render::fault_line(&rec, &place, unit)])
                        };
                        self.emit(Some(rec.raw.time_ns), json, &lines);
                    }
                }
                Err(_) => self.undecodable += 1,
            }
        }
        // Only a drain that reached the end vouches that nothing older is still to come.
        if complete {
            self.order.drained(ring.as_raw_fd(), began);
        }
        self.order.release(&mut self.out);
        let _ = self.out.flush();
        if let Some(metrics) = &self.metrics {
            metrics.health.record_events(
                &[("syscall", syscalls), ("vma", vmas)],
                self.undecodable - undecodable_before,
            );
        }
        complete
    }

    /// Counts a VMA activity, and renders it when VMA events are asked for.
    fn vma_activity(&mut self, activity: &vma::Activity) {
        if let vma::Activity::Call(call) = activity {
            // A region mapped and locked after the last /proc read is known from here only.
            for range in &call.after {
                self.mappings.note_vma(
                    activity.tgid(),
                    Mapping {
                        start: range.start,
                        end: range.end,
                        offset: 0,
                        name: format!("VMA seen by {}", call.syscall.syscall.name()).into(),
                        locked: range.flags & VM_LOCKED != 0,
                        lockonfault: Some(range.flags & VM_LOCKONFAULT != 0),
                        pages: crate::procfs::PageSizes::default(),
                    },
                );
            }
            let changes = call.counts();
            // By pid, as before: a VMA record carries no start time.
            let process = ProcessKey {
                tgid: activity.tgid(),
                _pad: 0,
                start_ns: 0,
            };
            let counts = self
                .vma
                .counts
                .get_or_insert_with(process, Default::default);
            counts.merge(&changes);
            if let Some(window) = &mut self.window {
                let counts = window.vma_counts.entry(activity.tgid()).or_default();
                counts.merge(&changes);
            }
        }
        // VMA changes are shown when asked for (`--events`, `--events=syscalls`, `--events=calls,vma`).
        if !self.config.vma_events {
            return;
        }
        let hooks = self.vma.hooks.as_ref();
        // A call's VMA lines carry the call's time; stores and functions outside calls carry
        // no kernel stamp: the time they were read.
        let ktime = match activity {
            vma::Activity::Call(c) => Some(c.syscall.raw.enter_ns),
            _ => None,
        };
        if self.config.json {
            self.emit(ktime, Some(vma::activity_json(activity, hooks)), &[]);
        } else {
            self.emit(ktime, None, &vma::activity_lines(activity, hooks));
        }
    }
}

/// The thread a VMA activity belongs to.
fn activity_tid(activity: &vma::Activity) -> u32 {
    match activity {
        vma::Activity::Call(c) => c.syscall.raw.tid,
        vma::Activity::Store(s) => s.tid,
        vma::Activity::Func(f) => f.tid,
    }
}
