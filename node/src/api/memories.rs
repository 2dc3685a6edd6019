//! The `/api/memories` routes over a [`MemoryBook`].
//!
//! - `GET /api/memories?q=&domain=&author=&limit=`: search (with `q`) or list.
//! - `POST /api/memories`: manual add ([`AddMemoryRequest`]): checked, not LLM-scored.
//! - `DELETE /api/memories?author=ID` or `?id=ID`: forget.
//! - `POST /api/memories/{id}/feedback`: `{"helpful": bool}`.
//! - `GET /api/memories/trust`, `POST /api/memories/trust`: author trust.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use super::{ApiError, ApiJson, ApiPath, ApiQuery, Documented};
use crate::memory::admission::{admit, AdmissionConfig, AdmissionError, Admitted, Pair};
use crate::memory::api_types::{
    AddMemoryRequest, AddMemoryResponse, FeedbackRequest, ForgetQuery, ForgetResponse, MemoryList,
    MemoryQuery, MemoryView, TrustRequest,
};
use crate::memory::book::{BookError, MemoryBook};
use crate::memory::record::DEFAULT_DOMAIN;
use crate::store::AuthorTrust;

impl Documented for AddMemoryRequest {
    const SCHEMA: &'static str = "AddMemoryRequest";
}

impl Documented for FeedbackRequest {
    const SCHEMA: &'static str = "FeedbackRequest";
}

impl Documented for TrustRequest {
    const SCHEMA: &'static str = "TrustRequest";
}

/// State of the memory routes.
#[derive(Clone, Debug)]
pub struct MemoryApi {
    /// The node's memory book.
    pub book: MemoryBook,
    /// Admission settings for manual adds.
    pub admission: AdmissionConfig,
}

/// The memory routes, ready to merge into any router (they carry their own state). Errors
/// are the API's OpenAI-shaped [`ApiError`]s.
pub fn routes<S: Clone + Send + Sync + 'static>(
    book: MemoryBook,
    admission: AdmissionConfig,
) -> Router<S> {
    Router::new()
        .route("/api/memories", get(list).post(add).delete(forget))
        .route("/api/memories/trust", get(trusts).post(set_trust))
        .route("/api/memories/{id}/feedback", post(feedback))
        .with_state(MemoryApi { book, admission })
}

fn book_error(e: BookError) -> ApiError {
    match e {
        BookError::Invalid(e) => ApiError::invalid(e.to_string()),
        BookError::NotFound(id) => ApiError::not_found(format!("no memory `{id}`")),
        BookError::Store(e) if e.is_full() => ApiError::insufficient_storage(e.to_string()),
        other => ApiError::internal(other.to_string()),
    }
}

async fn list(
    State(api): State<MemoryApi>,
    ApiQuery(q): ApiQuery<MemoryQuery>,
) -> Result<Json<MemoryList>, ApiError> {
    match q.q.as_deref().filter(|s| !s.trim().is_empty()) {
        Some(text) => {
            let domain = q.domain.as_deref().unwrap_or(DEFAULT_DOMAIN);
            let k = q.limit.unwrap_or(3).clamp(1, 100);
            let hits = api.book.top_k(domain, text, k).await.map_err(book_error)?;
            Ok(Json(MemoryList {
                memories: hits
                    .into_iter()
                    .map(|h| MemoryView {
                        memory: h.memory,
                        rank_score: Some(h.score),
                    })
                    .collect(),
            }))
        }
        None => {
            let limit = q.limit.unwrap_or(100).clamp(1, 10_000);
            let memories = api
                .book
                .list(q.domain.as_deref(), q.author.as_deref(), limit)
                .into_iter()
                .map(|memory| MemoryView {
                    memory,
                    rank_score: None,
                })
                .collect();
            Ok(Json(MemoryList { memories }))
        }
    }
}

async fn add(
    State(api): State<MemoryApi>,
    ApiJson(req): ApiJson<AddMemoryRequest>,
) -> Result<Response, ApiError> {
    let pair = Pair {
        domain: req.domain.unwrap_or_else(|| DEFAULT_DOMAIN.to_owned()),
        prompt: req.prompt,
        answer: req.answer,
        source: req.source,
    };
    let admitted = admit(&api.book, None, &api.admission, &pair, req.score)
        .await
        .map_err(|e| match e {
            // A field the checks before admission do not look at (say, a long `source`).
            AdmissionError::Book(e) => book_error(e),
            e => ApiError::internal(e.to_string()),
        })?;
    Ok(match admitted {
        Admitted::Kept(m) => (
            StatusCode::CREATED,
            Json(AddMemoryResponse {
                added: true,
                memory: Some(m),
                rejected: None,
            }),
        )
            .into_response(),
        Admitted::Rejected(r) => Json(AddMemoryResponse {
            added: false,
            memory: None,
            rejected: Some(r.to_string()),
        })
        .into_response(),
    })
}

async fn forget(
    State(api): State<MemoryApi>,
    ApiQuery(q): ApiQuery<ForgetQuery>,
) -> Result<Json<ForgetResponse>, ApiError> {
    let forgotten = match (q.author, q.id) {
        (Some(author), None) if !author.is_empty() => api.book.forget_author(&author).await,
        (None, Some(id)) if !id.is_empty() => api.book.forget(&id).await.map(u64::from),
        _ => {
            return Err(ApiError::invalid(
                "give exactly one of ?author=NODE_ID and ?id=MEMORY_ID, not empty",
            ))
        }
    }
    .map_err(book_error)?;
    Ok(Json(ForgetResponse { forgotten }))
}

async fn feedback(
    State(api): State<MemoryApi>,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<FeedbackRequest>,
) -> Result<Json<crate::memory::record::Memory>, ApiError> {
    api.book
        .feedback(&id, req.helpful)
        .await
        .map(Json)
        .map_err(book_error)
}

async fn trusts(State(api): State<MemoryApi>) -> Json<Vec<AuthorTrust>> {
    Json(api.book.trusts())
}

async fn set_trust(
    State(api): State<MemoryApi>,
    ApiJson(req): ApiJson<TrustRequest>,
) -> Result<Json<AuthorTrust>, ApiError> {
    if req.author.trim().is_empty() {
        return Err(ApiError::invalid_param("author", "the author is empty"));
    }
    api.book
        .set_trust(&req.author, req.trust, req.ignored)
        .await
        .map_err(book_error)?;
    // Answer what was stored (the book clamps the weight), not what was asked.
    let stored = api
        .book
        .trusts()
        .into_iter()
        .find(|t| t.author == req.author)
        .ok_or_else(|| ApiError::internal("the trust entry was not stored"))?;
    Ok(Json(stored))
}
