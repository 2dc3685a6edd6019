//! The Starling node: command line, configuration, and (in later modules) the HTTP API and
//! the agent runtime. This is the only crate that wires models and networking together.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod agent;
pub mod api;
pub mod cli;
pub mod commands;
pub mod config;
pub mod daemon;
pub mod llm;
pub mod loading;
pub mod logging;
pub mod memory;
mod outside;
pub mod owned;
pub mod search;
pub mod store;
