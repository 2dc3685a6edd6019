//! MCP servers as tools (`[[agent.mcp]]`): the node starts each server as a child process
//! and speaks MCP to it over stdio, or reaches a running one over streamable HTTP (both
//! through the `rmcp` SDK), and offers every tool it lists to the
//! executor as `SERVER_TOOL`, with the tool's own input schema. The executor's constrained
//! decoding writes arguments that fit that schema; they are checked against it once more
//! before the call, so a server never sees arguments its schema refuses.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use http::{HeaderName, HeaderValue};
use rmcp::model::{CallToolRequestParams, ContentBlock};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::ServiceExt;
use serde_json::Value;
use tracing::{debug, info};

use super::tools::{Tool, ToolError};
use crate::config::McpServerConfig;

/// How long a server has to start and list its tools.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running MCP server; dropping the last handle stops it.
type Client = Arc<RunningService<RoleClient, ()>>;

/// One tool of an MCP server.
pub struct McpTool {
    name: String,
    remote: String,
    description: String,
    schema: Value,
    validator: jsonschema::Validator,
    client: Client,
    timeout: Duration,
    max_output: usize,
}

fn failed(name: &str, reason: impl Into<String>) -> ToolError {
    ToolError::External {
        name: name.to_owned(),
        reason: reason.into(),
    }
}

/// Connects to the server of `config` (starting it when it is a command) and returns its
/// tools. The connection (and a started server) lives as long as one of them is held.
pub async fn start(config: &McpServerConfig) -> Result<Vec<Arc<dyn Tool>>, ToolError> {
    let name = &config.name;
    let (client, listed) = match &config.url {
        Some(url) => {
            let transport = StreamableHttpClientTransport::from_config(http_config(config, url)?);
            handshake(name, transport).await?
        }
        None => {
            let (program, args) = config
                .command
                .split_first()
                .ok_or_else(|| failed(name, "`command` needs a program"))?;
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args).envs(&config.env).kill_on_drop(true);
            let transport = TokioChildProcess::new(cmd)
                .map_err(|e| failed(name, format!("cannot start `{program}`: {e}")))?;
            handshake(name, transport).await?
        }
    };
    let client: Client = Arc::new(client);
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    for t in listed {
        let schema = Value::Object((*t.input_schema).clone());
        let validator = match jsonschema::validator_for(&schema) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(server = %name, tool = %t.name, "tool skipped: its input schema does not compile: {e}");
                continue;
            }
        };
        let description = t
            .description
            .as_deref()
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map_or_else(
                || format!("Tool `{}` of MCP server `{name}`.", t.name),
                str::to_owned,
            );
        tools.push(Arc::new(McpTool {
            name: tool_name(name, &t.name),
            remote: t.name.to_string(),
            description,
            schema,
            validator,
            client: client.clone(),
            timeout: Duration::from_secs(config.timeout_secs),
            max_output: config.max_output_bytes,
        }));
    }
    info!(server = %name, tools = tools.len(), "MCP server started");
    Ok(tools)
}

/// The streamable-HTTP transport's settings: `url`, and the entry's headers on every request.
fn http_config(
    config: &McpServerConfig,
    url: &str,
) -> Result<StreamableHttpClientTransportConfig, ToolError> {
    let mut headers = HashMap::new();
    for (key, value) in &config.headers {
        let bad = |e: &dyn std::fmt::Display| failed(&config.name, format!("header `{key}`: {e}"));
        headers.insert(
            HeaderName::try_from(key.as_str()).map_err(|e| bad(&e))?,
            HeaderValue::try_from(value.as_str()).map_err(|e| bad(&e))?,
        );
    }
    Ok(StreamableHttpClientTransportConfig::with_uri(url.to_owned()).custom_headers(headers))
}

/// The MCP handshake over `transport` and the server's tool list, within [`START_TIMEOUT`].
async fn handshake<T, E, A>(
    name: &str,
    transport: T,
) -> Result<(RunningService<RoleClient, ()>, Vec<rmcp::model::Tool>), ToolError>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let connect = async {
        let client = ()
            .serve(transport)
            .await
            .map_err(|e| failed(name, format!("MCP handshake failed: {e}")))?;
        let listed = client
            .list_all_tools()
            .await
            .map_err(|e| failed(name, format!("cannot list its tools: {e}")))?;
        Ok::<_, ToolError>((client, listed))
    };
    tokio::time::timeout(START_TIMEOUT, connect)
        .await
        .map_err(|_| {
            failed(
                name,
                format!("no answer within {} s", START_TIMEOUT.as_secs()),
            )
        })?
}

/// `SERVER_TOOL`, with characters a tool name cannot hold replaced by `_`.
fn tool_name(server: &str, tool: &str) -> String {
    let tool: String = tool
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{server}_{tool}")
}

