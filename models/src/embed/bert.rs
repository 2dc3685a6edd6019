//! sentence-transformers BERT models (all-MiniLM-L6-v2 and kin) and MPNet models
//! (all-mpnet-base-v2) on Starling's CPU kernels or candle.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config, HiddenAct};
use serde::Deserialize;
use tokenizers::{Encoding, Tokenizer, TruncationParams};

use super::mpnet::{MpnetConfig, MpnetModel};
use super::{EmbedError, Embedder, TokenEmbedding};
use crate::arch::cpu::bert::{Activation, BertShape, CpuBert, Variant};
use crate::arch::cpu::{Isa, BACKEND_ENV};

/// Texts per forward pass unless [`BertEmbedder::with_batch_size`] says otherwise.
pub const DEFAULT_BATCH_SIZE: usize = 32;

const CONFIG_FILE: &str = "config.json";
const TOKENIZER_FILE: &str = "tokenizer.json";
const WEIGHTS_FILE: &str = "model.safetensors";
const SBERT_CONFIG_FILE: &str = "sentence_bert_config.json";
const MODULES_FILE: &str = "modules.json";
const POOLING_CONFIG_FILE: &str = "1_Pooling/config.json";

/// Which implementation runs the encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EmbedBackend {
    /// The CPU kernels when this CPU has integer SIMD (AVX2 or AVX-512), otherwise candle;
    /// `STARLING_BACKEND=candle` forces candle.
    #[default]
    Auto,
    /// Starling's CPU kernels: Q8_0 weights in the linear layers, f32 elsewhere.
    Kernels,
    /// f32 on candle: candle's BERT, or Starling's MPNet on candle (candle has none): the
    /// reference implementation.
    Candle,
}

impl std::str::FromStr for EmbedBackend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "kernels" | "q8" | "q8_0" => Ok(Self::Kernels),
            "candle" | "f32" => Ok(Self::Candle),
            other => Err(format!(
                "unknown embedding backend {other:?} (expected auto, kernels or candle)"
            )),
        }
    }
}

enum Encoder {
    Candle(BertModel),
    CandleMpnet(MpnetModel),
    Kernels(CpuBert),
}

/// The architecture `config.json` describes (its `model_type`).
enum Arch {
    /// `bert` (or no `model_type`).
    Bert(Config),
    /// `mpnet`.
    MPNet(MpnetConfig),
}

/// The model types [`BertEmbedder`] loads.
const MODEL_TYPES: &str = "bert, mpnet";

/// The part of `config.json` that says which architecture it is.
#[derive(Deserialize)]
struct ModelType {
    model_type: Option<String>,
}

impl Arch {
    fn parse(path: &Path, bytes: &[u8]) -> Result<Self, EmbedError> {
        let probe: ModelType = parse_json(path, bytes)?;
        match probe.model_type.as_deref().unwrap_or("bert") {
            "bert" => Ok(Arch::Bert(parse_json(path, bytes)?)),
            "mpnet" => Ok(Arch::MPNet(parse_json(path, bytes)?)),
            other => Err(EmbedError::Unsupported(format!(
                "model_type `{other}` in {} (supported: {MODEL_TYPES})",
                path.display()
            ))),
        }
    }

    /// The model's sizes, for the kernels and for validation.
    fn shape(&self, path: &Path) -> Result<BertShape, EmbedError> {
        match self {
            Arch::Bert(config) => Ok(kernel_shape(config)),
            Arch::MPNet(config) => match config.activation() {
                Some(activation) => Ok(config.shape(activation)),
                None => Err(EmbedError::Unsupported(format!(
                    "hidden_act `{}` in {}",
                    config.hidden_act,
                    path.display()
                ))),
            },
        }
    }

    fn model_type(&self) -> &str {
        match self {
            Arch::Bert(config) => config.model_type.as_deref().unwrap_or("bert"),
            Arch::MPNet(_) => "mpnet",
        }
    }
}

