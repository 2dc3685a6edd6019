//! A memory bound for untrusted work that cannot be given one any other way.
//!
//! A chat template comes with the model file, and minijinja bounds its instructions (fuel)
//! but not its memory: `{% set ns.s = ns.s ~ ns.s %}` forty times in a loop needs a
//! terabyte after a few hundred instructions, and an allocation that fails aborts the
//! process. Rust gives no way to fail an allocation softly, so the bound works one level
//! below: [`Budgeted`], the binary's global allocator, counts what a thread running under
//! [`run_bounded`] allocates, and an allocation past the thread's limit never reaches the
//! system allocator. That thread stops for good instead (it parks forever, holding at most
//! its limit) and the caller gets [`Bounded::Exceeded`]: the node keeps running and the request gets
//! a clear error. The caller must never again use what that thread was working on (it may
//! have stopped half-way through an update); `chat::ChatTemplate` refuses the template from
//! then on, so a hostile template costs one stopped thread.
//!
//! Threads not under [`run_bounded`] pay one thread-local read per allocation. Where the
//! binary does not install [`Budgeted`] (library tests of other crates), [`run_bounded`]
//! still runs the work on its own thread, unbounded; [`installed`] says which.

// A global allocator is an unsafe trait, and the stopped thread's notice reads a raw
// pointer; each use says why it holds.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// The global allocator that makes [`run_bounded`] bound memory: the system allocator,
/// with a count of live bytes on threads that run under a limit. Install it in a binary
/// with `#[global_allocator] static ALLOC: Budgeted = Budgeted;`.
pub struct Budgeted;

/// Whether [`Budgeted`] is the global allocator (it sets this on its first allocation).
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// `usize::MAX`: this thread is not counted.
const UNBOUNDED: usize = usize::MAX;

thread_local! {
    // Const-initialised cells with no destructor: the allocator may read them at any
    // point of a thread's life, including its teardown, and reading them never allocates.
    static LIMIT: Cell<usize> = const { Cell::new(UNBOUNDED) };
    static USED: Cell<usize> = const { Cell::new(0) };
    static WATCH: Cell<*const Watch> = const { Cell::new(std::ptr::null()) };
}

/// Why work under [`run_bounded`] gave no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Bounded {
    /// It went past its memory limit and was stopped.
    #[error("needs more than {limit} bytes of memory")]
    Exceeded {
        /// The limit, in bytes.
        limit: usize,
    },
    /// It did not finish within the time given (it runs on, or waits on a lock held by
    /// a stopped thread; either way its thread is given up).
    #[error("did not finish within {0:?}")]
    TimedOut(std::time::Duration),
    /// No thread could be started for it (a process at its thread limit); it did not run.
    #[error("no thread for bounded work: {0}")]
    NoThread(String),
}

/// Most bounded threads at work at once: what stopped threads can hold before their callers
/// learn of it is this many limits. (Renders take microseconds; two match the cores of the
/// smallest machines Starling runs on.)
pub const MAX_AT_ONCE: usize = 2;

/// Bounded threads at work now, under [`MAX_AT_ONCE`].
static AT_WORK: Mutex<usize> = Mutex::new(0);
static SLOT_FREED: Condvar = Condvar::new();

/// A place among the [`MAX_AT_ONCE`] bounded threads, given back on drop.
struct Slot;

impl Slot {
    fn take() -> Self {
        let mut n = AT_WORK.lock().unwrap_or_else(PoisonError::into_inner);
        while *n >= MAX_AT_ONCE {
            n = SLOT_FREED.wait(n).unwrap_or_else(PoisonError::into_inner);
        }
        *n += 1;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *AT_WORK.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
        SLOT_FREED.notify_one();
    }
}

/// Runs `f` on this thread without counting what it allocates toward a [`run_bounded`]
/// limit: for trusted code called from bounded work that allocates while holding a
/// process-wide lock (reading an environment variable), where stopping would hold the lock
/// for good. Outside bounded work it just runs `f`.
pub fn exempt<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            LIMIT.set(self.0);
        }
    }
    let _restore = Restore(LIMIT.replace(UNBOUNDED));
    f()
}

/// How a bounded thread ended, for the caller waiting on it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    Running,
    Finished,
    Exceeded,
}

struct Watch {
    end: Mutex<End>,
    changed: Condvar,
}

impl Watch {
    fn set(&self, end: End) {
        *self.end.lock().unwrap_or_else(PoisonError::into_inner) = end;
        self.changed.notify_all();
    }
}

