//! The one panic boundary for every crossing of the C ABI, in both directions: the functions a
//! Rust plugin exports (through [`crate::sdk`]), the host callbacks plugins call, and the C API
//! of `libepx` all run their body through [`ffi_boundary!`](crate::ffi_boundary).
//!
//! A panic must never unwind into C. The boundary catches it and returns what the function's
//! return type says a failure is, chosen by the type through [`IntoFfi`] and [`OnPanic`]: a
//! function returning a status returns a `Panic` status naming the function; one returning an
//! object pointer returns NULL; one returning a count returns 0; one returning nothing returns.
//! The function's name comes from the function itself, so no call site types it by hand.
//!
//! ```
//! use epx_plugin_api::abi::EpxStatus;
//! use epx_plugin_api::ffi_boundary;
//! use epx_plugin_api::sdk::{Error, take_status};
//!
//! extern "C" fn answer(fail: bool) -> *mut EpxStatus {
//!     ffi_boundary!({
//!         if fail {
//!             panic!("no answer");
//!         }
//!         Ok::<(), Error>(())
//!     })
//! }
//! assert!(answer(false).is_null());
//! // SAFETY: the status was made by `answer` and is released once, here.
//! let err = unsafe { take_status(answer(true)) }.unwrap_err();
//! assert_eq!(err.message, "panic in answer: no answer");
//! ```

use std::ffi::{c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::abi::{EpxStatus, EpxStatusCode};
use crate::status::{Error, into_raw_status, panic_message};

/// A value a function returns across the C ABI when its body panicked.
pub trait OnPanic {
    /// The failure value; `call` is the function's name, `message` the panic's text.
    fn on_panic(call: &str, message: &str) -> Self;
}

/// The pointee of a pointer returned across the C ABI: what a panic returns in its place. NULL
/// unless the pointee is an error object, which makes an error saying the call panicked.
pub trait PanicPointee: Sized {
    fn on_panic(call: &str, message: &str) -> *mut Self {
        let _ = (call, message);
        std::ptr::null_mut()
    }
}

impl<T: PanicPointee> OnPanic for *mut T {
    fn on_panic(call: &str, message: &str) -> Self {
        T::on_panic(call, message)
    }
}

impl<T: PanicPointee> OnPanic for *const T {
    fn on_panic(call: &str, message: &str) -> Self {
        T::on_panic(call, message).cast_const()
    }
}

impl PanicPointee for EpxStatus {
    fn on_panic(call: &str, message: &str) -> *mut Self {
        into_raw_status(Error::new(
            EpxStatusCode::Panic,
            format!("panic in {call}: {message}"),
        ))
    }
}

impl PanicPointee for c_char {}
impl PanicPointee for c_void {}
// (ABI 1.8) `kernel_terminate_flag`: NULL on panic means "this run cannot be cancelled".
impl PanicPointee for u8 {}

macro_rules! zero_on_panic {
    ($($t:ty),*) => {$(
        impl OnPanic for $t {
            fn on_panic(_: &str, _: &str) -> Self {
                Default::default()
            }
        }
        impl IntoFfi for $t {
            type Raw = $t;
            fn into_ffi(self) -> $t {
                self
            }
        }
    )*};
}
zero_on_panic!(
    (),
    bool,
    u8,
    u16,
    u32,
    u64,
    usize,
    i8,
    i16,
    i32,
    i64,
    isize,
    f32,
    f64
);

/// What a boundary's body gives and the function returns: plain values pass through; a
/// `Result` becomes a status or an error object (NULL for success).
pub trait IntoFfi {
    type Raw: OnPanic;
    fn into_ffi(self) -> Self::Raw;
}

impl<T: PanicPointee> IntoFfi for *mut T {
    type Raw = *mut T;
    fn into_ffi(self) -> *mut T {
        self
    }
}

impl<T: PanicPointee> IntoFfi for *const T {
    type Raw = *const T;
    fn into_ffi(self) -> *const T {
        self
    }
}

/// The SDK's errors become statuses the receiver releases.
impl IntoFfi for Result<(), Error> {
    type Raw = *mut EpxStatus;
    fn into_ffi(self) -> *mut EpxStatus {
        match self {
            Ok(()) => std::ptr::null_mut(),
            Err(e) => into_raw_status(e),
        }
    }
}

/// An error object of another API (the C API's `EpxError`) is handed over as a raw pointer.
impl<E: PanicPointee> IntoFfi for Result<(), Box<E>> {
    type Raw = *mut E;
    fn into_ffi(self) -> *mut E {
        match self {
            Ok(()) => std::ptr::null_mut(),
            Err(e) => Box::into_raw(e),
        }
    }
}

/// Runs `body`; a panic becomes the failure value of the return type, naming `call` (a
/// function name, or the type name [`ffi_boundary!`](crate::ffi_boundary) passes, which is cut
/// to the function's name only when a panic needs it).
pub fn boundary<T: IntoFfi>(call: &'static str, body: impl FnOnce() -> T) -> T::Raw {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value.into_ffi(),
        Err(payload) => {
            let call = function_name(call);
            let message = panic_message(payload.as_ref());
            // Formatting the failure must not unwind either: a panic here aborts nothing, it
            // only loses the message.
            catch_unwind(AssertUnwindSafe(|| T::Raw::on_panic(call, &message)))
                .unwrap_or_else(|_| T::Raw::on_panic(call, "(the panic message could not be kept)"))
        }
    }
}

