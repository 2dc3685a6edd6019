//! The `/api/memories` routes over a [`MemoryBook`].
//!
//! - `GET /api/memories?q=&domain=&author=&limit=`: search (with `q`) or list.
//! - `POST /api/memories`: manual add ([`AddMemoryRequest`]): checked, not LLM-scored.
//! - `DELETE /api/memories?author=ID` or `?id=ID`: forget.
//! - `POST /api/memories/{id}/feedback`: `{"helpful": bool}`.
//! - `GET /api/memories/trust`, `POST /api/memories/trust`: author trust.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use super::admission::{admit, AdmissionConfig, Admitted, Pair};
use super::api_types::{
    AddMemoryRequest, AddMemoryResponse, FeedbackRequest, ForgetQuery, ForgetResponse, MemoryList,
    MemoryQuery, MemoryView, TrustRequest,
};
use super::book::{BookError, MemoryBook};
use super::record::DEFAULT_DOMAIN;
use crate::store::AuthorTrust;

/// State of the memory routes.
#[derive(Clone, Debug)]
pub struct MemoryApi {
    /// The node's memory book.
    pub book: MemoryBook,
    /// Admission settings for manual adds.
    pub admission: AdmissionConfig,
}

/// The memory routes, ready to merge into any router (they carry their own state).
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

/// An error answer in the API's shape (`{"error": {"message", "type"}}`).
fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    let kind = if status.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    };
    (
        status,
        Json(json!({"error": {"message": message.to_string(), "type": kind}})),
    )
        .into_response()
}

fn book_error(e: BookError) -> Response {
    match e {
        BookError::Invalid(e) => error(StatusCode::UNPROCESSABLE_ENTITY, e),
        BookError::NotFound(id) => error(StatusCode::NOT_FOUND, format!("no memory {id}")),
        other => error(StatusCode::INTERNAL_SERVER_ERROR, other),
    }
}

async fn list(State(api): State<MemoryApi>, Query(q): Query<MemoryQuery>) -> Response {
    match q.q.as_deref().filter(|s| !s.trim().is_empty()) {
        Some(text) => {
            let domain = q.domain.as_deref().unwrap_or(DEFAULT_DOMAIN);
            let k = q.limit.unwrap_or(3).clamp(1, 100);
            match api.book.top_k(domain, text, k).await {
                Ok(hits) => Json(MemoryList {
                    memories: hits
                        .into_iter()
                        .map(|h| MemoryView {
                            memory: h.memory,
                            rank_score: Some(h.score),
                        })
                        .collect(),
                })
                .into_response(),
                Err(e) => book_error(e),
            }
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
            Json(MemoryList { memories }).into_response()
        }
    }
}

async fn add(State(api): State<MemoryApi>, Json(req): Json<AddMemoryRequest>) -> Response {
    let pair = Pair {
        domain: req.domain.unwrap_or_else(|| DEFAULT_DOMAIN.to_owned()),
        prompt: req.prompt,
        answer: req.answer,
        source: req.source,
    };
    match admit(&api.book, None, &api.admission, &pair, req.score).await {
        Ok(Admitted::Kept(m)) => (
            StatusCode::CREATED,
            Json(AddMemoryResponse {
                added: true,
                memory: Some(m),
                rejected: None,
            }),
        )
            .into_response(),
        Ok(Admitted::Rejected(r)) => Json(AddMemoryResponse {
            added: false,
            memory: None,
            rejected: Some(r.to_string()),
        })
        .into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

async fn forget(State(api): State<MemoryApi>, Query(q): Query<ForgetQuery>) -> Response {
    let res = match (q.author, q.id) {
        (Some(author), None) => api.book.forget_author(&author).await,
        (None, Some(id)) => api.book.forget(&id).await.map(u64::from),
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "give exactly one of ?author=NODE_ID and ?id=MEMORY_ID",
            )
        }
    };
    match res {
        Ok(forgotten) => Json(ForgetResponse { forgotten }).into_response(),
        Err(e) => book_error(e),
    }
}

async fn feedback(
    State(api): State<MemoryApi>,
    Path(id): Path<String>,
    Json(req): Json<FeedbackRequest>,
) -> Response {
    match api.book.feedback(&id, req.helpful).await {
        Ok(m) => Json(m).into_response(),
        Err(e) => book_error(e),
    }
}

async fn trusts(State(api): State<MemoryApi>) -> Json<Vec<AuthorTrust>> {
    Json(api.book.trusts())
}

async fn set_trust(State(api): State<MemoryApi>, Json(req): Json<TrustRequest>) -> Response {
    match api
        .book
        .set_trust(&req.author, req.trust, req.ignored)
        .await
    {
        Ok(()) => Json(AuthorTrust {
            author: req.author,
            trust: req.trust,
            ignored: req.ignored,
        })
        .into_response(),
        Err(e) => book_error(e),
    }
}
