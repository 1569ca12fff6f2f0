//! The `/metrics` server, on the session's tokio runtime (hyper 1's HTTP/1 connection driver,
//! rustls for `--web-config` TLS), bounded against clients that are slow, greedy or hostile:
//!
//! - at most [`MAX_CONNECTIONS`] at once; past that new ones wait in the kernel's backlog;
//! - request heads of at most [`MAX_HEAD_BYTES`] (hyper answers 431 past that);
//! - [`TIMEOUT`] to send a whole request head (also the idle time between keep-alive
//!   requests: a 1 byte/s client is dropped), to finish the TLS handshake, and for each
//!   read and write to make progress;
//! - a failing `accept` (EMFILE, ENFILE, ENOBUFS, ...) is said once, backed off and retried,
//!   never the end of the server. If serving ever stops, stderr says so.
//!
//! Encoding and bcrypt run on blocking threads, one at a time, so a scrape never holds the
//! thread that drains the ring buffers.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::Incoming,
    header::{ACCEPT, CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    task::{AbortHandle, JoinHandle},
};
use tokio_io_timeout::TimeoutStream;
use tokio_rustls::TlsAcceptor;

use super::{Format, Metrics, web_config::WebConfig};
use crate::UsageError;

/// Connections served at once. Prometheus keeps one per scraper; a few HA replicas and a
/// curl fit many times over.
pub const MAX_CONNECTIONS: usize = 64;
/// Bytes of one request head (request line and headers).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Time to send a request head, to finish a TLS handshake, and for any read or write.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// Back-off after a failed accept: doubles from the first to the last.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

pub struct MetricsServer {
    /// Where it listens (the real port when 0 was asked for).
    pub addr: SocketAddr,
    listener: Option<std::net::TcpListener>,
    web: Option<WebConfig>,
    /// `https` with a TLS web config, else `http`.
    pub scheme: &'static str,
    /// The task that says so if the accept loop ever ends, and the loop.
    tasks: Option<(JoinHandle<()>, AbortHandle)>,
}

/// What every connection shares.
struct State {
    metrics: Arc<Metrics>,
    web: WebConfig,
    tls: Option<TlsAcceptor>,
    /// One encoding (or one bcrypt) at a time.
    encoding: tokio::sync::Mutex<()>,
}

impl MetricsServer {
    /// Binds `addr` now, so a taken port is reported before anything is loaded. Serving
    /// starts with [`Self::serve`], inside the session's runtime.
    pub fn bind(addr: SocketAddr, web: WebConfig) -> Result<Self> {
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|e| UsageError(format!("cannot serve Prometheus metrics on {addr}: {e}")))?;
        listener
            .set_nonblocking(true)
            .context("making the metrics socket non-blocking")?;
        let addr = listener.local_addr().unwrap_or(addr);
        Ok(Self {
            addr,
            listener: Some(listener),
            scheme: if web.tls.is_some() { "https" } else { "http" },
            web: Some(web),
            tasks: None,
        })
    }

    /// Starts serving on the current tokio runtime; does nothing the second time.
    pub fn serve(&mut self, metrics: Arc<Metrics>) -> Result<()> {
        let (Some(listener), Some(web)) = (self.listener.take(), self.web.take()) else {
            return Ok(());
        };
        let listener =
            TcpListener::from_std(listener).context("serving the metrics socket on tokio")?;
        let state = Arc::new(State {
            metrics,
            tls: web.tls.clone().map(TlsAcceptor::from),
            web,
            encoding: tokio::sync::Mutex::new(()),
        });
        let accept = tokio::spawn(accept_loop(listener, state));
        let abort = accept.abort_handle();
        let addr = self.addr;
        let watch = tokio::spawn(async move {
            let why = match accept.await {
                Err(e) if e.is_cancelled() => return,
                Err(e) => format!("{e}"),
                Ok(()) => "its accept loop ended".into(),
            };
            eprintln!(
                "memlock-trace: error: the Prometheus metrics server on {addr} STOPPED SERVING \
                 ({why}): every scrape of this node fails from now on; restart memlock-trace"
            );
        });
        self.tasks = Some((watch, abort));
        Ok(())
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        // The watcher first, so that ending the loop here says nothing.
        if let Some((watch, accept)) = self.tasks.take() {
            watch.abort();
            accept.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut backoff = BACKOFF.0;
    // Since when accept fails, and how often: said once when it starts and once when it ends.
    let mut failing: Option<(Instant, u64)> = None;
    loop {
        // At the bound, wait for a connection to end; new ones queue in the kernel meanwhile.
        let Ok(permit) = Arc::clone(&connections).acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, _peer)) => {
                if let Some((since, failures)) = failing.take() {
                    eprintln!(
                        "memlock-trace: note: the metrics server accepts connections again \
                         ({failures} failed accepts over {:.1} s)",
                        since.elapsed().as_secs_f64()
                    );
                }
                backoff = BACKOFF.0;
                tokio::spawn(connection(stream, Arc::clone(&state), permit));
            }
            // The client gave up between SYN and accept: nothing to wait for.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => {}
            Err(e) => {
                drop(permit);
                match &mut failing {
                    Some((_, failures)) => *failures += 1,
                    None => {
                        eprintln!(
                            "memlock-trace: warning: the metrics server cannot accept connections \
                             ({e}); it keeps serving the ones it has and retries with back-off \
                             up to {} s",
                            BACKOFF.1.as_secs()
                        );
                        failing = Some((Instant::now(), 1));
                    }
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF.1);
            }
        }
    }
}

