//! `starling memory ...`: the shared memories of a running node, through its API
//! (`/api/memories`).

use anyhow::Context;
use clap::{Args, Subcommand};

use super::client::NodeAddr;
use crate::memory::api_types::{
    AddMemoryRequest, AddMemoryResponse, ForgetResponse, MemoryList, MemoryView,
};

/// `starling memory ...`
#[derive(Debug, Subcommand)]
pub enum MemoryCommand {
    /// Add a prompt–answer pair (checked, not LLM-scored) and share it with the swarm.
    Add(AddArgs),
    /// Search a domain's memories as the node's retrieval does.
    Search(SearchArgs),
    /// List memories, newest first.
    List(ListArgs),
    /// Forget one memory, or everything from an author (who is ignored from then on).
    Forget(ForgetArgs),
}

/// `starling memory add`
#[derive(Debug, Args)]
pub struct AddArgs {
    /// Domain pool.
    #[arg(long, default_value = crate::memory::DEFAULT_DOMAIN)]
    pub domain: String,
    /// The prompt.
    #[arg(long)]
    pub prompt: String,
    /// The answer.
    #[arg(long)]
    pub answer: String,
    /// Quality score 0..10.
    #[arg(long)]
    pub score: Option<f32>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    node: NodeAddr,
}

/// `starling memory search`
#[derive(Debug, Args)]
pub struct SearchArgs {
    /// What to search for.
    pub query: String,
    /// Domain pool.
    #[arg(long, default_value = crate::memory::DEFAULT_DOMAIN)]
    pub domain: String,
    /// How many results.
    #[arg(short, default_value_t = 3)]
    pub k: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    node: NodeAddr,
}

/// `starling memory list`
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this domain.
    #[arg(long)]
    pub domain: Option<String>,
    /// Only this author (node id).
    #[arg(long)]
    pub author: Option<String>,
    /// At most this many.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    node: NodeAddr,
}

/// `starling memory forget`
#[derive(Debug, Args)]
pub struct ForgetArgs {
    /// Forget everything by this author (node id) and ignore it from now on.
    #[arg(long, conflicts_with = "id", required_unless_present = "id")]
    pub author: Option<String>,
    /// Forget this memory.
    #[arg(long)]
    pub id: Option<String>,
    #[command(flatten)]
    node: NodeAddr,
}

/// Runs a `starling memory` command.
pub fn run(command: MemoryCommand) -> anyhow::Result<()> {
    super::block_on(run_async(command))?
}

/// Percent-encodes a query value.
fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

async fn run_async(command: MemoryCommand) -> anyhow::Result<()> {
    match command {
        MemoryCommand::Add(a) => {
            let req = AddMemoryRequest {
                domain: Some(a.domain),
                prompt: a.prompt,
                answer: a.answer,
                source: None,
                score: a.score,
            };
            let resp: AddMemoryResponse = a.node.post("/api/memories", &req).await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&resp)?);
            } else if let Some(m) = &resp.memory {
                println!("added memory {} to domain {}", m.id, m.domain);
            } else {
                anyhow::bail!(
                    "not added: {}",
                    resp.rejected.as_deref().unwrap_or("unknown reason")
                );
            }
        }
        MemoryCommand::Search(a) => {
            let path = format!(
                "/api/memories?q={}&domain={}&limit={}",
                enc(&a.query),
                enc(&a.domain),
                a.k
            );
            let list: MemoryList = a.node.get(&path).await?;
            print_list(&list, a.json)?;
        }
        MemoryCommand::List(a) => {
            let mut path = format!("/api/memories?limit={}", a.limit);
            if let Some(d) = &a.domain {
                path += &format!("&domain={}", enc(d));
            }
            if let Some(au) = &a.author {
                path += &format!("&author={}", enc(au));
            }
            let list: MemoryList = a.node.get(&path).await?;
            print_list(&list, a.json)?;
        }
        MemoryCommand::Forget(a) => {
            let query = match (&a.author, &a.id) {
                (Some(au), _) => format!("author={}", enc(au)),
                (None, Some(id)) => format!("id={}", enc(id)),
                (None, None) => anyhow::bail!("give --author or --id"),
            };
            let url = format!("http://{}/api/memories?{query}", a.node.api);
            let resp = a
                .node
                .client()?
                .delete(&url)
                .send()
                .await
                .with_context(|| format!("no Starling node answers at http://{}", a.node.api))?;
            let status = resp.status();
            let text = resp.text().await.context("cannot read the node's answer")?;
            if !status.is_success() {
                anyhow::bail!("the node refused the request ({status}): {text}");
            }
            let r: ForgetResponse =
                serde_json::from_str(&text).context("the node answered with unexpected JSON")?;
            println!("forgot {} memories", r.forgotten);
        }
    }
    Ok(())
}

fn print_list(list: &MemoryList, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(list)?);
        return Ok(());
    }
    if list.memories.is_empty() {
        println!("no memories");
    }
    for MemoryView {
        memory: m,
        rank_score,
    } in &list.memories
    {
        let score = rank_score.map_or(String::new(), |s| format!(" rank {s:.3}"));
        let author: String = m.author.chars().take(12).collect();
        println!(
            "{} [{}] by {author}… score {:.0}/10 (+{} -{}){score}\n  Q: {}\n  A: {}",
            &m.id[..m.id.len().min(12)],
            m.domain,
            m.score,
            m.helpful,
            m.unhelpful,
            m.prompt.replace('\n', " "),
            m.answer.replace('\n', " ")
        );
    }
    Ok(())
}
