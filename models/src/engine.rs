//! The inference engine: one thread owns the model and its KV cache and serves generation
//! requests from a queue, streaming text back over a channel. Callers stay async and never
//! block a runtime worker; dropping the stream cancels the generation.
//!
//! The engine remembers which tokens its KV cache holds. A request whose prompt starts with
//! the same tokens (an agent's long system prompt, the earlier turns of a chat) only runs the
//! new suffix through the model.

use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Instant;

use candle_core::Device;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::arch::{self, Transformer};
use crate::chat::{ChatMessage, ChatTemplate};
use crate::constraint::{Constraint, ConstraintCompiler, ConstraintState, TokenVocab};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::sampling::{Sampler, SamplingOptions};
use crate::stop::{StopCheck, StopMatcher};
use crate::tokenizer::GgufTokenizer;

/// Which device the model runs on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// The CPU (default).
    #[default]
    Cpu,
    /// The first CUDA GPU (needs the `cuda` feature).
    Cuda,
    /// The Metal GPU (needs the `metal` feature).
    Metal,
}

impl DeviceKind {
    /// Opens the device, with a clear error when this build lacks the backend.
    pub fn open(self) -> Result<Device> {
        match self {
            Self::Cpu => Ok(Device::Cpu),
            Self::Cuda => Device::new_cuda(0).map_err(|e| {
                ModelError::InvalidRequest(format!(
                    "cannot open CUDA device (build with `--features cuda`): {e}"
                ))
            }),
            Self::Metal => Device::new_metal(0).map_err(|e| {
                ModelError::InvalidRequest(format!(
                    "cannot open Metal device (build with `--features metal`): {e}"
                ))
            }),
        }
    }
}

/// How a model is loaded.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct EngineConfig {
    /// Longest prompt + output, in tokens (capped by the model's own context length).
    pub max_seq_len: usize,
    /// Prompt tokens run through the model per forward pass.
    pub prefill_chunk: usize,
    /// Device to run on.
    pub device: DeviceKind,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_seq_len: 4096,
            prefill_chunk: 512,
            device: DeviceKind::Cpu,
        }
    }
}

/// What a loaded model is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ModelInfo {
    /// Short name (the file stem, or the name given at load).
    pub id: String,
    /// The GGUF file.
    pub path: PathBuf,
    /// `general.architecture`.
    pub architecture: String,
    /// Context length in force (tokens).
    pub context_length: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Most common quantisation type among the weight matrices.
    pub quantization: String,
    /// Size of the file in bytes.
    pub file_size: u64,
}

/// The prompt of a request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prompt {
    /// Chat messages, rendered with the model's chat template and followed by the
    /// assistant's turn.
    Chat(Vec<ChatMessage>),
    /// Chat messages with tools (OpenAI-style function definitions, a JSON array) given to
    /// the chat template, for templates with a tool format of their own
    /// ([`Engine::tool_format`]).
    ChatWithTools(Vec<ChatMessage>, serde_json::Value),
    /// Raw text, tokenised as is (control tokens in it are treated as plain text).
    Text(String),
    /// Token ids, the model's input exactly as given: no BOS is added, nothing is
    /// re-tokenised (evaluation harnesses send ids so that scores line up with their own
    /// token boundaries).
    Tokens(Vec<u32>),
}

/// A generation request.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// What to continue.
    pub prompt: Prompt,
    /// Upper bound on generated tokens.
    pub max_tokens: usize,
    /// Sampling settings.
    pub sampling: SamplingOptions,
    /// Generation stops before any of these strings; they are not part of the output.
    pub stop: Vec<String>,
    /// Output must match this JSON Schema, regular expression or grammar. Enforced token by
    /// token: the output always matches unless `max_tokens` cuts it short.
    pub constraint: Option<Constraint>,
    /// Report each generated token's log-probability and this many most likely
    /// alternatives ([`Chunk::Logprob`]); `None`: none.
    pub logprobs: Option<usize>,
}

/// Most alternatives a [`GenerateRequest::logprobs`] may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A token and its log-probability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenProb {
    /// Its text (invalid UTF-8, as in a piece of a character, is replaced).
    pub token: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Natural log of its probability.
    pub logprob: f32,
}

