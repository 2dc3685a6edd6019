//! Weight buffers on transparent huge pages.
//!
//! Decode streams every weight byte once a token: 0.8 GB a token at 1B scale. On 4 KiB pages
//! that is 200,000 page-table entries a token, more than the second-level TLB holds by two
//! orders, so the streaming loads also walk page tables. Most Linux systems leave
//! transparent huge pages to `madvise` (`/sys/kernel/mm/transparent_hugepage/enabled`), and
//! glibc asks for none: a matrix came either from its heap (already touched pages, below its
//! 32 MiB `mmap` threshold) or, while the engine loads (`budget::load_in_own_pages`), from a
//! mapping of its own that nobody advised, so it sat on 4 KiB pages. [`Pages`] maps a large
//! buffer itself, 2 MiB aligned, and advises its whole 2 MiB pages as huge before any is
//! touched; its tail (less than 2 MiB) stays on small pages, so nothing is rounded up in
//! memory. Measured in `benches/RESULTS.md` (issue 14, 2026-12-07). Where the system says
//! `never`, or off Linux, the advice does nothing and the buffer is an ordinary mapping or
//! `Vec`.

// mmap, madvise and munmap of the buffer's own memory.
#![allow(unsafe_code)]

use std::ops::{Deref, DerefMut};

use half::f16;

/// The size of a transparent huge page on x86-64 and on aarch64 with 4 KiB base pages.
const HUGE: usize = 2 << 20;

/// Where a mapped buffer's first value lies past the 2 MiB boundary: 16 bytes, where glibc's
/// own mappings put a large buffer (after its chunk header), the placement the kernels were
/// measured and tuned with. With the values starting on the boundary itself, Gemma 3 270M's
/// decode was slower and bimodal (best of three, four rounds alternating, AMD EPYC Zen 4,
/// 2 threads: 89.5-105.7 tok/s against 106.2-110.7 at 16 bytes, 100.3-107.0 before huge
/// pages); the 1B-class files did not care. Kept a multiple of every element's alignment.
const OFFSET: usize = 16;

/// Element types whose all-zero bit pattern is the value zero (a fresh anonymous mapping
/// reads as zeros).
pub(crate) trait ZeroBits: Copy {}
impl ZeroBits for u8 {}
impl ZeroBits for f16 {}

/// A fixed-length buffer of `T`, zeroed when made; large ones on huge pages where the
/// system allows (see the module's notes).
pub(crate) struct Pages<T: ZeroBits> {
    inner: Inner<T>,
}

enum Inner<T> {
    Heap(Vec<T>),
    #[cfg(target_os = "linux")]
    Mapped {
        /// The first value, [`OFFSET`] bytes into the mapping.
        ptr: std::ptr::NonNull<T>,
        len: usize,
        /// The mapping: its start (2 MiB aligned) and length (a whole number of base pages).
        map: std::ptr::NonNull<u8>,
        bytes: usize,
    },
}

// SAFETY: a `Mapped` buffer is owned memory like a `Vec`'s: no other handle to it exists.
unsafe impl<T: ZeroBits + Send> Send for Pages<T> {}
// SAFETY: shared access only reads through `&[T]`.
unsafe impl<T: ZeroBits + Sync> Sync for Pages<T> {}

impl<T: ZeroBits> Pages<T> {
    /// `len` zeros.
    pub(crate) fn zeroed(len: usize) -> Self {
        #[cfg(target_os = "linux")]
        if let Some(inner) = Self::map(len) {
            return Self { inner };
        }
        // SAFETY: `ZeroBits` types are valid as all-zero bytes.
        Self {
            inner: Inner::Heap(vec![unsafe { std::mem::zeroed() }; len]),
        }
    }

