//! `libepx`: the C API of the epx host.
//!
//! Every function is `extern "C"`, checks its pointer arguments, and runs inside the panic
//! boundary ([`epx_plugin_api::ffi_boundary!`]), so a panic anywhere below becomes an
//! [`EpxError`] with code [`EpxErrorCode::Panic`] (or, for the few functions that cannot return
//! an error, a neutral value chosen by the return type), never an unwind into C.
//!
//! Ownership: every object a `*_new` function or an out-parameter hands out has one matching
//! `*_free`, and every `*_free` accepts NULL. Environments, option sets and sessions are handles
//! ([`handle`]): `*_free` releases the caller's reference while calls in flight keep theirs, and
//! a call made with a freed handle is an error ("the session is closed"), never a use of freed
//! memory. Values and outputs belong to the one thread that made them. Strings and arrays reached through a descriptor
//! (`EpxProviderDesc`, `EpxValueDesc`, `EpxTensorRef`) belong to the object they were read from and
//! live as long as it does. Strings returned as `char **` are freed with [`epx_string_free`].
//!
//! One file per object: [`error`] (`EpxError`, strings), [`options`] (`EpxSessionOptions`),
//! [`env`] (`EpxEnv`), [`session`] (`EpxSession`), [`run`] (`EpxOutputs`, running) and
//! [`value`] (`EpxHostValue`); [`args`] reads arguments. The header `include/epx.h` is generated
//! from these files by cbindgen (`tests/headers.rs`).

use std::ffi::{CStr, CString, c_char, c_void};
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::sync::Arc;

use epx_host::{
    ElementType, Environment, ExecutionProvider, Map, Sequence, Session, Tensor, Value,
};
use epx_plugin_api::abi::EpxValueKind;
use epx_plugin_api::dlpack::{DLDevice, DLDeviceType, DLTensor};

use epx_plugin_api::ffi::{IntoFfi, OnPanic, PanicPointee};
use epx_plugin_api::ffi_boundary;

mod args;
mod env;
mod error;
mod handle;
mod options;
mod run;
mod session;
mod value;

use args::*;
pub use env::*;
pub use error::*;
pub use options::*;
pub use run::*;
pub use session::*;
pub use value::*;

/// The version of libepx: the `epx` crates' version.
pub const EPX_VERSION_MAJOR: u32 = 0;
/// See [`EPX_VERSION_MAJOR`].
pub const EPX_VERSION_MINOR: u32 = 1;
/// See [`EPX_VERSION_MAJOR`].
pub const EPX_VERSION_PATCH: u32 = 0;

/// The crate version, NUL-terminated, checked at compile time.
const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => panic!("the crate version holds a NUL byte"),
    };

/// The library version as text, e.g. `"0.1.0"`; static, never freed.
#[unsafe(no_mangle)]
pub extern "C" fn epx_version() -> *const c_char {
    ffi_boundary!(VERSION.as_ptr())
}

/// The plugin ABI version this host speaks, as `"major.minor"` (e.g. `"1.3"`): plugins built
/// for this major and a minor up to this one load. Static, never freed.
#[unsafe(no_mangle)]
pub extern "C" fn epx_plugin_abi_version() -> *const c_char {
    static TEXT: std::sync::OnceLock<CString> = std::sync::OnceLock::new();
    ffi_boundary!(
        TEXT.get_or_init(|| c_string(&epx_host::plugin_abi_version()))
            .as_ptr()
    )
}

/// Sets the largest tensor (in bytes) epx allocates, for the whole process: a model or an input
/// asking for more gets an error naming the shape and the size, never an abort. The default is
/// `EPX_MAX_TENSOR_BYTES` when set, else the machine's physical memory; 0 restores nothing and is
/// taken as 1. Returns the limit now in force.
#[unsafe(no_mangle)]
pub extern "C" fn epx_set_max_tensor_bytes(bytes: u64) -> u64 {
    ffi_boundary!({
        epx_host::set_max_tensor_bytes(bytes);
        epx_host::max_tensor_bytes()
    })
}

/// The largest tensor (in bytes) epx allocates now ([`epx_set_max_tensor_bytes`]).
#[unsafe(no_mangle)]
pub extern "C" fn epx_max_tensor_bytes() -> u64 {
    ffi_boundary!(epx_host::max_tensor_bytes())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_plugin_abi_version_is_the_abi_modules() {
        use epx_plugin_api::abi::{EPX_ABI_VERSION_MAJOR, EPX_ABI_VERSION_MINOR};
        // SAFETY: a static NUL-terminated string.
        let text = unsafe { std::ffi::CStr::from_ptr(super::epx_plugin_abi_version()) };
        assert_eq!(
            text.to_str().unwrap(),
            format!("{EPX_ABI_VERSION_MAJOR}.{EPX_ABI_VERSION_MINOR}")
        );
    }

    #[test]
    fn version_constants_match_the_crate() {
        // SAFETY: a static NUL-terminated string.
        let text = unsafe { std::ffi::CStr::from_ptr(super::epx_version()) };
        assert_eq!(text.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
        assert_eq!(
            super::EPX_VERSION_MAJOR.to_string(),
            env!("CARGO_PKG_VERSION_MAJOR")
        );
        assert_eq!(
            super::EPX_VERSION_MINOR.to_string(),
            env!("CARGO_PKG_VERSION_MINOR")
        );
        assert_eq!(
            super::EPX_VERSION_PATCH.to_string(),
            env!("CARGO_PKG_VERSION_PATCH")
        );
    }
}
