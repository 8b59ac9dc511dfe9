//! Errors: the code and message every fallible call returns, and the strings this library
//! hands out.

use super::*;

/// What kind of failure an [`EpxError`] reports. Values are fixed; new codes are only appended.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpxErrorCode {
    /// A NULL or malformed argument, an unknown option, or a value that is not valid UTF-8.
    InvalidArgument = 1,
    /// A model file or buffer that is not a readable ONNX model, or not a valid graph.
    Model = 2,
    /// A file could not be read.
    Io = 3,
    /// A plugin library could not be loaded (missing dependency, wrong ABI, refused, ...).
    PluginLoad = 4,
    /// An EP is unknown, unavailable on this machine, or rejected its options.
    ProviderSetup = 5,
    /// An EP failed (or panicked) during a call.
    Provider = 6,
    /// No EP can run some node.
    Unsupported = 7,
    /// Inputs given to a run do not match the model.
    InvalidInput = 8,
    /// A run failed.
    Run = 9,
    /// A panic was caught at the C API boundary (a bug in epx; the message says where).
    Panic = 10,
    /// Anything else.
    Internal = 11,
    /// A run or a session creation was cancelled by the application
    /// ([`epx_run_options_set_terminate`](crate::epx_run_options_set_terminate)).
    Cancelled = 12,
}

/// A failure: a code and a message. NULL means success wherever an `EpxError *` is returned.
/// Free with [`epx_error_free`].
#[derive(Debug)]
pub struct EpxError {
    pub(crate) code: EpxErrorCode,
    pub(crate) message: CString,
}

impl EpxError {
    pub(crate) fn new(code: EpxErrorCode, message: impl Into<String>) -> Box<Self> {
        // Escaped as the host's errors are (a name the program passed may hold anything).
        let message = epx_host::printable_lines(&message.into()).replace('\0', "\\0");
        Box::new(EpxError {
            code,
            message: CString::new(message).unwrap_or_default(),
        })
    }
}

pub(crate) type Res<T> = Result<T, Box<EpxError>>;

pub(crate) fn invalid(message: impl Into<String>) -> Box<EpxError> {
    EpxError::new(EpxErrorCode::InvalidArgument, message)
}

impl From<epx_host::Error> for Box<EpxError> {
    fn from(e: epx_host::Error) -> Self {
        use epx_host::Error as E;
        let code = match &e {
            E::Model { .. } | E::InvalidGraph { .. } => EpxErrorCode::Model,
            E::Io { .. } => EpxErrorCode::Io,
            E::PluginLoad { .. } => EpxErrorCode::PluginLoad,
            E::ProviderSetup { .. } => EpxErrorCode::ProviderSetup,
            E::Provider { .. } => EpxErrorCode::Provider,
            E::Unsupported(_) => EpxErrorCode::Unsupported,
            E::InvalidInput(_) => EpxErrorCode::InvalidInput,
            E::Run(_) => EpxErrorCode::Run,
            E::Cancelled(_) => EpxErrorCode::Cancelled,
            _ => EpxErrorCode::Internal,
        };
        EpxError::new(code, e.to_string())
    }
}

/// The code of `error` ([`EpxErrorCode::Internal`] for NULL).
///
/// Pointers: `error` is NULL or an error from this library, not yet freed.
#[unsafe(no_mangle)]
pub extern "C" fn epx_error_code(error: Option<&EpxError>) -> EpxErrorCode {
    ffi_boundary!(error.map_or(EpxErrorCode::Internal, |e| e.code))
}

/// The message of `error`, valid until the error is freed ("" for NULL).
///
/// Pointers: `error` is NULL or an error from this library, not yet freed.
#[unsafe(no_mangle)]
pub extern "C" fn epx_error_message(error: Option<&EpxError>) -> *const c_char {
    ffi_boundary!(error.map_or(c"".as_ptr(), |e| e.message.as_ptr()))
}

/// Frees an error. NULL is a no-op.
///
/// # Safety
/// `error` is NULL or an error from this library, freed only once.
#[unsafe(no_mangle)]
pub extern "C" fn epx_error_free(error: Option<Box<EpxError>>) {
    ffi_boundary!(drop(error))
}

/// Frees a string this library returned through a `char **`. NULL is a no-op.
///
/// # Safety
/// `s` is NULL or such a string, freed only once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn epx_string_free(s: *mut c_char) {
    ffi_boundary!({
        if !s.is_null() {
            // SAFETY: the caller's contract: made by CString::into_raw here, freed once.
            drop(unsafe { CString::from_raw(s) });
        }
    })
}

/// A panic caught at the boundary of a function returning `EpxError *` becomes an error of code
/// [`EpxErrorCode::Panic`] naming the function.
impl PanicPointee for EpxError {
    fn on_panic(call: &str, message: &str) -> *mut Self {
        Box::into_raw(EpxError::new(
            EpxErrorCode::Panic,
            format!("{call} panicked: {message}"),
        ))
    }
}

impl OnPanic for EpxErrorCode {
    fn on_panic(_: &str, _: &str) -> Self {
        EpxErrorCode::Internal
    }
}

impl IntoFfi for EpxErrorCode {
    type Raw = EpxErrorCode;
    fn into_ffi(self) -> Self {
        self
    }
}