/// A sentence-transformers model: a BERT or MPNet encoder, mean pooling over the
/// attention mask, L2 normalisation. Runs on the CPU, by default on Starling's
/// own kernels (Q8_0 linear layers), or in F32 on candle ([`EmbedBackend`]).
///
/// Loaded from a directory holding `config.json` (`model_type` `bert`, the default, or
/// `mpnet`), `tokenizer.json` and `model.safetensors`; `sentence_bert_config.json`,
/// `modules.json` and `1_Pooling/config.json` are read when present to take the maximum
/// sequence length and to refuse pipelines this backend does not implement.
pub struct BertEmbedder {
    encoder: Encoder,
    tokenizer: Tokenizer,
    device: Device,
    model_id: String,
    dim: usize,
    max_len: usize,
    batch_size: usize,
}

impl std::fmt::Debug for BertEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertEmbedder")
            .field("model_id", &self.model_id)
            .field("dim", &self.dim)
            .field("max_len", &self.max_len)
            .field("batch_size", &self.batch_size)
            .field("backend", &self.backend())
            .finish_non_exhaustive()
    }
}

impl BertEmbedder {
    /// Loads the model in `dir` on the default backend. The model id defaults to the
    /// directory's name.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self, EmbedError> {
        Self::load_with(dir, EmbedBackend::Auto)
    }

    /// Loads the model in `dir` on `backend`.
    pub fn load_with(dir: impl AsRef<Path>, backend: EmbedBackend) -> Result<Self, EmbedError> {
        let dir = dir.as_ref();
        let started = Instant::now();
        let device = Device::Cpu;

        let config_path = dir.join(CONFIG_FILE);
        let arch = Arch::parse(&config_path, &read_required(&config_path)?)?;
        let shape = arch.shape(&config_path)?;
        validate_shape(&shape, &config_path)?;
        check_pipeline(dir)?;

        let sbert_path = dir.join(SBERT_CONFIG_FILE);
        let max_seq_length = match read_optional(&sbert_path)? {
            Some(bytes) => parse_json::<SbertConfig>(&sbert_path, &bytes)?.max_seq_length,
            None => None,
        };
        let max_len = max_seq_length
            .unwrap_or(shape.max_tokens())
            .min(shape.max_tokens());
        if max_len < 2 {
            return Err(EmbedError::Corrupt {
                path: sbert_path,
                reason: format!("max_seq_length {max_len} leaves no room for any token"),
            });
        }

        let tokenizer_path = dir.join(TOKENIZER_FILE);
        let mut tokenizer =
            Tokenizer::from_bytes(read_required(&tokenizer_path)?).map_err(|e| {
                EmbedError::Corrupt {
                    path: tokenizer_path.clone(),
                    reason: e.to_string(),
                }
            })?;
        // tokenizer.json often carries a fixed padding and a shorter truncation
        // from export time: padding is done per batch here, truncation follows
        // the sentence-transformers maximum.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_len,
                ..TruncationParams::default()
            }))
            .map_err(|e| EmbedError::Corrupt {
                path: tokenizer_path.clone(),
                reason: format!("cannot truncate to {max_len} tokens: {e}"),
            })?;
        let tokenizer_vocab = tokenizer.get_vocab_size(true);
        if tokenizer_vocab > shape.vocab {
            return Err(EmbedError::Corrupt {
                path: tokenizer_path,
                reason: format!(
                    "tokenizer has {tokenizer_vocab} tokens but the model only {}",
                    shape.vocab
                ),
            });
        }

        let weights_path = dir.join(WEIGHTS_FILE);
        let weights = read_required(&weights_path)?;
        let corrupt_weights = |e: candle_core::Error| EmbedError::Corrupt {
            path: weights_path.clone(),
            reason: e.to_string(),
        };
        let encoder = if use_kernels(backend, &shape)? {
            let tensors = candle_core::safetensors::load_buffer(&weights, &device)
                .map_err(corrupt_weights)?;
            let source = |name: &str, dims: &[usize]| tensor_values(&tensors, name, dims);
            let prefix = weight_prefix(arch.model_type(), |name| tensors.contains_key(name));
            let threads = candle_core::utils::get_num_threads();
            let cpu = CpuBert::load(shape, &prefix, &source, threads).map_err(|reason| {
                EmbedError::Corrupt {
                    path: weights_path.clone(),
                    reason,
                }
            })?;
            tracing::debug!(
                isa = ?cpu.isa(),
                threads = cpu.threads(),
                model_type = arch.model_type(),
                "encoder on the CPU kernels"
            );
            Encoder::Kernels(cpu)
        } else {
            let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &device)
                .map_err(corrupt_weights)?;
            match &arch {
                Arch::Bert(config) => {
                    Encoder::Candle(BertModel::load(vb, config).map_err(corrupt_weights)?)
                }
                Arch::MPNet(config) => Encoder::CandleMpnet(
                    MpnetModel::load(vb, config, shape.activation).map_err(corrupt_weights)?,
                ),
            }
        };

        let model_id = dir
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|| dir.display().to_string());
        tracing::info!(
            model_id,
            dir = %dir.display(),
            model_type = arch.model_type(),
            dim = shape.hidden,
            max_len,
            backend = ?backend_of(&encoder),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "loaded embedding model"
        );
        Ok(Self {
            encoder,
            tokenizer,
            device,
            model_id,
            dim: shape.hidden,
            max_len,
            batch_size: DEFAULT_BATCH_SIZE,
        })
    }

    /// Sets the model id reported by [`Embedder::model_id`].
    #[must_use]
    pub fn with_model_id(mut self, model_id: impl Into<String>) -> Self {
        self.model_id = model_id.into();
        self
    }

    /// Sets how many texts go through one forward pass (at least 1).
    #[must_use]
    pub fn with_batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size.max(1);
        self
    }

    /// Texts per forward pass.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The implementation running the encoder: [`EmbedBackend::Kernels`] or
    /// [`EmbedBackend::Candle`].
    pub fn backend(&self) -> EmbedBackend {
        backend_of(&self.encoder)
    }

    /// Tokenises `texts`, runs them in length-sorted batches and returns `pool` of each
    /// one's hidden rows, in the callers' order.
    fn encode<T: Default + Clone>(
        &self,
        texts: &[&str],
        pool: &dyn Fn(&[f32]) -> T,
    ) -> Result<Vec<T>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let started = Instant::now();
        let encodings = self
            .tokenizer
            .encode_batch_fast(texts.to_vec(), true)
            .map_err(|e| EmbedError::Tokenize(e.to_string()))?;

        // Longest first, so texts of similar length share a batch and padding
        // is small; results go back to the caller's order.
        let mut order: Vec<usize> = (0..encodings.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(encodings[i].get_ids().len()));
        let lens: Vec<usize> = order
            .iter()
            .map(|&i| encodings[i].get_ids().len())
            .collect();
        let mut vectors: Vec<T> = vec![T::default(); texts.len()];
        // The kernels run a batch without padding, so only the candle path splits on it.
        let ranges = match self.encoder {
            Encoder::Candle(_) | Encoder::CandleMpnet(_) => split_batches(&lens, self.batch_size),
            Encoder::Kernels(_) => (0..lens.len())
                .step_by(self.batch_size)
                .map(|start| start..(start + self.batch_size).min(lens.len()))
                .collect(),
        };
        for range in ranges {
            let chunk = &order[range];
            let batch: Vec<&Encoding> = chunk.iter().map(|&i| &encodings[i]).collect();
            for (&i, vector) in chunk.iter().zip(self.embed_batch(&batch, pool)?) {
                vectors[i] = vector;
            }
        }
        tracing::debug!(
            model_id = %self.model_id,
            texts = texts.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "embedded texts"
        );
        Ok(vectors)
    }

    /// Runs one forward pass over `encodings` and returns `pool` of each one's hidden
    /// rows (`dim` values a token, special tokens included), in the same order.
    fn embed_batch<T>(
        &self,
        encodings: &[&Encoding],
        pool: &dyn Fn(&[f32]) -> T,
    ) -> Result<Vec<T>, EmbedError> {
        match &self.encoder {
            Encoder::Candle(_) | Encoder::CandleMpnet(_) => {
                self.embed_batch_candle(encodings, pool)
            }
            Encoder::Kernels(cpu) => {
                let ids: Vec<&[u32]> = encodings.iter().map(|e| e.get_ids()).collect();
                let hidden = cpu
                    .forward(&ids)
                    .map_err(|e| EmbedError::Inference(candle_core::Error::Msg(e)))?;
                let mut at = 0;
                Ok(ids
                    .iter()
                    .map(|ids| {
                        let rows = &hidden[at * self.dim..(at + ids.len()) * self.dim];
                        at += ids.len();
                        pool(rows)
                    })
                    .collect())
            }
        }
    }

    /// candle's forward pass, over `encodings` padded to the longest of them.
    fn embed_batch_candle<T>(
        &self,
        encodings: &[&Encoding],
        pool: &dyn Fn(&[f32]) -> T,
    ) -> Result<Vec<T>, EmbedError> {
        let batch = encodings.len();
        let seq_len = encodings
            .iter()
            .map(|e| e.get_ids().len())
            .max()
            .unwrap_or(0)
            .max(1);
        let mut ids = vec![0u32; batch * seq_len];
        let mut mask = vec![0u32; batch * seq_len];
        let mut lens = Vec::with_capacity(batch);
        for (row, encoding) in encodings.iter().enumerate() {
            let row_ids = encoding.get_ids();
            let start = row * seq_len;
            ids[start..start + row_ids.len()].copy_from_slice(row_ids);
            mask[start..start + row_ids.len()].fill(1);
            lens.push(row_ids.len());
        }

        let hidden = candle_core::utils::with_threadpool(|| -> candle_core::Result<Vec<f32>> {
            let input_ids = Tensor::from_vec(ids, (batch, seq_len), &self.device)?;
            let attention_mask = Tensor::from_vec(mask, (batch, seq_len), &self.device)?;
            let output = match &self.encoder {
                Encoder::Candle(model) => {
                    let token_type_ids = input_ids.zeros_like()?;
                    model.forward(&input_ids, &token_type_ids, Some(&attention_mask))?
                }
                Encoder::CandleMpnet(model) => model.forward(&input_ids, &attention_mask)?,
                Encoder::Kernels(_) => candle_core::bail!("not a candle encoder"),
            };
            output.flatten_all()?.to_vec1::<f32>()
        })?;

        let expected = batch * seq_len * self.dim;
        if hidden.len() != expected {
            return Err(EmbedError::Inference(candle_core::Error::Msg(format!(
                "model returned {} values, expected {expected}",
                hidden.len()
            ))));
        }
        Ok(lens
            .iter()
            .enumerate()
            .map(|(row, &len)| {
                let rows = &hidden[row * seq_len * self.dim..][..len * self.dim];
                pool(rows)
            })
            .collect())
    }
}

