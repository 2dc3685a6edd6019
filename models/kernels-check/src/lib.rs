//! The kernels of `starling-models`, compiled alone; see `Cargo.toml`.
#![allow(dead_code)]

#[path = "../../src/arch/cpu/kernels.rs"]
pub mod kernels;