/// A generated token's log-probability and the most likely tokens at its place.
///
/// The distribution is the model's at temperature 1 after the repetition penalty and, with
/// a constraint, over the tokens the constraint allows there (so a forced token has
/// log-probability 0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token chosen.
    pub chosen: TokenProb,
    /// The most likely tokens, best first.
    pub top: Vec<TokenProb>,
}

impl GenerateRequest {
    /// A chat request with default sampling.
    pub fn chat(messages: Vec<ChatMessage>) -> Self {
        Self {
            prompt: Prompt::Chat(messages),
            max_tokens: 256,
            sampling: SamplingOptions::default(),
            stop: Vec::new(),
            constraint: None,
            logprobs: None,
        }
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model ended its turn, or a stop string was reached.
    Stop,
    /// `max_tokens` or the context window was reached.
    Length,
}

/// Summary of a finished generation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Completion {
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values were reused from the cache.
    pub cached_prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Time spent on the (uncached part of the) prompt, in milliseconds.
    pub prompt_ms: f64,
    /// Time spent generating, in milliseconds.
    pub generation_ms: f64,
}

/// One item of a generation stream.
#[derive(Debug)]
pub enum Chunk {
    /// More output text (never splits a UTF-8 character).
    Text(String),
    /// The log-probability of the next generated token (only when asked for; it comes
    /// before the text the token adds, which may be held back until a character or a
    /// possible stop string is complete).
    Logprob(TokenLogprob),
    /// The end of the stream.
    Done(Completion),
}

/// A running generation: a stream of chunks. Dropping it cancels the generation.
pub struct Generation {
    rx: mpsc::UnboundedReceiver<Result<Chunk>>,
}

impl Generation {
    /// The next chunk; None after `Done` or an error.
    pub async fn next(&mut self) -> Option<Result<Chunk>> {
        self.rx.recv().await
    }

    /// Blocking variant of `next`, for synchronous callers (never from async code).
    pub fn blocking_next(&mut self) -> Option<Result<Chunk>> {
        self.rx.blocking_recv()
    }

    /// Waits for the whole output.
    pub async fn text(mut self) -> Result<(String, Completion)> {
        let mut out = String::new();
        while let Some(item) = self.next().await {
            match item? {
                Chunk::Text(t) => out.push_str(&t),
                Chunk::Logprob(_) => {}
                Chunk::Done(c) => return Ok((out, c)),
            }
        }
        Err(ModelError::EngineStopped)
    }
}

struct Job {
    prompt: Vec<u32>,
    req: GenerateRequest,
    constraint: Option<ConstraintState>,
    tx: mpsc::UnboundedSender<Result<Chunk>>,
}

/// Work for the inference thread.
enum Work {
    Generate(Box<Job>),
    Score(ScoreJob),
}

struct ScoreJob {
    /// What comes before; its last token gives the first scored token's distribution.
    context: Vec<u32>,
    /// The tokens scored.
    scored: Vec<u32>,
    /// Alternatives reported per token.
    top: usize,
    tx: oneshot::Sender<Result<Vec<TokenLogprob>>>,
}

/// A given text scored as the continuation of a prompt: the log-probability the model gives
/// each of its tokens (natural log, temperature 1, no penalty, no constraint).
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// The scored tokens, in order.
    pub tokens: Vec<u32>,
    /// `entries[i]` is `tokens[i]`'s log-probability after everything before it, with the
    /// most likely tokens at its place when asked for.
    pub entries: Vec<TokenLogprob>,
}

impl Scored {
    /// The log-probability of the whole scored text.
    pub fn total(&self) -> f32 {
        self.entries.iter().map(|e| e.chosen.logprob).sum()
    }

    /// The mean log-probability per token (0 when nothing was scored).
    pub fn mean(&self) -> f32 {
        if self.entries.is_empty() {
            0.0
        } else {
            self.total() / self.entries.len() as f32
        }
    }
}

/// A queued scoring request ([`Engine::score`]).
pub struct Scoring {
    tokens: Vec<u32>,
    rx: oneshot::Receiver<Result<Vec<TokenLogprob>>>,
}

impl Scoring {
    /// Waits for the result.
    pub async fn wait(self) -> Result<Scored> {
        let entries = self.rx.await.map_err(|_| ModelError::EngineStopped)??;
        Ok(Scored {
            tokens: self.tokens,
            entries,
        })
    }

