//! The agent runtime: team formation, group chat, tasks. The state machines here are sans-IO.

pub mod a2a;
pub mod card;
pub mod chat;
pub mod docs;
pub mod executor;
pub mod formation;
pub mod grounded;
pub mod mcp;
pub mod peers;
pub mod runtime;
pub mod tools;
