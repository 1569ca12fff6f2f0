//! The kernel's per-CPU counter arrays (`PerCpuArray` of `u64`), each counter summed over
//! CPUs: the health counters of the tracer, the families and the process tracking.

use anyhow::Result;
use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
};

use crate::object;

/// A per-CPU array of counters in the loaded object.
pub struct CpuCounters<'a>(PerCpuArray<&'a MapData, u64>);

impl<'a> CpuCounters<'a> {
    pub fn open(ebpf: &'a Ebpf, name: &str) -> Result<Self> {
        Ok(Self(PerCpuArray::try_from(object::map(ebpf, name)?)?))
    }

    /// Counter `index`, summed over CPUs.
    pub fn sum(&self, index: u32) -> Result<u64> {
        Ok(self.0.get(&index, 0)?.iter().sum())
    }
}