/// Whether [`Budgeted`] is the global allocator, so that [`run_bounded`] bounds memory.
pub fn installed() -> bool {
    if !INSTALLED.load(Ordering::Relaxed) {
        // One allocation settles it: Budgeted marks itself on its first.
        drop(std::hint::black_box(Box::new(0u8)));
    }
    INSTALLED.load(Ordering::Relaxed)
}

/// Runs `load` with every large allocation in pages of its own, then gives the memory the
/// C allocator holds free back to the system.
///
/// Why: glibc serves a request from its heap unless it is above the `mmap` threshold, and
/// raises that threshold to the size of any mapped block it frees. Loading a model reads
/// each tensor into a temporary buffer before repacking it, so after the first large
/// tensor every later temporary comes from the heap, and the heap's freed pages stay
/// resident; worse, the key/value cache (`calloc`ed, most of it never written in a short
/// conversation) then reuses those pages and has them cleared, which makes them resident
/// too. With the threshold held at glibc's default of 128 KiB during the load, temporaries
/// go back to the system when freed and the cache's unused pages are never touched; after
/// it the threshold is fixed at 32 MiB (glibc's own ceiling), so buffers allocated per
/// token (a vocabulary's logits) keep coming from the heap without a system call. Peak RSS
/// of `starling generate` with the 135M model for 128 tokens (debug build): 148 MB before,
/// 138 MB with this (llama.cpp's llama-simple: 128 MB). A plain call of `load` on other C
/// libraries.
pub fn load_in_own_pages<T>(load: impl FnOnce() -> T) -> T {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets glibc's tuning parameters; it takes no pointers.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
    let out = load();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: as above; malloc_trim only walks glibc's own free lists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::malloc_trim(0);
    }
    out
}

fn mark_installed() {
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
}

/// Counts `size` more bytes on this thread; false when that would pass its limit.
fn charge(size: usize) -> bool {
    let limit = LIMIT.get();
    if limit == UNBOUNDED {
        return true;
    }
    let used = USED.get().saturating_add(size);
    // A panicking thread is on its way out through `run_bounded`'s catch; what the panic
    // hook allocates (a backtrace) is let through, as stopping there would stop the thread
    // holding the hook's locks (stderr, a test's output capture).
    if used > limit && !std::thread::panicking() {
        return false;
    }
    USED.set(used);
    true
}

fn credit(size: usize) {
    if LIMIT.get() != UNBOUNDED {
        USED.set(USED.get().saturating_sub(size));
    }
}

/// This thread went past its limit: tell the caller, then stop for good (never return to
/// the work, never unwind through it: an allocator may not unwind).
fn stall() -> ! {
    // Whatever the rest of this function allocates (the thread handle `park` makes on
    // first use) is not counted.
    LIMIT.set(UNBOUNDED);
    let watch = WATCH.get();
    if !watch.is_null() {
        // SAFETY: `run_bounded`'s thread keeps the `Arc<Watch>` this points into alive
        // for as long as it runs, and this thread never returns from here.
        unsafe { &*watch }.set(End::Exceeded);
    }
    loop {
        std::thread::park();
    }
}

/// A new block of `size` bytes from `get`, counted on this thread; the count is undone
/// when the system has none.
#[inline(always)]
fn counted(size: usize, get: impl FnOnce() -> *mut u8) -> *mut u8 {
    mark_installed();
    if !charge(size) {
        stall();
    }
    let p = get();
    if p.is_null() {
        credit(size);
    }
    p
}

// SAFETY: every method hands the request to `System` unchanged (or never returns); the
// count is bookkeeping on thread-local cells that never allocate.
unsafe impl GlobalAlloc for Budgeted {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        counted(layout.size(), || unsafe { System.alloc(layout) })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        counted(layout.size(), || unsafe { System.alloc_zeroed(layout) })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        credit(layout.size());
        // SAFETY: `ptr` came from `System` through this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            if !charge(new_size - layout.size()) {
                stall();
            }
        } else {
            credit(layout.size() - new_size);
        }
        // SAFETY: as `dealloc`, and the caller's contract for `realloc`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            // The old block stays as it was: undo the count.
            if new_size > layout.size() {
                credit(new_size - layout.size());
            } else {
                let _ = charge(layout.size() - new_size);
            }
        }
        p
    }
}

/// Stack of a bounded thread: as much as a main thread has, for deep template recursion.
const STACK_BYTES: usize = 8 << 20;

