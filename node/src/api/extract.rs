//! Body, query and path extractors whose rejections are OpenAI-shaped errors naming the
//! bad field, so no malformed request gets axum's plain-text answers.

use std::collections::HashMap;
use std::sync::OnceLock;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::ApiError;

/// The body size limit in force, put in the request's extensions by the API's middleware
/// so extractors can name it in their errors.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimit(pub usize);

/// A request body type and the schema in the OpenAPI document
/// (`node/assets/openapi.json`, `#/components/schemas/NAME`) that describes it.
pub(crate) trait Documented {
    /// The component's name.
    const SCHEMA: &'static str;
}

/// The body, parsed as JSON into `T`.
///
/// A body that is not declared as JSON gets 415 (so a web page cannot post to the API
/// without a CORS preflight), one over the size limit 413, and one that does not parse,
/// does not fit `T` or breaks the documented schema of `T` a 400 whose `param` is the
/// path of the offending field. Checking the document's schema as well as `T` means the
/// API accepts exactly what it documents: serde alone would take, say, a struct written as
/// a JSON array, or a field the handler ignores in the wrong type.
pub(crate) struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned + Documented,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = json_body(req, state).await?;
        // `T` is read from the bytes themselves, not from the `Value` below: a `Value` keeps
        // the last of two equal keys, where serde refuses a duplicate field.
        let value: T = parse(&bytes)?;
        // `parse` has read the bytes as JSON already, so this cannot fail on syntax.
        let json: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::invalid(format!("the request body is not valid JSON: {e}")))?;
        check_documented(T::SCHEMA, &json)?;
        Ok(ApiJson(value))
    }
}

/// The bytes of a body declared as JSON: 415 when it is not declared so (a web page cannot
/// post it without a CORS preflight), 413 over the size limit.
pub(crate) async fn json_body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    if !is_json(&req) {
        return Err(ApiError::not_json());
    }
    let limit = req.extensions().get::<BodyLimit>().map(|l| l.0);
    Bytes::from_request(req, state).await.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(limit)
        } else {
            ApiError::invalid(format!("cannot read the request body: {}", r.body_text()))
        }
    })
}

/// Checks `body` against `#/components/schemas/{component}` of the OpenAPI document; the
/// first violation is a 400 naming the field. A component's validator is compiled the first
/// time a body of its type arrives.
pub(crate) fn check_documented(component: &str, body: &Value) -> Result<(), ApiError> {
    type Validators = HashMap<String, OnceLock<Result<jsonschema::Validator, String>>>;
    static VALIDATORS: OnceLock<Validators> = OnceLock::new();
    let doc = super::openapi::parsed()?;
    let validators = VALIDATORS.get_or_init(|| {
        doc["components"]["schemas"]
            .as_object()
            .map(|m| m.keys().map(|k| (k.clone(), OnceLock::new())).collect())
            .unwrap_or_default()
    });
    let validator = validators
        .get(component)
        .ok_or_else(|| {
            ApiError::internal(format!("the OpenAPI document has no schema `{component}`"))
        })?
        .get_or_init(|| validator(doc, component))
        .as_ref()
        .map_err(|e| ApiError::internal(e.clone()))?;
    match validator.validate(body) {
        Ok(()) => Ok(()),
        Err(e) => {
            let param = param_of(e.instance_path().as_str());
            // The document's own words for a field it restricts ("Tool calling is not
            // supported") say more than the validator's, which repeat the payload.
            let said = documented_reason(doc, e.schema_path().as_str());
            let detail = said.unwrap_or_else(|| bounded(&e.to_string()));
            let message = if param.is_empty() {
                format!("invalid request body: {detail}")
            } else {
                format!("invalid request field `{param}`: {detail}")
            };
            Err(if param.is_empty() {
                ApiError::invalid(message)
            } else {
                ApiError::invalid_param(param, message)
            })
        }
    }
}

/// A validator for one component schema. The schema is the whole document with a `$ref`
/// to the component at its root, so references between components resolve inside it;
/// the document's other members are not schema keywords and are ignored.
fn validator(doc: &Value, component: &str) -> Result<jsonschema::Validator, String> {
    let mut schema = doc.clone();
    schema["$ref"] = Value::String(format!("#/components/schemas/{component}"));
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(&schema)
        .map_err(|e| format!("schema `{component}` of the OpenAPI document does not compile: {e}"))
}

