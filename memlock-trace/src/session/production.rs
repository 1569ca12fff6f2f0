//! Turns the production options into what a session needs: validated filters, the
//! Prometheus registry and its server, the bound on per-process state.

use std::{collections::BTreeMap, sync::Arc};

use anyhow::Result;

use crate::{
    UsageError,
    cli::TraceArgs,
    metrics::{Metrics, server::MetricsServer, web_config::WebConfig},
    object::HookLine,
    process::{Cgroup, Filters},
};

pub struct Production {
    pub filters: Filters,
    pub metrics: Option<Arc<Metrics>>,
    /// Bound at set-up, serving from [`Self::serve_metrics`] until dropped.
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
                let web = match &p.web_config {
                    Some(path) => WebConfig::load(path)?,
                    None => WebConfig::default(),
                };
                let open = web.tls.is_none() && web.users.is_none();
                let metrics =
                    Arc::new(Metrics::new(p.prometheus_pid_label, p.prometheus_max_names));
                let server = MetricsServer::bind(addr, web)?;
                eprintln!(
                    "memlock-trace: serving Prometheus metrics on {}://{}/metrics",
                    server.scheme, server.addr
                );
                if open && !addr.ip().is_loopback() {
                    eprintln!(
                        "memlock-trace: warning: /metrics on {} is plain HTTP without \
                         authentication: anyone who reaches the port reads this node's process \
                         names and fault counts; use --web-config FILE (TLS and basic auth) or \
                         listen on 127.0.0.1",
                        server.addr
                    );
                }
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

    /// Starts the metrics server on the session's runtime (bound in [`Self::setup`]), its
    /// build info naming the hook set of each family (`hooks`: family, description).
    pub fn serve_metrics(&mut self, hooks: &BTreeMap<&'static str, HookLine>) -> Result<()> {
        match (&mut self.server, &self.metrics) {
            (Some(server), Some(metrics)) => {
                metrics.set_build_info(hooks.iter().map(|(family, line)| (*family, line.set())));
                server.serve(Arc::clone(metrics))
            }
            _ => Ok(()),
        }
    }
}

/// Returns the heap's free pages to the kernel. Reading the kernel's maps back allocates
/// per process the maps hold and frees it at once, and glibc keeps freed memory for reuse:
/// a session that runs for weeks would sit at its highest refresh (and its start's BTF and
/// object parsing) forever, which a memory cgroup's limit and `ps` count as its own.
pub fn give_back_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim takes no pointer; glibc's allocator is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}
