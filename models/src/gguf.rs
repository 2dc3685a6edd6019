//! Opening GGUF files: header and metadata, tensors on demand, with errors that name the file.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use candle_core::quantized::{gguf_file, QTensor};
use candle_core::Device;

use crate::error::{ModelError, Result};

/// An open GGUF file: parsed metadata plus a reader for tensor data.
pub struct GgufFile {
    path: PathBuf,
    content: gguf_file::Content,
    reader: Mutex<BufReader<File>>,
}

impl GgufFile {
    /// Opens `path` and parses its header, metadata and tensor index.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut reader = BufReader::new(file);
        let content = gguf_file::Content::read(&mut reader).map_err(|e| ModelError::BadGguf {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let file = Self {
            path: path.to_path_buf(),
            content,
            reader: Mutex::new(reader),
        };
        file.check_tensor_bounds()?;
        Ok(file)
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Parsed metadata and tensor index.
    pub fn content(&self) -> &gguf_file::Content {
        &self.content
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<String> {
        self.string("general.architecture")
    }

    /// A string metadata value.
    pub fn string(&self, key: &str) -> Result<String> {
        match self.content.metadata.get(key) {
            Some(v) => v.to_string().cloned().map_err(|e| ModelError::Metadata {
                key: key.to_string(),
                reason: e.to_string(),
            }),
            None => Err(ModelError::Metadata {
                key: key.to_string(),
                reason: "missing".into(),
            }),
        }
    }

    /// Whether a tensor of that name exists.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Reads one tensor onto `device`.
    pub fn tensor(&self, name: &str, device: &Device) -> Result<QTensor> {
        if !self.has_tensor(name) {
            return Err(ModelError::Tensor {
                name: name.to_string(),
                reason: format!("missing from {}", self.path.display()),
            });
        }
        // A poisoned lock only means another load panicked mid-read; the reader is
        // repositioned by every `tensor` call, so it is safe to keep using it.
        let mut reader = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        self.content
            .tensor(&mut *reader, name, device)
            .map_err(|e| ModelError::Tensor {
                name: name.to_string(),
                reason: e.to_string(),
            })
    }

    /// Fails early, with a clear message, when a tensor's data would lie past the end of the
    /// file (a truncated download), instead of failing deep inside a load.
    fn check_tensor_bounds(&self) -> Result<()> {
        let len = std::fs::metadata(&self.path)
            .map_err(|source| ModelError::Io {
                path: self.path.clone(),
                source,
            })?
            .len();
        for (name, info) in &self.content.tensor_infos {
            let elems = info.shape.elem_count();
            let block = info.ggml_dtype.block_size();
            if block == 0 || !elems.is_multiple_of(block) {
                return Err(ModelError::Tensor {
                    name: name.clone(),
                    reason: format!(
                        "{elems} elements is not a whole number of {block}-element blocks"
                    ),
                });
            }
            let bytes = tensor_bytes(info);
            let end = self.content.tensor_data_offset + info.offset + bytes;
            if end > len {
                return Err(ModelError::BadGguf {
                    path: self.path.clone(),
                    reason: format!(
                        "tensor `{name}` ends at byte {end} but the file has {len} bytes (truncated download?)"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// Bytes of a tensor's data: whole blocks of its type (0 for a type without blocks, which
/// [`GgufFile::open`] refuses).
pub fn tensor_bytes(info: &gguf_file::TensorInfo) -> u64 {
    let block = info.ggml_dtype.block_size();
    if block == 0 {
        return 0;
    }
    (info.shape.elem_count() / block) as u64 * info.ggml_dtype.type_size() as u64
}
