//! Intra-op parallelism: the thread pool a CPU EP instance owns when `intra_op_num_threads` asks
//! for more than one thread, and the helpers kernels split their loops with.
//!
//! A kernel splits work only while its program runs on such a pool ([`Pool::enter`], see
//! `CpuKernel::execute`). Anywhere else (one thread asked for, a program too small to be worth
//! the hand-off, inside a task of a loop already shared out) every helper here runs its loop in
//! order on the calling thread.
//!
//! The pool is a plain fork-join one rather than a work-stealing one: every loop the kernels
//! split is flat, and what costs on a small machine is starting one. The workers spin between
//! the loops of a program, and one hand-off splits a whole GEMM ([`split_gemm`]).

use std::any::Any;
use std::cell::Cell;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

thread_local! {
    /// The pool the program on this thread shares its loops with ([`Pool::enter`]); null
    /// elsewhere, in a task the pool runs, and inside [`serial_below`].
    static CURRENT: Cell<*const Pool> = const { Cell::new(std::ptr::null()) };
}

thread_local! {
    /// Each thread's buffer for [`with_work`].
    static WORK: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// Each thread's buffer for [`with_bytes`].
    static BYTES: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// How long a worker with nothing to do keeps checking for the next loop before it sleeps: the
/// next kernel's loop (or the next run) usually comes within it, and waking a sleeping thread
/// costs tens of microseconds on a virtual machine.
const SPIN: Duration = Duration::from_millis(2);

/// The intra-op threads of one CPU EP instance: `threads - 1` workers, and the thread that runs
/// the program, which takes its share of every loop. After a loop the workers spin for a while
/// ([`SPIN`]), so that the next one starts on them at once, then sleep; a program starting
/// wakes them.
pub struct Pool {
    threads: usize,
    shared: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<()>>,
    /// Held while a loop is shared out: a second program running on the same instance at the
    /// same time runs its loops alone rather than wait.
    busy: Mutex<()>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.threads)
            .finish()
    }
}

struct Shared {
    /// Bumped for every loop published, and to wake the workers when a program starts.
    epoch: AtomicUsize,
    stop: AtomicBool,
    job: Mutex<Option<Arc<Job>>>,
    /// Workers asleep, counted under the lock the wake-up takes.
    sleepers: Mutex<usize>,
    wake: Condvar,
}

