//! Shared helpers of the API tests: a tiny random-weight llama GGUF written by the test
//! itself (`starling_models::testing::write_tiny_llama`), a server on a loopback port,
//! and a reader for server-sent events.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use starling_node::api::{self, AppState};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Writes a 2-layer llama (GQA, byte-level BPE vocabulary, ChatML template) whose context
/// window is `context` tokens, and returns its path.
pub fn write_tiny_llama(dir: &Path, name: &str, context: u32) -> PathBuf {
    let path = dir.join(format!("{name}.gguf"));
    starling_models::testing::write_tiny_llama(&path, GgmlDType::Q8_0, context);
    path
}

/// [`write_tiny_llama`] of architecture `arch` with `template` as its chat template.
pub fn write_tiny_templated(
    dir: &Path,
    name: &str,
    arch: starling_models::testing::TinyArch,
    context: u32,
    template: &str,
) -> PathBuf {
    let path = dir.join(format!("{name}.gguf"));
    starling_models::testing::write_tiny_templated(&path, arch, GgmlDType::Q8_0, context, template);
    path
}

/// A server running the API on a free loopback port.
pub struct Server {
    pub addr: SocketAddr,
    pub state: AppState,
    pub cancel: CancellationToken,
    pub task: JoinHandle<Result<(), api::ServeError>>,
}

impl Server {
    /// Starts serving `state` on 127.0.0.1:0.
    pub async fn start(state: AppState) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        let cancel = CancellationToken::new();
        let task = tokio::spawn(api::serve_on(listener, state.clone(), cancel.clone()));
        Self {
            addr,
            state,
            cancel,
            task,
        }
    }

    /// `http://127.0.0.1:PORT` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops the server and waits (bounded) for it to return.
    pub async fn stop(self) {
        self.cancel.cancel();
        let done = tokio::time::timeout(std::time::Duration::from_secs(20), self.task)
            .await
            .expect("server stops within 20 s")
            .expect("server task did not panic");
        done.expect("server returned no error");
    }
}

/// Reads server-sent events from a streaming response: the `data:` payload of each event.
pub struct SseReader {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl SseReader {
    pub fn new(resp: reqwest::Response) -> Self {
        Self {
            resp,
            buf: Vec::new(),
        }
    }

    /// The next event's data, or None at the end of the body. Comment lines (keep-alives)
    /// are skipped.
    pub async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = self.buf.drain(..end + 2).collect();
                let event = String::from_utf8(event).expect("events are UTF-8");
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if data.is_empty() {
                    continue;
                }
                return Some(data.join("\n"));
            }
            match self.resp.chunk().await.expect("read body") {
                Some(bytes) => self.buf.extend_from_slice(&bytes),
                None => return None,
            }
        }
    }

    /// Every remaining event.
    pub async fn collect(mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(e) = self.next().await {
            out.push(e);
        }
        out
    }
}
