//! Request/response RPC over one QUIC bidirectional stream per request, and
//! concurrent fan-out to a list of members.
//!
//! Back-pressure: each connection has a bounded number of outgoing requests
//! in flight (callers wait for a slot), and QUIC limits the number of streams
//! a peer may open towards us.
//!
//! Cancellation: a caller that gives up on a request (its call future is
//! dropped: aborted, timed out) drops the stream, and QUIC tells the server
//! (`STOP_SENDING`); a lost connection tells it too. The server then drops the
//! handler's future, so the work the request started stops with it (a model's
//! generation, an external agent's process, a sub-team the handler hosts).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::codec::{encode_frame, expect_frame, write_frame, CodecError};
use crate::identity::NodeId;
use crate::transport::{PeerConn, TransportError};
use crate::wire::{RpcErrorCode, RpcRequest, RpcResponse, StreamHeader, StreamKind, WIRE_VERSION};

/// Longest accepted service or method name.
pub const MAX_NAME_LEN: usize = 128;

/// An incoming request as seen by a [`Handler`].
#[derive(Clone, Debug)]
pub struct Request {
    /// The authenticated, admitted caller.
    pub from: NodeId,
    /// Service name the request was routed by.
    pub service: String,
    /// Method within the service.
    pub method: String,
    /// Opaque body.
    pub body: Bytes,
}

/// An error returned by a handler, sent back to the caller.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct RpcError {
    /// Error class.
    pub code: RpcErrorCode,
    /// Detail.
    pub message: String,
}

impl RpcError {
    /// Builds an error.
    pub fn new(code: RpcErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Serves one named service. Implemented by the node for each service.
///
/// Closures `Fn(Request) -> impl Future<Output = Result<Vec<u8>, RpcError>>`
/// implement it too.
pub trait Handler: Send + Sync + 'static {
    /// Handles one request.
    fn handle(&self, req: Request) -> BoxFuture<'static, Result<Vec<u8>, RpcError>>;
}

impl<F, Fut> Handler for F
where
    F: Fn(Request) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<u8>, RpcError>> + Send + 'static,
{
    fn handle(&self, req: Request) -> BoxFuture<'static, Result<Vec<u8>, RpcError>> {
        Box::pin(self(req))
    }
}

/// Errors of an outgoing call.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Could not reach or admit the peer.
    #[error("connect: {0}")]
    Connect(#[from] TransportError),
    /// The stream failed.
    #[error("stream: {0}")]
    Stream(String),
    /// Bad frame from the peer (or our request too large).
    #[error("frame: {0}")]
    Codec(#[from] CodecError),
    /// No answer in time.
    #[error("timed out")]
    Timeout,
    /// The remote handler returned an error.
    #[error("remote: {0}")]
    Remote(RpcError),
}

/// Service name to handler.
#[derive(Default)]
pub struct Router {
    handlers: RwLock<HashMap<String, Arc<dyn Handler>>>,
}

impl Router {
    /// Registers (or replaces) the handler of `service`.
    pub fn register(&self, service: &str, handler: Arc<dyn Handler>) {
        if let Ok(mut h) = self.handlers.write() {
            h.insert(service.to_owned(), handler);
        }
    }

    /// Removes the handler of `service`.
    pub fn unregister(&self, service: &str) {
        if let Ok(mut h) = self.handlers.write() {
            h.remove(service);
        }
    }

    fn get(&self, service: &str) -> Option<Arc<dyn Handler>> {
        self.handlers.read().ok()?.get(service).cloned()
    }

    /// Serves one RPC stream whose header was already read.
    pub(crate) async fn serve(
        &self,
        from: NodeId,
        send: &mut quinn::SendStream,
        recv: &mut (impl tokio::io::AsyncRead + Unpin),
        max_frame: usize,
    ) -> Result<(), CodecError> {
        let req: RpcRequest = expect_frame(recv, max_frame).await?;
        let resp = if req.service.len() > MAX_NAME_LEN || req.method.len() > MAX_NAME_LEN {
            RpcResponse::Err {
                code: RpcErrorCode::BadRequest,
                message: "name too long".into(),
            }
        } else {
            match self.get(&req.service) {
                None => RpcResponse::Err {
                    code: RpcErrorCode::UnknownService,
                    message: format!("no service {:?}", req.service),
                },
                Some(h) => {
                    let request = Request {
                        from,
                        service: req.service,
                        method: req.method,
                        body: Bytes::from(req.body),
                    };
                    // Completes only when the caller stops the stream or the
                    // connection is lost: this side has not finished it yet.
                    let abandoned = send.stopped();
                    let outcome = tokio::select! {
                        r = h.handle(request) => r,
                        _ = abandoned => {
                            tracing::debug!(peer = %from.short(), "caller gave up: request dropped");
                            return Ok(());
                        }
                    };
                    match outcome {
                        Ok(body) => RpcResponse::Ok(body),
                        Err(e) => RpcResponse::Err {
                            code: e.code,
                            message: e.message,
                        },
                    }
                }
            }
        };
        let resp = match write_frame(send, &resp, max_frame).await {
            Err(CodecError::Oversized { len, max }) => {
                let msg = RpcResponse::Err {
                    code: RpcErrorCode::Internal,
                    message: format!("response of {len} bytes exceeds frame limit {max}"),
                };
                write_frame(send, &msg, max_frame).await
            }
            other => other,
        };
        resp?;
        let _ = send.finish();
        Ok(())
    }
}

/// Sends one request on `pc` and waits for the response.
pub(crate) async fn call_on(
    pc: &PeerConn,
    req: &RpcRequest,
    max_frame: usize,
    timeout: Duration,
) -> Result<Vec<u8>, CallError> {
    let fut = async {
        let _permit = pc
            .in_flight
            .acquire()
            .await
            .map_err(|_| CallError::Stream("connection closed".into()))?;
        let (mut send, mut recv) = pc
            .conn
            .open_bi()
            .await
            .map_err(|e| CallError::Stream(e.to_string()))?;
        let header = StreamHeader {
            version: WIRE_VERSION,
            kind: StreamKind::Rpc,
        };
        // Header and request in one write, FIN right after: one STREAM frame,
        // one packet for a small request.
        let mut out = encode_frame(&header, max_frame)?;
        out.extend_from_slice(&encode_frame(req, max_frame)?);
        send.write_all(&out)
            .await
            .map_err(|e| CallError::Stream(e.to_string()))?;
        let _ = send.finish();
        let resp: RpcResponse = expect_frame(&mut recv, max_frame).await?;
        match resp {
            RpcResponse::Ok(body) => Ok(body),
            RpcResponse::Err { code, message } => {
                Err(CallError::Remote(RpcError { code, message }))
            }
        }
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| CallError::Timeout)?
}
