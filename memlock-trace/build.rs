//! Builds the eBPF object (memlock-trace-ebpf) with the nightly toolchain and bpf-linker,
//! so a plain `cargo build` produces a loader with its programs embedded.
//! `cargo xtask setup` installs what this needs on a fresh machine.

use anyhow::Context as _;
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let ebpf_dir = format!("{manifest_dir}/../memlock-trace-ebpf");
    println!("cargo:rerun-if-changed={manifest_dir}/../memlock-trace-common/src");
    // This package's `bench` feature builds the eBPF crate's floor programs too; cargo tells a
    // build script its package's features in CARGO_FEATURE_*.
    let features: &[&str] = if std::env::var_os("CARGO_FEATURE_BENCH").is_some() {
        &["bench"]
    } else {
        &[]
    };
    aya_build::build_ebpf(
        [Package {
            name: "memlock-trace-ebpf",
            root_dir: &ebpf_dir,
            features,
            ..Default::default()
        }],
        Toolchain::Nightly,
    )
    .context(
        "building the eBPF programs failed; run `cargo xtask setup` to install the nightly \
         rust-src component and bpf-linker",
    )
}