    /// Blocking variant of `wait`, for synchronous callers (never from async code).
    pub fn blocking_wait(self) -> Result<Scored> {
        let entries = self
            .rx
            .blocking_recv()
            .map_err(|_| ModelError::EngineStopped)??;
        Ok(Scored {
            tokens: self.tokens,
            entries,
        })
    }
}

/// Handle to a loaded model. Cheap to clone; the model thread ends when the last handle
/// (and the last queued request) is gone.
#[derive(Clone)]
pub struct Engine {
    jobs: std_mpsc::Sender<Work>,
    tokenizer: Arc<GgufTokenizer>,
    template: Arc<ChatTemplate>,
    info: Arc<ModelInfo>,
    /// Built on the first constrained request (it indexes the whole vocabulary once).
    constraints: Arc<std::sync::OnceLock<std::result::Result<ConstraintCompiler, String>>>,
}

impl Engine {
    /// Loads a GGUF model and starts its inference thread.
    pub fn load(path: &Path, config: &EngineConfig) -> Result<Self> {
        crate::budget::load_in_own_pages(|| Self::load_now(path, config))
    }

    fn load_now(path: &Path, config: &EngineConfig) -> Result<Self> {
        let file = GgufFile::open(path)?;
        let device = config.device.open()?;
        let tokenizer = Arc::new(GgufTokenizer::from_gguf(file.content())?);
        let template = Arc::new(ChatTemplate::from_tokenizer(tokenizer.clone())?);
        let model = arch::load(&file, &device, config.max_seq_len)?;
        let info = Arc::new(ModelInfo {
            id: path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into()),
            path: path.to_path_buf(),
            architecture: file.architecture()?,
            context_length: model.max_seq_len(),
            vocab_size: model.vocab_size(),
            quantization: dominant_quantization(&file),
            file_size: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
        });
        let (jobs, rx) = std_mpsc::channel::<Work>();
        let worker = Worker {
            model,
            device,
            tokenizer: tokenizer.clone(),
            cached: Vec::new(),
            prefill_chunk: config.prefill_chunk.max(1),
        };
        std::thread::Builder::new()
            .name(format!("starling-infer-{}", info.id))
            .spawn(move || worker.run(rx))
            .map_err(|e| {
                ModelError::InvalidRequest(format!("cannot start the inference thread: {e}"))
            })?;
        Ok(Self {
            jobs,
            tokenizer,
            template,
            info,
            constraints: Arc::default(),
        })
    }

    /// Compiles a constraint for this model's vocabulary (a clear error when the schema,
    /// regex or grammar is invalid).
    pub fn compile_constraint(&self, constraint: &Constraint) -> Result<ConstraintState> {
        let compiler = self
            .constraints
            .get_or_init(|| {
                ConstraintCompiler::new(token_vocab(&self.tokenizer, self.info.vocab_size))
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| {
                ModelError::InvalidRequest(format!(
                    "constrained decoding is unavailable for this model: {e}"
                ))
            })?;
        Ok(compiler.compile(constraint)?)
    }

    /// The chat template's own tool-call format, if it has one.
    pub fn tool_format(&self) -> Option<crate::chat::ToolFormat> {
        self.template.tool_format()
    }

    /// What this model is.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &GgufTokenizer {
        &self.tokenizer
    }

    /// Token ids a request's prompt turns into.
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        match prompt {
            Prompt::Chat(messages) => Ok(self.template.encode_chat(messages, true)?),
            Prompt::ChatWithTools(messages, tools) => {
                Ok(self
                    .template
                    .encode_chat_with_tools(messages, Some(tools), true)?)
            }
            Prompt::Text(text) => {
                let mut ids = Vec::new();
                if self.tokenizer.add_bos() {
                    ids.extend(self.tokenizer.bos_id());
                }
                ids.extend(self.tokenizer.encode(text, false)?);
                Ok(ids)
            }
            Prompt::Tokens(ids) => {
                self.check_vocabulary(ids)?;
                Ok(ids.clone())
            }
        }
    }

    /// Refuses token ids the model has no embedding for.
    fn check_vocabulary(&self, ids: &[u32]) -> Result<()> {
        match ids.iter().find(|&&t| t as usize >= self.info.vocab_size) {
            Some(bad) => Err(ModelError::InvalidRequest(format!(
                "token {bad} is outside the vocabulary (the model has {} tokens)",
                self.info.vocab_size
            ))),
            None => Ok(()),
        }
    }

    /// Queues a request and returns its output stream.
    pub fn generate(&self, req: GenerateRequest) -> Result<Generation> {
        req.sampling.validate()?;
        if let Some(k) = req.logprobs {
            self.check_top(k)?;
        }
        if req.max_tokens == 0 {
            return Err(ModelError::InvalidRequest(
                "max_tokens must be at least 1".into(),
            ));
        }
        let text_bytes: usize = match &req.prompt {
            Prompt::Chat(messages) => messages.iter().map(|m| m.content.len()).sum(),
            Prompt::ChatWithTools(messages, tools) => {
                messages.iter().map(|m| m.content.len()).sum::<usize>() + tools.to_string().len()
            }
            Prompt::Text(text) => text.len(),
            Prompt::Tokens(_) => 0,
        };
        self.fits_before_tokenising(text_bytes)?;
        let prompt = self.prompt_tokens(&req.prompt)?;
        if prompt.is_empty() {
            return Err(ModelError::InvalidRequest("the prompt is empty".into()));
        }
        if prompt.len() >= self.info.context_length {
            return Err(ModelError::ContextOverflow {
                needed: prompt.len() + 1,
                max: self.info.context_length,
            });
        }
        let constraint = req
            .constraint
            .as_ref()
            .map(|c| self.compile_constraint(c))
            .transpose()?;
        let (tx, rx) = mpsc::unbounded_channel();
        self.jobs
            .send(Work::Generate(Box::new(Job {
                prompt,
                req,
                constraint,
                tx,
            })))
            .map_err(|_| ModelError::EngineStopped)?;
        Ok(Generation { rx })
    }

    /// Refuses a text far beyond the context before it is tokenised (a few megabytes of
    /// text would take seconds and gigabytes to tokenise). Every token stands for at most
    /// `max_token_bytes` bytes; the factor 2 leaves room for text that a tokenizer's
    /// normalisation shortens.
    fn fits_before_tokenising(&self, text_bytes: usize) -> Result<()> {
        let fewest = text_bytes / (2 * self.tokenizer.max_token_bytes());
        if fewest >= self.info.context_length {
            return Err(ModelError::ContextOverflow {
                needed: fewest + 1,
                max: self.info.context_length,
            });
        }
        Ok(())
    }

    /// Queues the scoring of `continuation` as what follows `prompt`: the log-probability
    /// of each of its tokens. This is how a model judges a given text instead of writing
    /// one, as in re-ranking passages by how likely a question is after each of them.
    pub fn score(&self, prompt: &Prompt, continuation: &str) -> Result<Scoring> {
        self.fits_before_tokenising(continuation.len())?;
        let tokens = self.tokenizer.encode(continuation, false)?;
        self.score_tokens(prompt, tokens)
    }

    /// [`score`](Self::score) for a continuation given as token ids.
    pub fn score_tokens(&self, prompt: &Prompt, tokens: Vec<u32>) -> Result<Scoring> {
        let context = self.prompt_tokens(prompt)?;
        self.queue_score(context, tokens, 0)
    }

    /// Scores a raw text as a whole (OpenAI's `echo` with `logprobs`): the text's tokens
    /// and, for every token with something before it, its log-probability and the `top`
    /// most likely tokens at its place. The first token has no entry unless the model
    /// starts its input with BOS (nothing precedes it). Returns the text's tokens (without
    /// BOS) and the scoring, whose entries cover the last `entries.len()` of them.
    pub fn score_text(&self, text: &str, top: usize) -> Result<(Vec<u32>, Option<Scoring>)> {
        self.check_top(top)?;
        self.fits_before_tokenising(text.len())?;
        let tokens = self.tokenizer.encode(text, false)?;
        let bos = self.tokenizer.bos_id().filter(|_| self.tokenizer.add_bos());
        self.score_whole(tokens, bos, top)
    }

    /// [`score_text`](Self::score_text) for a prompt given as token ids, taken exactly as
    /// they are: nothing is added before them, so the first id has no entry.
    pub fn score_ids(&self, ids: Vec<u32>, top: usize) -> Result<(Vec<u32>, Option<Scoring>)> {
        self.check_top(top)?;
        self.check_vocabulary(&ids)?;
        self.score_whole(ids, None, top)
    }

    fn check_top(&self, top: usize) -> Result<()> {
        if top > MAX_TOP_LOGPROBS {
            return Err(ModelError::InvalidRequest(format!(
                "at most {MAX_TOP_LOGPROBS} alternatives per token can be reported"
            )));
        }
        Ok(())
    }

    /// Scores every token of `tokens` that has something before it: `bos`, or the tokens
    /// before it.
    fn score_whole(
        &self,
        tokens: Vec<u32>,
        bos: Option<u32>,
        top: usize,
    ) -> Result<(Vec<u32>, Option<Scoring>)> {
        let (context, scored) = match (bos, tokens.split_first()) {
            (_, None) => return Ok((tokens, None)),
            (Some(b), Some(_)) => (vec![b], tokens.clone()),
            (None, Some((_, []))) => return Ok((tokens, None)),
            (None, Some((&first, rest))) => (vec![first], rest.to_vec()),
        };
        let scoring = self.queue_score(context, scored, top)?;
        Ok((tokens, Some(scoring)))
    }

    fn queue_score(&self, context: Vec<u32>, scored: Vec<u32>, top: usize) -> Result<Scoring> {
        if context.is_empty() || scored.is_empty() {
            return Err(ModelError::InvalidRequest(
                "scoring needs a prompt and a continuation".into(),
            ));
        }
        self.check_vocabulary(&context)?;
        self.check_vocabulary(&scored)?;
        let needed = context.len() + scored.len();
        if needed > self.info.context_length {
            return Err(ModelError::ContextOverflow {
                needed,
                max: self.info.context_length,
            });
        }
        let (tx, rx) = oneshot::channel();
        self.jobs
            .send(Work::Score(ScoreJob {
                context,
                scored: scored.clone(),
                top,
                tx,
            }))
            .map_err(|_| ModelError::EngineStopped)?;
        Ok(Scoring { tokens: scored, rx })
    }
}

