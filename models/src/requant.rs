//! Re-quantisation of weights that have no fast CPU kernel.
//!
//! Candle's CPU kernels are SIMD-accelerated for Q4_0, Q8_0 and the K-quants, but Q4_1
//! (the type the default SmolLM2 file ships in) and Q5_0/Q5_1 fall back to scalar code.
//! Such weights are converted once to a type with a kernel and the result is written as a
//! new GGUF file next to the original (or in a fallback directory when that one is not
//! writable), so later loads are instant.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::Device;
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

/// What to do with weights that lack a fast CPU kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Requantize {
    /// Leave the file as it is when Starling's own CPU kernels will run it on this CPU
    /// (llama-shaped files in Q8_0, Q4_0, Q4_1 or the Q4_K_M/Q5_K_M k-quant mixes, on a CPU
    /// with AVX2, AVX-512 or NEON: measured faster on the shipped Q4_1 file than a Q8_0
    /// copy, see `benches/RESULTS.md`); otherwise convert what candle runs slowly (Q4_1,
    /// Q5_0, Q5_1) to Q8_0. The default.
    #[default]
    Auto,
    /// Convert them to Q8_0 (no quality loss against a 4-bit source).
    Q8_0,
    /// Convert them to Q4_0 (smaller and faster, slightly lossy).
    Q4_0,
    /// Leave the file as it is.
    Off,
}

impl FromStr for Requantize {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "q8_0" | "q8" => Ok(Self::Q8_0),
            "q4_0" | "q4" => Ok(Self::Q4_0),
            "off" | "none" | "no" => Ok(Self::Off),
            other => Err(ModelError::InvalidRequest(format!(
                "unknown requantize setting `{other}` (expected auto, q8_0, q4_0 or off)"
            ))),
        }
    }
}

impl std::fmt::Display for Requantize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
            Self::Off => "off",
        })
    }
}

impl Requantize {
    fn target(self) -> Option<GgmlDType> {
        match self {
            Self::Auto | Self::Q8_0 => Some(GgmlDType::Q8_0),
            Self::Q4_0 => Some(GgmlDType::Q4_0),
            Self::Off => None,
        }
    }
}

/// Types that candle runs with scalar code only on CPU.
fn lacks_fast_kernel(t: GgmlDType) -> bool {
    matches!(t, GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1)
}

/// Returns the file to load for `path` under `policy`: `path` itself when nothing needs
/// converting, otherwise the converted file (created on first use in `path`'s directory, or
/// in `fallback_dir` when that is not writable).
pub fn prepare(path: &Path, policy: Requantize, fallback_dir: &Path) -> Result<PathBuf> {
    let Some(target) = policy.target() else {
        return Ok(path.to_path_buf());
    };
    let file = GgufFile::open(path)?;
    let needs = file
        .content()
        .tensor_infos
        .values()
        .any(|i| lacks_fast_kernel(i.ggml_dtype) && i.shape.rank() == 2);
    if !needs {
        return Ok(path.to_path_buf());
    }
    if policy == Requantize::Auto && crate::arch::cpu::eligible(&file, &Device::Cpu).is_ok() {
        tracing::debug!(path = %path.display(), "the CPU kernels run this file as it is");
        return Ok(path.to_path_buf());
    }
    // The converted file is named after the type it holds, so `auto` and `q8_0` share it.
    let policy = if policy == Requantize::Auto {
        Requantize::Q8_0
    } else {
        policy
    };
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = format!("{stem}.requant-{policy}.gguf");
    let beside = path.parent().map(|d| d.join(&name));
    let candidates = beside
        .into_iter()
        .chain(std::iter::once(fallback_dir.join(&name)));
    let mut last_err = None;
    for out in candidates {
        if is_fresh(&out, path) {
            return Ok(out);
        }
        match convert(&file, target, &out) {
            Ok(()) => return Ok(out),
            Err(e) => {
                tracing::debug!(path = %out.display(), error = %e, "cannot write requantised model here");
                last_err = Some(e);
            }
        }
    }
    Err(last_err.unwrap_or_else(|| {
        ModelError::InvalidRequest("no place to write the requantised model".into())
    }))
}

/// A converted file is reused when it exists, parses, and is newer than the source.
fn is_fresh(out: &Path, src: &Path) -> bool {
    let (Ok(o), Ok(s)) = (std::fs::metadata(out), std::fs::metadata(src)) else {
        return false;
    };
    let newer = match (o.modified(), s.modified()) {
        (Ok(a), Ok(b)) => a >= b,
        _ => false,
    };
    newer && GgufFile::open(out).is_ok()
}

/// Writes a copy of `file` with every slow-kernel 2-D weight converted to `target`.
pub fn convert(file: &GgufFile, target: GgmlDType, out: &Path) -> Result<()> {
    let started = std::time::Instant::now();
    let ct = file.content();
    let device = Device::Cpu;
    let mut names: Vec<&String> = ct.tensor_infos.keys().collect();
    names.sort_by_key(|n| ct.tensor_infos[*n].offset);
    let mut tensors: Vec<(String, QTensor)> = Vec::with_capacity(names.len());
    let mut converted = 0usize;
    for name in names {
        let info = &ct.tensor_infos[name];
        let t = file.tensor(name, &device)?;
        let k = info.shape.dims().last().copied().unwrap_or(0);
        let t = if lacks_fast_kernel(info.ggml_dtype)
            && info.shape.rank() == 2
            && k.is_multiple_of(target.block_size())
        {
            converted += 1;
            QTensor::quantize(&t.dequantize(&device)?, target)?
        } else {
            t
        };
        tensors.push((name.clone(), t));
    }
    let mut metadata: Vec<(&str, &gguf_file::Value)> =
        ct.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    metadata.sort_by_key(|(k, _)| *k);
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();

    let io = |source| ModelError::Io {
        path: out.to_path_buf(),
        source,
    };
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    let result = (|| -> Result<()> {
        let mut w = BufWriter::new(File::create(&tmp).map_err(io)?);
        gguf_file::write(&mut w, &metadata, &refs)?;
        let f = w.into_inner().map_err(|e| io(e.into_error()))?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, out).map_err(io)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    tracing::info!(
        tensors = converted,
        target = ?target,
        path = %out.display(),
        secs = started.elapsed().as_secs_f32(),
        "requantised weights without a fast CPU kernel"
    );
    Ok(())
}
