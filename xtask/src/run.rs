//! `cargo xtask run`: build in release mode and run every reference experiment under the
//! tracer (`memlock-trace suite`), writing the report to target/memlock-trace-report/.

use std::{path::PathBuf, process::Command};

use anyhow::Result;

use crate::{
    util::{build_release, run as run_cmd},
    vm,
};

#[derive(clap::Args)]
pub struct Args {
    /// Run only this scenario (repeatable), e.g. `--scenario first-touch`.
    #[arg(long)]
    scenario: Vec<String>,
    /// Tiny sizes: a quick check rather than a measurement.
    #[arg(long)]
    tiny: bool,
    /// More `memlock-trace suite` options (sizes, counts), after `--`.
    #[arg(last = true)]
    suite_args: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    // vm-memory boots the stock kernel under qemu: the same assets as the VM test stage.
    vm::ensure_assets(&vm::cache_dir(), vm::DEFAULT_KERNEL)?;
    // The preload library too: the advice section runs `advise --apply`, which loads it.
    build_release(None)?;
    let tracer = workspace_root().join("target/release/memlock-trace");
    let out = workspace_root().join("target/memlock-trace-report");
    let mut cmd = Command::new(&tracer);
    cmd.arg("suite").arg("--out").arg(&out);
    for s in &args.scenario {
        cmd.args(["--scenario", s]);
    }
    if args.tiny {
        cmd.arg("--tiny");
    }
    cmd.args(&args.suite_args);
    run_cmd(&mut cmd)
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}
