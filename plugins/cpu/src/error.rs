//! The CPU EP's error type: what every kernel, fast path and helper returns on failure. Level 0:
//! names nothing of this crate.

use std::fmt;

/// An operator error: a message naming the operator and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct OpError(pub String);

impl OpError {
    /// An error with the given message.
    pub fn new(msg: impl Into<String>) -> Self {
        OpError(msg.into())
    }
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OpError {}

/// The result of every operator function.
pub type OpResult<T> = Result<T, OpError>;

/// `bail!("fmt", args..)` returns `Err(OpError(format!(..)))` from the enclosing function.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::OpError(format!($($arg)*)))
    };
}
