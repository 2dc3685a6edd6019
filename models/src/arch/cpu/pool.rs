//! A persistent worker pool for the CPU transformer, and a slice that several workers write
//! disjoint parts of.
//!
//! A decode step runs about five parallel sections per layer, each only tens of
//! microseconds long, so waking threads through the OS for every section would cost as much
//! as the work. The workers therefore spin on an atomic generation counter while work keeps
//! coming, and only park after a few milliseconds without any, so an idle model burns no CPU.
//!
//! A job is a number of chunks that the calling thread and the workers claim one by one
//! from an atomic counter. A worker that the OS has not scheduled (the machine may have more
//! runnable threads than cores) therefore never holds the job up: the threads that do run
//! take its share, and a worker that arrives after the job has closed skips it.

#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it parks.
const SPIN_BEFORE_PARK: Duration = Duration::from_millis(3);

/// A job as the workers see it: a borrowed closure with its lifetime erased, called as
/// `f(thread, chunk)`. The pool only publishes it while [`Pool::run`] is running, and that
/// waits until no worker is inside it.
type JobPtr = *const (dyn Fn(usize, usize) + Sync);

struct Shared {
    /// Bumped once per job, to wake the workers.
    generation: AtomicUsize,
    /// The current job and its number of chunks; written by the caller while `open` is
    /// false and no worker is `active`, read by workers after they see `open` true.
    job: UnsafeCell<Option<(JobPtr, usize)>>,
    /// Whether the current job still accepts workers.
    open: AtomicBool,
    /// Next chunk to hand out.
    next: AtomicUsize,
    /// Workers between announcing themselves and leaving the job.
    active: AtomicUsize,
    /// Workers that are (about to be) parked.
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    panicked: AtomicBool,
}

// SAFETY: `job` follows the protocol described on the field: the caller writes it only while
// `open` is false and `active` is zero, and publishes it by storing `open = true` (SeqCst);
// a worker reads it only after incrementing `active` and then loading `open == true`, and
// the caller does not return from `run` (which would end the closure's borrow) before it has
// closed the job and seen `active` back at zero. The closure itself is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: see above; the raw pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// A fixed set of worker threads that run one job at a time.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Held by the one [`Pool::run`] in progress: the shared job slot takes one job at a
    /// time, and a pool reachable from several threads (an embedder behind a shared
    /// reference) must not have a second job published over the first.
    running: Mutex<()>,
}

impl Pool {
    /// A pool of `threads` threads in total (the caller plus `threads - 1` workers).
    pub(crate) fn new(threads: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            open: AtomicBool::new(false),
            next: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
        });
        let mut workers = Vec::new();
        for index in 1..threads.max(1) {
            let shared = Arc::clone(&shared);
            workers.push(
                std::thread::Builder::new()
                    .name(format!("starling-cpu-{index}"))
                    .spawn(move || worker(&shared, index))?,
            );
        }
        Ok(Self {
            shared,
            workers,
            running: Mutex::new(()),
        })
    }

    /// Number of threads a job may run on.
    pub(crate) fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Calls `job(thread, chunk)` once for every `chunk` in `0..chunks`, spread over the
    /// calling thread (`thread == 0`) and the workers (`1..threads()`), and returns when all
    /// calls have finished. A panic in any of them is re-raised here.
    pub(crate) fn run(&self, chunks: usize, job: &(dyn Fn(usize, usize) + Sync)) {
        if self.workers.is_empty() || chunks <= 1 {
            for c in 0..chunks {
                job(0, c);
            }
            return;
        }
        // A job that panicked poisons the lock on its way out; the pool itself is fine.
        let _running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let s = &*self.shared;
        // SAFETY: only the lifetime is erased. The pointer is published to the workers below
        // and this function neither returns nor unwinds before the job is closed and no
        // worker is inside it, so it never outlives `job`.
        let ptr: JobPtr = unsafe {
            std::mem::transmute::<
                &(dyn Fn(usize, usize) + Sync),
                &'static (dyn Fn(usize, usize) + Sync),
            >(job)
        };
        // SAFETY: `open` is false and `active` is zero here (the previous `run` ended that
        // way), so no worker reads the cell while it is written.
        unsafe { *s.job.get() = Some((ptr, chunks)) };
        s.next.store(0, Ordering::SeqCst);
        s.open.store(true, Ordering::SeqCst);
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            for w in &self.workers {
                w.thread().unpark();
            }
        }
        let mine = catch_unwind(AssertUnwindSafe(|| loop {
            let c = s.next.fetch_add(1, Ordering::Relaxed);
            if c >= chunks {
                break;
            }
            job(0, c);
        }));
        s.open.store(false, Ordering::SeqCst);
        let mut spins = 0u32;
        while s.active.load(Ordering::SeqCst) != 0 {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                // The worker holding the last chunk may have lost its core.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        if let Err(payload) = mine {
            resume_unwind(payload);
        }
        if s.panicked.swap(false, Ordering::AcqRel) {
            panic!("a CPU inference worker thread panicked");
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for w in &self.workers {
            w.thread().unpark();
        }
        for w in self.workers.drain(..) {
            // A worker that panicked outside a job has nothing left to report.
            let _ = w.join();
        }
    }
}

