//! The node's HTTP API: OpenAI-compatible chat completions (whole or streamed as
//! server-sent events), embeddings and model listing, served with axum.
//!
//! [`router`] builds the routes over an [`AppState`] (the served models, limits and
//! counters) so a daemon can mount them next to its own; [`serve`] runs them on a socket
//! until a [`CancellationToken`] fires.
//!
//! Routes:
//! - `POST /v1/chat/completions`
//! - `POST /v1/embeddings`
//! - `GET /v1/models`, `GET /v1/models/{id}`
//! - `GET /health`: liveness, served models and counters
//! - `GET /openapi.json`: the OpenAPI document of these routes (`node/assets/openapi.json`;
//!   a node serves all of it, see [`node::router`])
//!
//! Errors are OpenAI's `{"error": {"message", "type", "param", "code"}}` with a matching
//! status. Inference runs on the models' own threads; a streamed generation stops when its
//! client goes away. It binds to loopback by default and then answers only requests
//! addressed to a loopback host name (see [`ApiConfig::loopback_hosts_only`]). With API
//! keys ([`ApiConfig::api_keys`]) every request needs `Authorization: Bearer <key>`; the
//! API refuses to listen beyond loopback without one ([`check_exposure`]).

pub(crate) mod a2a;
mod chat;
mod completions;
mod embeddings;
mod error;
mod extract;
pub mod memories;
mod models;
pub mod node;
mod ollama;
mod openapi;
mod responses;
mod state;
pub mod tasks;
mod tools;

use std::net::{IpAddr, SocketAddr};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::timeout::RequestBodyTimeoutLayer;
use tower_http::trace::TraceLayer;

pub use chat::MEMORIES_HEADER;
pub use error::ApiError;
pub(crate) use extract::{ApiJson, ApiPath, ApiQuery, Documented};
pub use state::{ApiConfig, AppState, LoadModel, MemoryExamples, MetricsSnapshot, ModelSwitch};

use state::Metrics;

pub use crate::config::{ExposureError, DEFAULT_API_ADDR as DEFAULT_ADDR, MIN_API_KEY_LEN};

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Accepting or serving connections failed.
    #[error("HTTP server failed: {0}")]
    Io(#[from] std::io::Error),
    /// Beyond loopback without an API key, or with a weak one.
    #[error(transparent)]
    Exposure(#[from] ExposureError),
}

/// The API's routes and middleware over `state` (`starling serve`), with the OpenAI and
/// Ollama part of the OpenAPI document at `/openapi.json` and the API's counters at
/// `/metrics`.
pub fn router(state: AppState) -> Router {
    let extra = Router::new()
        .route("/openapi.json", get(openapi::openai_part))
        .route("/metrics", get(models::metrics))
        .with_state(state.clone());
    router_with(state, extra)
}

/// The OpenAI-compatible routes plus `extra` (e.g. the node API of a running node), all
/// behind the same limits, host check, CORS policy and error shape. `extra` serves
/// `/openapi.json` if it wants one.
pub fn router_with(state: AppState, extra: Router) -> Router {
    let limit = state.config().max_body_bytes;
    Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{*id}", get(models::get))
        .route("/health", get(models::health))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/embed", post(ollama::embed))
        .route("/api/embeddings", post(ollama::embeddings))
        .route("/api/show", post(ollama::show))
        .route("/api/pull", post(ollama::pull))
        .route(
            "/api/models/active",
            get(models::active_model).put(models::switch_model),
        )
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .with_state(state.clone())
        .merge(extra)
        .fallback(unknown_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(limit))
        // A promised body that never comes ends the request instead of holding it.
        .layer(RequestBodyTimeoutLayer::new(state.config().body_timeout))
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(CatchPanicLayer::custom(
            |_: Box<dyn std::any::Any + Send>| {
                ApiError::internal("the server hit an internal error").into_response()
            },
        ))
        .layer(cors(state.config().cors_origins.clone()))
        .layer(TraceLayer::new_for_http())
}

/// Binds `addr` and serves the API until `cancel` fires; see [`serve_on`].
pub async fn serve(
    addr: SocketAddr,
    state: AppState,
    cancel: CancellationToken,
) -> Result<(), ServeError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    serve_on(listener, state, cancel).await
}

/// Serves the API on `listener` until `cancel` fires. Then running streams end with an
/// error event, new inference is refused, and the call returns once open connections have
/// finished their current response.
pub async fn serve_on(
    listener: TcpListener,
    state: AppState,
    cancel: CancellationToken,
) -> Result<(), ServeError> {
    serve_router_on(listener, state.clone(), router(state), cancel).await
}

