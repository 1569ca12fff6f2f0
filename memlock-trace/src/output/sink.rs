//! Where the tool's own output goes: stdout, or the file `-o FILE` names (so a launched
//! command keeps the terminal to itself).
//!
//! A write that fails is remembered and named ([`WriteError`]): later writes fail at once,
//! the session stops on it ([`Sink::check`]), and a result already computed is printed on
//! the other stream rather than lost ([`Sink::write_result`]).

use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::Result;

use crate::UsageError;

pub struct Sink {
    dest: Dest,
    /// The first write error: every later write fails with it.
    failed: Option<WriteError>,
}

enum Dest {
    Stdout(io::Stdout),
    File(PathBuf, BufWriter<File>),
}

/// A write to the tool's output failed: names the output, and where the result went instead.
#[derive(Clone, Debug)]
pub struct WriteError {
    pub output: String,
    pub kind: io::ErrorKind,
    reason: String,
    /// The stream the unwritten result was printed on instead.
    fallback: Option<&'static str>,
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot write {}: {}", self.output, self.reason)?;
        if let Some(stream) = self.fallback {
            write!(f, "; the result was printed on {stream} instead")?;
        }
        Ok(())
    }
}

impl std::error::Error for WriteError {}

impl WriteError {
    /// The reader went away (`| head`): not a failure worth a message.
    pub fn is_closed_pipe(&self) -> bool {
        self.kind == io::ErrorKind::BrokenPipe
    }

    /// The write error behind `error`, if that is what it is (directly or inside an
    /// `io::Error`).
    pub fn find(error: &anyhow::Error) -> Option<&WriteError> {
        error.chain().find_map(|e| {
            e.downcast_ref::<WriteError>().or_else(|| {
                e.downcast_ref::<io::Error>()
                    .and_then(|io| io.get_ref())
                    .and_then(|inner| inner.downcast_ref::<WriteError>())
            })
        })
    }
}

impl Sink {
    /// Stdout, or FILE created (truncated) now: a path that cannot be written is a usage
    /// error before any work is done.
    pub fn open(path: Option<&Path>) -> Result<Self> {
        let dest = match path {
            None => Dest::Stdout(io::stdout()),
            Some(path) => File::create(path)
                .map(|f| Dest::File(path.to_path_buf(), BufWriter::new(f)))
                .map_err(|e| {
                    UsageError(format!(
                        "cannot write {}: {e}: give -o a writable file path",
                        path.display()
                    ))
                })?,
        };
        Ok(Self { dest, failed: None })
    }

    /// `standard output` or the file's path.
    pub fn name(&self) -> String {
        match &self.dest {
            Dest::Stdout(_) => "standard output".into(),
            Dest::File(path, _) => path.display().to_string(),
        }
    }

    /// Fails with the first write error, if a write failed.
    pub fn check(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(e.clone().into()),
            None => Ok(()),
        }
    }

    /// Writes and flushes a computed result. If that fails, the result is printed on the
    /// other stream (stdout for a file, stderr for stdout) so that it is not lost, and the
    /// error says so; a closed pipe is left quiet.
    pub fn write_result(&mut self, result: &[u8]) -> Result<()> {
        let written = self.write_all(result).and_then(|()| self.flush());
        let Err(e) = written else {
            return Ok(());
        };
        let Some(mut error) = self.failed.clone() else {
            return Err(e.into());
        };
        if !error.is_closed_pipe() {
            let printed = match self.dest {
                Dest::File(..) => io::stdout().write_all(result).map(|()| "standard output"),
                Dest::Stdout(_) => io::stderr().write_all(result).map(|()| "standard error"),
            };
            error.fallback = printed.ok();
        }
        Err(error.into())
    }

    fn fail(&mut self, e: io::Error) -> io::Error {
        let error = self.failed.get_or_insert_with(|| WriteError {
            output: match &self.dest {
                Dest::Stdout(_) => "standard output".into(),
                Dest::File(path, _) => path.display().to_string(),
            },
            kind: e.kind(),
            reason: e.to_string(),
            fallback: None,
        });
        io::Error::new(error.kind, error.clone())
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(e) = &self.failed {
            return Err(io::Error::new(e.kind, e.clone()));
        }
        let written = match &mut self.dest {
            Dest::Stdout(s) => s.write(buf),
            Dest::File(_, f) => f.write(buf),
        };
        written.map_err(|e| self.fail(e))
    }

    fn flush(&mut self) -> io::Result<()> {
        if let Some(e) = &self.failed {
            return Err(io::Error::new(e.kind, e.clone()));
        }
        let flushed = match &mut self.dest {
            Dest::Stdout(s) => s.flush(),
            Dest::File(_, f) => f.flush(),
        };
        flushed.map_err(|e| self.fail(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_names_the_file_and_sticks() {
        let mut sink = Sink::open(Some(Path::new("/dev/full"))).unwrap();
        assert!(sink.check().is_ok());
        // Buffered: the error shows at the flush.
        let _ = writeln!(sink, "event");
        let e = sink.flush().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        let message = format!("{:#}", sink.check().unwrap_err());
        assert!(message.starts_with("cannot write /dev/full: "), "{message}");
        assert!(sink.write(b"more").is_err(), "later writes fail at once");
        let error = anyhow::Error::from(e);
        assert!(WriteError::find(&error).is_some_and(|w| !w.is_closed_pipe()));
    }

    #[test]
    fn an_unwritable_path_is_refused_naming_it() {
        let e = Sink::open(Some(Path::new("/nonexistent/dir/x.json")))
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .starts_with("cannot write /nonexistent/dir/x.json: "),
            "{e}"
        );
    }
}
