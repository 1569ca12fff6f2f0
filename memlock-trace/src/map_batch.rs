//! Whole BPF maps read in batches. aya reads a map one key at a time (two `bpf()` calls a
//! key, one an array index): a system-wide session's fault maps, tens of thousands of keys,
//! cost 276,542 calls in a 2 s session and 53 s to stop after ten minutes of churn. And a
//! walk by next key that stands on a key the kernel deletes meanwhile starts again from the
//! first. `BPF_MAP_LOOKUP_BATCH` (Linux 5.6) copies thousands of entries a call and walks a
//! hash map by bucket, so concurrent inserts and deletes never restart it. Where a kernel
//! lacks it for a map type, the next-key walk is the fallback.

use std::{
    io,
    mem::size_of,
    os::fd::{AsFd as _, AsRawFd as _, RawFd},
};

use anyhow::{Context as _, Result};
use aya::{Pod, maps::MapData};
use aya_obj::generated::{bpf_attr, bpf_cmd};

/// Entries asked for a call, at most; more when one hash bucket holds more (ENOSPC).
const BATCH: usize = 4096;
/// The values buffer of one call, at most: a per-CPU value is copied once a possible CPU.
const BATCH_BYTES: usize = 4 << 20;

/// Every key and value of a map whose value is one `V`.
pub fn entries<K: Pod, V: Pod>(map: &MapData) -> Result<Vec<(K, V)>> {
    let mut out = Vec::new();
    read(map, size_of::<K>(), size_of::<V>(), &mut |k, v| {
        out.push((read_pod::<K>(k), read_pod::<V>(v)));
    })?;
    Ok(out)
}

/// Calls `f` with every key and value of a map whose value is one `V`, decoded a batch at
/// a time: nothing the size of the map is held but what `f` keeps.
pub fn for_each<K: Pod, V: Pod>(map: &MapData, mut f: impl FnMut(K, V)) -> Result<()> {
    read(map, size_of::<K>(), size_of::<V>(), &mut |k, v| {
        f(read_pod::<K>(k), read_pod::<V>(v));
    })
}

/// Calls `f` with every key of a per-CPU map and each possible CPU's value, decoded a
/// batch at a time: nothing the size of the map is held but what `f` keeps.
pub fn for_each_per_cpu<K: Pod, V: Pod>(map: &MapData, mut f: impl FnMut(K, &[V])) -> Result<()> {
    let cpus = aya::util::nr_cpus().map_err(|(path, e)| anyhow::anyhow!("{path}: {e}"))?;
    // The kernel copies each CPU's value into 8-byte-aligned slots.
    let slot = size_of::<V>().next_multiple_of(8);
    let mut values = Vec::with_capacity(cpus);
    read(map, size_of::<K>(), slot * cpus, &mut |k, v| {
        values.clear();
        values.extend(v.chunks_exact(slot).map(read_pod::<V>));
        f(read_pod::<K>(k), &values);
    })
}

fn read_pod<T: Pod>(bytes: &[u8]) -> T {
    assert!(bytes.len() >= size_of::<T>());
    // SAFETY: `T` is plain data (any bytes are a value) and `bytes` holds at least its size.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) }
}

/// What is read of a map: the size of its keys and of its values as the kernel copies them,
/// and what is done with each entry.
struct Reader<'a> {
    key_size: usize,
    value_size: usize,
    each: &'a mut dyn FnMut(&[u8], &[u8]),
    entries: usize,
}

impl Reader<'_> {
    fn entry(&mut self, key: &[u8], value: &[u8]) {
        self.entries += 1;
        (self.each)(key, value);
    }
}

/// Calls `each` with every key and value of the map, as the kernel copied them.
fn read(
    map: &MapData,
    key_size: usize,
    value_size: usize,
    each: &mut dyn FnMut(&[u8], &[u8]),
) -> Result<()> {
    let fd = map.fd().as_fd().as_raw_fd();
    let mut reader = Reader {
        key_size,
        value_size,
        each,
        entries: 0,
    };
    match read_batches(fd, &mut reader) {
        Ok(()) => Ok(()),
        // A kernel without batch lookups for this map type: key by key.
        Err(e) if reader.entries == 0 && is_unsupported(&e) => {
            read_by_next_key(fd, &mut reader).context("BPF_MAP_GET_NEXT_KEY/LOOKUP_ELEM")
        }
        Err(e) => Err(e).context("BPF_MAP_LOOKUP_BATCH"),
    }
}

