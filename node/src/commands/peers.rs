//! `starling peers` and `starling invite`: ask the running node.

use clap::Args;

use super::client::NodeAddr;
use crate::api::node::{InviteBody, PeerBody};

/// Arguments of `starling peers`.
#[derive(Debug, Args)]
pub struct PeersArgs {
    /// Which node.
    #[command(flatten)]
    pub node: NodeAddr,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also list peers that are down.
    #[arg(long)]
    pub all: bool,
}

/// Lists the peers the node knows.
pub fn peers(args: PeersArgs) -> anyhow::Result<()> {
    let list: Vec<PeerBody> = super::block_on(args.node.get("/api/peers"))??;
    let list: Vec<PeerBody> = list
        .into_iter()
        .filter(|p| args.all || args.json || p.state != "down")
        .collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    if list.is_empty() {
        println!("no peers yet (start another node with --bootstrap, --join or on the same LAN)");
        return Ok(());
    }
    let w = list.iter().map(|p| p.name.len()).max().unwrap_or(4).max(4);
    println!("{:<w$}  {:<8}  {:<22}  ID", "NAME", "STATE", "ADDRESS");
    for p in &list {
        println!("{:<w$}  {:<8}  {:<22}  {}", p.name, p.state, p.addr, p.id);
    }
    Ok(())
}

/// Arguments of `starling invite`.
#[derive(Debug, Args)]
pub struct InviteArgs {
    /// Which node.
    #[command(flatten)]
    pub node: NodeAddr,
    /// Print JSON (code, secret, bootstrap address).
    #[arg(long)]
    pub json: bool,
    /// Print only the swarm secret (for `--swarm-secret` in scripts).
    #[arg(long)]
    pub secret: bool,
}

/// Prints a join code for the node's swarm.
pub fn invite(args: InviteArgs) -> anyhow::Result<()> {
    let body: InviteBody = super::block_on(args.node.get("/api/invite"))??;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&body)?);
    } else if args.secret {
        println!("{}", body.secret);
    } else {
        println!("{}", body.code);
        eprintln!(
            "\nOn the other device run:\n  starling up --join {}\nThe code contains the swarm secret: share it only with devices you trust.",
            body.code
        );
    }
    Ok(())
}
