//! Writes the tiny random-weight GGUF files of every llama-shaped architecture that the
//! reference-logit tests use (`starling_models::testing::write_tiny`), so llama.cpp can read
//! the very same bytes. Used by `benches/llm/ref_logits.sh`.
//!
//! Usage: cargo run -p starling-models --example write_tiny -- OUT_DIR

use std::path::PathBuf;

use candle_core::quantized::GgmlDType;
use starling_models::testing::{write_tiny, TinyArch, REFERENCE_CONTEXT};

fn main() {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: write_tiny OUT_DIR");
        std::process::exit(2);
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {e}", dir.display());
        std::process::exit(1);
    }
    for arch in TinyArch::ALL {
        let path = dir.join(format!("tiny-{}.gguf", arch.name()));
        write_tiny(&path, arch, GgmlDType::Q8_0, REFERENCE_CONTEXT);
        println!("{}", path.display());
    }
}