impl Embedder for BertEmbedder {
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.encode(texts, &|rows| mean_pool_normalised(rows, self.dim))
    }

    fn embed_tokens(&self, texts: &[&str]) -> Result<Vec<TokenEmbedding>, EmbedError> {
        self.encode(texts, &|rows| TokenEmbedding {
            vector: mean_pool_normalised(rows, self.dim),
            tokens: token_rows_normalised(rows, self.dim),
        })
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn max_len(&self) -> usize {
        self.max_len
    }

    fn model_id(&self) -> &str {
        &self.model_id
    }
}

fn backend_of(encoder: &Encoder) -> EmbedBackend {
    match encoder {
        Encoder::Candle(_) | Encoder::CandleMpnet(_) => EmbedBackend::Candle,
        Encoder::Kernels(_) => EmbedBackend::Kernels,
    }
}

/// Whether `backend` means the CPU kernels for a model of `shape`.
fn use_kernels(backend: EmbedBackend, shape: &BertShape) -> Result<bool, EmbedError> {
    let supported =
        CpuBert::supports(shape).map_err(|e| EmbedError::Unsupported(format!("CPU kernels: {e}")));
    match backend {
        EmbedBackend::Candle => Ok(false),
        EmbedBackend::Kernels => supported.map(|()| true),
        EmbedBackend::Auto => Ok(supported.is_ok()
            && Isa::detect() != Isa::Scalar
            && !std::env::var(BACKEND_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("candle"))),
    }
}

