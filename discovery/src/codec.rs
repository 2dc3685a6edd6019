//! Length-delimited frames: a big-endian `u32` length, then a postcard body.
//!
//! Frame sizes are bounded; an oversized, truncated or malformed frame yields
//! a [`CodecError`], on which callers close that stream only.

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Default maximum frame body size (1 MiB).
pub const DEFAULT_MAX_FRAME: usize = 1 << 20;

/// Errors reading or writing frames.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The frame is larger than allowed.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    Oversized {
        /// Announced or actual length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame")]
    Truncated,
    /// The frame body is not a valid message.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// The transport failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// Encodes `msg` as one frame (length prefix included).
pub fn encode_frame<T: Serialize>(msg: &T, max: usize) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![0u8; 4];
    let mut out = postcard::to_extend(msg, std::mem::take(&mut out))
        .map_err(|e| CodecError::Malformed(e.to_string()))?;
    let len = out.len() - 4;
    if len > max {
        return Err(CodecError::Oversized { len, max });
    }
    let len32 = u32::try_from(len).map_err(|_| CodecError::Oversized { len, max })?;
    out[..4].copy_from_slice(&len32.to_be_bytes());
    Ok(out)
}

/// Decodes a frame body; trailing bytes are an error.
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, CodecError> {
    let (msg, rest) =
        postcard::take_from_bytes(body).map_err(|e| CodecError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CodecError::Malformed(format!(
            "{} trailing bytes",
            rest.len()
        )));
    }
    Ok(msg)
}

/// Sans-IO decoder: tries to take one frame from the front of `buf`.
/// Returns `Ok(None)` if more bytes are needed, else the message and the
/// number of bytes consumed.
pub fn decode_frame<T: DeserializeOwned>(
    buf: &[u8],
    max: usize,
) -> Result<Option<(T, usize)>, CodecError> {
    let Some(prefix) = buf.get(..4) else {
        return Ok(None);
    };
    let mut len_bytes = [0u8; 4];
    len_bytes.copy_from_slice(prefix);
    let len = u32::from_be_bytes(len_bytes) as usize;
    if len > max {
        return Err(CodecError::Oversized { len, max });
    }
    let Some(body) = buf.get(4..4 + len) else {
        return Ok(None);
    };
    Ok(Some((decode_body(body)?, 4 + len)))
}

/// Reads one frame. `Ok(None)` on a clean end of stream before a frame.
pub async fn read_frame<T, R>(reader: &mut R, max: usize) -> Result<Option<T>, CodecError>
where
    T: DeserializeOwned,
    R: AsyncRead + Unpin,
{
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = reader.read(&mut prefix[got..]).await?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(CodecError::Truncated)
            };
        }
        got += n;
    }
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max {
        return Err(CodecError::Oversized { len, max });
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            CodecError::Truncated
        } else {
            CodecError::Io(e)
        }
    })?;
    decode_body(&body).map(Some)
}

/// Reads one frame, treating end of stream as [`CodecError::Truncated`].
pub async fn expect_frame<T, R>(reader: &mut R, max: usize) -> Result<T, CodecError>
where
    T: DeserializeOwned,
    R: AsyncRead + Unpin,
{
    read_frame(reader, max).await?.ok_or(CodecError::Truncated)
}