/// One parallel loop: `n` calls of `f`, each index handed out once.
struct Job {
    /// The caller's closure with its lifetime erased: called only for an index claimed below
    /// `n`, and the caller returns only once all `n` calls have returned.
    f: *const (dyn Fn(usize) + Sync),
    n: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `f` points to a `Sync` closure, called from several threads only while the caller
// keeps it alive (see `Job::f`); the rest is atomics and locks.
unsafe impl Send for Job {}
// SAFETY: as above.
unsafe impl Sync for Job {}

impl Job {
    /// Claims and runs indices until none is left. A panic in a call is kept for the caller,
    /// and the call counts as done.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            // SAFETY: index `i < n` was claimed here, so the caller is still waiting for this
            // call and the closure is alive.
            let f = unsafe { &*self.f };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(i))) {
                let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(p);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

impl Pool {
    /// A pool for `threads` threads in all (`threads - 1` workers are started).
    pub fn new(threads: usize) -> Result<Pool, String> {
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            job: Mutex::new(None),
            sleepers: Mutex::new(0),
            wake: Condvar::new(),
        });
        let mut pool = Pool {
            threads: threads.max(1),
            shared,
            workers: Vec::new(),
            busy: Mutex::new(()),
        };
        for i in 1..pool.threads {
            let shared = pool.shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("epx-cpu-{i}"))
                .spawn(move || worker(&shared))
                .map_err(|e| format!("cannot start {threads} intra-op threads: {e}"))?;
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Threads in all, the caller's included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` (a program) on this thread with the pool's workers taking their share of
    /// every loop the helpers here split.
    pub fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Leave(*const Pool);
        impl Drop for Leave {
            fn drop(&mut self) {
                CURRENT.set(self.0);
            }
        }
        // Woken now, sleeping workers are spinning by the time the first loop comes.
        self.shared.publish(None);
        let _leave = Leave(CURRENT.replace(self));
        f()
    }

    /// Calls `f(i)` for `i` in `0..n`, shared with the workers; alone when another loop holds
    /// the pool.
    fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let Ok(_busy) = self.busy.try_lock() else {
            return serially(|| (0..n).for_each(f));
        };
        let f: *const (dyn Fn(usize) + Sync + '_) = f;
        // SAFETY: only the lifetime changes. The closure is called only for an index claimed
        // below `n`, and this function returns only after all `n` calls have returned (the
        // wait below), so no call outlives the borrow.
        let f: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        let job = Arc::new(Job {
            f,
            n,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
        });
        self.shared.publish(Some(job.clone()));
        serially(|| job.work());
        let mut spins = 0u32;
        while job.done.load(Ordering::Acquire) < n {
            spins += 1;
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        *self.shared.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let panic = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = panic {
            resume_unwind(p);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.publish(None);
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Shared {
    /// Makes `job` the current loop (when given) and wakes the workers.
    fn publish(&self, job: Option<Arc<Job>>) {
        if let Some(job) = job {
            *self.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
        }
        self.epoch.fetch_add(1, Ordering::SeqCst);
        let sleepers = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
        if *sleepers > 0 {
            self.wake.notify_all();
        }
    }
}

/// A worker: waits for a new epoch (spinning for [`SPIN`], then asleep), then works on the
/// current loop.
fn worker(shared: &Shared) {
    let mut seen = shared.epoch.load(Ordering::SeqCst);
    loop {
        let idle_since = Instant::now();
        let mut spins = 0u32;
        loop {
            let epoch = shared.epoch.load(Ordering::SeqCst);
            if epoch != seen {
                seen = epoch;
                break;
            }
            if shared.stop.load(Ordering::SeqCst) {
                return;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(256) || idle_since.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let mut sleepers = shared.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            *sleepers += 1;
            while shared.epoch.load(Ordering::SeqCst) == seen && !shared.stop.load(Ordering::SeqCst)
            {
                sleepers = shared
                    .wake
                    .wait(sleepers)
                    .unwrap_or_else(|e| e.into_inner());
            }
            *sleepers -= 1;
        }
        let job = shared.job.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(job) = job {
            job.work();
        }
    }
}

/// Runs `f` with the helpers here running their loops in order on this thread.
fn serially<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(*const Pool);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.set(self.0);
        }
    }
    let _restore = Restore(CURRENT.replace(std::ptr::null()));
    f()
}

/// Calls `f` with the pool this thread's program shares its loops with, if any.
fn with_current<R>(f: impl FnOnce(Option<&Pool>) -> R) -> R {
    let p = CURRENT.get();
    // SAFETY: `CURRENT` is non-null only inside `Pool::enter`, which borrows the pool for the
    // whole of the program it runs, and so for the whole of this call made from it.
    f((!p.is_null()).then(|| unsafe { &*p }))
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

/// The threads the running kernel may use: its pool's size while a program runs on a pool
/// ([`Pool::enter`]), else 1.
pub fn threads() -> usize {
    with_current(|p| p.map_or(1, Pool::threads))
}

/// Multiply-adds below which a GEMM stays on one thread: waking another costs more than it
/// saves (about 0.2 ms of work at one core's speed).
pub(crate) const GEMM_PAR_MIN: usize = 4 << 20;

/// Operations (multiply-adds, or element steps) below which a kernel runs all of its loops on
/// the calling thread: about 40 µs at one core's speed, more than sharing them costs.
pub(crate) const PAR_WORK_MIN: usize = 1 << 20;

/// Runs `f` with every helper here in order on the calling thread when `work` (in the units of
/// [`PAR_WORK_MIN`]) is too little to share; else as usual.
pub fn serial_below<R>(work: usize, f: impl FnOnce() -> R) -> R {
    if work >= PAR_WORK_MIN || CURRENT.get().is_null() {
        f()
    } else {
        serially(f)
    }
}

/// Whether a GEMM of `m × k` by `k × n` is worth splitting across the pool: there is one, and
/// the product is large enough.
pub fn gemm_splits(m: usize, k: usize, n: usize) -> bool {
    threads() > 1 && m.saturating_mul(k).saturating_mul(n) >= GEMM_PAR_MIN
}

/// Cuts an `m × n` GEMM output into one block per thread, along its longer side (each piece
/// then packs the whole of the shorter operand, the smaller repeat), and calls `f(rows, cols)`
/// for each across the pool; `f(0..m, 0..n)` on one thread.
pub fn split_gemm(
    m: usize,
    n: usize,
    f: impl Fn(std::ops::Range<usize>, std::ops::Range<usize>) + Sync + Send,
) {
    let t = threads();
    let cut = |len: usize, align: usize| len.div_ceil(t).div_ceil(align) * align;
    if t <= 1 {
        f(0..m, 0..n);
    } else if n >= m {
        let w = cut(n, 16);
        for_each_index(n.div_ceil(w), |i| f(0..m, i * w..((i + 1) * w).min(n)));
    } else {
        let h = cut(m, if m >= 64 * t { 64 } else { 8 });
        for_each_index(m.div_ceil(h), |i| f(i * h..((i + 1) * h).min(m), 0..n));
    }
}

/// Calls `f(i)` for every `i` in `0..n`: across the pool's threads when there are several, in
/// order otherwise.
pub fn for_each_index(n: usize, f: impl Fn(usize) + Sync + Send) {
    with_current(|pool| match pool {
        Some(pool) if n > 1 && pool.threads() > 1 => pool.run(n, &f),
        _ => (0..n).for_each(f),
    })
}

/// Calls `f(i, chunk)` for the `i`-th run of `chunk` elements of `data` (the last may be
/// shorter): across the pool's threads when there are several, in order otherwise.
pub fn for_each_chunk<T: Send>(
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    let chunk = chunk.max(1);
    if data.len() <= chunk || threads() <= 1 {
        data.chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
        return;
    }
    let len = data.len();
    let d = Disjoint::new(data);
    for_each_index(len.div_ceil(chunk), |i| {
        let start = i * chunk;
        // SAFETY: chunk `i` is handed to this call alone.
        f(i, unsafe { d.slice(start, chunk.min(len - start)) });
    });
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

    pub fn push(&mut self, v: T) {
        self.dst[self.len].write(v);
        self.len += 1;
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
        let p = Pool::new(2).unwrap();
        p.enter(|| {
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
        // Outside `enter`, loops run on the calling thread.
        assert_eq!(threads(), 1);
    }

    #[test]
    fn every_index_runs_once_and_panics_reach_the_caller() {
        let p = Pool::new(3).unwrap();
        for round in 0..200 {
            let n = 2 + round % 17;
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            let nested = AtomicUsize::new(0);
            p.enter(|| {
                for_each_index(n, |i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                    // A loop inside a task runs on that task's thread.
                    if threads() == 1 {
                        nested.fetch_add(1, Ordering::Relaxed);
                    }
                });
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            assert_eq!(nested.load(Ordering::Relaxed), n);
        }
        let caught = catch_unwind(AssertUnwindSafe(|| {
            p.enter(|| {
                for_each_index(8, |i| {
                    assert!(i != 5, "task 5 fails");
                })
            })
        }));
        let msg = caught.expect_err("the panic comes back");
        assert_eq!(msg.downcast_ref::<&str>(), Some(&"task 5 fails"));
        // The pool still works after it.
        let sum = AtomicUsize::new(0);
        p.enter(|| for_each_index(100, |i| _ = sum.fetch_add(i, Ordering::Relaxed)));
        assert_eq!(sum.into_inner(), 4950);
    }

    #[test]
    fn programs_on_two_threads_share_one_pool() {
        let p = Arc::new(Pool::new(2).unwrap());
        let runs: Vec<_> = (0..2)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let sum = AtomicUsize::new(0);
                        p.enter(|| for_each_index(64, |i| _ = sum.fetch_add(i, Ordering::Relaxed)));
                        assert_eq!(sum.into_inner(), 2016);
                    }
                })
            })
            .collect();
        for r in runs {
            r.join().unwrap();
        }
    }

    #[test]
    fn gemm_pieces_tile_the_output() {
        let p = Pool::new(2).unwrap();
        for (m, n) in [(1, 1), (10, 300), (300, 10), (129, 129), (1000, 7)] {
            let cells: Vec<AtomicUsize> = (0..m * n).map(|_| AtomicUsize::new(0)).collect();
            p.enter(|| {
                split_gemm(m, n, |rows, cols| {
                    for i in rows {
                        for j in cols.clone() {
                            cells[i * n + j].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            });
            assert!(
                cells.iter().all(|c| c.load(Ordering::Relaxed) == 1),
                "{m}×{n}"
            );
        }
    }
}
