//! Values as files: [`npy`] reads and writes numpy's `.npy` (numeric, bool, strings and the
//! `ml_dtypes` types), and [`valuefile`] maps every kind of ONNX value onto files (a `.npy` per
//! tensor, a folder per sequence, a JSON object per map). The `epx` CLI and the tests use them;
//! the host library itself reads no files but models.

#![forbid(unsafe_code)]

pub mod compare;
pub mod nodetest;
pub mod npy;
pub mod valuefile;
