//! `--pprof`: the stacks as a pprof profile, gzipped `profile.proto`
//! (<https://github.com/google/pprof/blob/main/proto/profile.proto>), for `go tool pprof`,
//! Grafana Pyroscope and Parca. The messages are derived with prost from the published
//! schema (the fields used here, by their tags). Two values per sample: faults and bytes
//! (calls and bytes locked for call sites); each sample carries its process as the
//! labels `pid` and `comm`.

use std::{collections::HashMap, io::Write as _};

use anyhow::Result;
use flate2::{Compression, write::GzEncoder};
use prost::Message as _;

use super::{Profile, ProfileStack, Weight, folded::exact_name};
use crate::symbolize::Frame;

#[derive(Clone, PartialEq, prost::Message)]
pub struct PprofProfile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// Innermost first: every entry but the last was inlined into the next.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

/// The string table: index 0 is "", as the format requires.
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut s = Self {
            table: Vec::new(),
            index: HashMap::new(),
        };
        s.get("");
        s
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// The profile message of `profile` (its default sample type the one `weight` names).
pub fn message(profile: &Profile, weight: Weight, time_ns: u64, duration_ns: u64) -> PprofProfile {
    let mut strings = Strings::new();
    let (count, bytes) = if weight.of_faults() {
        ("faults", "bytes")
    } else {
        ("calls", "locked")
    };
    let sample_type = vec![
        ValueType {
            r#type: strings.get(count),
            unit: strings.get("count"),
        },
        ValueType {
            r#type: strings.get(bytes),
            unit: strings.get("bytes"),
        },
    ];
    let mut p = PprofProfile {
        period_type: Some(sample_type[0].clone()),
        period: i64::from(profile.sample_every),
        default_sample_type: sample_type[usize::from(weight.in_bytes())].r#type,
        sample_type,
        time_nanos: i64::try_from(time_ns).unwrap_or(i64::MAX),
        duration_nanos: i64::try_from(duration_ns).unwrap_or(i64::MAX),
        ..PprofProfile::default()
    };
    if profile.sample_every > 1 {
        let note = format!(
            "one fault in {} kept its stack; values are scaled by it",
            profile.sample_every
        );
        p.comment.push(strings.get(&note));
    }
    let mut samples = Samples {
        pid_key: strings.get("pid"),
        comm_key: strings.get("comm"),
        strings,
        p,
        mappings: HashMap::new(),
        functions: HashMap::new(),
        locations: HashMap::new(),
    };
    for stack in &profile.stacks {
        samples.add(stack);
    }
    let mut p = samples.p;
    p.string_table = samples.strings.table;
    p
}

/// The profile being filled with samples, and its tables' ids so far (ids count from 1).
struct Samples {
    strings: Strings,
    p: PprofProfile,
    pid_key: i64,
    comm_key: i64,
    /// By module path.
    mappings: HashMap<String, u64>,
    /// By (name, file).
    functions: HashMap<(String, i64), u64>,
    /// By (process, address).
    locations: HashMap<(u32, String), u64>,
}

impl Samples {
    /// One sample: the stack's locations, its two values, its process's labels.
    fn add(&mut self, stack: &ProfileStack) {
        let mut location_ids = Vec::new();
        // A location is an address: the functions inlined there, then the function they
        // were inlined into (consecutive frames of one address are recursion otherwise).
        let mut i = 0;
        while i < stack.frames.len() {
            let end = stack.frames[i..]
                .iter()
                .position(|f| !f.inlined)
                .map_or(stack.frames.len(), |j| i + j + 1);
            location_ids.push(self.location_id(stack.pid, &stack.frames[i..end]));
            i = end;
        }
        self.p.sample.push(Sample {
            location_id: location_ids,
            value: vec![
                i64::try_from(stack.count).unwrap_or(i64::MAX),
                i64::try_from(stack.bytes).unwrap_or(i64::MAX),
            ],
            label: vec![
                Label {
                    key: self.pid_key,
                    num: i64::from(stack.pid),
                    ..Label::default()
                },
                Label {
                    key: self.comm_key,
                    str: self.strings.get(&stack.comm),
                    ..Label::default()
                },
            ],
        });
    }

