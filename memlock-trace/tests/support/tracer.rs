//! memlock-trace running in the background: its stderr read as it comes (to wait for what
//! it says), its stdout collected until it exits.

use std::{
    io::{BufRead as _, BufReader, Read as _},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::BIN;

/// memlock-trace running in the background.
pub struct Tracer {
    pub child: Child,
    stderr: Arc<Mutex<String>>,
    stdout: Option<std::thread::JoinHandle<String>>,
}

pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Tracer {
    pub fn spawn(args: &[&str]) -> Self {
        Self::spawn_command(Command::new(BIN).args(args))
    }

    pub fn spawn_command(cmd: &mut Command) -> Self {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start memlock-trace");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let err = child.stderr.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let mut out = child.stdout.take().expect("piped");
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        Self {
            child,
            stderr,
            stdout: Some(stdout),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until stderr contains `needle` (the tracer prints "tracing ..." once attached).
    ///
    /// A hang guard, not a target: a debug build parsing the kernel's BTF and attaching a
    /// dozen trampolines in a software-emulated guest, beside other guests on a loaded 2-core
    /// machine, took over 30 s to start on 6.12.
    pub fn wait_for_stderr(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let err = self.stderr();
            if let Some(line) = err.lines().find(|l| l.contains(needle)) {
                return line.to_string();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("memlock-trace exited ({status}) before printing {needle:?}:\n{err}");
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} on stderr within 120 s:\n{err}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: plain kill(2) on our own child.
        assert_eq!(
            unsafe { libc::kill(self.pid(), signal) },
            0,
            "kill({}, {signal})",
            self.pid()
        );
    }

    /// Waits (at most 120 s) for the tracer to exit: a guard against a hang, not a measure
    /// of promptness (test:promptness asserts that). As the start's bound: an emulated guest
    /// beside four other stages once took past 60 s to write test:memory_limit's summary of
    /// 2,000 exited processes.
    pub fn finish(mut self) -> Finished {
        let deadline = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "memlock-trace did not exit within 120 s:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let stdout = self
            .stdout
            .take()
            .expect("once")
            .join()
            .expect("stdout reader");
        // Let the stderr reader see EOF.
        std::thread::sleep(Duration::from_millis(50));
        Finished {
            status,
            stdout,
            stderr: self.stderr(),
        }
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