/// The inference thread's state.
struct Worker {
    model: Box<dyn Transformer>,
    device: Device,
    tokenizer: Arc<GgufTokenizer>,
    /// Tokens whose keys and values are in the model's cache, in order.
    cached: Vec<u32>,
    prefill_chunk: usize,
}

impl Worker {
    fn run(mut self, jobs: std_mpsc::Receiver<Work>) {
        let device = self.device.clone();
        while let Ok(work) = jobs.recv() {
            match work {
                Work::Generate(job) => {
                    if job.tx.is_closed() {
                        continue;
                    }
                    let tx = job.tx.clone();
                    let result = device.with_context(|| self.serve(*job));
                    if let Err(e) = result {
                        tracing::warn!(error = %e, "generation failed");
                        self.forget();
                        let _ = tx.send(Err(e));
                    }
                }
                Work::Score(job) => {
                    if job.tx.is_closed() {
                        continue;
                    }
                    let result =
                        device.with_context(|| self.score(&job.context, &job.scored, job.top));
                    if result.is_err() {
                        self.forget();
                    }
                    let _ = job.tx.send(result);
                }
            }
        }
        tracing::debug!("inference thread stopped");
    }

    /// Forgets the cache after a failed pass (it may hold part of one).
    fn forget(&mut self) {
        self.model.truncate(0);
        self.cached.clear();
    }

