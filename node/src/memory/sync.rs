//! Feeding the memory book from the swarm's record store and record events.

use std::time::Duration;

use starling_discovery::{RecordId, Swarm, SwarmEvent};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::book::MemoryBook;
use super::record::MEMORY_KIND;

/// Most records ingested in one batch.
const BATCH: usize = 256;

/// Ingests every stored memory record, then new ones as their events arrive, batching the
/// events that are already queued. After a lagged event stream it re-reads the store.
pub async fn follow(book: MemoryBook, swarm: Swarm, cancel: CancellationToken) {
    let mut rx = swarm.events();
    catch_up(&book, &swarm).await;
    loop {
        let first = tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            ev = rx.recv() => ev,
        };
        let mut ids: Vec<RecordId> = Vec::new();
        let mut lagged = false;
        let mut push = |ev: Result<SwarmEvent, RecvError>, ids: &mut Vec<RecordId>| match ev {
            Ok(SwarmEvent::Record { id, kind, .. }) if kind == MEMORY_KIND => {
                ids.push(id);
                true
            }
            Ok(_) => true,
            Err(RecvError::Lagged(n)) => {
                tracing::warn!(
                    missed = n,
                    "memory book fell behind; re-reading the records"
                );
                lagged = true;
                true
            }
            Err(RecvError::Closed) => false,
        };
        if !push(first, &mut ids) {
            break;
        }
        while ids.len() < BATCH {
            match rx.try_recv() {
                Ok(ev) => {
                    push(Ok(ev), &mut ids);
                }
                Err(tokio::sync::broadcast::error::TryRecvError::Lagged(n)) => {
                    push(Err(RecvError::Lagged(n)), &mut ids);
                }
                Err(_) => break,
            }
        }
        if lagged {
            catch_up(&book, &swarm).await;
            continue;
        }
        if ids.is_empty() {
            continue;
        }
        let records: Vec<_> = ids
            .iter()
            .filter_map(|id| match swarm.record(id) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read a memory record");
                    None
                }
            })
            .collect();
        if let Err(e) = book.ingest_records(&records).await {
            tracing::warn!(error = %e, "cannot ingest memory records");
            // A transient store/embedder failure: the records stay in the swarm store and
            // are picked up by the next catch-up.
            tokio::time::sleep(Duration::from_millis(200)).await;
            catch_up(&book, &swarm).await;
        }
    }
}

/// Ingests every memory record the swarm holds (known ones are skipped cheaply).
pub async fn catch_up(book: &MemoryBook, swarm: &Swarm) {
    match swarm.records(MEMORY_KIND) {
        Ok(all) => {
            for chunk in all.chunks(BATCH * 4) {
                match book.ingest_records(chunk).await {
                    Ok(n) if n > 0 => tracing::debug!(added = n, "memories caught up"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "cannot ingest memory records"),
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot list memory records"),
    }
}
