//! Recycled buffers of f32 and of bytes (uint8 and int8). The kernels' large outputs and work
//! buffers come from here and return here once the host has copied a kernel's outputs, so a run
//! does not hand megabytes back to the allocator (and the OS) after every operator only to fault
//! them in again for the next: a quantized model's activations are bytes, and faulting in its
//! outputs cost more than some of its kernels. Per thread (a program runs on the caller's thread
//! or, with intra-op threads, on one of its pool's), bounded in count and in bytes over all
//! three kinds.

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::thread::LocalKey;

use crate::error::{OpError, OpResult};

/// Buffers below this many bytes are left to the allocator.
const MIN_BYTES: usize = 64 << 10;
const MAX_BUFFERS: usize = 24;
/// Byte buffers of each kind: a quantized model's activations are a quarter of a float one's,
/// and fewer of them do.
const MAX_BYTE_BUFFERS: usize = 6;
const MAX_BYTES: usize = 512 << 20;

type Free<T> = RefCell<Vec<Vec<T>>>;

thread_local! {
    static F32: Free<f32> = const { RefCell::new(Vec::new()) };
    static U8: Free<u8> = const { RefCell::new(Vec::new()) };
    static I8: Free<i8> = const { RefCell::new(Vec::new()) };
}

/// An element type with a pool of its own.
pub trait Pooled: Copy + 'static {
    fn free() -> &'static LocalKey<Free<Self>>;
}

impl Pooled for f32 {
    fn free() -> &'static LocalKey<Free<f32>> {
        &F32
    }
}

impl Pooled for u8 {
    fn free() -> &'static LocalKey<Free<u8>> {
        &U8
    }
}

impl Pooled for i8 {
    fn free() -> &'static LocalKey<Free<i8>> {
        &I8
    }
}

/// The bytes one pool holds.
fn held<T: Pooled>() -> usize {
    T::free().with(|f| f.borrow().iter().map(|b| b.capacity()).sum::<usize>()) * size_of::<T>()
}

/// A new vector with room for `len` elements, or an error (not an abort) when the allocator
/// refuses: an address-space or container limit below the tensor limit.
pub fn reserve<T>(len: usize) -> OpResult<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        OpError(format!(
            "cannot allocate {} bytes: the memory is not there (an address-space or container \
             limit)",
            len.saturating_mul(size_of::<T>())
        ))
    })?;
    Ok(v)
}

/// An empty vector with room for `len` elements: the smallest free buffer that fits (and is not
/// more than twice too big), else a new one; an error when the memory is not there.
pub fn take<T: Pooled>(len: usize) -> OpResult<Vec<T>> {
    if len * size_of::<T>() >= MIN_BYTES {
        let found = T::free().with(|f| {
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
            return Ok(v);
        }
        // A miss: a buffer of another kind that would have fitted goes back to the allocator
        // first, which can hand its memory out again, so that pools of two kinds do not hold
        // what one of them alone would (a model turning bytes into floats and back).
        let bytes = len * size_of::<T>();
        if TypeId::of::<T>() != TypeId::of::<f32>() {
            drop_one::<f32>(bytes);
        }
        if TypeId::of::<T>() != TypeId::of::<u8>() {
            drop_one::<u8>(bytes);
        }
        if TypeId::of::<T>() != TypeId::of::<i8>() {
            drop_one::<i8>(bytes);
        }
    }
    reserve(len)
}

/// Frees the smallest pooled buffer of `U` with room for `bytes` (and not more than twice that).
fn drop_one<U: Pooled>(bytes: usize) {
    let fits = |v: &Vec<U>| {
        let b = v.capacity() * size_of::<U>();
        b >= bytes && b <= 2 * bytes
    };
    let freed = U::free().with(|f| {
        let mut f = f.borrow_mut();
        let best = (0..f.len())
            .filter(|&i| fits(&f[i]))
            .min_by_key(|&i| f[i].capacity());
        best.map(|i| f.swap_remove(i))
    });
    drop(freed);
}

/// [`take`] for an element type known only as a type parameter (a new vector when it has no
/// pool).
pub fn take_any<T: 'static>(len: usize) -> OpResult<Vec<T>> {
    fn cast<A: 'static, T: 'static>(v: Vec<A>) -> Option<Vec<T>> {
        let v: Box<dyn Any> = Box::new(v);
        v.downcast::<Vec<T>>().ok().map(|v| *v)
    }
    let id = TypeId::of::<T>();
    let pooled = if id == TypeId::of::<f32>() {
        cast(take::<f32>(len)?)
    } else if id == TypeId::of::<u8>() {
        cast(take::<u8>(len)?)
    } else if id == TypeId::of::<i8>() {
        cast(take::<i8>(len)?)
    } else {
        None
    };
    match pooled {
        Some(v) => Ok(v),
        None => reserve(len),
    }
}