/// Serves `app` (built with [`router_with`] over `state`) on `listener` until `cancel`
/// fires; see [`serve_on`]. Each connection has the config's header-read timeout (which
/// also closes idle keep-alive connections) and at most `max_connections` are served at
/// once: a slow or idle client cannot hold the server's sockets.
pub async fn serve_router_on(
    listener: TcpListener,
    state: AppState,
    app: Router,
    cancel: CancellationToken,
) -> Result<(), ServeError> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto;
    use hyper_util::server::graceful::GracefulShutdown;
    use hyper_util::service::TowerToHyperService;

    let addr = listener.local_addr()?;
    check_exposure(addr, state.config())?;
    tracing::info!(%addr, "HTTP API listening");
    let config = state.config().clone();
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(config.max_connections.max(1)));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(config.header_timeout);
    let graceful = GracefulShutdown::new();
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let stream = tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: back off a little rather than spin.
                    tracing::warn!(error = %e, "HTTP API cannot accept a connection");
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => continue,
                    }
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!("HTTP API at its connection cap; closing a new connection");
            drop(stream);
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        connections.spawn(async move {
            let _slot = slot;
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "HTTP connection ended with an error");
            }
        });
        // Reap the finished ones as we go.
        while connections.try_join_next().is_some() {}
    }
    tracing::info!("HTTP API shutting down");
    state.begin_shutdown();
    drop(listener);
    // Every connection finishes its current response, then closes.
    graceful.shutdown().await;
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Counts requests and answers, and refuses requests addressed to a non-loopback host when
/// the config says so.
async fn guard(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let counters = state.counters();
    Metrics::add(&counters.http_requests, 1);
    req.extensions_mut()
        .insert(extract::BodyLimit(state.config().max_body_bytes));
    let response = match host_refused(&state, &req).or_else(|| key_refused(&state, &req)) {
        Some(err) => {
            let mut r = err.into_response();
            if r.status() == axum::http::StatusCode::UNAUTHORIZED {
                r.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            r
        }
        None => next.run(req).await,
    };
    let status = response.status();
    if status.is_client_error() {
        Metrics::add(&counters.client_errors, 1);
    } else if status.is_server_error() {
        Metrics::add(&counters.server_errors, 1);
    }
    response
}

fn host_refused(state: &AppState, req: &Request) -> Option<ApiError> {
    if !state.config().loopback_hosts_only {
        return None;
    }
    // HTTP/1.1 puts the host in the Host header, HTTP/2 in the URI's authority.
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()));
    match host {
        Some(h) if is_loopback_authority(&h) => None,
        Some(h) => Some(ApiError::forbidden_host(&h)),
        None => Some(ApiError::forbidden_host("")),
    }
}

