//! `cargo xtask dist`: the release binary with its man page and shell completions, all
//! generated from the one clap definition (`memlock-trace man DIR`, `memlock-trace
//! completions SHELL`, hidden subcommands), and the systemd unit, the Kubernetes DaemonSet
//! and the image recipe of dist/, under target/dist/. With `--target TRIPLE` (aarch64-unknown-linux-gnu), the binary, its eBPF
//! object (aya-build builds it for the target's `bpf_target_arch`) and the preload library
//! are cross-built, under target/dist/TRIPLE/; the pages and completions, the same on every
//! architecture, come from a build for this machine, which can run them.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use crate::{
    run::workspace_root,
    util::{build_release, output_of, run as run_cmd},
};

/// Where each shell looks for completions, relative to a prefix such as /usr/share.
const COMPLETIONS: [(&str, &str); 3] = [
    ("bash", "bash-completion/completions/memlock-trace"),
    ("zsh", "zsh/vendor-completions/_memlock-trace"),
    ("fish", "fish/vendor_completions.d/memlock-trace.fish"),
];

#[derive(clap::Args)]
pub struct Args {
    /// Cross-build for this target triple (aarch64-unknown-linux-gnu), installing its
    /// standard library and cross linker first.
    #[arg(long)]
    target: Option<String>,
}

pub fn run(args: &Args) -> Result<()> {
    let root = workspace_root();
    // The binary that writes the pages and completions: this machine's.
    let tracer = root.join("target/release/memlock-trace");
    build_release(None)?;
    let (built, dist): (PathBuf, PathBuf) = match &args.target {
        Some(target) => {
            crate::setup::ensure_cross(target)?;
            build_release(Some(target))?;
            (
                root.join("target").join(target).join("release"),
                root.join("target/dist").join(target),
            )
        }
        None => (root.join("target/release"), root.join("target/dist")),
    };
    let write = |relative: &str, text: &str| -> Result<()> {
        let path = dist.join(relative);
        std::fs::create_dir_all(path.parent().expect("a file under dist"))?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("xtask: dist: {}", path.display());
        Ok(())
    };
    std::fs::create_dir_all(dist.join("bin"))?;
    copy(
        &built.join("memlock-trace"),
        &dist.join("bin/memlock-trace"),
    )?;
    println!("xtask: dist: {}", dist.join("bin/memlock-trace").display());
    // `advise --apply`'s preload library, where the tracer looks for it (../lib/memlock-trace/).
    let preload = dist.join("lib/memlock-trace/libmemlock_preload.so");
    std::fs::create_dir_all(preload.parent().expect("a file under dist"))?;
    copy(&built.join("libmemlock_preload.so"), &preload)?;
    println!("xtask: dist: {}", preload.display());
    // memlock-trace.1 and a page per subcommand it names (memlock-trace-probe.1, ...).
    let man = dist.join("share/man/man1");
    std::fs::create_dir_all(&man)?;
    run_cmd(Command::new(&tracer).arg("man").arg(&man))?;
    for page in std::fs::read_dir(&man)? {
        println!("xtask: dist: {}", page?.path().display());
    }
    for (shell, relative) in COMPLETIONS {
        let script = output_of(Command::new(&tracer).args(["completions", shell]))?;
        write(&format!("share/{relative}"), &script)?;
    }
    // The hardened unit for running it as a node service, and for a cluster the DaemonSet
    // and the recipe of its image, built from this tree (README.md, "Installing").
    for (source, installed) in [
        (
            "dist/memlock-trace.service",
            "lib/systemd/system/memlock-trace.service",
        ),
        (
            "dist/kubernetes/memlock-trace.yaml",
            "share/memlock-trace/kubernetes/memlock-trace.yaml",
        ),
        (
            "dist/container/Containerfile",
            "share/memlock-trace/container/Containerfile",
        ),
    ] {
        let path = root.join(source);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        write(installed, &text)?;
    }
    println!(
        "xtask: dist: install with `cp -r {}/* /usr/local/`; read the page with `man {}`",
        dist.display(),
        dist.join("share/man/man1/memlock-trace.1").display()
    );
    Ok(())
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to)
        .map(|_| ())
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))
}
