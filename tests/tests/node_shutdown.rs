//! `Node::shutdown` owns the HTTP API's task: when it returns, the API's listener and its
//! connections are closed, and a client holding a stream open (as the dashboard holds
//! `/api/events`) delays it by at most `API_DRAIN`.

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

    let started = Instant::now();
    node.shutdown().await;
    let took = started.elapsed();
    assert!(
        took < API_DRAIN + Duration::from_secs(5),
        "shutdown took {took:?} with a stream open"
    );
    // Returned: the stream it held is closed (read to its end, not timed out) ...
    events
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut rest = Vec::new();
    let end = events.read_to_end(&mut rest);
    assert!(
        end.is_ok()
            || end
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the events stream is still open after shutdown: {end:?}"
    );
    // ... and nothing listens on the API's address any more.
    let after = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2));
    assert!(
        after.is_err(),
        "the API still accepts connections after shutdown"
    );
}
