//! `GET /v1/models`, `GET /v1/models/{id}` and `GET /health`.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::ApiPath;
use super::state::{AppState, ServedModel};

fn model_object(state: &AppState, m: &ServedModel) -> Value {
    json!({
        "id": m.id,
        "object": "model",
        "created": state.created(),
        "owned_by": "starling",
        // Extensions: what the model does and how much text it reads.
        "kind": m.kind,
        "aliases": m.aliases,
        "context_length": m.context_length,
    })
}

/// Lists the served models.
pub(crate) async fn list(State(state): State<AppState>) -> Json<Value> {
    let data: Vec<Value> = state
        .served_models()
        .iter()
        .map(|m| model_object(&state, m))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// One served model, by id or alias.
pub(crate) async fn get(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    let served = state.served_models();
    served
        .iter()
        .find(|m| m.answers_to(&id))
        .map(|m| Json(model_object(&state, m)))
        .ok_or_else(|| {
            let ids: Vec<String> = served.iter().map(|m| m.id.clone()).collect();
            ApiError::model_not_found(&id, &ids)
        })
}

/// Liveness, the served models and the counters.
pub(crate) async fn health(State(state): State<AppState>) -> Json<Value> {
    let served = state.served_models();
    let id_of = |kind: &str| served.iter().find(|m| m.kind == kind).map(|m| m.id.clone());
    Json(json!({
        "status": "ok",
        "chat_model": id_of("chat"),
        "embedding_model": id_of("embedding"),
        "metrics": state.metrics(),
    }))
}