/// The description of the schema whose keyword failed (the keyword's location without
/// its last segment, a JSON pointer into the document), when it states a limit of this
/// server (`not supported`, `only …`).
fn documented_reason(doc: &Value, keyword_location: &str) -> Option<String> {
    let (parent, _) = keyword_location.rsplit_once('/')?;
    let d = doc.pointer(parent)?.get("description")?.as_str()?;
    let lower = d.to_lowercase();
    (lower.contains("not supported") || lower.starts_with("only")).then(|| d.to_owned())
}

/// A validator's message cut to 300 characters (it quotes the offending value).
fn bounded(text: &str) -> String {
    match text.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

/// A JSON pointer (`/messages/0/role`) as the API names fields (`messages[0].role`).
fn param_of(pointer: &str) -> String {
    let mut out = String::new();
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{segment}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&segment);
        }
    }
    out
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

    #[test]
    fn pointers_become_field_names() {
        assert_eq!(param_of(""), "");
        assert_eq!(param_of("/messages/0/role"), "messages[0].role");
        assert_eq!(param_of("/a~1b/c~0d"), "a/b.c~d");
    }

    fn documented_param(component: &str, body: Value) -> Option<String> {
        check_documented(component, &body)
            .err()
            .map(|e| e.body()["error"]["param"].as_str().unwrap_or("").to_owned())
    }

    #[test]
    fn refused_features_are_named_in_the_documents_words() {
        use serde_json::json;
        let tools = json!({"type": "function", "function": {"name": "f", "parameters": {}}});
        let body = json!({
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [tools]
        });
        assert!(check_documented("ChatCompletionRequest", &body).is_ok());
        let body = json!({
            "messages": [{"role": "user", "content": "hi"}],
            "functions": [{"name": "f", "parameters": {"secret_payload": 1}}]
        });
        let e = check_documented("ChatCompletionRequest", &body).unwrap_err();
        let m = e.body()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        assert!(m.contains("Function calling is not supported"), "{m}");
        assert!(
            !m.contains("secret_payload"),
            "the payload is not repeated: {m}"
        );
        for (field, value) in [
            ("logit_bias", json!({"50256": -100})),
            ("functions", json!([{"name": "f"}])),
            ("function_call", json!("auto")),
            ("grammar", json!("root ::= \"a\"")),
            ("guided_json", json!({"type": "object"})),
        ] {
            let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
            body[field] = value;
            let e = check_documented("ChatCompletionRequest", &body).unwrap_err();
            assert_eq!(e.body()["error"]["param"], field);
            let m = e.body()["error"]["message"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            assert!(m.contains("not supported"), "{field}: {m}");
        }
    }

    #[test]
    fn every_component_schema_compiles() {
        let doc: Value = serde_json::from_str(super::super::openapi::DOCUMENT).expect("document");
        for name in doc["components"]["schemas"]
            .as_object()
            .expect("schemas")
            .keys()
        {
            validator(&doc, name).expect("compiles");
        }
    }

    #[test]
    fn bodies_are_held_to_the_document() {
        use serde_json::json;
        let chat = |extra: Value| {
            let mut body = json!({"messages": [{"role": "user", "content": "hi"}]});
            for (k, v) in extra.as_object().expect("object") {
                body[k] = v.clone();
            }
            documented_param("ChatCompletionRequest", body)
        };
        assert_eq!(chat(json!({})), None);
        assert_eq!(chat(json!({"max_tokens": 5, "temperature": 0.5})), None);
        assert_eq!(
            chat(json!({"max_tokens": 0, "max_completion_tokens": 5})).as_deref(),
            Some("max_tokens")
        );
        assert_eq!(
            chat(json!({"temperature": 3})).as_deref(),
            Some("temperature")
        );
        assert_eq!(
            chat(json!({"stream_options": [true]})).as_deref(),
            Some("stream_options")
        );
        let format = |spec: Value| {
            chat(json!({"response_format": {"type": "json_schema", "json_schema": spec}}))
        };
        for bad in [
            json!({"name": 1}),
            json!({"name": -1.5, "schema": {}}),
            json!({"name": "x", "strict": "yes"}),
            json!({"name": "x", "description": []}),
        ] {
            assert_eq!(
                format(bad.clone()).as_deref(),
                Some("response_format"),
                "{bad}"
            );
        }
        assert_eq!(
            format(json!({"name": "x", "strict": null, "description": "d"})),
            None
        );
        assert_eq!(
            documented_param(
                "ChatCompletionRequest",
                json!({"messages": [["user", "hi"]]})
            )
            .as_deref(),
            Some("messages[0]")
        );
        assert_eq!(
            documented_param("TrustRequest", json!(["someone"])).as_deref(),
            Some("")
        );
    }
}
