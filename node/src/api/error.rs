//! Errors of the HTTP API, in OpenAI's error body shape.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use starling_models::embed::EmbedError;
use starling_models::ModelError;

/// The longest error message a client is sent (bytes; longer ones are cut).
const MAX_MESSAGE: usize = 2000;

/// An error's text as a client may see it: without a backtrace (errors of some libraries,
/// candle's among them, carry one in their text when `RUST_BACKTRACE` is set; it shows
/// the server's source paths and is of no use to a client) and at most [`MAX_MESSAGE`]
/// bytes.
fn client_message(mut m: String) -> String {
    let trace = [
        "stack backtrace:",
        "Stack backtrace:",
        "\n   0: ",
        "\n  0: ",
    ]
    .iter()
    .filter_map(|marker| m.find(marker))
    .min();
    if let Some(at) = trace {
        m.truncate(at);
    }
    if m.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !m.is_char_boundary(cut) {
            cut -= 1;
        }
        m.truncate(cut);
        m.push('…');
    }
    m.trim_end().to_owned()
}

/// An error answered to an API client as `{"error": {"message", "type", "param", "code"}}`
/// with a matching HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    param: Option<String>,
    code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: client_message(message.into()),
            param: None,
            code: None,
        }
    }

    /// 400: the request is malformed or asks for something invalid.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the offending request field (`messages[0].role`, `temperature`, ...).
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::invalid(message).with_param(param)
    }

    /// 404 for an object (peer, group, task, memory...) that does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message).with_code("not_found")
    }

    /// 409: the request conflicts with the node's current state.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "invalid_request_error", message).with_code("conflict")
    }

    /// 503: a part of the node the request needs is not available.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message).with_code("unavailable")
    }

    /// 404 for a route that does not exist.
    pub fn route_not_found(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("unknown endpoint: {method} {path}"),
        )
        .with_code("unknown_url")
    }

    /// 405 for a known route called with the wrong method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("method {method} is not allowed on {path}"),
        )
        .with_code("method_not_allowed")
    }

    /// 404 for a model this server does not serve.
    pub fn model_not_found(model: &str, served: &[String]) -> Self {
        let served = if served.is_empty() {
            "none".to_owned()
        } else {
            served.join(", ")
        };
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("the model `{model}` does not exist on this server (serving: {served})"),
        )
        .with_param("model")
        .with_code("model_not_found")
    }

    /// 503: no model of the needed kind is loaded.
    pub fn model_not_loaded(what: &str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            format!("no {what} model is loaded on this node"),
        )
        .with_code("model_not_loaded")
    }

    /// 413: the body is larger than the configured limit.
    pub fn too_large(limit: Option<usize>) -> Self {
        let message = match limit {
            Some(limit) => {
                format!("the request body is larger than this server's limit of {limit} bytes")
            }
            None => "the request body is larger than this server's limit".to_owned(),
        };
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            message,
        )
        .with_code("request_too_large")
    }

    /// 415: the body is not declared as JSON.
    pub fn not_json() -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            "the request body must be JSON, sent with `Content-Type: application/json`",
        )
        .with_code("unsupported_media_type")
    }

    /// 403: the `Host` header names something other than this machine's loopback.
    pub fn forbidden_host(host: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            format!("requests for host `{host}` are refused: this API only answers to localhost"),
        )
        .with_code("forbidden_host")
    }

    /// 401: the request carries no valid API key.
    pub fn unauthorized(present: bool) -> Self {
        let message = if present {
            "the API key is not valid for this node"
        } else {
            "this node's API needs a key: send `Authorization: Bearer <key>`"
        };
        Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
            .with_code("invalid_api_key")
    }

    /// 429: too many inference requests are running or queued.
    pub fn busy(limit: usize) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!(
                "the server is busy ({limit} inference requests running or queued); retry later"
            ),
        )
        .with_code("server_busy")
    }

    /// 503: the server is shutting down.
    pub fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the server is shutting down",
        )
        .with_code("shutting_down")
    }

    /// 507: the disk is full; nothing was written.
    pub fn insufficient_storage(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INSUFFICIENT_STORAGE, "server_error", message).with_code("disk_full")
    }

    /// 500: something failed inside the server.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// Sets the `param` field.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Sets the `code` field.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The request field it names, if any.
    pub fn param(&self) -> Option<&str> {
        self.param.as_deref()
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The JSON body, `{"error": {...}}`.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({ "error": ErrorObject::from(self) })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

impl std::error::Error for ApiError {}

/// The inner object of an error body.
#[derive(Serialize)]
struct ErrorObject<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl<'a> From<&'a ApiError> for ErrorObject<'a> {
    fn from(e: &'a ApiError) -> Self {
        Self {
            message: &e.message,
            kind: e.kind,
            param: e.param.as_deref(),
            code: e.code,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = %self.status, message = %self.message, "API request failed");
        } else {
            tracing::debug!(status = %self.status, message = %self.message, "API request rejected");
        }
        let mut response = (self.status, Json(self.body())).into_response();
        // Busy is momentary: a generation slot frees within seconds. Clients (openai,
        // litellm) honour Retry-After instead of their own back-off.
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}

