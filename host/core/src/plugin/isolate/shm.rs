//! The memory both processes map: an anonymous file (`memfd_create`) the host makes and the
//! child inherits as a descriptor. Either side may grow it (`ftruncate`); the other remaps when a
//! message says the file is larger than its mapping.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use memmap2::{MmapMut, MmapOptions};

/// Where each tensor starts in the region.
pub(super) const ALIGN: usize = 64;

pub(super) fn align_up(n: usize) -> Option<usize> {
    n.checked_add(ALIGN - 1).map(|n| n & !(ALIGN - 1))
}

pub(super) struct Shared {
    file: File,
    map: Option<MmapMut>,
}

impl Shared {
    /// A new, empty region (host side).
    pub fn create() -> std::io::Result<Self> {
        // SAFETY: a NUL-terminated name; flags are valid. The descriptor is close-on-exec; the
        // spawn duplicates it onto the child's descriptor 3 (see `super::remote`).
        let fd = unsafe {
            libc::memfd_create(
                c"epx-isolated-ep".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        let mut owned = unsafe { OwnedFd::from_raw_fd(fd) };
        if fd < 3 {
            // A host that closed stdin/stdout/stderr got one of those numbers back; the spawn
            // puts the child's pipes there, so the region moves above them.
            // SAFETY: duplicating a descriptor we own.
            let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
            if high < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: just made, owned by nobody else; the low one closes as `owned` drops.
            owned = unsafe { OwnedFd::from_raw_fd(high) };
        }
        // The child may grow the region but never shrink it under the host's mapping.
        // SAFETY: a descriptor we own, made with MFD_ALLOW_SEALING.
        if unsafe { libc::fcntl(owned.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Shared {
            file: File::from(owned),
            map: None,
        })
    }

    /// The region inherited as descriptor `fd` (child side).
    ///
    /// # Safety
    /// `fd` is an open descriptor this process owns and nothing else uses.
    pub unsafe fn inherit(fd: i32) -> std::io::Result<Self> {
        // SAFETY: the caller's contract.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        // Not passed on to processes a plugin may start.
        // SAFETY: a descriptor this process owns.
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
        let mut s = Shared { file, map: None };
        s.remap()?;
        Ok(s)
    }

    pub fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    pub fn len(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }

    /// Maps the file at its current size (after the other side grew it).
    pub fn remap(&mut self) -> std::io::Result<()> {
        let size = usize::try_from(self.file.metadata()?.len())
            .map_err(|_| std::io::Error::other("shared memory larger than the address space"))?;
        self.map = None;
        if size > 0 {
            // SAFETY: the file is shared only with the child, which writes it only while this
            // side waits for its reply (one request at a time), so no slice handed out here is
            // changed underneath its user.
            self.map = Some(unsafe { MmapOptions::new().len(size).map_mut(&self.file)? });
        }
        Ok(())
    }

    /// Makes the region at least `size` bytes (grown by doubling, never shrunk).
    pub fn ensure(&mut self, size: usize) -> std::io::Result<()> {
        let current = usize::try_from(self.file.metadata()?.len()).unwrap_or(usize::MAX);
        if size <= current {
            if self.len() < current {
                self.remap()?;
            }
            return Ok(());
        }
        let grown = size.max(current.saturating_mul(2)).max(1 << 20);
        // Grown by reserving the pages (the size changes only if that succeeds): memory that
        // runs out is this error, not a SIGBUS at the first touch of a page.
        // SAFETY: a descriptor we own; the range is the file's new size.
        let err = unsafe { libc::posix_fallocate(self.file.as_raw_fd(), 0, grown as libc::off_t) };
        if err != 0 {
            return Err(std::io::Error::from_raw_os_error(err));
        }
        self.remap()
    }

    pub fn bytes(&self, at: usize, len: usize) -> Option<&[u8]> {
        let end = at.checked_add(len)?;
        if len == 0 {
            return Some(&[]);
        }
        self.map.as_ref()?.get(at..end)
    }

    pub fn bytes_mut(&mut self, at: usize, len: usize) -> Option<&mut [u8]> {
        let end = at.checked_add(len)?;
        if len == 0 {
            return Some(&mut []);
        }
        self.map.as_mut()?.get_mut(at..end)
    }
}
