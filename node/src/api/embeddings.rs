//! `POST /v1/embeddings`.

use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{ApiJson, Documented};
use starling_models::embed::EmbedHandle;

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

/// The texts of `input`: a string, an array of strings, or token ids (an array of ids, or
/// an array of such arrays), which are read as OpenAI's `cl100k_base` tokens.
///
/// Clients built for OpenAI's embedding models count and cut texts with that vocabulary
/// and send the ids (LangChain's `OpenAIEmbeddings` does by default); ids of the served
/// model's own vocabulary would mean nothing to them. The ids are decoded back to text,
/// which the served model then tokenises its own way (a character cut between two id
/// lists is replaced by U+FFFD).
pub(crate) fn texts(input: Value, max: usize) -> Result<Vec<String>, ApiError> {
    let bad = |m: String| ApiError::invalid_param("input", m);
    let texts = match input {
        Value::String(s) => vec![s],
        Value::Array(items) => {
            if items.is_empty() {
                return Err(bad("input must not be an empty array".into()));
            }
            if items.iter().all(Value::is_number) {
                return Ok(vec![decode_ids(&items, "input")?]);
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
                    Value::Array(ids) if !ids.is_empty() && ids.iter().all(Value::is_number) => {
                        decode_ids(&ids, &format!("input[{i}]"))
                    }
                    _ => Err(ApiError::invalid_param(
                        format!("input[{i}]"),
                        "inputs must be strings or non-empty arrays of token ids",
                    )),
                })
                .collect::<Result<_, _>>()?
        }
        _ => {
            return Err(bad(
                "input must be a string, an array of strings or token ids".into(),
            ))
        }
    };
    Ok(texts)
}

/// Whether `id` is a token of `cl100k_base`: the 100,256 ordinary tokens and its five
/// special ones (the ids between them are unassigned).
fn is_cl100k_token(id: u64) -> bool {
    id <= 100_255 || (100_257..=100_260).contains(&id) || id == 100_276
}

/// The text of a list of `cl100k_base` token ids.
fn decode_ids(ids: &[Value], param: &str) -> Result<String, ApiError> {
    let mut ranks = Vec::with_capacity(ids.len());
    for (j, v) in ids.iter().enumerate() {
        match v.as_u64().filter(|&id| is_cl100k_token(id)) {
            Some(id) => ranks.push(id as u32),
            None => {
                return Err(ApiError::invalid_param(
                    format!("{param}[{j}]"),
                    format!(
                        "{v} is not a token id of cl100k_base (token ids are read as OpenAI's \
                         cl100k_base tokens; send text to use the served model's own tokenizer)"
                    ),
                ))
            }
        }
    }
    let bytes: Vec<u8> = tiktoken_rs::cl100k_base_singleton()
        ._decode_native_and_split(ranks)
        .flatten()
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
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

/// The vectors of `texts`, each cut to `dimensions` components when asked (checked against
/// the model before any work), admitted and counted like every embedding request.
pub(crate) async fn embed_counted(
    state: &AppState,
    handle: &EmbedHandle,
    texts: Vec<String>,
    dimensions: Option<u64>,
) -> Result<Vec<Vec<f32>>, ApiError> {
    let keep = match dimensions {
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
    Ok(vectors)
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
    let vectors = embed_counted(&state, &handle, texts, body.dimensions).await?;
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
        assert!(texts(json!([1.5, 2]), 4).is_err());
        assert!(texts(json!([[]]), 4).is_err());
        assert!(texts(json!([100_256]), 4).is_err(), "unassigned id");
        assert!(texts(json!([-1]), 4).is_err());
        assert!(texts(json!({"a": 1}), 4).is_err());
        assert!(texts(Value::Null, 4).is_err());
    }

    #[test]
    fn cl100k_token_ids_are_read_back_as_text() {
        let bpe = tiktoken_rs::cl100k_base_singleton();
        let text = "Starling nodes share memories — über alles, 42 times.";
        let ids: Vec<u32> = bpe.encode_with_special_tokens(text);
        assert_eq!(texts(json!(ids), 4).expect("one list"), vec![text]);
        let both = texts(json!([ids.clone(), bpe.encode_ordinary("a cat")]), 4).expect("lists");
        assert_eq!(both, vec![text.to_owned(), "a cat".to_owned()]);
        // A character cut between two lists becomes U+FFFD, not an error.
        let umlaut = bpe.encode_ordinary("ü");
        if umlaut.len() > 1 {
            assert!(texts(json!([umlaut[..1].to_vec()]), 4).expect("cut")[0].contains('\u{fffd}'));
        }
        // Every id the check lets through decodes (no panic in the decoder).
        let all: Vec<u32> = (0..=100_300u64)
            .filter(|&i| is_cl100k_token(i))
            .map(|i| i as u32)
            .collect();
        assert_eq!(all.len(), 100_256 + 5);
        assert_eq!(bpe._decode_native_and_split(all).count(), 100_261);
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
