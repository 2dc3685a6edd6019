//! Shared helpers of the API tests: a tiny random-weight llama GGUF written by the test
//! itself (the same shape as `models/tests/tiny_model.rs`), a server on a loopback port,
//! and a reader for server-sent events.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use starling_node::api::{self, AppState};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const LAYERS: usize = 2;
const FFN: usize = 128;

/// GPT-2's byte-to-unicode table: printable bytes map to themselves, the rest to U+0100...
fn byte_chars() -> Vec<char> {
    let printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars: Vec<(u32, u32)> = printable.iter().map(|&b| (b, b)).collect();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars.push((b, 256 + n));
            n += 1;
        }
    }
    chars.sort();
    chars
        .into_iter()
        .map(|(_, c)| char::from_u32(c).expect("valid char"))
        .collect()
}

fn random(shape: (usize, usize), seed: u64) -> Tensor {
    // A small LCG keeps the weights reproducible without extra dependencies.
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let data: Vec<f32> = (0..shape.0 * shape.1)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 0.2
        })
        .collect();
    Tensor::from_vec(data, shape, &Device::Cpu).expect("shape matches data")
}

/// Writes a 2-layer llama (GQA, byte-level BPE vocabulary, ChatML template) whose context
/// window is `context` tokens, and returns its path.
pub fn write_tiny_llama(dir: &Path, name: &str, context: u32) -> PathBuf {
    let path = dir.join(format!("{name}.gguf"));
    let mut tokens = vec![
        "<|endoftext|>".to_string(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
    ];
    let mut types = vec![3, 3, 3];
    for c in byte_chars() {
        tokens.push(c.to_string());
        types.push(1);
    }
    let merges = ["Ġ t", "h e", "Ġt he", "i n", "o n"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    let n_vocab = tokens.len();
    let q = |t: Tensor| QTensor::quantize(&t, GgmlDType::Q8_0).expect("quantize");
    let ones = |n: usize| {
        let t = Tensor::ones(n, candle_core::DType::F32, &Device::Cpu).expect("ones");
        QTensor::quantize(&t, GgmlDType::F32).expect("f32")
    };
    let mut tensors: Vec<(String, QTensor)> = vec![
        ("token_embd.weight".into(), q(random((n_vocab, HIDDEN), 1))),
        ("output_norm.weight".into(), ones(HIDDEN)),
    ];
    let kv = HIDDEN / HEADS * KV_HEADS;
    for l in 0..LAYERS {
        let s = 100 * (l as u64 + 1);
        let p = |n: &str| format!("blk.{l}.{n}.weight");
        tensors.push((p("attn_norm"), ones(HIDDEN)));
        tensors.push((p("attn_q"), q(random((HIDDEN, HIDDEN), s + 1))));
        tensors.push((p("attn_k"), q(random((kv, HIDDEN), s + 2))));
        tensors.push((p("attn_v"), q(random((kv, HIDDEN), s + 3))));
        tensors.push((p("attn_output"), q(random((HIDDEN, HIDDEN), s + 4))));
        tensors.push((p("ffn_norm"), ones(HIDDEN)));
        tensors.push((p("ffn_gate"), q(random((FFN, HIDDEN), s + 5))));
        tensors.push((p("ffn_up"), q(random((FFN, HIDDEN), s + 6))));
        tensors.push((p("ffn_down"), q(random((HIDDEN, FFN), s + 7))));
    }
    let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let strs = |xs: &[String]| Value::Array(xs.iter().map(|s| Value::String(s.clone())).collect());
    let merges: Vec<String> = merges.iter().map(|s| s.to_string()).collect();
    let md: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("general.name", Value::String("tiny".into())),
        ("llama.context_length", Value::U32(context)),
        ("llama.embedding_length", Value::U32(HIDDEN as u32)),
        ("llama.block_count", Value::U32(LAYERS as u32)),
        ("llama.feed_forward_length", Value::U32(FFN as u32)),
        ("llama.attention.head_count", Value::U32(HEADS as u32)),
        ("llama.attention.head_count_kv", Value::U32(KV_HEADS as u32)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        (
            "llama.rope.dimension_count",
            Value::U32((HIDDEN / HEADS) as u32),
        ),
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("smollm".into())),
        ("tokenizer.ggml.tokens", strs(&tokens)),
        (
            "tokenizer.ggml.token_type",
            Value::Array(types.iter().map(|&t| Value::I32(t)).collect()),
        ),
        ("tokenizer.ggml.merges", strs(&merges)),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
        ("tokenizer.chat_template", Value::String(template.into())),
    ];
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (*k, v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(&path).expect("create gguf");
    gguf_file::write(&mut f, &md_refs, &t_refs).expect("write gguf");
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
