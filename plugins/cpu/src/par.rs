//! Intra-op parallelism: the thread pool a CPU EP instance owns when `intra_op_num_threads` asks
//! for more than one thread, and the helpers kernels split their loops with.
//!
//! A kernel splits work only while it runs inside such a pool (see `CpuKernel::execute`). On any
//! other thread (one thread asked for, a program too small to be worth the hand-off, or a rayon
//! pool of the embedding application's) every helper here runs its loop in order on the calling
//! thread.

use std::cell::Cell;
use std::marker::PhantomData;

use rayon::prelude::*;

thread_local! {
    /// Set on the threads of the pools [`pool`] builds.
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

thread_local! {
    /// Each thread's buffer for [`with_work`].
    static WORK: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// Each thread's buffer for [`with_bytes`].
    static BYTES: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Calls `f` with this thread's scratch buffer of `len` elements (contents unspecified), kept
/// between calls.
pub fn with_work<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    with_buffer(&WORK, len, f)
}

/// [`with_work`] for bytes: this thread's byte buffer of `len` elements (contents
/// unspecified), kept between calls.
pub fn with_bytes<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    with_buffer(&BYTES, len, f)
}

/// Calls `f` with the first `len` elements of the thread-local buffer `key` (grown as needed,
/// contents unspecified). The buffer is out of the thread-local while `f` runs, so a nested
/// call (a task the thread picks up while it waits for others) gets a buffer of its own.
pub fn with_buffer<T: Copy + Default, R>(
    key: &'static std::thread::LocalKey<Cell<Vec<T>>>,
    len: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    let mut v = key.take();
    if v.len() < len {
        v.resize(len, T::default());
    }
    let r = f(&mut v[..len]);
    key.set(v);
    r
}

/// A pool of `threads` workers for one CPU EP instance.
pub fn pool(threads: usize) -> Result<rayon::ThreadPool, String> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("epx-cpu-{i}"))
        .start_handler(|_| IN_POOL.set(true))
        .build()
        .map_err(|e| format!("cannot start {threads} intra-op threads: {e}"))
}

/// The threads the running kernel may use: its pool's size inside an epx pool, else 1.
pub fn threads() -> usize {
    if IN_POOL.get() {
        rayon::current_num_threads()
    } else {
        1
    }
}

/// Multiply-adds below which a GEMM stays on one thread: waking another costs more than it
/// saves (about 0.2 ms of work at one core's speed).
pub(crate) const GEMM_PAR_MIN: usize = 4 << 20;

/// Operations (multiply-adds, or element steps) below which a kernel runs all of its loops on
/// the calling thread: about 40 µs at one core's speed, more than the hand-off to a sleeping
/// worker costs.
pub(crate) const PAR_WORK_MIN: usize = 1 << 20;

/// Runs `f` with every helper here in order on the calling thread when `work` (in the units of
/// [`PAR_WORK_MIN`]) is too little to share; else as usual.
pub fn serial_below<R>(work: usize, f: impl FnOnce() -> R) -> R {
    if work >= PAR_WORK_MIN || !IN_POOL.get() {
        return f();
    }
    /// Puts the pool mark back, also when `f` panics.
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_POOL.set(true);
        }
    }
    IN_POOL.set(false);
    let _restore = Restore;
    f()
}

/// How a GEMM of `m × k` by `k × n` may split: across the pool when there is one and the
/// product is large enough to be worth it.
pub fn gemm_parallelism(m: usize, k: usize, n: usize) -> gemm::Parallelism {
    if threads() > 1 && m.saturating_mul(k).saturating_mul(n) >= GEMM_PAR_MIN {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    }
}

/// Calls `f(i)` for every `i` in `0..n`: across the pool's threads when there are several, in
/// order otherwise.
pub fn for_each_index(n: usize, f: impl Fn(usize) + Sync + Send) {
    if n > 1 && threads() > 1 {
        (0..n).into_par_iter().for_each(f);
    } else {
        (0..n).for_each(f);
    }
}

/// Calls `f(i, chunk)` for the `i`-th run of `chunk` elements of `data` (the last may be
/// shorter): across the pool's threads when there are several, in order otherwise.
pub fn for_each_chunk<T: Send>(
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    let chunk = chunk.max(1);
    if data.len() > chunk && threads() > 1 {
        data.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        data.chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    }
}

/// A run of elements to cut `len` into for the pool: `len` itself on one thread, else pieces of
/// at least `min` elements, about four per thread (for balance), in multiples of `align`.
pub fn chunk_len(len: usize, min: usize, align: usize) -> usize {
    let t = threads();
    if t <= 1 {
        return len.max(1);
    }
    let align = align.max(1);
    let want = len.div_ceil(4 * t).max(min);
    want.div_ceil(align) * align
}

