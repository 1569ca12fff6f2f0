//! A small HTTP server for `/metrics`, on its own thread so a slow scraper never delays
//! draining the ring buffer.

use std::{net::SocketAddr, sync::Arc, thread::JoinHandle};

use anyhow::Result;
use tiny_http::{Header, Method, Response, Server};

use super::{CONTENT_TYPE, Metrics};
use crate::UsageError;

pub struct MetricsServer {
    server: Arc<Server>,
    thread: Option<JoinHandle<()>>,
    /// Where it listens (the real port when 0 was asked for).
    pub addr: SocketAddr,
}

impl MetricsServer {
    /// Binds `addr` now, so a taken port is reported before anything is loaded.
    pub fn start(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<Self> {
        let server = Server::http(addr)
            .map_err(|e| UsageError(format!("cannot serve Prometheus metrics on {addr}: {e}")))?;
        let bound = server.server_addr().to_ip().unwrap_or(addr);
        let server = Arc::new(server);
        let serving = Arc::clone(&server);
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || serve(&serving, &metrics))?;
        Ok(Self {
            server,
            thread: Some(thread),
            addr: bound,
        })
    }
}

fn serve(server: &Server, metrics: &Metrics) {
    // `incoming_requests` ends when `unblock` is called.
    for request in server.incoming_requests() {
        let path = request.url().split('?').next().unwrap_or("");
        let (body, content_type, status) = match (request.method(), path) {
            (Method::Get | Method::Head, "/metrics") => (metrics.encode(), CONTENT_TYPE, 200),
            (Method::Get, "/") => ("memlock-trace: metrics at /metrics\n".into(), TEXT, 200),
            _ => ("not found\n".into(), TEXT, 404),
        };
        let mut response = Response::from_string(body).with_status_code(status);
        if let Ok(header) = Header::from_bytes(&b"Content-Type"[..], content_type.as_bytes()) {
            response.add_header(header);
        }
        // A scraper that hung up is its problem, not the tracer's.
        let _ = request.respond(response);
    }
}

const TEXT: &str = "text/plain; charset=utf-8";

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
