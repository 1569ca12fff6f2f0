//! Options for production use: filters, Prometheus export, bounds on per-process state.

use clap::Args;
use std::{net::SocketAddr, path::PathBuf};

use crate::{
    metrics::DEFAULT_MAX_NAMES,
    process::DEFAULT_MAX_PROCESSES,
    values::{MAX_PIDS, int},
};

/// Options for production use: the process filters, Prometheus export and the bounds on
/// per-process state.
#[derive(Debug, Args, Default, Clone)]
pub struct ProductionArgs {
    /// Only processes whose name (the comm of the main thread, at most 15 bytes) is NAME.
    #[arg(long, value_name = "NAME")]
    pub comm: Option<String>,
    /// Only processes in this cgroup v2 or below it (a path under the cgroup2 mount, or
    /// relative to it, e.g. `system.slice/nginx.service`).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<PathBuf>,
    /// Also trace the processes that traced processes fork, from their first instruction.
    #[arg(long)]
    pub follow_children: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (`IP:PORT`, or `:PORT` for all
    /// interfaces; port 0 picks a free one, printed on stderr).
    #[arg(long, value_name = "ADDR", value_parser = listen_addr)]
    pub prometheus: Option<SocketAddr>,
    /// Serve /metrics as the web configuration FILE says: TLS (`tls_server_config`) and
    /// basic auth (`basic_auth_users`, bcrypt), the Prometheus exporter-toolkit format.
    #[arg(long, value_name = "FILE", requires = "prometheus")]
    pub web_config: Option<PathBuf>,
    /// Add a `pid` label to per-process metrics (one series per process: use with care).
    #[arg(long, requires = "prometheus")]
    pub prometheus_pid_label: bool,
    /// Process names that keep their own series: the first N with a call or fault, for the
    /// whole session; later names are counted under `comm="other"` (with
    /// `--prometheus-pid-label`, N processes). 0 counts every process under `other`.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_NAMES, value_parser = int(0, MAX_PIDS))]
    pub prometheus_max_names: u32,
    /// Most processes the summary lists one by one, the most active; the others fold into a
    /// line per name. Call statistics are kept for as many; past that the least recently
    /// seen is evicted and counted (`evicted_processes`).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_PROCESSES, value_parser = int(1, MAX_PIDS))]
    pub max_processes: u32,
    /// Also add the summary up by cgroup v2 (`cgroup`): per service, container or pod, in
    /// text instead of the per-process blocks, in JSON as a `"cgroups"` list beside
    /// `"processes"`.
    #[arg(long, value_enum, value_name = "WHAT")]
    pub by: Option<GroupBy>,
    /// Most processes traced at once by pid (`-p`, a command, its children); children past
    /// that are counted as not followed.
    #[arg(long, value_name = "N", value_parser = int(1, MAX_PIDS))]
    pub max_targets: Option<u32>,
}

/// What `--by` adds the summary up by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupBy {
    Cgroup,
}

fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    let full = match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => s.to_string(),
    };
    full.parse().map_err(|_| {
        format!("`{s}` is not a listen address: use IP:PORT (127.0.0.1:9464, [::1]:9464) or :PORT")
    })
}
