//! Where the tool's own output goes: stdout, or the file `-o FILE` names (so a launched
//! command keeps the terminal to itself).
//!
//! A write that fails is remembered and named ([`WriteError`]): later writes fail at once,
//! the session stops on it ([`Sink::check`]), and a result already computed is printed on
//! the other stream rather than lost ([`Sink::write_result`]).

use std::{
    fs::{File, OpenOptions},
    io::{self, BufWriter, Write},
    os::unix::fs::OpenOptionsExt as _,
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

/// Creates (or truncates) a file the tool writes for the user: new files are 0600 (less if
/// the umask says so), since they hold other processes' names and memory layout; and a
/// symbolic link as the last component is refused rather than followed (`O_NOFOLLOW`), so a
/// link planted where the user writes cannot make a privileged tracer truncate its target.
/// `option` names the option that gave the path, for the error.
pub fn create_private(path: &Path, option: &str) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            let shown = crate::output::Outside::from(path);
            let why = if e.raw_os_error() == Some(libc::ELOOP) && path.is_symlink() {
                "it is a symbolic link, which is not followed (another user may have placed \
                 it): name the file it points to, or remove the link"
                    .to_string()
            } else {
                format!("{e}: give {option} a writable file path")
            };
            UsageError(format!("cannot write {shown}: {why}")).into()
        })
}

/// Writes `contents` to a new or truncated private file ([`create_private`]).
pub fn write_private(path: &Path, contents: &[u8], option: &str) -> Result<()> {
    create_private(path, option)?
        .write_all(contents)
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", crate::output::Outside::from(path)))
}

impl Sink {
    /// Stdout, or FILE created (truncated) now with [`create_private`]: a path that cannot
    /// be written is a usage error before any work is done.
    pub fn open(path: Option<&Path>) -> Result<Self> {
        let dest = match path {
            None => Dest::Stdout(io::stdout()),
            Some(path) => create_private(path, "-o")
                .map(|f| Dest::File(path.to_path_buf(), BufWriter::new(f)))?,
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
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn new_files_are_private_and_links_are_not_followed() {
        let dir = std::env::temp_dir().join(format!("memlock-trace-sink-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let file = dir.join("out.txt");
        // SAFETY: umask has no preconditions; 0 shows the mode the tool asks for.
        let old = unsafe { libc::umask(0) };
        let created = Sink::open(Some(&file));
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        drop(created.unwrap());
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{mode:o}");
        let target = dir.join("victim");
        std::fs::write(&target, "keep me").unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = Sink::open(Some(&link)).err().unwrap().to_string();
        assert!(e.contains("is a symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
