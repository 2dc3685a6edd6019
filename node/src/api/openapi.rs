//! `GET /openapi.json`: the OpenAPI 3.1 document of the HTTP API.
//!
//! The document is written by hand in `node/assets/openapi.json` and embedded in the binary.
//! A running node serves all of it; `starling serve`, which has only the OpenAI-compatible
//! routes, serves the operations tagged `openai` or `meta`. The tests below keep the
//! document and the routers in step: every route the routers register is documented, and
//! every documented operation is a registered route.

use std::sync::OnceLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::error::ApiError;

/// The whole document.
pub(crate) const DOCUMENT: &str = include_str!("../../assets/openapi.json");

/// Tags of the operations `starling serve` has.
const SERVE_TAGS: [&str; 3] = ["openai", "ollama", "meta"];

fn json(body: String) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// The whole document (a node's routes).
pub(crate) async fn full() -> Response {
    json(DOCUMENT.to_owned())
}

/// The document, parsed once; an error names what is wrong with the embedded file.
pub(crate) fn parsed() -> Result<&'static Value, ApiError> {
    static DOC: OnceLock<Result<Value, String>> = OnceLock::new();
    DOC.get_or_init(|| serde_json::from_str(DOCUMENT).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| ApiError::internal(format!("the embedded OpenAPI document is broken: {e}")))
}

/// The document cut down to the OpenAI-compatible routes (`starling serve`).
pub(crate) async fn openai_part() -> Result<Response, ApiError> {
    static PART: OnceLock<String> = OnceLock::new();
    let doc = parsed()?;
    Ok(json(
        PART.get_or_init(|| restrict(doc.clone(), &SERVE_TAGS).to_string())
            .clone(),
    ))
}