/// `len` zeros, in a recycled buffer when one fits; an error when the memory is not there.
pub fn zeros<T: Pooled + Default>(len: usize) -> OpResult<Vec<T>> {
    let mut v = take(len)?;
    v.resize(len, T::default());
    Ok(v)
}

/// Returns a buffer for reuse (dropped when it is small or the pools are full).
pub fn give<T: Pooled>(v: Vec<T>) {
    if v.capacity() * size_of::<T>() < MIN_BYTES {
        return;
    }
    let bytes = held::<f32>() + held::<u8>() + held::<i8>();
    T::free().with(|f| {
        let mut f = f.borrow_mut();
        let most = if size_of::<T>() == 1 {
            MAX_BYTE_BUFFERS
        } else {
            MAX_BUFFERS
        };
        if f.len() < most && bytes + v.capacity() * size_of::<T>() <= MAX_BYTES {
            f.push(v);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_by_size() {
        const MIN_LEN: usize = MIN_BYTES / 4;
        let mut v = zeros::<f32>(MIN_LEN * 2).unwrap();
        v[0] = 3.0;
        let p = v.as_ptr();
        give(v);
        let again = take::<f32>(MIN_LEN * 2 - 5).unwrap();
        assert!(again.is_empty() && again.capacity() >= MIN_LEN * 2 - 5);
        assert_eq!(again.as_ptr(), p);
        give(again);
        // Far too big for a small request: a fresh buffer.
        let small = take::<f32>(MIN_LEN / 2).unwrap();
        assert_ne!(small.as_ptr(), p);
        let z = zeros::<f32>(MIN_LEN * 2).unwrap();
        assert!(z.iter().all(|&x| x == 0.0));
    }

    /// Bytes have pools of their own, reached through the element type alone; a request that
    /// misses its own pool frees a buffer of another kind that would have fitted.
    #[test]
    fn byte_buffers_are_reused_and_kept_apart_by_type() {
        let mut v = zeros::<u8>(MIN_BYTES).unwrap();
        v[0] = 7;
        let p = v.as_ptr();
        give(v);
        assert!(held::<u8>() >= MIN_BYTES);
        let again = take_any::<u8>(MIN_BYTES).unwrap();
        assert_eq!(again.as_ptr(), p);
        give(again);
        let other = take_any::<i8>(MIN_BYTES).unwrap();
        assert!(other.is_empty() && other.capacity() >= MIN_BYTES);
        assert_eq!(
            held::<u8>(),
            0,
            "the uint8 buffer went back to the allocator"
        );
        assert!(take_any::<i64>(MIN_BYTES).unwrap().capacity() >= MIN_BYTES / 8);
    }

    #[test]
    fn a_buffer_the_allocator_refuses_is_an_error() {
        let e = reserve::<u64>(usize::MAX / 16).unwrap_err();
        assert!(e.0.contains("cannot allocate"), "{}", e.0);
        assert!(take::<f32>(usize::MAX / 8).is_err());
    }
}