    /// The log-probability (and `top` alternatives) of each token of `scored` after
    /// `context`.
    fn score(&mut self, context: &[u32], scored: &[u32], top: usize) -> Result<Vec<TokenLogprob>> {
        let tokenizer = self.tokenizer.clone();
        let (first, _) = self.prefill(context)?;
        let mut out = Vec::with_capacity(scored.len());
        out.push(token_logprob(&tokenizer, &first, scored[0], top));
        let (fed, _) = scored.split_at(scored.len() - 1);
        // A batched pass gives the logits after each fed token: a whole vocabulary of them
        // per token, so the passes are short.
        const CHUNK: usize = 32;
        for (c, tokens) in fed.chunks(CHUNK).enumerate() {
            let all = self.model.forward_all(tokens)?;
            self.cached.extend_from_slice(tokens);
            let vocab = self.model.vocab_size();
            let next = &scored[1 + c * CHUNK..];
            for (logits, &t) in all.chunks_exact(vocab).zip(next) {
                out.push(token_logprob(&tokenizer, logits, t, top));
            }
        }
        Ok(out)
    }

    /// Runs the prompt through the model, reusing the longest cached prefix, and returns the
    /// logits of its last token and how many prompt tokens were reused.
    fn prefill(&mut self, prompt: &[u32]) -> Result<(Vec<f32>, usize)> {
        let mut reuse = self
            .cached
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        // The last prompt token must run to produce fresh logits.
        reuse = reuse.min(prompt.len() - 1);
        self.model.truncate(reuse);
        self.cached.truncate(reuse);
        let mut logits = Vec::new();
        for chunk in prompt[reuse..].chunks(self.prefill_chunk) {
            logits = self.model.forward(chunk)?;
            self.cached.extend_from_slice(chunk);
        }
        Ok((logits, reuse))
    }

