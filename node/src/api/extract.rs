//! Body, query and path extractors whose rejections are OpenAI-shaped errors naming the
//! bad field, so no malformed request gets axum's plain-text answers.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// The body size limit in force, put in the request's extensions by the API's middleware
/// so extractors can name it in their errors.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimit(pub usize);

/// The body, parsed as JSON into `T`.
///
/// A body that is not declared as JSON gets 415 (so a web page cannot post to the API
/// without a CORS preflight), one over the size limit 413, and one that does not parse or
/// does not fit `T` a 400 whose `param` is the path of the offending field.
pub(crate) struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(&req) {
            return Err(ApiError::not_json());
        }
        let limit = req.extensions().get::<BodyLimit>().map(|l| l.0);
        let bytes = Bytes::from_request(req, state).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(limit)
            } else {
                ApiError::invalid(format!("cannot read the request body: {}", r.body_text()))
            }
        })?;
        parse(&bytes).map(ApiJson)
    }
}

/// The query string, parsed into `T`; one that does not fit gets a 400.
pub(crate) struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| ApiQuery(q))
            .map_err(|r| {
                let text = r.body_text();
                let detail = text
                    .strip_prefix("Failed to deserialize query string: ")
                    .unwrap_or(&text);
                let message = format!("invalid query string: {detail}");
                // serde names the parameter first: `k: invalid digit found in string`.
                match detail.split_once(": ") {
                    Some((name, _))
                        if !name.is_empty()
                            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
                    {
                        ApiError::invalid_param(name, message)
                    }
                    _ => ApiError::invalid(message),
                }
            })
    }
}

/// The path parameters, parsed into `T`; ones that do not fit (say, not UTF-8 once
/// percent-decoded) get a 400.
pub(crate) struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(p)| ApiPath(p))
            .map_err(|r| {
                let status = r.status();
                let text = r.body_text();
                if status.is_server_error() {
                    // A route whose template does not match its handler: a bug, not input.
                    ApiError::internal(text)
                } else {
                    ApiError::invalid(format!("invalid URL path: {text}"))
                }
            })
    }
}

fn is_json(req: &Request) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|mime| {
            let mime = mime.trim().to_ascii_lowercase();
            mime == "application/json"
                || (mime.starts_with("application/") && mime.ends_with("+json"))
        })
        .unwrap_or(false)
}

/// Parses `bytes` into `T`, naming the field that does not fit.
pub(crate) fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let mut path = e.path().to_string();
        let inner = e.into_inner();
        // serde reports a missing field at its parent: name the field itself.
        if let Some(field) = missing_field(&inner.to_string()) {
            path = if path == "." {
                field
            } else {
                format!("{path}.{field}")
            };
        }
        if inner.is_data() && path != "." {
            ApiError::invalid_param(
                path.clone(),
                format!("invalid request field `{path}`: {inner}"),
            )
        } else if inner.is_data() {
            ApiError::invalid(format!("invalid request body: {inner}"))
        } else {
            ApiError::invalid(format!("the request body is not valid JSON: {inner}"))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::invalid(format!("the request body is not valid JSON: {e}")))?;
    Ok(value)
}

/// The field named by serde's "missing field `x`" message.
fn missing_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("missing field `")?;
    rest.split_once('`').map(|(field, _)| field.to_owned())
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Body {
        messages: Vec<Msg>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Msg {
        role: String,
    }

    fn param(bytes: &[u8]) -> Option<String> {
        parse::<Body>(bytes)
            .err()
            .and_then(|e| e.body()["error"]["param"].as_str().map(str::to_owned))
    }

    #[test]
    fn errors_name_the_field_or_say_it_is_not_json() {
        assert_eq!(
            param(br#"{"messages": [{"role": 3}]}"#).as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            param(br#"{"messages": [{}]}"#).as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(param(br#"{}"#).as_deref(), Some("messages"));
        assert_eq!(param(br#"[]"#), None);
        let e = parse::<Body>(b"{not json").expect_err("syntax error");
        assert!(e.message().contains("not valid JSON"), "{}", e.message());
        let e = parse::<Body>(br#"{"messages": []} trailing"#).expect_err("trailing");
        assert!(e.message().contains("not valid JSON"), "{}", e.message());
        assert!(parse::<Body>(br#"{"messages": []}"#).is_ok());
    }
}
