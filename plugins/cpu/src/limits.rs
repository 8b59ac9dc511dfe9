//! Size checks: the largest tensor the CPU EP allocates (shared with the host, which sets it per
//! process and per session), element counts checked against it, and zero-filled buffers reserved
//! fallibly. Level 0: names only [`crate::error`].

use crate::error::{OpError, OpResult};

/// `len` zeros, or an error (instead of an abort) when the memory cannot be had: for sizes a
/// model's attributes or scalar inputs choose.
pub fn zeros_checked<T: Clone + Default>(len: usize, what: &str) -> OpResult<Vec<T>> {
    checked_len(&[len], size_of::<T>()).map_err(|e| OpError(format!("{what}: {}", e.0)))?;
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        OpError(format!(
            "{what} needs {len} elements, more memory than can be allocated"
        ))
    })?;
    v.resize(len, T::default());
    Ok(v)
}

/// How every refusal of a tensor over [`max_tensor_bytes`] ends, so that the EP's boundary can
/// report it as what it is (`OutOfMemory`: the request asked for more than the host allocates),
/// not as a kernel failure.
pub const OVER_LIMIT: &str =
    "allocated for one tensor (EPX_MAX_TENSOR_BYTES; default: the machine's memory)";

/// Whether `message` is a refusal of a tensor over the limit.
pub fn is_over_limit(message: &str) -> bool {
    message.contains(OVER_LIMIT)
}

/// Number of elements of a shape, failing on overflow.
pub fn checked_numel(shape: &[usize]) -> OpResult<usize> {
    let n = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| OpError(format!("shape {shape:?} has too many elements")))?;
    // Counted at 8 bytes an element: the widest form the kernels hold a tensor's values in
    // while computing it (f64, whatever the output type), so that no shape passing this check
    // makes an allocation larger than the limit. Saying so beats an allocator abort.
    let limit = max_tensor_bytes();
    if (n as u64).saturating_mul(8) > limit {
        return Err(OpError(format!(
            "shape {shape:?} has {n} elements, at up to 8 bytes each more than the {limit} \
             bytes allocated for one tensor (EPX_MAX_TENSOR_BYTES; default: the machine's memory)"
        )));
    }
    // An empty tensor with a huge dim ([2^40, 0]) holds nothing, but kernels size tables and
    // loops by its dims (per-index maps, reductions over the empty axis): its non-zero dims are
    // held to the same limit.
    let extent = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
    if n == 0 && extent.is_none_or(|e| e.saturating_mul(8) > limit) {
        return Err(OpError(format!(
            "empty shape {shape:?} has dims whose product is more than the {limit} bytes \
             allocated for one tensor (EPX_MAX_TENSOR_BYTES; default: the machine's memory)"
        )));
    }
    Ok(n)
}

/// Number of elements of a shape whose elements take `elem_bytes` each (a scratch buffer of
/// `f64` or complex values, say), failing on overflow or when the bytes are over the limit.
pub fn checked_len(shape: &[usize], elem_bytes: usize) -> OpResult<usize> {
    let n = checked_numel(shape)?;
    let limit = max_tensor_bytes();
    match n.checked_mul(elem_bytes) {
        Some(b) if b as u64 <= limit => Ok(n),
        _ => Err(OpError(format!(
            "shape {shape:?} of {elem_bytes}-byte elements needs more than the {limit} bytes \
             allocated for one tensor (EPX_MAX_TENSOR_BYTES; default: the machine's memory)"
        ))),
    }
}

/// The largest tensor epx allocates: the limit of the session running on this thread
/// ([`with_max_tensor_bytes`]), else the last [`set_max_tensor_bytes`], else
/// `EPX_MAX_TENSOR_BYTES` when set (a number of bytes), else this machine's physical memory
/// (from `/proc/meminfo`; no limit where that is not there). A bigger tensor is an error naming
/// its shape, never an abort in the allocator.
pub fn max_tensor_bytes() -> u64 {
    use std::sync::atomic::Ordering;
    let scoped = SCOPED_MAX_TENSOR_BYTES.with(std::cell::Cell::get);
    if scoped != 0 {
        return scoped;
    }
    match MAX_TENSOR_BYTES.load(Ordering::Relaxed) {
        0 => {
            let limit = default_max_tensor_bytes();
            // A concurrent `set_max_tensor_bytes` wins over the default.
            let _ =
                MAX_TENSOR_BYTES.compare_exchange(0, limit, Ordering::Relaxed, Ordering::Relaxed);
            MAX_TENSOR_BYTES.load(Ordering::Relaxed)
        }
        limit => limit,
    }
}

/// Sets the limit [`max_tensor_bytes`] returns, for the whole process (at least 1 byte).
pub fn set_max_tensor_bytes(bytes: u64) {
    MAX_TENSOR_BYTES.store(bytes.max(1), std::sync::atomic::Ordering::Relaxed);
}

/// Runs `f` with [`max_tensor_bytes`] returning `limit` on this thread (a session's own limit,
/// around its creation and its runs); `None` runs it under the process's limit. Checks made on
/// other threads meanwhile (a kernel's pool workers) keep the process's limit.
pub fn with_max_tensor_bytes<R>(limit: Option<u64>, f: impl FnOnce() -> R) -> R {
    let Some(limit) = limit else {
        return f();
    };
    /// Puts the previous value back, also when `f` panics.
    struct Restore(u64);
    impl Drop for Restore {
        fn drop(&mut self) {
            SCOPED_MAX_TENSOR_BYTES.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SCOPED_MAX_TENSOR_BYTES.with(|s| s.replace(limit.max(1))));
    f()
}

thread_local! {
    /// The limit of the session running on this thread; 0 when none is set.
    static SCOPED_MAX_TENSOR_BYTES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// 0 until read or set.
static MAX_TENSOR_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn default_max_tensor_bytes() -> u64 {
    if let Some(v) = std::env::var("EPX_MAX_TENSOR_BYTES")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&v| v > 0)
    {
        return v;
    }
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            kib.checked_mul(1024)
        })
        .unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_over_the_limit_says_so_in_the_form_the_boundary_reads() {
        with_max_tensor_bytes(Some(1024), || {
            let refusals = [
                checked_numel(&[1024]).unwrap_err(),
                checked_numel(&[1 << 40, 0]).unwrap_err(),
                checked_len(&[64], 32).unwrap_err(),
            ];
            for e in refusals {
                assert!(is_over_limit(&e.0), "{}", e.0);
            }
            assert!(checked_numel(&[16]).is_ok());
            assert!(!is_over_limit("shape [3] has too many elements"));
        });
    }
}
