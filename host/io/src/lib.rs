//! Values as files: [`npy`] reads and writes numpy's `.npy` (numeric, bool, strings and the
//! `ml_dtypes` types), and [`valuefile`] maps every kind of ONNX value onto files (a `.npy` per
//! tensor, a folder per sequence, a JSON object per map). The `epx` CLI and the tests use them;
//! the host library itself reads no files but models.

#![forbid(unsafe_code)]

pub mod compare;
pub mod nodetest;
pub mod npy;
pub mod valuefile;

/// The bytes of `path` when it is a regular file (symlinks followed), read no further than the
/// size it had when opened: `/dev/zero`, a FIFO or a socket is an error, not an endless read.
pub fn read_regular_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a device, FIFO or socket is not read)",
        ));
    }
    let len = usize::try_from(meta.len()).map_err(|_| std::io::ErrorKind::FileTooLarge)?;
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(len)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::OutOfMemory, "file too large"))?;
    file.take(meta.len()).read_to_end(&mut bytes)?;
    Ok(bytes)
}