/// `doc` with only the operations carrying one of `tags` (paths left empty are dropped).
fn restrict(mut doc: Value, tags: &[&str]) -> Value {
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for item in paths.values_mut() {
            if let Some(ops) = item.as_object_mut() {
                ops.retain(|_, op| {
                    op["tags"]
                        .as_array()
                        .is_some_and(|t| t.iter().any(|t| tags.iter().any(|want| t == want)))
                });
            }
        }
        paths.retain(|_, item| item.as_object().is_some_and(|ops| !ops.is_empty()));
    }
    if let Some(list) = doc.get_mut("tags").and_then(Value::as_array_mut) {
        list.retain(|t| tags.iter().any(|want| t["name"] == *want));
    }
    doc
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// (method, OpenAPI path) pairs.
    type Ops = BTreeSet<(String, String)>;

    const METHODS: [&str; 5] = ["get", "post", "put", "delete", "patch"];

    /// Every `.route("PATH", METHOD(..).METHOD(..))` call in a router's source, as
    /// (method, path) with axum's `{*rest}` written as OpenAPI's `{rest}`. Reading the source
    /// means a route added to any of these routers shows up here without anyone listing it.
    fn routes_in(source: &str) -> Ops {
        let mut out = Ops::new();
        let mut rest = source;
        while let Some(at) = rest.find(".route(") {
            // The path may follow on the next line (rustfmt breaks long calls).
            let call = rest[at + ".route(".len()..].trim_start();
            if !call.starts_with('"') {
                rest = &rest[at + 1..];
                continue;
            }
            // The call's text up to its closing parenthesis.
            let mut depth = 1usize;
            let mut end = call.len();
            for (i, c) in call.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            end = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let call = &call[..end];
            let path_end = call[1..].find('"').expect("closing quote") + 1;
            let path = call[1..path_end].replace("{*", "{");
            let handlers = &call[path_end + 1..];
            let mut found = false;
            for m in METHODS {
                let pattern = format!("{m}(");
                let mut from = 0;
                while let Some(i) = handlers[from..].find(&pattern) {
                    let i = from + i;
                    let before = handlers[..i].chars().next_back();
                    if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                        out.insert((m.to_owned(), path.clone()));
                        found = true;
                    }
                    from = i + pattern.len();
                }
            }
            assert!(found, "no method found for route {path}: {handlers}");
            rest = &rest[at + 1..];
        }
        out
    }

    fn documented(doc: &Value) -> Ops {
        let mut out = Ops::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                assert!(METHODS.contains(&method.as_str()), "{method} {path}");
                out.insert((method.clone(), path.clone()));
            }
        }
        out
    }

    fn document() -> Value {
        serde_json::from_str(DOCUMENT).expect("node/assets/openapi.json is JSON")
    }

    fn serve_routes() -> Ops {
        routes_in(include_str!("mod.rs"))
    }

    fn node_routes() -> Ops {
        let mut all = serve_routes();
        // A node merges its own routes into `router_with`, not `router`: `router`'s
        // `/openapi.json` (the OpenAI part) is `starling serve`'s alone.
        all.extend(routes_in(include_str!("node.rs")));
        all.extend(routes_in(include_str!("memories.rs")));
        all
    }

    #[test]
    fn route_extraction_reads_chained_methods_and_wildcards() {
        let src = r#"Router::new()
            .route("/a/{*id}", get(models::get))
            .route("/b", get(list).post(add).delete(forget))
            .route("/c", post(budget_of))
            .route(
                "/d",
                get(models::active).put(models::switch),
            )"#;
        let got: Vec<(String, String)> = routes_in(src).into_iter().collect();
        let want: Vec<(String, String)> = [
            ("delete", "/b"),
            ("get", "/a/{id}"),
            ("get", "/b"),
            ("get", "/d"),
            ("post", "/b"),
            ("post", "/c"),
            ("put", "/d"),
        ]
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn every_route_of_a_node_is_documented_and_nothing_else() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        let routes = node_routes();
        let documented = documented(&doc);
        let undocumented: Vec<_> = routes.difference(&documented).collect();
        let extra: Vec<_> = documented.difference(&routes).collect();
        assert!(
            undocumented.is_empty(),
            "routes missing from node/assets/openapi.json: {undocumented:?}"
        );
        assert!(
            extra.is_empty(),
            "documented operations no router registers: {extra:?}"
        );
        assert!(routes.len() >= 25, "{routes:?}");
    }

    #[test]
    fn the_serve_part_is_exactly_the_openai_routes() {
        let part = restrict(document(), &SERVE_TAGS);
        assert_eq!(documented(&part), serve_routes());
        let tags: Vec<&str> = part["tags"]
            .as_array()
            .expect("tags")
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert_eq!(tags, SERVE_TAGS);
    }

    /// Every `$ref` in `v` names something under `#/components`.
    fn check_refs(doc: &Value, v: &Value) {
        match v {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get("$ref") {
                    let pointer = r.strip_prefix('#').expect("local ref");
                    assert!(doc.pointer(pointer).is_some(), "dangling $ref {r}");
                }
                map.values().for_each(|v| check_refs(doc, v));
            }
            Value::Array(items) => items.iter().for_each(|v| check_refs(doc, v)),
            _ => {}
        }
    }

    #[test]
    fn operations_document_their_errors_and_refs_resolve() {
        let doc = document();
        check_refs(&doc, &doc);
        let mut ids = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("item") {
                let what = format!("{method} {path}");
                assert!(
                    ids.insert(op["operationId"].as_str().expect("operationId")),
                    "{what}: duplicate operationId"
                );
                let responses = op["responses"].as_object().expect("responses");
                // The host check answers every route.
                assert!(responses.contains_key("403"), "{what}: no 403");
                assert!(
                    responses.keys().any(|c| c.starts_with('2')),
                    "{what}: no success"
                );
                // JSON-RPC (A2A) answers a bad request with 200 and an `error` member.
                let json_rpc = op["tags"]
                    .as_array()
                    .is_some_and(|t| t.contains(&"a2a".into()));
                if op.get("requestBody").is_some() {
                    let codes: &[&str] = if json_rpc {
                        &["413", "415"]
                    } else {
                        &["400", "413", "415"]
                    };
                    for &code in codes {
                        assert!(responses.contains_key(code), "{what}: no {code}");
                    }
                }
                // Ollama's routes answer errors in Ollama's shape, except the host check,
                // which answers before any route is chosen.
                let ollama = op["tags"]
                    .as_array()
                    .is_some_and(|t| t.contains(&"ollama".into()));
                for (name, resp) in responses {
                    if name.starts_with('4') || name.starts_with('5') {
                        let r = resp["$ref"].as_str().expect("errors use shared responses");
                        let resp = doc
                            .pointer(r.strip_prefix('#').expect("local"))
                            .expect("response");
                        let shape = if ollama && name != "403" {
                            "#/components/schemas/OllamaError"
                        } else {
                            "#/components/schemas/Error"
                        };
                        assert_eq!(
                            resp["content"]["application/json"]["schema"]["$ref"], shape,
                            "{what} {name}"
                        );
                    }
                }
                let params = op["parameters"].as_array().cloned().unwrap_or_default();
                for name in path
                    .split('/')
                    .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
                {
                    assert!(
                        params
                            .iter()
                            .any(|p| p["in"] == "path" && p["name"] == name),
                        "{what}: path parameter {name} undocumented"
                    );
                }
            }
        }
    }

    /// The `starling serve` router answers every operation its document lists (with the
    /// operation's own answer, not the unknown-route or wrong-method fallback), and serves
    /// that document.
    #[tokio::test]
    async fn the_serve_router_answers_every_documented_operation() {
        let state = super::super::AppState::new(super::super::ApiConfig::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let cancel = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(super::super::serve_on(listener, state, cancel.clone()));
        let client = reqwest::Client::new();
        let base = format!("http://{addr}");

        let served: Value = client
            .get(format!("{base}/openapi.json"))
            .send()
            .await
            .expect("GET /openapi.json")
            .json()
            .await
            .expect("JSON");
        assert_eq!(served, restrict(document(), &SERVE_TAGS));

        for (method, path) in documented(&served) {
            let url = format!("{base}{}", path.replace("{id}", "some-model"));
            let req = match method.as_str() {
                "get" => client.get(&url),
                "post" => client.post(&url).json(&serde_json::json!({})),
                "put" => client.put(&url).json(&serde_json::json!({})),
                other => panic!("unexpected method {other}"),
            };
            let resp = req.send().await.expect("send");
            let status = resp.status();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            let code = body["error"]["code"].as_str().unwrap_or_default();
            assert!(
                code != "unknown_url" && code != "method_not_allowed",
                "{method} {path}: {status} {body}"
            );
        }
        cancel.cancel();
        server.await.expect("join").expect("serve");
    }
}
