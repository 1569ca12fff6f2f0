//! The files `--folded`, `--flamegraph` and `--pprof` name: created (private, never through
//! a symbolic link) before anything is traced, so that a path that cannot be written is
//! refused at once; written when the session ends.

use std::{
    fs::File,
    io::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

use super::{Profile, Weight, flamegraph, folded, pprof};
use crate::output::{Outside, create_private};

/// The profile files asked for, open.
#[derive(Default)]
pub struct ProfileFiles {
    folded: Option<(PathBuf, File)>,
    flamegraph: Option<(PathBuf, File)>,
    pprof: Option<(PathBuf, File)>,
    pub weight: Weight,
}

impl ProfileFiles {
    /// Creates the files now: a usage error names the one that cannot be.
    pub fn open(
        folded: Option<&Path>,
        flamegraph: Option<&Path>,
        pprof: Option<&Path>,
        weight: Weight,
    ) -> Result<Self> {
        let open = |path: Option<&Path>, option: &str| -> Result<Option<(PathBuf, File)>> {
            path.map(|p| Ok((p.to_path_buf(), create_private(p, option)?)))
                .transpose()
        };
        Ok(Self {
            folded: open(folded, "--folded")?,
            flamegraph: open(flamegraph, "--flamegraph")?,
            pprof: open(pprof, "--pprof")?,
            weight,
        })
    }

    /// Whether any profile file was asked for.
    pub fn wanted(&self) -> bool {
        self.folded.is_some() || self.flamegraph.is_some() || self.pprof.is_some()
    }

    /// Writes every file asked for from `profile` (the session's `time_ns`, `duration_ns`
    /// for pprof); returns the notes for stderr (what each file holds, or why it is empty).
    pub fn write(
        &mut self,
        profile: &Profile,
        time_ns: u64,
        duration_ns: u64,
    ) -> Result<Vec<String>> {
        let weight = self.weight;
        let mut notes = Vec::new();
        let stacks = profile
            .stacks
            .iter()
            .filter(|s| s.weight(weight) > 0)
            .count();
        let what = if weight.of_faults() {
            "fault stacks"
        } else {
            "mlock-family call sites"
        };
        if let Some((path, file)) = &mut self.folded {
            let mut text = folded::lines(profile, weight).join("\n");
            if !text.is_empty() {
                text.push('\n');
            }
            write(path, file, text.as_bytes())?;
            notes.push(format!(
                "{}: {stacks} {what} folded",
                Outside::from(path.as_path())
            ));
        }
        if let Some((path, file)) = &mut self.flamegraph {
            match flamegraph::svg(profile, weight)? {
                Some(svg) => {
                    write(path, file, &svg)?;
                    notes.push(format!(
                        "{}: flame graph of {stacks} {what}, in {}",
                        Outside::from(path.as_path()),
                        weight.count_name()
                    ));
                }
                None => notes.push(format!(
                    "{}: left empty: no {what} were kept",
                    Outside::from(path.as_path())
                )),
            }
        }
        if let Some((path, file)) = &mut self.pprof {
            write(
                path,
                file,
                &pprof::encode(profile, weight, time_ns, duration_ns)?,
            )?;
            notes.push(format!(
                "{}: pprof profile of {} {what}",
                Outside::from(path.as_path()),
                profile.stacks.len()
            ));
        }
        Ok(notes)
    }
}

fn write(path: &Path, file: &mut File, bytes: &[u8]) -> Result<()> {
    file.write_all(bytes)
        .and_then(|()| file.flush())
        .with_context(|| format!("cannot write {}", Outside::from(path)))
}
