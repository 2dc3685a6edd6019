//! An embedder on its own thread, behind an async handle.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc};

use tokio::sync::oneshot;

use super::{EmbedError, Embedder, TokenEmbedding};

type Reply = oneshot::Sender<Result<Vec<TokenEmbedding>, EmbedError>>;

struct Job {
    texts: Vec<String>,
    /// Whether the token vectors are wanted too ([`Embedder::embed_tokens`]).
    tokens: bool,
    reply: Reply,
}

#[derive(Debug)]
struct Info {
    model_id: String,
    dim: usize,
    max_len: usize,
    /// Whether the embedder gives token vectors ([`Embedder::embed_tokens`]).
    tokens: bool,
}

/// Cheap-to-clone async handle to an [`Embedder`] that runs on a dedicated
/// thread.
///
/// Requests are queued and served one at a time, so inference never runs on
/// (or blocks) a tokio worker. The thread stops once every handle is dropped
/// and the queue is drained.
#[derive(Clone, Debug)]
pub struct EmbedHandle {
    jobs: mpsc::Sender<Job>,
    info: Arc<Info>,
}

impl EmbedHandle {
    /// Moves `embedder` onto a new thread named `starling-embed`.
    pub fn spawn<E: Embedder + 'static>(embedder: E) -> Result<Self, EmbedError> {
        let info = Arc::new(Info {
            model_id: embedder.model_id().to_owned(),
            dim: embedder.dim(),
            max_len: embedder.max_len(),
            tokens: embedder.embed_tokens(&[]).is_ok(),
        });
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("starling-embed".to_owned())
            .spawn(move || serve(&embedder, &queue))
            .map_err(EmbedError::Spawn)?;
        Ok(Self { jobs, info })
    }

    /// Embeds `texts` on the embedding thread; see [`Embedder::embed`].
    pub async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        let out = self.run(texts, false).await?;
        Ok(out.into_iter().map(|e| e.vector).collect())
    }

    /// Embeds `texts` with their token vectors; see [`Embedder::embed_tokens`].
    pub async fn embed_tokens(
        &self,
        texts: Vec<String>,
    ) -> Result<Vec<TokenEmbedding>, EmbedError> {
        self.run(texts, true).await
    }

    async fn run(
        &self,
        texts: Vec<String>,
        tokens: bool,
    ) -> Result<Vec<TokenEmbedding>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job {
                texts,
                tokens,
                reply,
            })
            .map_err(|_| EmbedError::WorkerStopped)?;
        answer.await.map_err(|_| EmbedError::WorkerStopped)?
    }

    /// Length of every vector.
    pub fn dim(&self) -> usize {
        self.info.dim
    }

    /// Maximum number of tokens read from a text.
    pub fn max_len(&self) -> usize {
        self.info.max_len
    }

    /// Whether [`EmbedHandle::embed_tokens`] gives token vectors (otherwise it fails with
    /// [`EmbedError::Unsupported`]).
    pub fn supports_tokens(&self) -> bool {
        self.info.tokens
    }

    /// Identifier of the model.
    pub fn model_id(&self) -> &str {
        &self.info.model_id
    }
}

fn serve<E: Embedder>(embedder: &E, queue: &mpsc::Receiver<Job>) {
    tracing::debug!(model_id = embedder.model_id(), "embedding thread started");
    while let Ok(Job {
        texts,
        tokens,
        reply,
    }) = queue.recv()
    {
        if reply.is_closed() {
            // The caller gave up (its future was dropped): skip the work.
            continue;
        }
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let result = catch_unwind(AssertUnwindSafe(|| {
            if tokens {
                embedder.embed_tokens(&refs)
            } else {
                embedder.embed(&refs).map(|vs| {
                    vs.into_iter()
                        .map(|vector| TokenEmbedding {
                            vector,
                            tokens: Vec::new(),
                        })
                        .collect()
                })
            }
        }))
        .unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            tracing::error!(%message, "embedder panicked");
            Err(EmbedError::Panicked(message))
        });
        // The caller may have stopped waiting; nothing to do then.
        let _ = reply.send(result);
    }
    tracing::debug!(model_id = embedder.model_id(), "embedding thread stopped");
}
