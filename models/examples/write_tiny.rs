//! Writes the tiny random-weight GGUF files of every llama-shaped architecture that the
//! reference-logit tests use (`starling_models::testing::write_tiny`), so llama.cpp can read
//! the very same bytes. Used by `benches/llm/ref_logits.sh`.
//!
//! With `--shape NAME`, writes one random-weight F16 file with the shape of a published
//! model instead (`testing::REAL_SHAPES`: `llama-3.2-1b`, `qwen2.5-1.5b`), for speed
//! measurements at that scale (`benches/llm/scale.sh` quantises it with llama-quantize).
//!
//! Usage: cargo run -p starling-models --example write_tiny -- OUT_DIR
//!        cargo run -p starling-models --example write_tiny -- --shape NAME OUT_FILE

use std::path::PathBuf;

use candle_core::quantized::GgmlDType;
use starling_models::testing::{
    write_model, write_tiny, TinyArch, CHATML_TEMPLATE, REAL_SHAPES, REFERENCE_CONTEXT,
};

fn usage() -> ! {
    let names: Vec<&str> = REAL_SHAPES.iter().map(|s| s.name).collect();
    eprintln!(
        "usage: write_tiny OUT_DIR\n       write_tiny --shape {} OUT_FILE",
        names.join("|")
    );
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag, name, out] if flag == "--shape" => {
            let Some(shape) = REAL_SHAPES.iter().find(|s| s.name == name) else {
                usage()
            };
            let out = PathBuf::from(out);
            // The context only sizes metadata; benchmarks ask for what they need.
            write_model(
                &out,
                shape.arch,
                &shape.dims,
                GgmlDType::F16,
                4096,
                CHATML_TEMPLATE,
            );
            println!("{}", out.display());
        }
        [dir] if !dir.starts_with('-') => {
            let dir = PathBuf::from(dir);
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
        _ => usage(),
    }
}