/// The kernel's own ENOTSUPP, which it returns to user space as is (5.10's per-CPU hash
/// maps): "Unknown error 524".
const ENOTSUPP: i32 = 524;

fn is_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::ENOTSUP | libc::ENOSYS | ENOTSUPP)
    )
}

fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<()> {
    // SAFETY: `attr` is a bpf_attr with the fields of `cmd` set; the buffers it points to
    // live, and are as large as it says, for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            std::ptr::from_mut(attr),
            size_of::<bpf_attr>(),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn zeroed_attr() -> bpf_attr {
    // SAFETY: bpf_attr is a C union of integers: all zeroes is the kernel's "unset".
    unsafe { std::mem::zeroed() }
}

fn read_batches(fd: RawFd, reader: &mut Reader<'_>) -> io::Result<()> {
    let (key_size, value_size) = (reader.key_size, reader.value_size);
    // The position between calls: a bucket index for hash maps, a key for arrays.
    let token_size = key_size.max(8);
    let (mut position, mut next) = (vec![0u8; token_size], vec![0u8; token_size]);
    let mut started = false;
    let mut count = (BATCH_BYTES / value_size.max(1)).clamp(16, BATCH);
    // Not zeroed: the kernel writes the entries it copies, and only those are read. Zeroed
    // for each read, the buffers were most of a `--prometheus` session's page faults (1,600
    // a second on 2 CPUs, perf: memset under map_batch::read), the session giving freed
    // memory back every second.
    let (mut keys, mut values) = (Vec::<u8>::new(), Vec::<u8>::new());
    loop {
        keys.clear();
        keys.reserve(count * key_size);
        values.clear();
        values.reserve(count * value_size);
        let mut attr = zeroed_attr();
        // SAFETY: the `batch` member of the union is the one BPF_MAP_LOOKUP_BATCH reads.
        let batch = unsafe { &mut attr.batch };
        batch.in_batch = if started { position.as_ptr() as u64 } else { 0 };
        batch.out_batch = next.as_mut_ptr() as u64;
        batch.keys = keys.spare_capacity_mut().as_mut_ptr() as u64;
        batch.values = values.spare_capacity_mut().as_mut_ptr() as u64;
        batch.count = count as u32;
        batch.map_fd = fd as u32;
        let result = bpf(bpf_cmd::BPF_MAP_LOOKUP_BATCH, &mut attr);
        // How many entries the kernel copied: it writes the count back when it ran the batch
        // (done, at the end, or one bucket too big); refusing the command (5.10's ENOTSUPP),
        // it leaves ours there, and those entries are not there.
        let ran = match &result {
            Ok(()) => true,
            Err(e) => matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOSPC)),
        };
        let got = if ran {
            // SAFETY: as above: the member the kernel wrote back.
            let copied = unsafe { attr.batch.count };
            (copied as usize).min(count)
        } else {
            0
        };
        // SAFETY: the kernel copied `got` keys and values, each contiguous from the start
        // of its buffer, within the capacity reserved above.
        unsafe {
            keys.set_len(got * key_size);
            values.set_len(got * value_size);
        }
        for (k, v) in keys
            .chunks_exact(key_size)
            .zip(values.chunks_exact(value_size))
        {
            reader.entry(k, v);
        }
        match result {
            Ok(()) => {}
            // The end of the map.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            // One bucket holds more entries than were asked for.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && got == 0 => {
                count *= 2;
                continue;
            }
            Err(e) => return Err(e),
        }
        position.copy_from_slice(&next);
        started = true;
    }
}

