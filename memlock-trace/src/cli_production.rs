//! Options for production use: the process filters, Prometheus export and the bounds on
//! per-process state. Flattened into [`crate::cli::TraceArgs`].

use std::{net::SocketAddr, path::PathBuf};

use clap::Args;

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
    /// Add a `pid` label to per-process metrics (one series per process: use with care).
    #[arg(long, requires = "prometheus")]
    pub prometheus_pid_label: bool,
    /// Most processes the summary keeps; past that the least recently seen is evicted and
    /// counted (`evicted_processes`).
    #[arg(long, value_name = "N", default_value_t = crate::processes::DEFAULT_MAX_PROCESSES, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_processes: u32,
    /// Most processes traced at once by pid (`-p`, a command, its children); children past
    /// that are counted as not followed.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_targets: Option<u32>,
}

/// Parameters of the `children` and `flood` workloads.
#[derive(Debug, Args, Clone)]
pub struct WorkloadParams {
    /// `children`: how many children.
    #[arg(long, default_value_t = 4)]
    pub count: u32,
    /// mlock calls per child (`children`) or per thread (`flood`).
    #[arg(long, default_value_t = 1)]
    pub calls: u32,
    /// `flood`: how many threads.
    #[arg(long, default_value_t = 2)]
    pub threads: u32,
    /// `flood`: wait for one byte on stdin before starting.
    #[arg(long)]
    pub wait_stdin: bool,
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

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use crate::cli::Cli;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("memlock-trace").chain(args.iter().copied()))
    }

    #[test]
    fn production_options_parse() {
        let cli = parse(&[
            "--comm",
            "postgres",
            "--cgroup",
            "system.slice",
            "--follow-children",
            "--prometheus",
            ":9464",
            "--prometheus-pid-label",
            "--max-processes",
            "10",
            "--max-targets",
            "5",
        ])
        .unwrap();
        let p = &cli.trace.production;
        assert_eq!(p.comm.as_deref(), Some("postgres"));
        assert_eq!(
            p.cgroup.as_deref(),
            Some(std::path::Path::new("system.slice"))
        );
        assert!(p.follow_children && p.prometheus_pid_label);
        assert_eq!(p.prometheus, Some("0.0.0.0:9464".parse().unwrap()));
        assert_eq!((p.max_processes, p.max_targets), (10, Some(5)));
        let p = parse(&["--prometheus", "[::1]:0"])
            .unwrap()
            .trace
            .production;
        assert_eq!(p.prometheus, Some("[::1]:0".parse().unwrap()));
        assert_eq!(p.max_processes, crate::processes::DEFAULT_MAX_PROCESSES);
    }

    #[test]
    fn bad_production_options_are_rejected() {
        let e = parse(&["--prometheus", "localhost"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a listen address"), "{e}");
        assert!(parse(&["--prometheus", "1.2.3.4:99999"]).is_err());
        assert!(
            parse(&["--prometheus-pid-label"]).is_err(),
            "needs --prometheus"
        );
        assert!(parse(&["--max-processes", "0"]).is_err());
        assert!(parse(&["--max-targets", "-1"]).is_err());
    }
}