/// Serves one connection, holding `_permit` until it ends.
async fn connection(stream: TcpStream, state: Arc<State>, _permit: OwnedSemaphorePermit) {
    let _ = stream.set_nodelay(true);
    let mut stream = TimeoutStream::new(stream);
    stream.set_read_timeout(Some(TIMEOUT));
    stream.set_write_timeout(Some(TIMEOUT));
    let stream = Box::pin(stream);
    match &state.tls {
        Some(acceptor) => {
            // A failed or stalled handshake is the client's problem: just close.
            if let Ok(Ok(tls)) = tokio::time::timeout(TIMEOUT, acceptor.accept(stream)).await {
                serve_http(tls, state).await;
            }
        }
        None => serve_http(stream, state).await,
    }
}

async fn serve_http<Io>(io: Io, state: Arc<State>)
where
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request| {
        let state = Arc::clone(&state);
        async move { Ok::<_, Infallible>(respond(request, state).await) }
    });
    // Errors (a timeout, a reset, a head too large: answered 431 first) end this connection
    // only.
    let _ = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(io), service)
        .await;
}

async fn respond(request: Request<Incoming>, state: Arc<State>) -> Response<Full<Bytes>> {
    let (parts, _body) = request.into_parts();
    if state.web.users.is_some() {
        let checking = Arc::clone(&state);
        let headers = parts.headers.clone();
        let allowed = tokio::task::spawn_blocking(move || {
            checking
                .web
                .users
                .as_ref()
                .is_some_and(|users| users.allows(&headers))
        })
        .await
        .unwrap_or(false);
        if !allowed {
            let mut response = text(StatusCode::UNAUTHORIZED, "unauthorized\n");
            response.headers_mut().insert(
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"memlock-trace\""),
            );
            return response;
        }
    }
    match (&parts.method, parts.uri.path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => {
            let accept = parts.headers.get(ACCEPT).and_then(|v| v.to_str().ok());
            let format = Format::negotiate(accept);
            let _one_at_a_time = state.encoding.lock().await;
            let metrics = Arc::clone(&state.metrics);
            let Ok(body) = tokio::task::spawn_blocking(move || metrics.encode_as(format)).await
            else {
                return text(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n");
            };
            let mut response = Response::new(Full::new(Bytes::from(body)));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(format.content_type()),
            );
            response
        }
        (&Method::GET, "/") => text(StatusCode::OK, "memlock-trace: metrics at /metrics\n"),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