/// Refuses a request without a valid `Authorization: Bearer <key>` when keys are set.
fn key_refused(state: &AppState, req: &Request) -> Option<ApiError> {
    let keys = &state.config().api_keys;
    if keys.is_empty() {
        return None;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| {
            let (scheme, token) = h.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    match given {
        Some(token) if keys.iter().any(|k| same_secret(k, token)) => None,
        Some(_) => Some(ApiError::unauthorized(true)),
        None => Some(ApiError::unauthorized(false)),
    }
}

/// Compares two secrets in time that does not depend on where they differ (`subtle`,
/// which the TLS stack already brings).
fn same_secret(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// Whether the API may listen on `addr` with `config` ([`crate::config::check_exposure`]
/// over its keys).
pub fn check_exposure(addr: SocketAddr, config: &ApiConfig) -> Result<(), ServeError> {
    Ok(crate::config::check_exposure(addr, &config.api_keys)?)
}

/// Whether `authority` (`host[:port]`) names loopback: `localhost`, `*.localhost`, an
/// address in 127.0.0.0/8, or `[::1]`.
fn is_loopback_authority(authority: &str) -> bool {
    let host = if let Some(rest) = authority.strip_prefix('[') {
        match rest.split_once(']') {
            Some((h, _)) => h,
            None => return false,
        }
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    host == "localhost"
        || host.ends_with(".localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// CORS for pages served from this machine (a local web UI) and for the configured
/// `origins` (lower-case, exact); other origins get no CORS headers, so browsers keep their
/// pages from reading or posting JSON to the API.
fn cors(origins: Vec<String>) -> CorsLayer {
    CorsLayer::new()
        .allow_origin(AllowOrigin::predicate(move |origin: &HeaderValue, _| {
            let Ok(o) = origin.to_str() else {
                return false;
            };
            let loopback = o
                .strip_prefix("http://")
                .or_else(|| o.strip_prefix("https://"))
                .is_some_and(is_loopback_authority);
            loopback || origins.iter().any(|x| x.eq_ignore_ascii_case(o))
        }))
        .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
        .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION])
}

async fn unknown_route(req: Request) -> ApiError {
    ApiError::route_not_found(req.method().as_str(), req.uri().path())
}

async fn wrong_method(req: Request) -> ApiError {
    ApiError::method_not_allowed(req.method().as_str(), req.uri().path())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "k3y-0123456789abcdef";

    fn keyed() -> ApiConfig {
        ApiConfig {
            api_keys: vec![KEY.to_owned()],
            ..ApiConfig::default()
        }
    }

    #[test]
    fn beyond_loopback_the_api_needs_a_long_enough_key() {
        let off: SocketAddr = "0.0.0.0:7431".parse().expect("addr");
        assert!(matches!(
            check_exposure(off, &ApiConfig::default()),
            Err(ServeError::Exposure(ExposureError::NoKey { .. }))
        ));
        assert!(check_exposure(off, &keyed()).is_ok());
        assert!(check_exposure(DEFAULT_ADDR, &ApiConfig::default()).is_ok());
        let weak = ApiConfig {
            api_keys: vec!["short".into()],
            ..ApiConfig::default()
        };
        assert!(matches!(
            check_exposure(DEFAULT_ADDR, &weak),
            Err(ServeError::Exposure(ExposureError::WeakKey { len: 5, .. }))
        ));
    }

    /// Binding beyond loopback without a key fails before a request is served (binding
    /// sends nothing; no request leaves loopback).
    #[tokio::test]
    async fn serving_beyond_loopback_without_a_key_is_refused() {
        let listener = TcpListener::bind("0.0.0.0:0").await.expect("bind");
        let state = AppState::new(ApiConfig {
            loopback_hosts_only: false,
            ..ApiConfig::default()
        });
        let r = serve_on(listener, state, CancellationToken::new()).await;
        assert!(
            matches!(r, Err(ServeError::Exposure(ExposureError::NoKey { .. }))),
            "{r:?}"
        );
    }

    /// Serves `config` on a loopback port; returns the address and the server's stop.
    async fn serve_with(
        config: ApiConfig,
    ) -> (
        SocketAddr,
        CancellationToken,
        tokio::task::JoinHandle<Result<(), ServeError>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let cancel = CancellationToken::new();
        let server = tokio::spawn(serve_on(listener, AppState::new(config), cancel.clone()));
        (addr, cancel, server)
    }

    /// Reads until the server closes the connection (or `limit` passes); returns what
    /// was read and whether it closed.
    async fn read_until_closed(
        s: &mut tokio::net::TcpStream,
        limit: std::time::Duration,
    ) -> (String, bool) {
        use tokio::io::AsyncReadExt;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let read_all = async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return true,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        };
        let closed = tokio::time::timeout(limit, read_all).await.unwrap_or(false);
        (String::from_utf8_lossy(&got).into_owned(), closed)
    }

    fn quick() -> ApiConfig {
        ApiConfig {
            header_timeout: std::time::Duration::from_millis(300),
            body_timeout: std::time::Duration::from_millis(300),
            ..ApiConfig::default()
        }
    }

    /// What the server answers `Origin: origin` on `GET /health` (headers and body).
    async fn answer_to_origin(addr: SocketAddr, origin: &str) -> String {
        use tokio::io::AsyncWriteExt;
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let req = format!(
            "GET /health HTTP/1.1\r\nHost: localhost\r\nOrigin: {origin}\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.expect("write");
        read_until_closed(&mut s, std::time::Duration::from_secs(5))
            .await
            .0
            .to_ascii_lowercase()
    }

    /// Loopback pages always get CORS headers; a configured origin gets them too (however
    /// its case is written); any other origin, or a configured one's other port or scheme,
    /// gets none.
    #[tokio::test]
    async fn cors_headers_go_to_loopback_pages_and_configured_origins_only() {
        let (addr, cancel, server) = serve_with(ApiConfig {
            cors_origins: vec!["https://app.example.com".into()],
            ..ApiConfig::default()
        })
        .await;
        let allowed = |answer: &str, origin: &str| {
            answer.contains(&format!("access-control-allow-origin: {origin}"))
        };
        for origin in [
            "http://localhost:3000",
            "https://app.example.com",
            "https://APP.example.com",
        ] {
            let a = answer_to_origin(addr, origin).await;
            assert!(a.starts_with("http/1.1 200"), "{a}");
            assert!(allowed(&a, &origin.to_ascii_lowercase()), "{origin}: {a}");
        }
        for origin in [
            "https://evil.example",
            "http://app.example.com",
            "https://app.example.com:8443",
        ] {
            let a = answer_to_origin(addr, origin).await;
            assert!(!a.contains("access-control-allow-origin"), "{origin}: {a}");
        }
        cancel.cancel();
        server.await.expect("join").expect("serve");
    }

    /// Slowloris: headers that never end, and an idle keep-alive connection, are closed
    /// after the header timeout (bounded here at 10x it).
    #[tokio::test]
    async fn slow_headers_and_idle_connections_are_closed() {
        use tokio::io::AsyncWriteExt;
        let (addr, cancel, server) = serve_with(quick()).await;
        let limit = std::time::Duration::from_secs(3);
        let mut slow = tokio::net::TcpStream::connect(addr).await.expect("connect");
        slow.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
            .await
            .expect("write");
        let (_, closed) = read_until_closed(&mut slow, limit).await;
        assert!(closed, "a request whose headers never end stays open");

        let mut idle = tokio::net::TcpStream::connect(addr).await.expect("connect");
        idle.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .expect("write");
        let (answer, closed) = read_until_closed(&mut idle, limit).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(closed, "an idle keep-alive connection stays open");
        cancel.cancel();
        server.await.expect("join").expect("serve");
    }

    /// A promised body that never comes ends the request.
    #[tokio::test]
    async fn a_body_that_never_comes_ends_the_request() {
        use tokio::io::AsyncWriteExt;
        let (addr, cancel, server) = serve_with(quick()).await;
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"input\":",
        )
        .await
        .expect("write");
        let (answer, _) = read_until_closed(&mut s, std::time::Duration::from_secs(3)).await;
        let status: u16 = answer
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        assert!((400..500).contains(&status), "{answer}");
        cancel.cancel();
        server.await.expect("join").expect("serve");
    }

    /// Past the connection cap a new connection is closed at once; the held ones still
    /// work.
    #[tokio::test]
    async fn connections_past_the_cap_are_closed() {
        use tokio::io::AsyncWriteExt;
        let (addr, cancel, server) = serve_with(ApiConfig {
            max_connections: 2,
            ..ApiConfig::default()
        })
        .await;
        let mut held = Vec::new();
        for _ in 0..2 {
            held.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
        }
        // The server takes the held ones before the next one (accepts are in order).
        let mut extra = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let _ = extra
            .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await;
        let (answer, closed) =
            read_until_closed(&mut extra, std::time::Duration::from_secs(3)).await;
        assert!(closed && answer.is_empty(), "{answer}");
        held[0]
            .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let (answer, _) = read_until_closed(&mut held[0], std::time::Duration::from_secs(3)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        cancel.cancel();
        server.await.expect("join").expect("serve");
    }

    #[tokio::test]
    async fn with_a_key_every_route_needs_it() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let cancel = CancellationToken::new();
        let server = tokio::spawn(serve_on(listener, AppState::new(keyed()), cancel.clone()));
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        for path in ["/health", "/v1/models", "/no/such/route"] {
            let url = format!("http://{addr}{path}");
            let none = client.get(&url).send().await.expect("send");
            assert_eq!(none.status(), 401, "{path}");
            assert_eq!(
                none.headers().get("www-authenticate").map(|v| v.as_bytes()),
                Some(&b"Bearer"[..])
            );
            let body: serde_json::Value = none.json().await.expect("json");
            assert_eq!(body["error"]["code"], "invalid_api_key");
            let wrong = client
                .get(&url)
                .bearer_auth("k3y-0123456789abcdeX")
                .send()
                .await
                .expect("send");
            assert_eq!(wrong.status(), 401, "{path}");
        }
        let ok = client
            .get(format!("http://{addr}/health"))
            .bearer_auth(KEY)
            .send()
            .await
            .expect("send");
        assert_eq!(ok.status(), 200);
        cancel.cancel();
        server.await.expect("join").expect("serve");
    }

    #[test]
    fn loopback_authorities() {
        for ok in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:1",
            "127.1.2.3",
            "[::1]:7431",
            "[::1]",
            "app.localhost:3000",
        ] {
            assert!(is_loopback_authority(ok), "{ok}");
        }
        for bad in [
            "evil.com",
            "evil.com:80",
            "10.0.0.1:80",
            "[::2]:1",
            "[::1",
            "localhost.evil.com",
            "",
        ] {
            assert!(!is_loopback_authority(bad), "{bad}");
        }
    }
}
