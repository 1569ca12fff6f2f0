//! The session's ring buffers and their draining, in one owner: the loop waits once for
//! whichever is readable, and every other reading (the drain timer, an interval's end, the
//! stop) reads them all in one order. Syscall and VMA records have a ring of their own, fault
//! events another (a storm of faults cannot crowd out the calls), `--stacks` a third.

use std::{os::fd::AsRawFd as _, time::Duration};

use anyhow::{Context as _, Result};
use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

use super::output::Output;
use crate::tracer::Tracer;

type Ring = AsyncFd<RingBuf<MapData>>;

pub(super) struct Rings {
    events: Ring,
    faults: Option<Ring>,
    stacks: Option<Ring>,
}

/// Polls `ring`, named `what` in errors.
fn register(ring: RingBuf<MapData>, what: &str) -> Result<Ring> {
    // SAFETY: the ring buffer owns its fd for as long as the AsyncFd holds it.
    unsafe { AsyncFd::register(ring) }
        .map_err(std::io::Error::from)
        .with_context(|| format!("polling the {what}"))
}

impl Rings {
    /// Takes the tracer's rings; event lines wait until both event rings were read past them.
    pub(super) fn take(tracer: &mut Tracer, output: &mut Output) -> Result<Self> {
        let events = register(tracer.take_events()?, "ring buffer")?;
        let faults = tracer
            .take_fault_events()?
            .map(|r| register(r, "fault event ring buffer"))
            .transpose()?;
        let stacks = tracer
            .take_stack_samples()?
            .map(|r| register(r, "stack ring buffer"))
            .transpose()?;
        output.order.watch(events.get_ref().as_raw_fd());
        if let Some(faults) = &faults {
            output.order.watch(faults.get_ref().as_raw_fd());
        }
        Ok(Self {
            events,
            faults,
            stacks,
        })
    }

    /// Waits until a ring is readable and drains it; one left ready when its budget ran
    /// out is come back to on the loop's next turn.
    pub(super) async fn drain_ready(&mut self, output: &mut Output) -> Result<()> {
        let (guard, what) = tokio::select! {
            guard = self.events.readable_mut() => (guard, "ring buffer"),
            guard = readable(&mut self.faults), if self.faults.is_some() => (guard, "fault event ring buffer"),
            guard = readable(&mut self.stacks), if self.stacks.is_some() => {
                let mut guard = guard.context("polling the stack ring buffer")?;
                output.drain_stacks(guard.get_inner_mut());
                guard.clear_ready();
                return Ok(());
            }
        };
        let mut guard = guard.with_context(|| format!("polling the {what}"))?;
        if output.drain(guard.get_inner_mut()) {
            guard.clear_ready();
        }
        Ok(())
    }

    /// Reads every ring now: the kept stacks first (unwound while their process lives),
    /// then both event rings, so that held event lines are not kept waiting for a wakeup.
    pub(super) fn drain_all(&mut self, output: &mut Output) {
        if let Some(stacks) = self.stacks.as_mut() {
            output.drain_stacks(stacks.get_mut());
        }
        output.drain(self.events.get_mut());
        if let Some(faults) = self.faults.as_mut() {
            output.drain(faults.get_mut());
        }
    }

    /// The last reading after a stop. Everything the kernel submitted before it is still in
    /// the rings: each is read for at least as many bytes as it holds, and then only for as
    /// long as `budget` allows (a flood still writing would never let a ring empty). Returns
    /// whether every ring was read to its end.
    pub(super) fn drain_final(&mut self, output: &mut Output, budget: Duration) -> bool {
        if let Some(stacks) = self.stacks.as_mut() {
            output.drain_stacks(stacks.get_mut());
        }
        let mut complete = output.drain_for(
            self.events.get_mut(),
            budget,
            memlock_trace_common::EVENTS_BYTE_SIZE.into(),
        );
        if let Some(faults) = self.faults.as_mut() {
            complete &= output.drain_for(
                faults.get_mut(),
                budget,
                memlock_trace_common::faults::FAULT_EVENTS_BYTE_SIZE.into(),
            );
        }
        complete
    }
}

/// An optional ring's readiness (the select arm is guarded by its presence).
async fn readable(
    ring: &mut Option<Ring>,
) -> std::io::Result<tokio::io::unix::AsyncFdReadyMutGuard<'_, RingBuf<MapData>>> {
    ring.as_mut().expect("guarded").readable_mut().await
}
