//! `cargo xtask run`: build in release mode and run the bundled workload under the tracer.

use std::{path::PathBuf, process::Command};

use anyhow::Result;

use crate::util::run as run_cmd;

#[derive(clap::Args)]
pub struct Args {
    /// Also print every traced call.
    #[arg(long)]
    events: bool,
}

pub fn run(args: &Args) -> Result<()> {
    run_cmd(Command::new("cargo").args(["build", "--release", "-p", "memlock-trace"]))?;
    let tracer = workspace_root().join("target/release/memlock-trace");
    let mut cmd = Command::new(&tracer);
    if args.events {
        cmd.arg("--events");
    }
    cmd.arg("--").arg(&tracer).args(["workload", "syscalls"]);
    eprintln!("xtask: {cmd:?}");
    run_cmd(&mut cmd)
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}