/// Writes one frame.
pub async fn write_frame<T, W>(writer: &mut W, msg: &T, max: usize) -> Result<(), CodecError>
where
    T: Serialize,
    W: AsyncWrite + Unpin,
{
    let bytes = encode_frame(msg, max)?;
    writer.write_all(&bytes).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use proptest::prelude::*;

    use super::*;
    use crate::identity::{Identity, NodeId};
    use crate::wire::*;

    fn node_id() -> impl Strategy<Value = NodeId> {
        any::<[u8; 32]>().prop_map(|seed| Identity::from_seed(seed).node_id())
    }

    fn member() -> impl Strategy<Value = MemberWire> {
        (
            node_id(),
            any::<std::net::IpAddr>(),
            any::<u16>(),
            any::<u64>(),
            ".{0,40}",
        )
            .prop_map(|(id, ip, port, generation, name)| MemberWire {
                id,
                // Flow info and scope ids are not part of the wire format.
                addr: SocketAddr::new(ip, port),
                generation,
                name,
            })
    }

    fn record() -> impl Strategy<Value = RecordWire> {
        (
            node_id(),
            "[a-z/]{0,20}",
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..200),
            proptest::collection::vec(any::<u8>(), 0..80),
        )
            .prop_map(|(author, kind, timestamp_ms, body, signature)| RecordWire {
                author,
                kind,
                timestamp_ms,
                body,
                signature,
            })
    }

    fn code() -> impl Strategy<Value = RpcErrorCode> {
        prop_oneof![
            Just(RpcErrorCode::UnknownService),
            Just(RpcErrorCode::UnknownMethod),
            Just(RpcErrorCode::BadRequest),
            Just(RpcErrorCode::Internal),
            Just(RpcErrorCode::Unavailable),
        ]
    }

    fn round_trip<T>(msg: &T)
    where
        T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        let frame = encode_frame(msg, DEFAULT_MAX_FRAME).unwrap();
        let (back, used) = decode_frame::<T>(&frame, DEFAULT_MAX_FRAME)
            .unwrap()
            .unwrap();
        assert_eq!(used, frame.len());
        assert_eq!(&back, msg);
        // Every strict prefix is "need more", never an error or a panic.
        for cut in 0..frame.len() {
            assert!(decode_frame::<T>(&frame[..cut], DEFAULT_MAX_FRAME)
                .unwrap()
                .is_none());
        }
    }

    proptest! {
        #[test]
        fn hello_round_trips(version: u16, proof: [u8; 32], member in member()) {
            round_trip(&Hello { version, proof, member });
        }

        #[test]
        fn header_round_trips(version: u16, k in 0u8..4) {
            let kind = [StreamKind::Rpc, StreamKind::Sync, StreamKind::Push, StreamKind::Gossip][k as usize];
            round_trip(&StreamHeader { version, kind });
        }

        #[test]
        fn rpc_round_trips(service in ".{0,20}", method in ".{0,20}", body: Vec<u8>, code in code(), message in ".{0,30}") {
            round_trip(&RpcRequest { service, method, body: body.clone() });
            round_trip(&RpcResponse::Ok(body));
            round_trip(&RpcResponse::Err { code, message });
        }

        #[test]
        fn sync_round_trips(neg: Vec<u8>, ids: Vec<[u8; 32]>, recs in proptest::collection::vec(record(), 0..4)) {
            round_trip(&SyncMsg::Neg(neg));
            round_trip(&SyncMsg::Want(ids.iter().map(|i| { let mut p = [0u8; 16]; p.copy_from_slice(&i[..16]); p }).collect()));
            round_trip(&SyncMsg::Records(recs));
            round_trip(&SyncMsg::WantDone);
            round_trip(&SyncMsg::Done);
            round_trip(&SyncMsg::Offer(ids.clone()));
            round_trip(&SyncMsg::Take(ids.iter().map(|i| u32::from(i[0])).collect()));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes: Vec<u8>) {
            let _ = decode_frame::<Hello>(&bytes, 4096);
            let _ = decode_frame::<StreamHeader>(&bytes, 4096);
            let _ = decode_frame::<RpcRequest>(&bytes, 4096);
            let _ = decode_frame::<RpcResponse>(&bytes, 4096);
            let _ = decode_frame::<RecordWire>(&bytes, 4096);
            let _ = decode_frame::<SyncMsg>(&bytes, 4096);
            let _ = decode_body::<SyncMsg>(&bytes);
            let _ = decode_body::<Hello>(&bytes);
        }
    }

    #[test]
    fn oversized_frames_are_refused_both_ways() {
        let msg = RpcResponse::Ok(vec![0; 100]);
        assert!(matches!(
            encode_frame(&msg, 50),
            Err(CodecError::Oversized { .. })
        ));
        let frame = encode_frame(&msg, 1000).unwrap();
        assert!(matches!(
            decode_frame::<RpcResponse>(&frame, 50),
            Err(CodecError::Oversized { .. })
        ));
    }

    #[test]
    fn trailing_bytes_are_malformed() {
        let mut body = postcard::to_allocvec(&StreamHeader {
            version: 1,
            kind: StreamKind::Rpc,
        })
        .unwrap();
        body.push(0);
        assert!(matches!(
            decode_body::<StreamHeader>(&body),
            Err(CodecError::Malformed(_))
        ));
    }

    #[test]
    fn invalid_node_id_is_malformed() {
        // Some 32-byte strings are not curve points; they must not decode as a NodeId.
        let bad = (0u8..=255)
            .map(|b| {
                let mut k = [b; 32];
                k[31] &= 0x7f;
                k
            })
            .find(|k| NodeId::from_bytes(*k).is_err())
            .expect("some byte pattern is not a valid point");
        let body = postcard::to_allocvec(&bad).unwrap();
        assert!(decode_body::<NodeId>(&body).is_err());
    }

    #[tokio::test]
    async fn async_reader_reports_truncation_and_clean_eof() {
        let frame = encode_frame(&RpcResponse::Ok(vec![1, 2, 3]), 100).unwrap();
        let mut cut = &frame[..frame.len() - 1];
        assert!(matches!(
            read_frame::<RpcResponse, _>(&mut cut, 100).await,
            Err(CodecError::Truncated)
        ));
        let mut empty: &[u8] = &[];
        assert!(read_frame::<RpcResponse, _>(&mut empty, 100)
            .await
            .unwrap()
            .is_none());
        let mut full = &frame[..];
        assert_eq!(
            read_frame::<RpcResponse, _>(&mut full, 100).await.unwrap(),
            Some(RpcResponse::Ok(vec![1, 2, 3]))
        );
    }
}
