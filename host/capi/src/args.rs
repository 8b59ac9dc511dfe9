//! Reading the arguments C passes: out-parameters, strings, arrays and objects, each
//! refused with an error naming it when NULL or malformed.

use super::*;

/// `*out = value`, refusing a NULL `out`. Out-parameters are `Option<&mut MaybeUninit<T>>`: C
/// passes a pointer to (perhaps uninitialized) room for a `T`, or NULL.
pub(crate) fn put<T>(out: Option<&mut MaybeUninit<T>>, what: &str, value: T) -> Res<()> {
    out.ok_or_else(|| invalid(format!("`{what}` is NULL")))?
        .write(value);
    Ok(())
}

/// A C string argument as UTF-8.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
pub(crate) unsafe fn text<'a>(p: *const c_char, what: &str) -> Res<&'a str> {
    if p.is_null() {
        return Err(invalid(format!("`{what}` is NULL")));
    }
    // SAFETY: `p` is a NUL-terminated string (not NULL: checked above), per the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| invalid(format!("`{what}` is not valid UTF-8")))
}

/// A C array argument; NULL is allowed when `n` is 0.
///
/// # Safety
/// `p` points at `n` elements (or `n` is 0).
pub(crate) unsafe fn slice<'a, T>(p: *const T, n: usize, what: &str) -> Res<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(format!("`{what}` is NULL but its count is {n}")));
    }
    // SAFETY: `p` points at `n` elements (not NULL: checked above), per the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// A C string for a descriptor, with NUL bytes escaped.
pub(crate) fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

/// An object argument, refused with an error naming it when NULL.
pub(crate) fn object<'a, T>(p: Option<&'a T>, what: &str) -> Res<&'a T> {
    p.ok_or_else(|| invalid(format!("`{what}` is NULL")))
}

pub(crate) fn out_string(
    out: Option<&mut MaybeUninit<*mut c_char>>,
    what: &str,
    s: &str,
) -> Res<()> {
    put(out, what, c_string(s).into_raw())
}