    /// The parts one after another.
    pub(crate) fn concat(parts: &[&[T]]) -> Self {
        let mut all = Self::zeroed(parts.iter().map(|p| p.len()).sum());
        let mut at = 0;
        for p in parts {
            all[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        all
    }

    /// A buffer of at least one whole huge page, mapped 2 MiB aligned with its whole huge
    /// pages advised; `None` for a smaller one or when the mapping fails (the caller falls
    /// back to the heap).
    #[cfg(target_os = "linux")]
    fn map(len: usize) -> Option<Inner<T>> {
        let want = len.checked_mul(std::mem::size_of::<T>())?;
        if want < HUGE {
            return None;
        }
        // SAFETY: sysconf reads a constant of the system.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|&p| p > 0 && HUGE.is_multiple_of(p))?;
        let bytes = (want + OFFSET).next_multiple_of(page);
        let span = bytes.checked_add(HUGE)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let base = raw as usize;
        let start = base.next_multiple_of(HUGE);
        // SAFETY: the head and the tail unmapped here lie inside the mapping just made and
        // outside [start, start + bytes), which is all that is kept; the advice covers only
        // whole huge pages of the kept range and changes no contents.
        unsafe {
            if start > base {
                libc::munmap(raw, start - base);
            }
            let end = start + bytes;
            if base + span > end {
                libc::munmap(end as *mut libc::c_void, base + span - end);
            }
            libc::madvise(
                start as *mut libc::c_void,
                bytes / HUGE * HUGE,
                libc::MADV_HUGEPAGE,
            );
        }
        let ptr = std::ptr::NonNull::new((start + OFFSET) as *mut T)?;
        let map = std::ptr::NonNull::new(start as *mut u8)?;
        Some(Inner::Mapped {
            ptr,
            len,
            map,
            bytes,
        })
    }
}

impl<T: ZeroBits> Deref for Pages<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.inner {
            Inner::Heap(v) => v,
            // SAFETY: `len` zero-initialised values of `T` live at `ptr` while `self` does.
            #[cfg(target_os = "linux")]
            Inner::Mapped { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), *len)
            },
        }
    }
}

impl<T: ZeroBits> DerefMut for Pages<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.inner {
            Inner::Heap(v) => v,
            // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
            #[cfg(target_os = "linux")]
            Inner::Mapped { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), *len)
            },
        }
    }
}

impl<T: ZeroBits> Drop for Pages<T> {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let Inner::Mapped { map, bytes, .. } = self.inner {
            // SAFETY: the range was mapped by `Pages::map` and is unmapped once, here.
            unsafe { libc::munmap(map.as_ptr() as *mut libc::c_void, bytes) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_buffers_start_zeroed_and_keep_what_is_written() {
        for len in [0, 1, 4095, HUGE - 1, HUGE, 3 * HUGE + 12_345] {
            let mut p = Pages::<u8>::zeroed(len);
            assert_eq!(p.len(), len);
            assert!(p.iter().all(|&b| b == 0), "len {len}");
            for (i, b) in p.iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            assert!(p.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        }
        let h = Pages::<f16>::zeroed(HUGE);
        assert!(h.iter().all(|&x| x == f16::ZERO));
    }

    #[test]
    fn large_buffers_start_just_past_a_huge_page_boundary_on_linux() {
        let p = Pages::<u8>::zeroed(HUGE + 1);
        if cfg!(target_os = "linux") {
            assert_eq!(p.as_ptr() as usize % HUGE, OFFSET);
        }
    }

    /// The kernel lists the advice among a mapping's flags (`hg` in `/proc/self/smaps`).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_large_buffer_is_advised_as_huge_pages() {
        // A kernel without transparent huge pages, or with them set to `never`, refuses
        // the advice; the buffer works all the same (the other tests).
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        if thp.is_err() || thp.as_deref().is_ok_and(|s| s.contains("[never]")) {
            return;
        }
        let p = Pages::<u8>::zeroed(3 * HUGE);
        let at = p.as_ptr() as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let mut inside = false;
        let mut flags = None;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((lo, hi)) = range.split_once('-') {
                    if let (Ok(lo), Ok(hi)) =
                        (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                    {
                        inside = lo <= at && at < hi;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(f) = line.strip_prefix("VmFlags:") {
                    flags = Some(f.to_string());
                }
            }
        }
        let flags = flags.expect("the buffer's mapping is listed");
        assert!(
            flags.split_whitespace().any(|f| f == "hg"),
            "flags: {flags}"
        );
        let small = Pages::<u8>::zeroed(4096);
        assert_eq!(small.len(), 4096);
    }

    #[test]
    fn concat_keeps_every_part_in_order() {
        let a: Vec<u8> = (0..HUGE).map(|i| (i % 7) as u8).collect();
        let b = vec![9u8; 1000];
        let c = Pages::concat(&[&a, &b, &[]]);
        assert_eq!(c.len(), HUGE + 1000);
        assert_eq!(&c[..HUGE], &a[..]);
        assert_eq!(&c[HUGE..], &b[..]);
    }
}
