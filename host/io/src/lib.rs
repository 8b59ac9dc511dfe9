//! Values as files: [`npy`] reads and writes numpy's `.npy` (numeric, bool, strings and the
//! `ml_dtypes` types), and [`valuefile`] maps every kind of ONNX value onto files (a `.npy` per
//! tensor, a folder per sequence, a JSON object per map). The `epx` CLI and the tests use them;
//! the host library itself reads no files but models.

#![forbid(unsafe_code)]

pub mod compare;
pub mod nodetest;
pub mod npy;
pub mod valuefile;

/// The bytes of `path` when it is a regular file (symlinks followed; a device, FIFO or socket is
/// refused without blocking), read no further than the size it had when opened, and only when
/// that is within the tensor limit ([`epx::max_tensor_bytes`]) and room for a header.
pub fn read_regular_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    let limit = epx::max_tensor_bytes().saturating_add(1 << 20);
    epx::files::read_regular(
        path,
        limit,
        "the tensor limit (EPX_MAX_TENSOR_BYTES) and a header",
    )
}