fn kernel_shape(config: &Config) -> BertShape {
    BertShape {
        vocab: config.vocab_size,
        hidden: config.hidden_size,
        layers: config.num_hidden_layers,
        heads: config.num_attention_heads,
        ffn: config.intermediate_size,
        max_positions: config.max_position_embeddings,
        type_vocab: config.type_vocab_size,
        eps: config.layer_norm_eps as f32,
        activation: match config.hidden_act {
            HiddenAct::Gelu => Activation::GeluErf,
            HiddenAct::GeluApproximate => Activation::GeluTanh,
            HiddenAct::Relu => Activation::Relu,
        },
        variant: Variant::Bert,
    }
}

/// The prefix of the checkpoint's tensor names: none, or the model type (`bert.`,
/// `mpnet.`) for checkpoints saved from a model with a task head.
fn weight_prefix(model_type: &str, has: impl Fn(&str) -> bool) -> String {
    const PROBE: &str = "embeddings.word_embeddings.weight";
    if has(PROBE) {
        return String::new();
    }
    format!("{model_type}.")
}

/// The values of tensor `name` as f32, if it has dimensions `dims`.
fn tensor_values(
    tensors: &std::collections::HashMap<String, Tensor>,
    name: &str,
    dims: &[usize],
) -> Result<Vec<f32>, String> {
    let t = tensors
        .get(name)
        .ok_or_else(|| format!("tensor {name} is missing"))?;
    if t.dims() != dims {
        return Err(format!(
            "tensor {name} has shape {:?}, expected {dims:?}",
            t.dims()
        ));
    }
    t.to_dtype(DType::F32)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(|e| format!("tensor {name}: {e}"))
}