impl From<ModelError> for ApiError {
    fn from(e: ModelError) -> Self {
        match &e {
            ModelError::InvalidRequest(_) | ModelError::Chat(_) | ModelError::Tokenizer(_) => {
                Self::invalid(e.to_string())
            }
            ModelError::ContextOverflow { .. } => {
                Self::invalid_param("messages", e.to_string()).with_code("context_length_exceeded")
            }
            // The only constraints requests carry come from `response_format`: a schema the
            // grammar engine cannot follow to the end is the request's problem.
            ModelError::Constraint(_) => Self::invalid_param("response_format", e.to_string()),
            ModelError::EngineStopped => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                e.to_string(),
            )
            .with_code("model_not_loaded"),
            _ => Self::internal(e.to_string()),
        }
    }
}

impl From<EmbedError> for ApiError {
    fn from(e: EmbedError) -> Self {
        match &e {
            EmbedError::Tokenize(_) => Self::invalid_param("input", e.to_string()),
            EmbedError::WorkerStopped => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                e.to_string(),
            )
            .with_code("model_not_loaded"),
            _ => Self::internal(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_says_when_to_retry() {
        let r = ApiError::busy(4).into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[axum::http::header::RETRY_AFTER], "1");
        let r = ApiError::invalid("x").into_response();
        assert!(r.headers().get(axum::http::header::RETRY_AFTER).is_none());
    }

    #[test]
    fn messages_carry_no_backtrace_and_are_bounded() {
        let traced = ApiError::invalid_param(
            "model",
            "cannot read tensor blk.0\nStack backtrace:\n   0: candle_core::error::Error::bt\n             at /home/x/.cargo/registry/src/candle-core/src/error.rs:244:25",
        );
        assert_eq!(traced.message, "cannot read tensor blk.0");
        let long = ApiError::invalid("é".repeat(5000));
        assert!(long.message.len() <= MAX_MESSAGE + '…'.len_utf8());
    }

    #[test]
    fn body_has_openai_shape() {
        let e = ApiError::invalid_param("temperature", "temperature must be in [0, 2]");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            e.body(),
            serde_json::json!({"error": {
                "message": "temperature must be in [0, 2]",
                "type": "invalid_request_error",
                "param": "temperature",
                "code": null,
            }})
        );
    }

    #[test]
    fn model_errors_map_to_client_or_server_statuses() {
        let overflow = ApiError::from(ModelError::ContextOverflow { needed: 10, max: 5 });
        assert_eq!(overflow.status(), StatusCode::BAD_REQUEST);
        assert_eq!(overflow.body()["error"]["code"], "context_length_exceeded");
        let stopped = ApiError::from(ModelError::EngineStopped);
        assert_eq!(stopped.status(), StatusCode::SERVICE_UNAVAILABLE);
        let bad = ApiError::from(ModelError::InvalidRequest("top_p must be in (0, 1]".into()));
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    }
}
