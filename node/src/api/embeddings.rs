//! `POST /v1/embeddings`.

use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{ApiJson, Documented};
use super::state::{AppState, Metrics};

/// The request body.
#[derive(Debug, Deserialize)]
pub(crate) struct EmbeddingsRequest {
    model: Option<String>,
    input: Value,
    encoding_format: Option<String>,
    dimensions: Option<u64>,
}

impl Documented for EmbeddingsRequest {
    const SCHEMA: &'static str = "EmbeddingsRequest";
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Float,
    /// Little-endian f32s, base64-encoded (what OpenAI's Python client asks for by default).
    Base64,
}

/// The texts of `input`: a string or an array of strings.
fn texts(input: Value, max: usize) -> Result<Vec<String>, ApiError> {
    let bad = |m: String| ApiError::invalid_param("input", m);
    let texts = match input {
        Value::String(s) => vec![s],
        Value::Array(items) => {
            if items.is_empty() {
                return Err(bad("input must not be an empty array".into()));
            }
            if items.len() > max {
                return Err(bad(format!(
                    "at most {max} inputs are accepted per request"
                )));
            }
            items
                .into_iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s),
                    Value::Number(_) | Value::Array(_) => Err(ApiError::invalid_param(
                        format!("input[{i}]"),
                        "token-id input is not supported; send text",
                    )),
                    _ => Err(ApiError::invalid_param(
                        format!("input[{i}]"),
                        "inputs must be strings",
                    )),
                })
                .collect::<Result<_, _>>()?
        }
        _ => return Err(bad("input must be a string or an array of strings".into())),
    };
    Ok(texts)
}

/// The handler.
pub(crate) async fn embeddings(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<EmbeddingsRequest>,
) -> Result<Json<Value>, ApiError> {
    let encoding = match body.encoding_format.as_deref() {
        None | Some("float") => Encoding::Float,
        Some("base64") => Encoding::Base64,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "encoding_format",
                format!("unknown encoding_format `{other}` (expected float or base64)"),
            ))
        }
    };
    let texts = texts(body.input, state.config().max_embedding_inputs)?;
    let handle = state.embed_handle(body.model.as_deref().filter(|m| !m.is_empty()))?;
    if let Some(d) = body.dimensions {
        if d != handle.dim() as u64 {
            return Err(ApiError::invalid_param(
                "dimensions",
                format!(
                    "this model's vectors have {} dimensions and cannot be shortened",
                    handle.dim()
                ),
            ));
        }
    }
    let _permit = state.admit()?;
    let count = texts.len() as u64;
    let vectors = handle.embed(texts).await?;
    let m = state.counters();
    Metrics::add(&m.embedding_requests, 1);
    Metrics::add(&m.embedded_texts, count);
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = match encoding {
                Encoding::Float => json!(v),
                Encoding::Base64 => {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": handle.model_id(),
        // The embedding handle does not report token counts yet.
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_shapes() {
        assert_eq!(texts(json!("a"), 4).expect("string"), vec!["a"]);
        assert_eq!(texts(json!(["a", "b"]), 4).expect("array"), vec!["a", "b"]);
        assert!(texts(json!([]), 4).is_err());
        assert!(texts(json!(vec!["a"; 5]), 4).is_err());
        assert!(texts(json!([1, 2]), 4).is_err());
        assert!(texts(json!([[1, 2]]), 4).is_err());
        assert!(texts(json!({"a": 1}), 4).is_err());
        assert!(texts(Value::Null, 4).is_err());
    }
}