fn read_by_next_key(fd: RawFd, reader: &mut Reader<'_>) -> io::Result<()> {
    let mut key = vec![0u8; reader.key_size];
    let mut next = vec![0u8; reader.key_size];
    let mut value = vec![0u8; reader.value_size];
    let mut started = false;
    loop {
        let mut attr = zeroed_attr();
        // SAFETY: the member BPF_MAP_GET_NEXT_KEY and BPF_MAP_LOOKUP_ELEM read.
        let elem = unsafe { &mut attr.__bindgen_anon_2 };
        elem.map_fd = fd as u32;
        elem.key = if started { key.as_ptr() as u64 } else { 0 };
        elem.__bindgen_anon_1.next_key = next.as_mut_ptr() as u64;
        match bpf(bpf_cmd::BPF_MAP_GET_NEXT_KEY, &mut attr) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            Err(e) => return Err(e),
        }
        key.copy_from_slice(&next);
        started = true;
        let mut attr = zeroed_attr();
        // SAFETY: as above.
        let elem = unsafe { &mut attr.__bindgen_anon_2 };
        elem.map_fd = fd as u32;
        elem.key = key.as_ptr() as u64;
        elem.__bindgen_anon_1.value = value.as_mut_ptr() as u64;
        match bpf(bpf_cmd::BPF_MAP_LOOKUP_ELEM, &mut attr) {
            Ok(()) => reader.entry(&key, &value),
            // Deleted between the two calls.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use aya::maps::{HashMap, IterableMap as _, PerCpuArray, PerCpuHashMap, PerCpuValues};

    use super::*;

    /// More entries than one call asks for, each read once, whichever way.
    #[test]
    fn a_hash_map_of_several_batches_is_read_whole_both_ways() {
        let n = 3 * BATCH as u32 + 17;
        let mut map = HashMap::<MapData, u32, u64>::create(n, 0)
            .expect("creating a BPF hash map needs CAP_BPF: run the tests as root");
        for k in 0..n {
            map.insert(k, u64::from(k) * 3, 0).unwrap();
        }
        let read: BTreeMap<u32, u64> = entries(map.map()).unwrap().into_iter().collect();
        assert_eq!(read.len(), n as usize);
        assert!(read.iter().all(|(&k, &v)| v == u64::from(k) * 3));
        let fd = map.map().fd().as_fd().as_raw_fd();
        let mut walked = BTreeMap::new();
        let mut each = |k: &[u8], v: &[u8]| {
            walked.insert(read_pod::<u32>(k), read_pod::<u64>(v));
        };
        let mut reader = Reader {
            key_size: 4,
            value_size: 8,
            each: &mut each,
            entries: 0,
        };
        read_by_next_key(fd, &mut reader).unwrap();
        assert_eq!(reader.entries, n as usize);
        assert_eq!(walked, read);
    }

    fn per_cpu<V: Pod>(map: &MapData) -> Vec<(u32, Vec<V>)> {
        let mut out = Vec::new();
        for_each_per_cpu(map, |k, v: &[V]| out.push((k, v.to_vec()))).unwrap();
        out
    }

    /// Each CPU's value, from slots rounded up to 8 bytes (a 12-byte value here).
    #[test]
    fn per_cpu_values_are_each_cpus_own() {
        let cpus = aya::util::nr_cpus().unwrap();
        let value = |k: u32, cpu: usize| -> [u8; 12] {
            let mut v = [0u8; 12];
            v[..4].copy_from_slice(&k.to_ne_bytes());
            v[8..].copy_from_slice(&(cpu as u32 + 1).to_ne_bytes());
            v
        };
        let mut map = PerCpuHashMap::<MapData, u32, [u8; 12]>::create(5000, 0).unwrap();
        for k in 0..5000 {
            let values =
                PerCpuValues::try_from((0..cpus).map(|c| value(k, c)).collect::<Vec<_>>()).unwrap();
            map.insert(k, values, 0).unwrap();
        }
        let read = per_cpu::<[u8; 12]>(map.map());
        assert_eq!(read.len(), 5000);
        for (k, values) in read {
            let expected: Vec<_> = (0..cpus).map(|c| value(k, c)).collect();
            assert_eq!(values, expected, "key {k}");
        }
        let mut array = PerCpuArray::<MapData, u64>::create(64, 0).unwrap();
        let values =
            PerCpuValues::try_from((0..cpus).map(|c| c as u64 + 7).collect::<Vec<_>>()).unwrap();
        array.set(63, values, 0).unwrap();
        let read = per_cpu::<u64>(array.map());
        assert_eq!(read.len(), 64, "an array has every index");
        assert_eq!(
            read[63].1,
            (0..cpus).map(|c| c as u64 + 7).collect::<Vec<_>>()
        );
        assert!(read[..63].iter().all(|(_, v)| v.iter().all(|&x| x == 0)));
    }
}
