//! Fuzz target: every frame decoder of the discovery wire protocol.
//!
//! Any input must decode to a message or to an error, never panic, and a
//! message that decodes must re-encode to a frame that decodes to the same
//! message.
#![cfg_attr(fuzzing, no_main)]

use starling_discovery::codec::{decode_body, decode_frame, encode_frame};
use starling_discovery::wire::{Hello, RecordWire, RpcRequest, RpcResponse, StreamHeader, SyncMsg};

const MAX: usize = 64 * 1024;

fn check<T>(data: &[u8])
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if let Ok(Some((msg, used))) = decode_frame::<T>(data, MAX) {
        assert!(used <= data.len());
        let frame = encode_frame(&msg, MAX).expect("a decoded message re-encodes");
        let (back, n) = decode_frame::<T>(&frame, MAX)
            .expect("re-encoded frame decodes")
            .expect("re-encoded frame is complete");
        assert_eq!(n, frame.len());
        assert_eq!(back, msg);
    }
    let _ = decode_body::<T>(data);
}

/// Runs one input through every decoder.
fn run(data: &[u8]) {
    check::<Hello>(data);
    check::<StreamHeader>(data);
    check::<RpcRequest>(data);
    check::<RpcResponse>(data);
    check::<RecordWire>(data);
    check::<SyncMsg>(data);
}

#[cfg(fuzzing)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| run(data));

/// Stable-toolchain driver: replays the files of the directories given,
/// then generated inputs (valid frames with random mutations, and random bytes).
#[cfg(not(fuzzing))]
fn main() {
    use rand::{Rng, SeedableRng};

    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let iterations: usize = match args.last().map(|a| a.parse()) {
        Some(Ok(n)) => {
            args.pop();
            n
        }
        _ => 200_000,
    };
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    for dir in &args {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{dir}: {e}"));
        for entry in entries.flatten() {
            if let Ok(bytes) = std::fs::read(entry.path()) {
                run(&bytes);
                seeds.push(bytes);
            }
        }
    }
    println!("replayed {} corpus files", seeds.len());
    seeds.extend(sample_frames());
    let mut rng = rand::rngs::StdRng::seed_from_u64(
        std::env::var("FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1),
    );
    for i in 0..iterations {
        let mut input = if i % 4 == 0 {
            let len = rng.gen_range(0..256);
            (0..len).map(|_| rng.gen()).collect()
        } else {
            seeds[rng.gen_range(0..seeds.len())].clone()
        };
        for _ in 0..rng.gen_range(0..8) {
            if input.is_empty() {
                input.push(rng.gen());
                continue;
            }
            let at = rng.gen_range(0..input.len());
            match rng.gen_range(0..4) {
                0 => input[at] = rng.gen(),
                1 => input[at] ^= 1 << rng.gen_range(0..8),
                2 => input.truncate(at),
                _ => input.insert(at, rng.gen()),
            }
        }
        run(&input);
    }
    println!("ran {iterations} generated inputs: no panic");
}

/// Valid frames of every message type, as mutation seeds.
#[cfg(not(fuzzing))]
fn sample_frames() -> Vec<Vec<u8>> {
    use starling_discovery::records::Record;
    use starling_discovery::wire::{MemberWire, RpcErrorCode, StreamKind};
    use starling_discovery::Identity;

    let id = Identity::from_seed([7; 32]);
    let record = Record::sign_at(&id, "card", 1, b"body".to_vec())
        .expect("valid record")
        .to_wire();
    let hello = Hello {
        version: 1,
        proof: [3; 32],
        member: MemberWire {
            id: id.node_id(),
            addr: "127.0.0.1:7420".parse().expect("literal address"),
            generation: 5,
            name: "n".into(),
        },
    };
    let enc = |r: Result<Vec<u8>, _>| r.expect("sample encodes");
    vec![
        enc(encode_frame(&hello, MAX)),
        enc(encode_frame(
            &StreamHeader {
                version: 1,
                kind: StreamKind::Sync,
            },
            MAX,
        )),
        enc(encode_frame(
            &RpcRequest {
                service: "s".into(),
                method: "m".into(),
                body: vec![1, 2],
            },
            MAX,
        )),
        enc(encode_frame(
            &RpcResponse::Err {
                code: RpcErrorCode::Internal,
                message: "x".into(),
            },
            MAX,
        )),
        enc(encode_frame(&record, MAX)),
        enc(encode_frame(&SyncMsg::Records(vec![record]), MAX)),
        enc(encode_frame(&SyncMsg::Want(vec![[1; 16]]), MAX)),
        enc(encode_frame(&SyncMsg::Offer(vec![[2; 32]]), MAX)),
        enc(encode_frame(&SyncMsg::Take(vec![0, 300]), MAX)),
        enc(encode_frame(&SyncMsg::Neg(vec![0x61, 0]), MAX)),
    ]
}