/// The name of the function a boundary is in, from the type name of an item defined in it
/// (`crate::module::function::here`, perhaps with closures between).
pub fn function_name(marker: &str) -> &str {
    marker
        .rsplit("::")
        .find(|s| *s != "__epx_boundary_marker" && !s.starts_with('{'))
        .unwrap_or(marker)
}

/// Runs the body of a function that crosses the C ABI inside the panic boundary: its value
/// (a status `Result`, an error `Result`, a pointer, a count, nothing) is what the function
/// returns, and a panic becomes the failure value of that type, naming the function.
#[macro_export]
macro_rules! ffi_boundary {
    ($body:expr) => {{
        fn __epx_boundary_marker() {}
        $crate::ffi::boundary(::std::any::type_name_of_val(&__epx_boundary_marker), || {
            $body
        })
    }};
}

/// Runs `f` inside the panic boundary ([`boundary`]), turning an error into a
/// status and a panic into a `Panic` status naming `what` was running. For hand-written exports;
/// [`ffi_boundary!`](crate::ffi_boundary) names the function by itself.
pub fn guard(what: &'static str, f: impl FnOnce() -> crate::status::Result<()>) -> *mut EpxStatus {
    boundary(what, f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sdk::take_status;

    struct Object;
    impl PanicPointee for Object {}

    extern "C" fn make(fail: bool) -> *mut Object {
        ffi_boundary!({
            assert!(!fail, "cannot make it");
            Box::into_raw(Box::new(Object))
        })
    }

    extern "C" fn count(fail: bool) -> usize {
        ffi_boundary!({
            assert!(!fail);
            7usize
        })
    }

    extern "C" fn status(fail: bool) -> *mut EpxStatus {
        ffi_boundary!({
            if fail {
                return Err(Error::runtime("refused"));
            }
            Ok(())
        })
    }

    #[test]
    fn the_return_type_chooses_what_a_panic_returns() {
        let p = make(false);
        assert!(!p.is_null());
        // SAFETY: made by `make` just above.
        drop(unsafe { Box::from_raw(p) });
        assert!(make(true).is_null());
        assert_eq!(count(false), 7);
        assert_eq!(count(true), 0);
        assert!(status(false).is_null());
        // SAFETY: made by `status`, released once.
        let err = unsafe { take_status(status(true)) }.unwrap_err();
        assert_eq!(err, Error::runtime("refused"));
    }

    #[test]
    fn a_panic_status_names_the_function_it_happened_in() {
        extern "C" fn inner() -> *mut EpxStatus {
            ffi_boundary!({
                let f = || -> Result<(), Error> { panic!("deep") };
                f()
            })
        }
        // SAFETY: made by `inner`, released once.
        let err = unsafe { take_status(inner()) }.unwrap_err();
        assert_eq!(err.code, EpxStatusCode::Panic);
        assert_eq!(err.message, "panic in inner: deep");
    }

    #[test]
    fn function_names_skip_markers_and_closures() {
        assert_eq!(
            function_name("epx::capi::epx_session_new::{{closure}}::__epx_boundary_marker"),
            "epx_session_new"
        );
        assert_eq!(function_name("a::b::__epx_boundary_marker"), "b");
    }

    #[test]
    fn guard_catches_panics() {
        let raw = guard("execute", || panic!("boom"));
        // SAFETY: made by `guard`.
        let err = unsafe { take_status(raw) }.unwrap_err();
        assert_eq!(err.code, EpxStatusCode::Panic);
        assert_eq!(err.message, "panic in execute: boom");
        assert!(guard("x", || Ok(())).is_null());
    }
}