/// The text of a tool result: its text blocks, else its structured content as JSON.
fn result_text(content: &[ContentBlock], structured: Option<&Value>) -> String {
    let texts: Vec<&str> = content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect();
    if texts.is_empty() {
        structured.map(Value::to_string).unwrap_or_default()
    } else {
        texts.join("\n")
    }
}

impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        self.schema.clone()
    }

    fn call(&self, args: Value) -> BoxFuture<'_, Result<String, ToolError>> {
        Box::pin(async move {
            if let Some(e) = self.validator.iter_errors(&args).next() {
                return Err(ToolError::BadArgs(format!(
                    "`{}` at `{}`: {e}",
                    self.name,
                    e.instance_path()
                )));
            }
            let Value::Object(arguments) = args else {
                return Err(ToolError::BadArgs(format!(
                    "`{}` takes a JSON object",
                    self.name
                )));
            };
            debug!(tool = %self.name, "calling MCP tool");
            let call = self.client.call_tool(
                CallToolRequestParams::new(self.remote.clone()).with_arguments(arguments),
            );
            let result = tokio::time::timeout(self.timeout, call)
                .await
                .map_err(|_| ToolError::Timeout {
                    name: self.name.clone(),
                    secs: self.timeout.as_secs(),
                })?
                .map_err(|e| failed(&self.name, format!("the MCP call failed: {e}")))?;
            let text = result_text(&result.content, result.structured_content.as_ref());
            if result.is_error == Some(true) {
                let why = if text.trim().is_empty() {
                    "no reason given".to_owned()
                } else {
                    text.trim().to_owned()
                };
                return Err(failed(&self.name, format!("it reported failure: {why}")));
            }
            if text.len() > self.max_output {
                return Err(failed(
                    &self.name,
                    format!("its result is larger than {} bytes", self.max_output),
                ));
            }
            if text.trim().is_empty() {
                return Err(failed(&self.name, "its result is empty"));
            }
            Ok(text.trim().to_owned())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_are_prefixed_and_cleaned() {
        assert_eq!(tool_name("files", "read_file"), "files_read_file");
        assert_eq!(tool_name("gh", "Search Issues/v2"), "gh_search_issues_v2");
    }

    #[test]
    fn results_prefer_text_then_structured_content() {
        let content = vec![ContentBlock::text("a"), ContentBlock::text("b")];
        assert_eq!(result_text(&content, None), "a\nb");
        let s = serde_json::json!({"status": "shipped"});
        assert_eq!(result_text(&[], Some(&s)), r#"{"status":"shipped"}"#);
        assert_eq!(result_text(&[], None), "");
    }

    fn http_entry(url: String) -> McpServerConfig {
        McpServerConfig {
            name: "stock".into(),
            command: Vec::new(),
            env: Default::default(),
            url: Some(url),
            headers: [("X-Desk".to_owned(), "fay".to_owned())].into(),
            timeout_secs: 5,
            max_output_bytes: 1024,
        }
    }

    /// `start`'s error for the `stock` entry: it names the server and the failed handshake.
    fn handshake_error(started: Result<Vec<Arc<dyn Tool>>, ToolError>) -> String {
        let err = started.err().expect("no MCP server there").to_string();
        assert!(
            err.contains("stock") && err.contains("handshake failed"),
            "{err}"
        );
        err
    }

    /// An HTTP endpoint that is not an MCP server: the node sends the configured headers,
    /// fails with an error naming the server, and does not wait for the start timeout.
    #[tokio::test]
    async fn http_servers_get_the_headers_and_a_failed_handshake_is_named() {
        use std::sync::Mutex;
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let record = seen.clone();
        let app = axum::Router::new().route(
            "/mcp",
            axum::routing::post(move |headers: http::HeaderMap| async move {
                let desk = headers.get("x-desk").and_then(|v| v.to_str().ok());
                record.lock().unwrap().push(desk.unwrap_or("").to_owned());
                (
                    http::StatusCode::SERVICE_UNAVAILABLE,
                    "down for maintenance",
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let started = tokio::time::Instant::now();
        let err = handshake_error(start(&http_entry(format!("http://{addr}/mcp"))).await);
        assert!(
            started.elapsed() < START_TIMEOUT,
            "waited for the timeout: {err}"
        );
        let seen = seen.lock().unwrap().clone();
        assert!(
            !seen.is_empty() && seen.iter().all(|d| d == "fay"),
            "{seen:?}"
        );
        server.abort();
    }

    #[tokio::test]
    async fn an_http_server_nobody_runs_is_a_clear_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        handshake_error(start(&http_entry(format!("http://{addr}/mcp"))).await);
    }
}
