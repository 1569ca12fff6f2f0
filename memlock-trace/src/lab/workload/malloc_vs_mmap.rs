//! malloc-vs-mmap (reference 002): a region of 28-byte records (16-byte string + 3 ints),
//! random writes then random reads, in `malloc`ed memory and in `mmap(MAP_LOCKED)` memory.
//! The malloc run pays its page faults inside the timed loop; MAP_LOCKED pays them in mmap.

use std::{hint::black_box, time::Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use super::{Faults, args::ScenarioArgs};

#[repr(C, packed)]
#[derive(Clone, Copy)]
struct Record {
    name: [u8; 16],
    a: i32,
    b: i32,
    c: i32,
}

const _: () = assert!(size_of::<Record>() == 28);

/// xorshift64*: cheap, deterministic, good enough to scatter accesses.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n as u64) as usize
    }
}

pub fn run(variant: &str, args: &ScenarioArgs) -> Result<Value> {
    let bytes = args.records_mib << 20;
    let count = bytes / size_of::<Record>();
    let mut runs = Vec::new();
    for run in 0..args.runs {
        let before_alloc = Faults::process();
        let t = Instant::now();
        // SAFETY: a fresh allocation of `bytes`, released at the end of the run.
        let ptr: *mut Record = unsafe {
            match variant {
                "malloc" => libc::malloc(bytes).cast(),
                "mmap-locked" => {
                    let p = libc::mmap(
                        std::ptr::null_mut(),
                        bytes,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_LOCKED,
                        -1,
                        0,
                    );
                    if p == libc::MAP_FAILED {
                        std::ptr::null_mut()
                    } else {
                        p.cast()
                    }
                }
                other => bail!("unknown malloc-vs-mmap variant {other}"),
            }
        };
        let alloc_us = t.elapsed().as_secs_f64() * 1e6;
        let alloc_faults = Faults::process().since(before_alloc);
        if ptr.is_null() {
            bail!(
                "{variant} of {} MiB failed: {}",
                args.records_mib,
                std::io::Error::last_os_error()
            );
        }
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ run as u64);
        let before_write = Faults::process();
        let t = Instant::now();
        for i in 0..args.accesses {
            let rec = Record {
                name: *b"memlock-trace-00",
                a: i as i32,
                b: (i * 2) as i32,
                c: (i * 3) as i32,
            };
            // SAFETY: index below `count`, inside the allocation; unaligned write of a packed struct.
            unsafe { ptr.add(rng.below(count)).write_unaligned(rec) };
        }
        let write_us = t.elapsed().as_secs_f64() * 1e6;
        let write_faults = Faults::process().since(before_write);
        let before_read = Faults::process();
        let t = Instant::now();
        let mut sum = 0i64;
        for _ in 0..args.accesses {
            // SAFETY: index below `count`, inside the allocation; unaligned read of a packed
            // struct.
            let rec = unsafe { ptr.add(rng.below(count)).read_unaligned() };
            sum += i64::from(rec.a) + i64::from(rec.b) + i64::from(rec.c) + i64::from(rec.name[0]);
        }
        black_box(sum);
        let read_us = t.elapsed().as_secs_f64() * 1e6;
        let read_faults = Faults::process().since(before_read);
        // SAFETY: releasing what was allocated above.
        unsafe {
            if variant == "malloc" {
                libc::free(ptr.cast())
            } else {
                libc::munmap(ptr.cast(), bytes);
            }
        }
        runs.push(json!({
            "alloc_us": alloc_us, "write_us": write_us, "read_us": read_us,
            "alloc_faults": alloc_faults.minflt, "write_faults": write_faults.minflt, "read_faults": read_faults.minflt,
        }));
    }
    let median = |key: &str| super::median(runs.iter().map(|r| r[key].as_f64().unwrap_or(0.0)));
    Ok(json!({
        "bytes": bytes, "records": count, "accesses": args.accesses, "runs": runs,
        "alloc_us": median("alloc_us"), "write_us": median("write_us"), "read_us": median("read_us"),
        "alloc_faults": median("alloc_faults"), "write_faults": median("write_faults"), "read_faults": median("read_faults"),
    }))
}