/// Splits texts sorted by descending token count `lens` into consecutive
/// batches of at most `batch_size`, also starting a new batch where a text
/// would be padded to more than twice its length: compute grows with the
/// padded length, so one long text must not make a batch of short ones pay
/// for its length. Small absolute differences are tolerated, since every
/// forward pass has a fixed cost too.
fn split_batches(lens: &[usize], batch_size: usize) -> Vec<std::ops::Range<usize>> {
    const TOLERATED_PADDING: usize = 16;
    let mut batches = Vec::new();
    let mut start = 0;
    for (pos, &len) in lens.iter().enumerate() {
        let first = lens[start];
        let full = pos - start >= batch_size;
        let wasteful = first > 2 * len && first - len > TOLERATED_PADDING;
        if pos > start && (full || wasteful) {
            batches.push(start..pos);
            start = pos;
        }
    }
    if start < lens.len() {
        batches.push(start..lens.len());
    }
    batches
}

/// The `dim`-wide rows of `rows` without the first and last (the tokenizer's `[CLS]` and
/// `[SEP]`, or `<s>` and `</s>`), each scaled to unit length.
fn token_rows_normalised(rows: &[f32], dim: usize) -> Vec<f32> {
    let n = rows.len() / dim;
    let inner = if n > 2 {
        &rows[dim..(n - 1) * dim]
    } else {
        rows
    };
    let mut out = inner.to_vec();
    for row in out.chunks_exact_mut(dim) {
        let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
        row.iter_mut().for_each(|x| *x /= norm);
    }
    out
}

/// Mean of the `dim`-wide rows in `rows`, scaled to unit length.
fn mean_pool_normalised(rows: &[f32], dim: usize) -> Vec<f32> {
    let mut sum = vec![0f32; dim];
    let count = rows.len() / dim;
    for row in rows.chunks_exact(dim) {
        for (s, &x) in sum.iter_mut().zip(row) {
            *s += x;
        }
    }
    // The mean's own scale cancels out in the normalisation, but it is kept so
    // tiny vectors meet the same epsilon as in sentence-transformers.
    let inv_count = 1.0 / count.max(1) as f32;
    sum.iter_mut().for_each(|s| *s *= inv_count);
    let norm = sum.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    sum.iter_mut().for_each(|s| *s /= norm);
    sum
}

/// The part of `sentence_bert_config.json` that matters here.
#[derive(Deserialize)]
struct SbertConfig {
    max_seq_length: Option<usize>,
}

/// One entry of `modules.json`.
#[derive(Deserialize)]
struct ModuleEntry {
    #[serde(rename = "type")]
    kind: String,
}

/// `1_Pooling/config.json`.
#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
}

