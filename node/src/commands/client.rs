//! A small client for the node API, used by the commands that talk to a running node
//! (`starling peers`, `starling invite`, ...).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Which node to talk to.
#[derive(Debug, Clone, Args)]
pub struct NodeAddr {
    /// The node's HTTP API address (as printed by `starling up`).
    #[arg(long, env = "STARLING_API", default_value_t = crate::api::DEFAULT_ADDR)]
    pub api: SocketAddr,
    /// The node's API key, when it has one (`starling up --api-key`).
    #[arg(
        long,
        value_name = "KEY",
        env = "STARLING_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
}

impl NodeAddr {
    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.api, path)
    }

    /// An HTTP client for the node: no proxy, and the API key on every request.
    pub fn client(&self) -> anyhow::Result<reqwest::Client> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(k) = &self.api_key {
            let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {k}"))
                .context("the API key holds characters a header cannot carry")?;
            v.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, v);
        }
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .default_headers(headers)
            .no_proxy()
            .build()
            .context("cannot build an HTTP client")
    }

    /// `GET path`, parsed as `T`.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.exchange(self.client()?.get(self.url(path))).await
    }

    /// `GET path?query`, parsed as `T` (the query form-encoded from `query`).
    pub async fn get_query<Q: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        query: &Q,
    ) -> anyhow::Result<T> {
        self.exchange(self.client()?.get(self.url(path)).query(query))
            .await
    }

    /// `DELETE path`, parsed as `T`.
    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.exchange(self.client()?.delete(self.url(path))).await
    }

    /// `POST path` with a JSON body, parsed as `T`.
    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        self.exchange(self.client()?.post(self.url(path)).json(body))
            .await
    }

    /// Sends `request`; an unreachable node and a refusal are errors that say so.
    async fn exchange<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> anyhow::Result<T> {
        let resp = request.send().await.map_err(|e| self.unreachable(e))?;
        Self::parse(resp).await
    }

    fn unreachable(&self, e: reqwest::Error) -> anyhow::Error {
        anyhow::anyhow!(
            "no Starling node answers at http://{} ({e}). Start one with `starling up`, or pass --api ADDR (or STARLING_API) for a node on another address.",
            self.api
        )
    }

    async fn parse<T: DeserializeOwned>(resp: reqwest::Response) -> anyhow::Result<T> {
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .context("cannot read the node's answer")?;
        if !status.is_success() {
            let msg = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            anyhow::bail!("the node refused the request ({status}): {msg}");
        }
        serde_json::from_slice(&bytes).context("the node answered with unexpected JSON")
    }
}
