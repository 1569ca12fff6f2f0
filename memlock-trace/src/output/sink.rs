//! Where the tracer's own output goes: stdout, or the file `-o FILE` names (so a launched
//! command keeps the terminal to itself).

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use anyhow::Result;

use crate::UsageError;

pub enum Sink {
    Stdout(std::io::Stdout),
    File(BufWriter<File>),
}

impl Sink {
    /// Stdout, or FILE created (truncated) now: a path that cannot be written is a usage
    /// error before anything is loaded.
    pub fn open(path: Option<&Path>) -> Result<Self> {
        match path {
            None => Ok(Sink::Stdout(std::io::stdout())),
            Some(path) => File::create(path)
                .map(|f| Sink::File(BufWriter::new(f)))
                .map_err(|e| {
                    UsageError(format!(
                        "cannot write {}: {e}: give -o a writable file path",
                        path.display()
                    ))
                    .into()
                }),
        }
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sink::Stdout(s) => s.write(buf),
            Sink::File(f) => f.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::Stdout(s) => s.flush(),
            Sink::File(f) => f.flush(),
        }
    }
}
