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

/// `e` and the errors under it, `: `-separated: a client error's own text rarely says why
/// (`error sending request` hides `invalid peer certificate: UnknownIssuer`).
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}
