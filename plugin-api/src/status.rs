//! Errors on the Rust side and statuses on the C side; the panic boundary between them is
//! [`crate::ffi`].

use std::any::Any;
use std::ffi::{CStr, CString, c_char};
use std::fmt;

use crate::abi::{EpxStatus, EpxStatusCode};

/// An error a plugin returns to the host: a status code and a message for a person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub code: EpxStatusCode,
    pub message: String,
}

/// The SDK's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(code: EpxStatusCode, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
        }
    }
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(EpxStatusCode::InvalidArgument, message)
    }
    pub fn not_implemented(message: impl Into<String>) -> Self {
        Self::new(EpxStatusCode::NotImplemented, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(EpxStatusCode::Unavailable, message)
    }
    pub fn runtime(message: impl Into<String>) -> Self {
        Self::new(EpxStatusCode::RuntimeError, message)
    }
    pub fn invalid_graph(message: impl Into<String>) -> Self {
        Self::new(EpxStatusCode::InvalidGraph, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// The heap block behind a status this side made: the status first, so a pointer to the block
/// is a pointer to the status.
#[repr(C)]
struct OwnedStatus {
    status: EpxStatus,
    message: CString,
}

unsafe extern "C" fn release_owned_status(status: *mut EpxStatus) {
    if status.is_null() {
        return;
    }
    // SAFETY: statuses with this release function are only made by `into_raw_status`, which
    // leaks a `Box<OwnedStatus>` whose first field (repr(C)) is the status.
    drop(unsafe { Box::from_raw(status.cast::<OwnedStatus>()) });
}

/// Turns an error into a status owned by this side, for returning across the ABI.
pub fn into_raw_status(err: Error) -> *mut EpxStatus {
    let message = CString::new(err.message.replace('\0', "\\0")).unwrap_or_default();
    let mut owned = Box::new(OwnedStatus {
        status: EpxStatus {
            struct_size: std::mem::size_of::<EpxStatus>(),
            code: err.code as u32,
            message: std::ptr::null(),
            release: Some(release_owned_status),
        },
        message,
    });
    owned.status.message = owned.message.as_ptr();
    Box::into_raw(owned).cast::<EpxStatus>()
}

/// Reads and frees a status received from the other side. NULL means success.
///
/// # Safety
/// `status` is NULL or a status the other side made and has not been released yet.
pub unsafe fn take_status(status: *mut EpxStatus) -> Result<()> {
    if status.is_null() {
        return Ok(());
    }
    // SAFETY: non-null statuses point at a live `EpxStatus` (caller's contract); the size is
    // checked before reading fields past `struct_size`.
    let (code, message, release) = unsafe {
        let s = &*status;
        let min = std::mem::offset_of!(EpxStatus, release) + std::mem::size_of::<usize>();
        if s.struct_size < min {
            // Too short to carry a release function: it cannot be freed; read what we can.
            (
                EpxStatusCode::Fail,
                "malformed status (struct_size too small)".to_string(),
                None,
            )
        } else {
            let message = if s.message.is_null() {
                String::from("(no message)")
            } else {
                CStr::from_ptr(s.message).to_string_lossy().into_owned()
            };
            (EpxStatusCode::from_raw(s.code), message, s.release)
        }
    };
    if let Some(release) = release {
        // SAFETY: the maker's release function, called exactly once.
        unsafe { release(status) };
    }
    Err(Error { code, message })
}

/// The text of a panic payload.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Reads a NUL-terminated string, or `""` for NULL.
///
/// # Safety
/// `p` is NULL or a valid NUL-terminated string for `'a`.
pub unsafe fn cstr_or_empty<'a>(p: *const c_char) -> std::borrow::Cow<'a, str> {
    if p.is_null() {
        std::borrow::Cow::Borrowed("")
    } else {
        // SAFETY: the caller's contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trip() {
        let raw = into_raw_status(Error::runtime("it broke"));
        // SAFETY: `raw` was just made by this side and not released.
        let err = unsafe { take_status(raw) }.unwrap_err();
        assert_eq!(err, Error::runtime("it broke"));
        // SAFETY: NULL is success.
        assert!(unsafe { take_status(std::ptr::null_mut()) }.is_ok());
    }
}
