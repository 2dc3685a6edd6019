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
pub(crate) fn texts(input: Value, max: usize) -> Result<Vec<String>, ApiError> {
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

/// The first `keep` components of the unit vector `v`, renormalised to unit length (as
/// OpenAI's `dimensions`; a vector whose kept part is all zeros stays as it is).
pub(crate) fn shorten(mut v: Vec<f32>, keep: usize) -> Vec<f32> {
    if keep >= v.len() {
        return v;
    }
    v.truncate(keep);
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm.is_finite() && norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
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
    let keep = match body.dimensions {
        None => handle.dim(),
        Some(d) if d >= 1 && d <= handle.dim() as u64 => d as usize,
        Some(d) => {
            return Err(ApiError::invalid_param(
                "dimensions",
                format!(
                    "dimensions must be between 1 and this model's {} (got {d})",
                    handle.dim()
                ),
            ))
        }
    };
    let _permit = state.admit()?;
    let count = texts.len() as u64;
    let vectors: Vec<Vec<f32>> = handle
        .embed(texts)
        .await?
        .into_iter()
        .map(|v| shorten(v, keep))
        .collect();
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

    #[test]
    fn shortened_vectors_are_unit_prefixes() {
        let v = vec![0.6, 0.0, 0.8, 0.0];
        assert_eq!(shorten(v.clone(), 4), v);
        assert_eq!(shorten(v.clone(), 9), v);
        assert_eq!(shorten(v.clone(), 1), vec![1.0]);
        let s = shorten(vec![0.5, 0.5, 0.5, 0.5], 2);
        assert!((s[0] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6 && s.len() == 2);
        assert_eq!(shorten(vec![0.0, 0.0, 1.0], 2), vec![0.0, 0.0]);
    }
}
