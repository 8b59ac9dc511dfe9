//! Opening the files the host is given (models, external data, inputs, manifests, plugin
//! libraries, cache entries) so that none can block or flood it.
//!
//! A path is opened non-blocking and its kind is read from the opened file (`fstat`), never
//! from a separate look-up that a rename could outdate: a FIFO, a socket, a device or a folder
//! is refused at once instead of blocking the open (a FIFO with no writer) or never ending
//! (`/dev/zero`). A regular file is read no further than the size it had when opened, and only
//! when that size is within the caller's bound.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// The largest model read from a file or taken from memory: protobuf's 2 GiB limit for one
/// message. Larger ONNX models keep their weights in external data files.
pub const MAX_MODEL_BYTES: u64 = (2 << 30) - 1;

/// What `meta` is, when it is not a regular file, in words for a message.
fn kind_of(meta: &std::fs::Metadata) -> Option<&'static str> {
    let ft = meta.file_type();
    if ft.is_file() {
        return None;
    }
    if ft.is_dir() {
        return Some("a folder");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return Some("a FIFO");
        }
        if ft.is_socket() {
            return Some("a socket");
        }
        if ft.is_char_device() || ft.is_block_device() {
            return Some("a device");
        }
    }
    Some("something else")
}

fn not_regular(kind: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("it is {kind}, not a regular file (only regular files are read)"),
    )
}

/// Opens `path` for reading when it is a regular file (symbolic links followed), without
/// blocking on a FIFO; anything else is an `InvalidInput` error saying what it is.
pub fn open_regular(path: &Path) -> io::Result<(File, std::fs::Metadata)> {
    open_with(path, false)
}

/// [`open_regular`], refusing a symbolic link as the last component of `path` too.
pub fn open_regular_nofollow(path: &Path) -> io::Result<(File, std::fs::Metadata)> {
    open_with(path, true)
}

fn open_with(path: &Path, nofollow: bool) -> io::Result<(File, std::fs::Metadata)> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // O_NONBLOCK: opening a FIFO without a writer returns at once (and is refused below).
        // It does not change how a regular file reads.
        let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC;
        if nofollow {
            flags |= libc::O_NOFOLLOW;
        }
        options.custom_flags(flags);
    }
    let file = options.open(path).map_err(|e| {
        #[cfg(unix)]
        if nofollow && e.raw_os_error() == Some(libc::ELOOP) {
            return io::Error::new(
                io::ErrorKind::InvalidInput,
                "a symbolic link, which is not followed here",
            );
        }
        // A socket cannot be opened at all (ENXIO): say what it is.
        #[cfg(unix)]
        if e.raw_os_error() == Some(libc::ENXIO) {
            return not_regular("a socket or a device without a driver");
        }
        e
    })?;
    let meta = file.metadata()?;
    if let Some(kind) = kind_of(&meta) {
        return Err(not_regular(kind));
    }
    Ok((file, meta))
}

/// The bytes of the regular file `path`, when its size is at most `limit`: read no further
/// than the size it had when opened, into memory reserved fallibly. `what` names the limit in
/// the error (`"the model size limit (2 GiB)"`).
pub fn read_regular(path: &Path, limit: u64, what: &str) -> io::Result<Vec<u8>> {
    let (file, meta) = open_regular(path)?;
    read_opened(file, meta.len(), limit, what)
}

/// [`read_regular`] of a file already opened by [`open_regular`] with size `len`.
pub fn read_opened(file: File, len: u64, limit: u64, what: &str) -> io::Result<Vec<u8>> {
    if len > limit {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("{len} bytes, more than {what} ({limit} bytes)"),
        ));
    }
    let n = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::FileTooLarge))?;
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(n).map_err(|_| {
        io::Error::new(
            io::ErrorKind::OutOfMemory,
            format!("cannot allocate {len} bytes to read it"),
        )
    })?;
    file.take(len).read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("epx-files-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_regular_file_is_read_within_its_bound() {
        let dir = scratch("regular");
        let f = dir.join("a.bin");
        std::fs::write(&f, b"hello").unwrap();
        assert_eq!(read_regular(&f, 5, "the test limit").unwrap(), b"hello");
        let e = read_regular(&f, 4, "the test limit").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        assert!(
            e.to_string()
                .contains("5 bytes, more than the test limit (4 bytes)"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[cfg(unix)]
    #[test]
    fn fifos_devices_folders_and_sockets_are_refused_without_blocking() {
        let dir = scratch("special");
        let fifo = dir.join("p.onnx");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let sock = dir.join("s.onnx");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        for (path, kind) in [
            (fifo.as_path(), "a FIFO"),
            (Path::new("/dev/zero"), "a device"),
            (dir.as_path(), "a folder"),
            (sock.as_path(), "a socket"),
        ] {
            let e = read_regular(path, u64::MAX, "no limit").unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{}", path.display());
            assert!(e.to_string().contains(kind), "{}: {e}", path.display());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[cfg(unix)]
    #[test]
    fn nofollow_refuses_a_link_and_plain_open_follows_it() {
        let dir = scratch("link");
        let target = dir.join("t");
        std::fs::write(&target, b"x").unwrap();
        let link = dir.join("l");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(open_regular(&link).is_ok());
        let e = open_regular_nofollow(&link).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