/// Runs `work` on a thread of its own whose live allocations may total at most `limit`
/// bytes, and waits for it. Past the limit the thread stops where it is and this returns
/// [`Bounded::Exceeded`]; a panic in `work` is re-raised here. When [`Budgeted`] is not the global
/// allocator the work runs the same way without the bound. Memory the work frees that was
/// allocated before it started counts in its favour, so the limit is approximate by the
/// size of what `work` owns on entry.
pub fn run_bounded<T: Send + 'static>(
    limit: usize,
    time: std::time::Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Bounded> {
    let _slot = Slot::take();
    let watch = Arc::new(Watch {
        end: Mutex::new(End::Running),
        changed: Condvar::new(),
    });
    let slot = Arc::new(Mutex::new(None));
    let (their_watch, their_slot) = (watch.clone(), slot.clone());
    let body = move || {
        WATCH.set(Arc::as_ptr(&their_watch));
        USED.set(0);
        LIMIT.set(limit);
        let out = std::panic::catch_unwind(AssertUnwindSafe(work));
        LIMIT.set(UNBOUNDED);
        WATCH.set(std::ptr::null());
        *their_slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(out);
        their_watch.set(End::Finished);
    };
    let thread = match std::thread::Builder::new()
        .name("bounded".into())
        .stack_size(STACK_BYTES)
        .spawn(body)
    {
        Ok(thread) => thread,
        // No thread to be had: the work cannot run bounded, and running it unbounded here
        // is what the bound exists to avoid.
        Err(e) => return Err(Bounded::NoThread(e.to_string())),
    };
    let end = watch.end.lock().unwrap_or_else(PoisonError::into_inner);
    let (end, _) = watch
        .changed
        .wait_timeout_while(end, time, |e| *e == End::Running)
        .unwrap_or_else(PoisonError::into_inner);
    let ended = *end;
    drop(end);
    if ended == End::Running {
        // Given up: the thread is detached with its handle.
        return Err(Bounded::TimedOut(time));
    }
    if ended == End::Exceeded {
        // The thread is parked for good; dropping its handle detaches it.
        return Err(Bounded::Exceeded { limit });
    }
    let _ = thread.join();
    let out = slot
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .expect("a finished bounded thread leaves its result");
    match out {
        Ok(value) => Ok(value),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    // The crate's test binary installs `Budgeted` (lib.rs), so these run with the bound.

    const SECOND: std::time::Duration = std::time::Duration::from_secs(1);

    #[test]
    fn work_within_its_limit_returns_its_value() {
        assert!(installed());
        let got = run_bounded(1 << 20, SECOND, || vec![7u8; 100_000].len()).unwrap();
        assert_eq!(got, 100_000);
        // Memory freed along the way does not count: many small rounds fit a small limit.
        let got = run_bounded(1 << 20, SECOND, || {
            (0..1000)
                .map(|i| vec![i as u8; 10_000].len())
                .sum::<usize>()
        })
        .unwrap();
        assert_eq!(got, 10_000_000);
    }

    #[test]
    fn work_past_its_limit_is_stopped_and_the_process_goes_on() {
        // Doubling a string: a terabyte within a few dozen steps, were it allowed.
        let err = run_bounded(64 << 20, SECOND, || {
            let mut s = String::from("x");
            for _ in 0..40 {
                s = s.clone() + &s;
            }
            s.len()
        })
        .unwrap_err();
        assert_eq!(err, Bounded::Exceeded { limit: 64 << 20 });
        // One allocation far past the limit never reaches the system allocator.
        let err = run_bounded(64 << 20, SECOND, || {
            Vec::<u8>::with_capacity(1 << 40).capacity()
        });
        assert!(err.is_err());
        // This thread is unbounded and unaffected, and later bounded work runs.
        let big = vec![1u8; 128 << 20];
        assert_eq!(big.len(), 128 << 20);
        assert_eq!(run_bounded(1 << 20, SECOND, || 2 + 2), Ok(4));
    }

    #[test]
    fn work_past_its_time_is_given_up_and_exempt_work_is_not_counted() {
        let err = run_bounded(1 << 20, std::time::Duration::from_millis(50), || {
            std::thread::sleep(std::time::Duration::from_secs(2));
        });
        assert!(matches!(err, Err(Bounded::TimedOut(_))), "{err:?}");
        // Exempt allocations pass a limit they are far above; counting resumes after.
        let got = run_bounded(1 << 20, SECOND, || {
            let big = exempt(|| vec![1u8; 8 << 20]);
            big.len()
        });
        assert_eq!(got, Ok(8 << 20));
        let err = run_bounded(1 << 20, SECOND, || {
            let _exempt = exempt(|| vec![1u8; 8 << 20]);
            vec![1u8; 4 << 20].len()
        });
        assert!(matches!(err, Err(Bounded::Exceeded { .. })), "{err:?}");
    }

    #[test]
    #[should_panic(expected = "bounded work panicked")]
    fn a_panic_in_the_work_reaches_the_caller() {
        let _ = run_bounded(1 << 20, SECOND, || -> usize {
            panic!("bounded work panicked")
        });
    }
}
