//! Turns the production options into what a session needs: validated filters, the
//! Prometheus registry and its server, the bound on per-process state.

use std::sync::Arc;

use anyhow::Result;

use crate::{
    UsageError,
    cli::TraceArgs,
    metrics::{Metrics, server::MetricsServer},
    process::{Cgroup, Filters},
};

pub struct Production {
    pub filters: Filters,
    pub metrics: Option<Arc<Metrics>>,
    /// Serves until dropped.
    #[expect(
        dead_code,
        reason = "held for its Drop: the server runs until the session ends"
    )]
    pub server: Option<MetricsServer>,
    pub max_processes: usize,
}

impl Production {
    /// Validates the options (bad ones are [`UsageError`]s) and binds the metrics address,
    /// before anything is loaded into the kernel.
    pub fn setup(args: &TraceArgs) -> Result<Self> {
        let p = &args.production;
        let mut filters = Filters {
            follow_children: p.follow_children,
            max_targets: p.max_targets,
            ..Default::default()
        };
        if p.follow_children && args.pids.is_empty() && args.command.is_empty() {
            return Err(UsageError(
                "--follow-children needs processes to follow: -p PID or -- COMMAND".into(),
            )
            .into());
        }
        if let Some(name) = &p.comm {
            filters.set_comm(name, &mut |notice| {
                eprintln!("memlock-trace: note: {notice}")
            })?;
        }
        if let Some(path) = &p.cgroup {
            filters.cgroup = Some(Cgroup::resolve(path)?);
        }
        let (metrics, server) = match p.prometheus {
            Some(addr) => {
                let metrics = Arc::new(Metrics::new(p.prometheus_pid_label));
                let server = MetricsServer::start(addr, Arc::clone(&metrics))?;
                eprintln!(
                    "memlock-trace: serving Prometheus metrics on http://{}/metrics",
                    server.addr
                );
                (Some(metrics), Some(server))
            }
            None => (None, None),
        };
        Ok(Self {
            filters,
            metrics,
            server,
            max_processes: p.max_processes as usize,
        })
    }
}