    fn serve(&mut self, job: Job) -> Result<()> {
        let Job {
            prompt,
            req,
            mut constraint,
            tx,
        } = job;
        let started = Instant::now();
        let (mut logits, reused) = self.prefill(&prompt)?;
        let prompt_ms = started.elapsed().as_secs_f64() * 1e3;
        let gen_start = Instant::now();

        let mut sampler = Sampler::new(req.sampling.clone());
        let tokenizer = self.tokenizer.clone();
        let mut decoder = tokenizer.stream_decoder();
        let mut stops = StopMatcher::new(&req.stop);
        let eot = self.tokenizer.eot_ids().to_vec();
        let room = self.model.max_seq_len() - self.cached.len();
        let budget = req.max_tokens.min(room);
        let mut history = prompt.clone();
        let mut generated = 0;
        let mut finish = FinishReason::Length;
        let mut hit_stop_string = false;
        while generated < budget {
            if constraint.as_ref().is_some_and(|c| c.is_finished()) {
                finish = FinishReason::Stop;
                break;
            }
            sampler.penalize(&mut logits, &history);
            let mut token = sampler.pick(&logits);
            if let (Some(c), Some(t)) = (constraint.as_mut(), token) {
                // Lazy masking: the full mask is computed only when the sampled token breaks
                // the constraint, then the token is drawn again from the allowed ones.
                if !c.is_allowed(t) {
                    c.compute_mask()?.apply_to_logits(&mut logits);
                    token = sampler.pick(&logits);
                }
            }
            let Some(token) = token else {
                return Err(ModelError::InvalidRequest(
                    "the model produced no valid logits".into(),
                ));
            };
            if let Some(k) = req.logprobs {
                if let Some(c) = constraint.as_mut() {
                    // Over the allowed tokens only, whether or not the draw needed the mask.
                    c.compute_mask()?.apply_to_logits(&mut logits);
                }
                let entry = token_logprob(&tokenizer, &logits, token, k);
                if tx.send(Ok(Chunk::Logprob(entry))).is_err() {
                    return Ok(()); // the caller went away: cancelled
                }
            }
            if eot.contains(&token) {
                finish = FinishReason::Stop;
                break;
            }
            if let Some(c) = constraint.as_mut() {
                c.commit(token)?;
            }
            generated += 1;
            history.push(token);
            match stops.push(&decoder.push(token).unwrap_or_default()) {
                StopCheck::Continue(t) => {
                    if !t.is_empty() && tx.send(Ok(Chunk::Text(t))).is_err() {
                        return Ok(()); // the caller went away: cancelled
                    }
                }
                StopCheck::Stop(t) => {
                    if !t.is_empty() {
                        let _ = tx.send(Ok(Chunk::Text(t)));
                    }
                    finish = FinishReason::Stop;
                    hit_stop_string = true;
                    break;
                }
            }
            if generated == budget {
                break;
            }
            logits = self.model.forward(&[token])?;
            self.cached.push(token);
        }
        if !hit_stop_string {
            // Release what the decoder and the stop matcher still hold.
            let tail = match stops.push(&decoder.finish().unwrap_or_default()) {
                StopCheck::Continue(t) => t + &stops.finish(),
                StopCheck::Stop(t) => t,
            };
            if !tail.is_empty() {
                let _ = tx.send(Ok(Chunk::Text(tail)));
            }
        }
        let _ = tx.send(Ok(Chunk::Done(Completion {
            finish_reason: finish,
            prompt_tokens: prompt.len(),
            cached_prompt_tokens: reused,
            completion_tokens: generated,
            prompt_ms,
            generation_ms: gen_start.elapsed().as_secs_f64() * 1e3,
        })));
        Ok(())
    }
}

