//! `Node::shutdown` owns the HTTP API's task: when it returns, the API's listener and its
//! connections are closed. A client holding `/api/events` open (as the dashboard does)
//! gets a last `shutdown` event and a clean end of the stream; any other stream still
//! open delays shutdown by at most `API_DRAIN`. The node's background tasks (memory sync,
//! swarm follower, memory announcer) are owned: none is left when shutdown returns.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use starling_discovery::SwarmSecret;
use starling_node::daemon::API_DRAIN;

mod support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_with_the_api_closed_even_with_a_stream_open() {
    let dir = tempfile::tempdir().unwrap();
    let models = support::tiny_models(dir.path());
    let secret = SwarmSecret::generate().to_string();
    let node = support::start(
        support::loopback_config(dir.path(), "ada", &secret, None),
        &models,
    )
    .await;
    let addr = node.api_addr;

    // A client that subscribes to the node's events and keeps the stream open.
    let mut events = std::net::TcpStream::connect(addr).unwrap();
    write!(
        events,
        "GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    events
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut head = [0u8; 12];
    events.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200", "the events stream is open");

    // The memory sync, the swarm follower and the memory announcer.
    assert!(
        node.background_tasks() >= 3,
        "{} background tasks",
        node.background_tasks()
    );
    let started = Instant::now();
    node.shutdown().await;
    assert_eq!(
        node.background_tasks(),
        0,
        "background tasks outlived shutdown"
    );
    assert_eq!(
        node.aborted_at_shutdown(),
        0,
        "background tasks ignored the node's cancel and were aborted"
    );
    let took = started.elapsed();
    assert!(
        took < API_DRAIN + Duration::from_secs(5),
        "shutdown took {took:?} with a stream open"
    );
    // Returned: the stream it held was ended by the node, not cut: a last `shutdown`
    // event, then the chunked body's terminating empty chunk, then the connection closed.
    events
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut rest = Vec::new();
    let end = events.read_to_end(&mut rest);
    assert!(
        end.is_ok(),
        "the events stream is still open after shutdown: {end:?}"
    );
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.contains("event: shutdown\n"),
        "no shutdown event: {rest:?}"
    );
    assert!(
        rest.ends_with("\r\n0\r\n\r\n"),
        "the stream was cut, not ended: {rest:?}"
    );
    // ... and nothing listens on the API's address any more.
    let after = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2));
    assert!(
        after.is_err(),
        "the API still accepts connections after shutdown"
    );
}
