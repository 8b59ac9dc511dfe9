//! The checks every callback makes on what a plugin passes: indices in range, out-pointers
//! not NULL, out-structs written no further than the plugin declared, shapes non-negative.
//! Names nothing else of the host API.

use epx_plugin_api::sdk::Error as SdkError;

/// `i` when it indexes `items`; else an error naming what was asked for.
pub(super) fn index<T>(items: &[T], i: usize, what: &str) -> Result<usize, SdkError> {
    if i < items.len() {
        Ok(i)
    } else {
        Err(SdkError::invalid_argument(format!(
            "{what} {i} out of range (there are {})",
            items.len()
        )))
    }
}

/// Writes `value` into a plugin-provided out-struct, never past the size the plugin declared.
///
/// # Safety
/// `out` points at a writable struct of at least `(*out).struct_size` bytes.
pub(super) unsafe fn write_sized<T>(out: *mut T, value: T) -> Result<(), SdkError> {
    if out.is_null() {
        return Err(SdkError::invalid_argument("NULL out-pointer"));
    }
    // SAFETY: every ABI struct starts with `struct_size: usize` (caller's contract).
    let declared = unsafe { *out.cast::<usize>() };
    let full = std::mem::size_of::<T>();
    if declared >= full {
        // SAFETY: the plugin's struct is at least as large as ours.
        unsafe { out.write(value) };
    } else if declared >= std::mem::size_of::<usize>() {
        // An older plugin with a shorter struct: copy the prefix it knows, keeping its size.
        // SAFETY: both regions are valid for `declared` bytes and do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&value as *const T).cast::<u8>(),
                out.cast::<u8>(),
                declared,
            );
            *out.cast::<usize>() = declared;
        }
    } else {
        return Err(SdkError::invalid_argument(
            "out-struct has no valid struct_size",
        ));
    }
    Ok(())
}

/// # Safety
/// `shape` is NULL or points at `ndim` extents.
pub(super) unsafe fn read_shape(ndim: i32, shape: *const i64) -> Result<Vec<usize>, SdkError> {
    let ndim = usize::try_from(ndim)
        .map_err(|_| SdkError::invalid_argument(format!("negative ndim {ndim}")))?;
    let dims: &[i64] = if ndim == 0 {
        &[]
    } else if shape.is_null() {
        return Err(SdkError::invalid_argument("NULL shape"));
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(shape, ndim) }
    };
    dims.iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| {
                SdkError::invalid_argument(format!("negative extent {d} in shape {dims:?}"))
            })
        })
        .collect()
}

pub(super) fn out_ptr<T>(out: *mut T) -> Result<*mut T, SdkError> {
    if out.is_null() {
        Err(SdkError::invalid_argument("NULL out-pointer"))
    } else {
        Ok(out)
    }
}
