//! `--folded`, `--flamegraph`, `--pprof` at the end of a session, and the last read of the
//! runtimes' perf maps.

use std::collections::BTreeMap;

use anyhow::Result;

use super::Output;
use crate::{output::WallClock, profile, tracer::Tracer};

impl Output {
    /// The last look at the perf maps of processes that ran generated code, before the
    /// session's summary names their frames.
    pub(super) fn finish_perf_maps(&mut self) {
        if let Some(stacks) = &self.stacks {
            let tgids: Vec<u32> = stacks.modules.with_generated_code().collect();
            self.symbolizer.perf_maps.finish(tgids);
        }
    }

    /// Writes the profile files asked for, and says on stderr what they hold and which
    /// processes ran generated code no perf map named.
    pub(in crate::session) fn write_profiles(
        &mut self,
        tracer: &Tracer,
        quiet: bool,
    ) -> Result<()> {
        let Some(stacks) = &self.stacks else {
            return Ok(());
        };
        let mut names: BTreeMap<u32, String> = BTreeMap::new();
        for (key, comm) in tracer.exit_comms()? {
            names.insert(key.tgid, comm.to_str_lossy().into_owned());
        }
        for (key, id) in tracer.identities()? {
            if !id.comm.is_empty() {
                names.insert(key.tgid, id.comm.to_str_lossy().into_owned());
            }
        }
        let comm = |tgid: u32| -> String {
            names.get(&tgid).cloned().unwrap_or_else(|| {
                std::fs::read_to_string(format!("/proc/{tgid}/comm"))
                    .map_or_else(|_| format!("pid {tgid}"), |c| c.trim_end().to_string())
            })
        };
        if !quiet {
            for tgid in self.symbolizer.perf_maps.absent() {
                eprintln!(
                    "memlock-trace: {} (pid {tgid}) ran generated code and wrote no perf map \
                     (/tmp/perf-{tgid}.map): its frames there stay `[unknown]` (node \
                     --perf-basic-prof, python3.12 -X perf and the JVM's perf-map agents write one)",
                    crate::output::escape(comm(tgid).as_bytes())
                );
            }
        }
        if !self.profiles.wanted() {
            return Ok(());
        }
        let weight = self.profiles.weight;
        let symbols = profile::Symbols {
            modules: &stacks.modules,
            symbolizer: &self.symbolizer,
            comm: &comm,
        };
        let built = if weight.of_faults() {
            symbols.fault_profile(&stacks.faults, self.config.stack_sample, weight)
        } else {
            symbols.call_profile(&stacks.calls, weight)
        };
        let now = WallClock::now_ns();
        let notes =
            self.profiles
                .write(&built, self.started_ns, now.saturating_sub(self.started_ns))?;
        if !quiet {
            for note in notes {
                eprintln!("memlock-trace: {note}");
            }
        }
        Ok(())
    }
}