/// `buf` (emptied) holding `len` elements built in pieces of `piece` elements, across the pool
/// when there are several threads, without initializing them first: `fill(start, out)` appends
/// elements `start..start + n` of the result to `out`, a [`Filler`] with room for exactly `n`.
///
/// # Panics
/// When a call leaves its piece short (nothing uninitialized is ever read).
pub fn build_vec<T: Copy + Send + Sync>(
    buf: Vec<T>,
    len: usize,
    piece: usize,
    fill: impl Fn(usize, &mut Filler<'_, T>) + Sync + Send,
) -> Vec<T> {
    let mut v = buf;
    v.clear();
    v.reserve(len);
    let piece = piece.max(1);
    let short = std::sync::atomic::AtomicBool::new(false);
    for_each_chunk(&mut v.spare_capacity_mut()[..len], piece, |i, dst| {
        let mut out = Filler { dst, len: 0 };
        fill(i * piece, &mut out);
        if out.len != out.dst.len() {
            short.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    });
    assert!(!short.into_inner(), "build_vec: a piece was left short");
    // SAFETY: a `Filler` initializes its slots in order and counts them; every piece of the
    // first `len` slots was filled to its end (checked above).
    unsafe { v.set_len(len) };
    v
}

/// Appends to one piece of [`build_vec`]'s result, in order; its slots beyond
/// [`len`](Self::len) are not yet written.
pub struct Filler<'a, T> {
    dst: &'a mut [std::mem::MaybeUninit<T>],
    len: usize,
}

impl<T: Copy> Filler<'_, T> {
    /// Elements written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn extend_from_slice(&mut self, src: &[T]) {
        for (d, s) in self.dst[self.len..self.len + src.len()].iter_mut().zip(src) {
            d.write(*s);
        }
        self.len += src.len();
    }

    /// Appends `f(v)` for each element `v` of `src` (a loop that vectorizes when inlined into
    /// a function compiled for the wide instruction set).
    #[inline(always)]
    pub fn extend_map<S: Copy>(&mut self, src: &[S], f: impl Fn(S) -> T) {
        for (d, &s) in self.dst[self.len..self.len + src.len()].iter_mut().zip(src) {
            d.write(f(s));
        }
        self.len += src.len();
    }

    pub fn extend(&mut self, src: impl IntoIterator<Item = T>) {
        for v in src {
            self.dst[self.len].write(v);
            self.len += 1;
        }
    }

    /// Appends `n` elements that `f` writes into the slots it is handed.
    ///
    /// # Safety
    /// `f` initializes every one of the `n` slots.
    pub unsafe fn extend_raw(&mut self, n: usize, f: impl FnOnce(&mut [std::mem::MaybeUninit<T>])) {
        f(&mut self.dst[self.len..self.len + n]);
        self.len += n;
    }

    /// Appends a copy of the already written elements `range`.
    pub fn extend_from_within(&mut self, range: std::ops::Range<usize>) {
        assert!(range.start <= range.end && range.end <= self.len);
        let n = range.len();
        self.dst.copy_within(range, self.len);
        self.len += n;
    }
}

/// A mutable buffer whose elements parallel tasks write at places no two of them share, when the
/// places interleave so that `chunks_mut` cannot express them (the columns of a band of every
/// channel plane, say).
pub struct Disjoint<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: a `Disjoint` is the exclusive borrow of a `[T]`, split among tasks that by the contract
// of `slice` and `as_mut_ptr` never touch the same element; sending or sharing it moves `T`s
// between threads, which `T: Send` allows.
unsafe impl<T: Send> Send for Disjoint<'_, T> {}
// SAFETY: as above: shared access only hands out pointers to disjoint places.
unsafe impl<T: Send> Sync for Disjoint<'_, T> {}

impl<'a, T> Disjoint<'a, T> {
    pub fn new(data: &'a mut [T]) -> Self {
        Disjoint {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            _borrow: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Elements `start..start + len`.
    ///
    /// # Safety
    /// No other slice or pointer from this buffer may reach these elements while the returned
    /// slice is alive.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        assert!(
            start <= self.len && len <= self.len - start,
            "disjoint slice {start}+{len} outside {}",
            self.len
        );
        // SAFETY: in bounds (asserted); exclusive by the caller's contract; the borrow the
        // buffer came from outlives `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }

    /// A pointer to element `start`, for a writer that checks its own extent.
    ///
    /// # Safety
    /// The caller writes only elements no other task reaches, all below [`len`](Self::len).
    pub unsafe fn as_mut_ptr(&self, start: usize) -> *mut T {
        assert!(start <= self.len);
        // SAFETY: `start` is within the buffer (asserted).
        unsafe { self.ptr.add(start) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_split_inside_a_pool_and_not_outside() {
        assert_eq!(threads(), 1);
        assert_eq!(chunk_len(1000, 64, 8), 1000);
        let p = pool(2).unwrap();
        p.install(|| {
            assert_eq!(threads(), 2);
            // Four pieces per thread, at least `min`, rounded to `align`.
            assert_eq!(chunk_len(1000, 64, 8), 128);
            assert_eq!(chunk_len(100, 64, 8), 64);
            let mut v = vec![0usize; 1000];
            for_each_chunk(&mut v, 64, |i, c| c.iter_mut().for_each(|x| *x = i));
            assert!(v.iter().enumerate().all(|(j, &x)| x == j / 64));
            let mut w = vec![0u32; 12];
            let d = Disjoint::new(&mut w);
            // Interleaved places: task i writes every element congruent to i mod 3.
            for_each_index(3, |i| {
                for k in (i..12).step_by(3) {
                    // SAFETY: task i alone reaches the elements congruent to i mod 3.
                    unsafe { d.slice(k, 1)[0] = i as u32 + 1 };
                }
            });
            assert_eq!(w, [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3]);
            // Pieces written in order, one of them partly by copying its own first row.
            let v = build_vec(Vec::new(), 10, 4, |start, out| {
                out.extend([start as u8, start as u8 + 1]);
                if start < 8 {
                    out.extend_from_within(0..2);
                }
            });
            assert_eq!(v, [0, 1, 0, 1, 4, 5, 4, 5, 8, 9]);
            let short = std::panic::catch_unwind(|| {
                build_vec(Vec::new(), 10, 4, |start, out| out.extend([start as u8]))
            });
            assert!(short.is_err(), "a piece left short is refused");
        });
        // A rayon pool that is not epx's does not count.
        let other = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        other.install(|| assert_eq!(threads(), 1));
    }
}