fn worker(s: &Shared, index: usize) {
    let mut seen = 0usize;
    loop {
        // Wait for a new generation: spin first, then park.
        let mut idle_since: Option<Instant> = None;
        let mut spins = 0u32;
        loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(1024) {
                std::hint::spin_loop();
                continue;
            }
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < SPIN_BEFORE_PARK {
                std::hint::spin_loop();
                continue;
            }
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            // Re-check after announcing ourselves: either the caller's bump is visible here,
            // or the caller sees `sleepers > 0` and unparks us (an early unpark makes the
            // park return at once).
            if s.generation.load(Ordering::SeqCst) == seen && !s.shutdown.load(Ordering::SeqCst) {
                std::thread::park();
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            idle_since = None;
        }
        s.active.fetch_add(1, Ordering::SeqCst);
        if s.open.load(Ordering::SeqCst) {
            // SAFETY: `open` was stored true after the cell was written, and the caller will
            // not write it again before `active` (which includes us) drops to zero.
            if let Some((job, chunks)) = unsafe { *s.job.get() } {
                // SAFETY: as above, the closure outlives our `active` section.
                let f = unsafe { &*job };
                let r = catch_unwind(AssertUnwindSafe(|| loop {
                    let c = s.next.fetch_add(1, Ordering::Relaxed);
                    if c >= chunks {
                        break;
                    }
                    f(index, c);
                }));
                if r.is_err() {
                    s.panicked.store(true, Ordering::Release);
                }
            }
        }
        s.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A mutable slice that several threads of one [`Pool::run`] job write, each to parts no
/// other thread touches during that job.
pub(crate) struct Disjoint<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: `Disjoint` hands out access only through `part`, whose contract forbids
// overlapping concurrent parts; with that, sharing it between threads is like sharing
// disjoint `&mut` sub-slices, which is sound for `T: Send`.
unsafe impl<T: Send> Sync for Disjoint<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for Disjoint<'_, T> {}

impl<'a, T> Disjoint<'a, T> {
    /// Wraps a slice borrowed mutably for the lifetime of the wrapper.
    pub(crate) fn new(slice: &'a mut [T]) -> Self {
        Self {
            ptr: slice.as_mut_ptr(),
            len: slice.len(),
            _borrow: PhantomData,
        }
    }

    /// The elements `start..start + len`.
    ///
    /// # Safety
    /// While the returned slice is alive, no other call may return an overlapping range
    /// (on any thread). Out-of-bounds ranges panic.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn part(&self, start: usize, len: usize) -> &mut [T] {
        assert!(
            start <= self.len && len <= self.len - start,
            "range {start}..{} out of bounds ({})",
            start + len,
            self.len
        );
        // SAFETY: in bounds (checked above); exclusivity is the caller's obligation.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_runs_once() {
        let pool = Pool::new(3).expect("spawn");
        assert_eq!(pool.threads(), 3);
        for chunks in [0usize, 1, 2, 7, 100] {
            for _ in 0..200 {
                let mut out = vec![0usize; chunks];
                let d = Disjoint::new(&mut out);
                pool.run(chunks, &|t, c| {
                    assert!(t < 3);
                    // SAFETY: each chunk index is handed out once.
                    let slot = unsafe { d.part(c, 1) };
                    slot[0] += c + 1;
                });
                assert!(out.iter().enumerate().all(|(i, &v)| v == i + 1));
            }
        }
    }

    #[test]
    fn callers_on_several_threads_each_get_their_own_job() {
        let pool = Pool::new(2).expect("spawn");
        std::thread::scope(|scope| {
            for caller in 1..=3usize {
                let pool = &pool;
                scope.spawn(move || {
                    for _ in 0..300 {
                        let mut out = vec![0usize; 37];
                        let d = Disjoint::new(&mut out);
                        pool.run(37, &|_, c| {
                            // SAFETY: each chunk index is handed out once per job.
                            let slot = unsafe { d.part(c, 1) };
                            slot[0] += caller;
                        });
                        assert!(out.iter().all(|&v| v == caller), "{out:?}");
                    }
                });
            }
        });
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = Pool::new(2).expect("spawn");
        std::thread::sleep(SPIN_BEFORE_PARK * 3);
        let hits = AtomicUsize::new(0);
        pool.run(64, &|_, _| {
            hits.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_micros(50));
        });
        assert_eq!(hits.load(Ordering::Relaxed), 64);
    }

    #[test]
    fn worker_panic_is_reported_and_pool_survives() {
        let pool = Pool::new(2).expect("spawn");
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(16, &|_, c| {
                assert!(c != 5, "boom");
            })
        }));
        assert!(r.is_err());
        let hits = AtomicUsize::new(0);
        pool.run(16, &|_, _| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 16);
    }
}