/// The log of the softmax's normaliser: `ln Σ exp(logit)`, computed stably.
fn log_normaliser(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .map(|&l| f64::from(l - max).exp())
        .filter(|e| e.is_finite())
        .sum();
    max + sum.ln() as f32
}

/// The log-probability of `token` under `logits` (log-softmax) and the `k` most likely
/// tokens.
fn token_logprob(tokenizer: &GgufTokenizer, logits: &[f32], token: u32, k: usize) -> TokenLogprob {
    let log_z = log_normaliser(logits);
    let prob = |id: u32| {
        let bytes = if (id as usize) < tokenizer.vocab_size() {
            tokenizer.token_bytes(id).to_vec()
        } else {
            Vec::new()
        };
        TokenProb {
            token: String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
            logprob: (logits[id as usize] - log_z).min(0.0),
        }
    };
    let mut top: Vec<u32> = Vec::with_capacity(k + 1);
    if k > 0 {
        // One pass keeping the k best (k is at most 20).
        for (id, &l) in logits.iter().enumerate() {
            if l == f32::NEG_INFINITY {
                continue;
            }
            if top.len() < k || l > logits[top[top.len() - 1] as usize] {
                let at = top.partition_point(|&t| logits[t as usize] >= l);
                top.insert(at, id as u32);
                top.truncate(k);
            }
        }
    }
    TokenLogprob {
        chosen: prob(token),
        top: top.into_iter().map(prob).collect(),
    }
}

/// The vocabulary as raw bytes per token, for the constraint engine. Ids past the
/// tokenizer's vocabulary (models whose output layer is padded) are empty and never allowed.
fn token_vocab(tokenizer: &Arc<GgufTokenizer>, model_vocab: usize) -> TokenVocab {
    let n = tokenizer.vocab_size().max(model_vocab);
    let tokens = (0..n as u32)
        .map(|id| {
            if (id as usize) < tokenizer.vocab_size() {
                tokenizer.token_bytes(id).to_vec()
            } else {
                Vec::new()
            }
        })
        .collect();
    let special = (0..tokenizer.vocab_size() as u32)
        .filter(|&id| tokenizer.is_special(id))
        .collect();
    let tok = tokenizer.clone();
    TokenVocab {
        tokens,
        special,
        eos_ids: tokenizer.eot_ids().to_vec(),
        tokenize: Arc::new(move |bytes: &[u8]| {
            // The constraint engine passes valid UTF-8; anything else tokenises to nothing.
            std::str::from_utf8(bytes)
                .ok()
                .and_then(|s| tok.encode(s, false).ok())
                .unwrap_or_default()
        }),
    }
}

/// The most common quantisation type among 2-D weights, by element count.
pub(crate) fn dominant_quantization(file: &GgufFile) -> String {
    let mut counts: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for info in file.content().tensor_infos.values() {
        if info.shape.rank() == 2 {
            *counts.entry(format!("{:?}", info.ggml_dtype)).or_default() += info.shape.elem_count();
        }
    }
    counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(t, _)| t)
        .unwrap_or_else(|| "unknown".into())
}

/// The active chat model of a node, replaceable while running.
///
/// `current()` hands out a clone of the active engine; a generation started on it runs to
/// its end on that engine even if another model is swapped in meanwhile, and the old
/// model's thread exits once its last handle and queued request are gone.
#[derive(Clone)]
pub struct ModelSlot {
    active: Arc<std::sync::RwLock<Engine>>,
}

impl ModelSlot {
    /// A slot holding `engine`.
    pub fn new(engine: Engine) -> Self {
        Self {
            active: Arc::new(std::sync::RwLock::new(engine)),
        }
    }

    /// The active engine.
    pub fn current(&self) -> Engine {
        // A poisoned lock means a writer panicked after or before the assignment; either
        // way the stored engine is a complete value.
        self.active
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Makes `engine` the active one and returns the previous one.
    pub fn swap(&self, engine: Engine) -> Engine {
        let mut guard = self.active.write().unwrap_or_else(|p| p.into_inner());
        std::mem::replace(&mut *guard, engine)
    }
}