/// Refuses sentence-transformers pipelines other than
/// Transformer → mean Pooling → (Normalize).
fn check_pipeline(dir: &Path) -> Result<(), EmbedError> {
    let modules_path = dir.join(MODULES_FILE);
    if let Some(bytes) = read_optional(&modules_path)? {
        let modules: Vec<ModuleEntry> = parse_json(&modules_path, &bytes)?;
        for module in &modules {
            let kind = module.kind.rsplit('.').next().unwrap_or(&module.kind);
            if !matches!(kind, "Transformer" | "Pooling" | "Normalize") {
                return Err(EmbedError::Unsupported(format!(
                    "module {} in {} (only Transformer, Pooling and Normalize are implemented)",
                    module.kind,
                    modules_path.display()
                )));
            }
        }
    }
    let pooling_path = dir.join(POOLING_CONFIG_FILE);
    if let Some(bytes) = read_optional(&pooling_path)? {
        let pooling: PoolingConfig = parse_json(&pooling_path, &bytes)?;
        let mean_only = pooling.pooling_mode_mean_tokens
            && !pooling.pooling_mode_cls_token
            && !pooling.pooling_mode_max_tokens
            && !pooling.pooling_mode_mean_sqrt_len_tokens;
        if !mean_only {
            return Err(EmbedError::Unsupported(format!(
                "pooling in {} (only mean pooling is implemented)",
                pooling_path.display()
            )));
        }
    }
    Ok(())
}

/// Rejects configs that would make the forward pass fail or panic later.
fn validate_shape(shape: &BertShape, path: &Path) -> Result<(), EmbedError> {
    let reason = if shape.hidden == 0 || shape.heads == 0 {
        Some("hidden_size and num_attention_heads must be positive".to_owned())
    } else if !shape.hidden.is_multiple_of(shape.heads) {
        Some(format!(
            "hidden_size {} is not a multiple of num_attention_heads {}",
            shape.hidden, shape.heads
        ))
    } else if shape.variant == Variant::Bert && shape.type_vocab == 0 {
        Some("type_vocab_size must be positive".to_owned())
    } else if shape.max_tokens() < 2 {
        Some(format!(
            "max_position_embeddings {} leaves no room for any token",
            shape.max_positions
        ))
    } else if let Variant::MPNet { buckets, .. } = shape.variant {
        (buckets < 4 || !buckets.is_multiple_of(2)).then(|| {
            format!("relative_attention_num_buckets {buckets} must be even and at least 4")
        })
    } else {
        None
    };
    match reason {
        Some(reason) => Err(EmbedError::Corrupt {
            path: path.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

fn read_required(path: &Path) -> Result<Vec<u8>, EmbedError> {
    read_optional(path)?.ok_or_else(|| EmbedError::MissingFile {
        path: path.to_owned(),
    })
}

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, EmbedError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(EmbedError::Read {
            path: PathBuf::from(path),
            source,
        }),
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(path: &Path, bytes: &[u8]) -> Result<T, EmbedError> {
    serde_json::from_slice(bytes).map_err(|e| EmbedError::Corrupt {
        path: path.to_owned(),
        reason: format!("not the expected JSON: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_pool_averages_rows_then_normalises() {
        let v = mean_pool_normalised(&[1.0, 0.0, 3.0, 4.0], 2);
        // mean (2, 2) -> unit (0.7071, 0.7071)
        assert!((v[0] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6);
        assert!((v[1] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6);
    }

    #[test]
    fn batches_respect_size_and_split_on_padding_waste() {
        assert_eq!(split_batches(&[], 32), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(split_batches(&[5, 5, 5, 5, 5], 2), vec![0..2, 2..4, 4..5]);
        // 256 vs 20 tokens: the long text goes alone.
        assert_eq!(split_batches(&[256, 20, 18, 12], 32), vec![0..1, 1..4]);
        // Short texts stay together even if one is twice another.
        assert_eq!(split_batches(&[14, 6, 3, 2], 32), vec![0..4]);
        assert_eq!(split_batches(&[80, 60, 39, 30], 32), vec![0..2, 2..4]);
    }

    #[test]
    fn mean_pool_of_zeros_stays_finite() {
        let v = mean_pool_normalised(&[0.0; 4], 2);
        assert_eq!(v, vec![0.0, 0.0]);
    }
}