    /// The location of one address of process `pid`: `group` is the frames there,
    /// innermost first.
    fn location_id(&mut self, pid: u32, group: &[Frame]) -> u64 {
        let addr = &group[0].addr;
        if let Some(&id) = self.locations.get(&(pid, addr.clone())) {
            return id;
        }
        let mapping_id = self.mapping_id(&group[0]);
        let line = group
            .iter()
            .map(|frame| Line {
                function_id: self.function_id(frame),
                line: frame.line.map_or(0, i64::from),
            })
            .collect();
        let id = self.p.location.len() as u64 + 1;
        self.p.location.push(Location {
            id,
            mapping_id,
            address: u64::from_str_radix(addr.trim_start_matches("0x"), 16).unwrap_or(0),
            line,
        });
        self.locations.insert((pid, addr.clone()), id);
        id
    }

    /// The mapping of the module `frame` is in; 0 when it is unknown.
    fn mapping_id(&mut self, frame: &Frame) -> u64 {
        let Some(module) = &frame.module else {
            return 0;
        };
        let name = module.to_str_lossy().into_owned();
        let next = self.p.mapping.len() as u64 + 1;
        *self.mappings.entry(name.clone()).or_insert_with(|| {
            self.p.mapping.push(Mapping {
                id: next,
                filename: self.strings.get(&name),
                build_id: self.strings.get(frame.build_id.as_deref().unwrap_or("")),
                has_functions: true,
            });
            next
        })
    }

    /// The function `frame` is in, by name and file.
    fn function_id(&mut self, frame: &Frame) -> u64 {
        let name = exact_name(frame);
        let file = frame
            .file
            .as_ref()
            .map_or(0, |f| self.strings.get(&f.to_str_lossy()));
        let next = self.p.function.len() as u64 + 1;
        *self
            .functions
            .entry((name.clone(), file))
            .or_insert_with(|| {
                let name = self.strings.get(&name);
                self.p.function.push(Function {
                    id: next,
                    name,
                    system_name: name,
                    filename: file,
                });
                next
            })
    }
}

/// The gzipped encoding of [`message`], as `go tool pprof` reads it.
pub fn encode(
    profile: &Profile,
    weight: Weight,
    time_ns: u64,
    duration_ns: u64,
) -> Result<Vec<u8>> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&message(profile, weight, time_ns, duration_ns).encode_to_vec())?;
    Ok(gz.finish()?)
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    #[test]
    fn round_trips_with_one_location_per_address() {
        let profile = super::super::folded::tests::profile();
        let bytes = encode(&profile, Weight::Faults, 1, 2).unwrap();
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_end(&mut raw)
            .unwrap();
        let p = PprofProfile::decode(&raw[..]).unwrap();
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(s(p.sample_type[0].r#type), "faults");
        assert_eq!(s(p.sample_type[1].unit), "bytes");
        assert_eq!(s(p.default_sample_type), "faults");
        assert_eq!(p.sample.len(), 4);
        assert_eq!(p.sample[0].value, [1000, 4_096_000]);
        // One location per (process, address): the third stack's are the first's.
        assert_eq!(p.location.len(), 6);
        assert_eq!(p.sample[0].location_id, [1, 2, 3]);
        assert_eq!(p.sample[2].location_id, [1, 2, 3]);
        let names: Vec<&str> = p.sample[0]
            .location_id
            .iter()
            .map(|&l| {
                let line = &p.location[l as usize - 1].line;
                s(p.function[line[0].function_id as usize - 1].name)
            })
            .collect();
        assert_eq!(names, ["touch;All", "grow", "main"]);
        assert_eq!(s(p.sample[3].label[1].str), "a\nb");
    }
}
