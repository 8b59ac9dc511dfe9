//! Recycled f32 buffers. The kernels' large outputs and work buffers come from here and return
//! here once the host has copied a kernel's outputs, so a run does not hand megabytes back to
//! the allocator (and the OS) after every operator only to fault them in again for the next.
//! Per thread (a program runs on the caller's thread or, with intra-op threads, on one of its
//! pool's), bounded in count and bytes.

use std::cell::RefCell;

/// Buffers below this many elements are left to the allocator.
const MIN_LEN: usize = 16 << 10;
const MAX_BUFFERS: usize = 24;
const MAX_BYTES: usize = 512 << 20;

thread_local! {
    static FREE: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// An empty vector with room for `len` elements: the smallest free buffer that fits (and is not
/// more than twice too big), else a new one.
pub fn take(len: usize) -> Vec<f32> {
    if len >= MIN_LEN {
        let found = FREE.with(|f| {
            let mut f = f.borrow_mut();
            let best = f
                .iter()
                .enumerate()
                .filter(|(_, v)| v.capacity() >= len && v.capacity() <= 2 * len)
                .min_by_key(|(_, v)| v.capacity())
                .map(|(i, _)| i);
            best.map(|i| f.swap_remove(i))
        });
        if let Some(mut v) = found {
            v.clear();
            return v;
        }
    }
    Vec::with_capacity(len)
}

/// `len` zeros, in a recycled buffer when one fits.
pub fn zeros(len: usize) -> Vec<f32> {
    let mut v = take(len);
    v.resize(len, 0.0);
    v
}

/// Returns a buffer for reuse (dropped when it is small or the pool is full).
pub fn give(v: Vec<f32>) {
    if v.capacity() < MIN_LEN {
        return;
    }
    FREE.with(|f| {
        let mut f = f.borrow_mut();
        let bytes: usize = f.iter().map(|b| b.capacity() * 4).sum();
        if f.len() < MAX_BUFFERS && bytes + v.capacity() * 4 <= MAX_BYTES {
            f.push(v);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_by_size() {
        let mut v = zeros(MIN_LEN * 2);
        v[0] = 3.0;
        let p = v.as_ptr();
        give(v);
        let again = take(MIN_LEN * 2 - 5);
        assert!(again.is_empty() && again.capacity() >= MIN_LEN * 2 - 5);
        assert_eq!(again.as_ptr(), p);
        give(again);
        // Far too big for a small request: a fresh buffer.
        let small = take(MIN_LEN / 2);
        assert_ne!(small.as_ptr(), p);
        let z = zeros(MIN_LEN * 2);
        assert!(z.iter().all(|&x| x == 0.0));
    }
}
