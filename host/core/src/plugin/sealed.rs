//! Sealed copies of the libraries the host opens, so that the bytes it checked are the bytes it
//! runs.
//!
//! A library is read once into an anonymous memory file (`memfd_create`) while it is hashed,
//! and the file is then sealed (`F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`): no
//! one can change it any more, not even this process. Admission checks that copy (its SHA-256
//! against the manifest's pin, its ELF needs), the probe child and the isolated child open a
//! copy of their own that must have the same SHA-256, and `dlopen` maps the sealed copy
//! (`/proc/self/fd/N`). Rewriting the file on disk during or after the checks changes nothing
//! that runs; the next load sees the new file and checks it afresh.
//!
//! Copies are shared by content: sealing bytes already sealed in this process returns the same
//! copy, so `dlopen` finds the library it loaded before (the loader knows objects by name, and
//! `/proc/self/fd/N` names one copy) instead of loading it twice. The descriptor of a copy stays
//! open as long as its library is loaded, and for the life of the process when `dlclose` could
//! not unload it (a library with thread-local destructors stays mapped): a later copy must never
//! get a number the loader already knows.
//!
//! On targets other than Linux there is no memfd: libraries are opened by path, as they are
//! when the kernel refuses executable memfds (`vm.memfd_noexec = 2`); that is logged.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The largest library sealed (a plugin or a dependency): 4 GiB.
pub const MAX_LIBRARY_BYTES: u64 = 4 << 30;

/// A library's bytes, sealed in memory, and their SHA-256.
#[derive(Debug)]
pub struct SealedFile {
    #[cfg(target_os = "linux")]
    fd: std::os::fd::OwnedFd,
    sha256: String,
    len: u64,
}

impl SealedFile {
    /// The SHA-256 of the sealed bytes, as 64 lowercase hex digits.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The number of bytes sealed.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The path the loader opens the sealed copy by.
    #[cfg(target_os = "linux")]
    pub fn load_path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// Whether the sealed copy is still mapped as a library (after its last `dlclose`): then
    /// its descriptor must stay open for the life of the process ([`pin`]).
    #[cfg(target_os = "linux")]
    pub(crate) fn still_loaded(&self) -> bool {
        let Ok(name) =
            std::ffi::CString::new(self.load_path().into_os_string().into_encoded_bytes())
        else {
            return false;
        };
        // SAFETY: RTLD_NOLOAD loads nothing and runs no code: it only looks the name up among
        // the objects already loaded, and takes a reference released at once below.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if handle.is_null() {
            return false;
        }
        // SAFETY: the reference RTLD_NOLOAD just took.
        unsafe { libc::dlclose(handle) };
        true
    }
}

/// A library file and, where the target allows, the sealed copy of it that was checked: what
/// loading opens, and what a child process is told to open (the path, and the SHA-256 its own
/// copy must have).
#[derive(Clone, Debug)]
pub struct LibraryImage {
    /// The file on disk, for messages and for children to read.
    pub path: PathBuf,
    pub sealed: Option<Arc<SealedFile>>,
    /// For an ONNX Runtime plugin-EP library: epx's adapter that opens it, and its settings
    /// ([`hosted`](super::hosted)). Travels with the library to every place that opens it (this
    /// process, the probe child, an isolated EP's child).
    pub hosted_by: Option<Arc<Hosting>>,
}

impl LibraryImage {
    /// Seals `path` ([`seal`]).
    pub fn of(path: &Path) -> std::io::Result<LibraryImage> {
        Ok(LibraryImage {
            path: path.to_path_buf(),
            sealed: seal(path)?,
            hosted_by: None,
        })
    }

    /// Seals `path`, which a parent checked with SHA-256 `expected` when given
    /// ([`seal_expecting`]).
    pub fn checked(path: &Path, expected: Option<&str>) -> Result<LibraryImage, String> {
        let sealed = match expected {
            Some(d) => seal_expecting(path, d)?,
            None => seal(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?,
        };
        Ok(LibraryImage {
            path: path.to_path_buf(),
            sealed,
            hosted_by: None,
        })
    }

    /// A library opened by path, unsealed (where the target has no memfd).
    pub fn unsealed(path: &Path) -> LibraryImage {
        LibraryImage {
            path: path.to_path_buf(),
            sealed: None,
            hosted_by: None,
        }
    }

    /// What `dlopen` opens: the sealed copy, else the file.
    pub fn load_path(&self) -> PathBuf {
        #[cfg(target_os = "linux")]
        if let Some(s) = &self.sealed {
            return s.load_path();
        }
        self.path.clone()
    }

    /// The SHA-256 of the sealed copy, when there is one.
    pub fn sha256(&self) -> Option<&str> {
        self.sealed.as_deref().map(SealedFile::sha256)
    }
}

/// Makes the loader name the library at `handle` (opened from a sealed copy, so known as
/// `/proc/self/fd/N`) by its file, `path`: `dladdr`, backtraces, debuggers and profilers then see
/// the plugin's real path, and a plugin that finds its own folder through `dladdr` (to load
/// the vendor runtime it ships beside itself) finds it. glibc only (its `struct link_map`
/// begins as `<link.h>` declares it); elsewhere nothing is changed.
///
/// # Safety
/// `handle` is a live handle `dlopen` returned.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) unsafe fn name_as_file(handle: *mut std::ffi::c_void, path: &Path) {
    use std::ffi::{CStr, CString, c_char, c_void};
    /// The public beginning of glibc's `struct link_map` (`<link.h>`).
    #[repr(C)]
    struct LinkMap {
        l_addr: usize,
        l_name: *mut c_char,
        l_ld: *mut c_void,
        l_next: *mut LinkMap,
        l_prev: *mut LinkMap,
    }
    let Ok(name) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return;
    };
    let mut map: *mut LinkMap = std::ptr::null_mut();
    // SAFETY: RTLD_DI_LINKMAP writes the object's `struct link_map *` into `map`.
    let got = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            (&mut map as *mut *mut LinkMap).cast(),
        )
    };
    if got != 0 || map.is_null() {
        return;
    }
    // SAFETY: `map` is the loader's live entry for `handle`; `l_name` is a NUL-terminated
    // string it owns. The new name is allocated with libc's malloc, because the loader frees
    // `l_name` with free() when it unloads the object; the old one is left allocated (a name
    // per load), since nothing says no other pointer to it exists. The pointer-sized store is
    // what a concurrent `dladdr` reads: the old string or the new one, both valid.
    unsafe {
        let current = (*map).l_name;
        if !current.is_null() && CStr::from_ptr(current) == name.as_c_str() {
            return;
        }
        let copy = libc::strdup(name.as_ptr());
        if !copy.is_null() {
            std::ptr::write_volatile(&mut (*map).l_name, copy);
        }
    }
}

/// Load addresses (`l_addr`) of the libraries loaded here from sealed copies, so that
/// [`loaded_elsewhere`] does not take them for the program's own.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
static OURS: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// The load address of the object `handle` names.
///
/// # Safety
/// `handle` is a live handle `dlopen` returned.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe fn load_address(handle: *mut std::ffi::c_void) -> Option<usize> {
    // The first field of `struct link_map` (`<link.h>`): the load address.
    let mut map: *mut usize = std::ptr::null_mut();
    // SAFETY: RTLD_DI_LINKMAP writes the object's `struct link_map *` into `map`.
    let got = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            (&mut map as *mut *mut usize).cast(),
        )
    };
    // SAFETY: a live link map, whose first field is `l_addr`.
    (got == 0 && !map.is_null()).then(|| unsafe { *map })
}

/// Records the object at `handle` as loaded here from a sealed copy; returns its load address,
/// for [`forget_ours`] once it is unloaded.
///
/// # Safety
/// `handle` is a live handle `dlopen` returned.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) unsafe fn mark_ours(handle: *mut std::ffi::c_void) -> Option<usize> {
    // SAFETY: the caller's contract.
    let addr = unsafe { load_address(handle) }?;
    let mut list = OURS.lock().unwrap_or_else(|p| p.into_inner());
    if !list.contains(&addr) {
        list.push(addr);
    }
    Some(addr)
}

/// The object loaded at `addr` from a sealed copy is unloaded: the address may hold another.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn forget_ours(addr: usize) {
    OURS.lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|&a| a != addr);
}

/// The name the loader knows `path` by when the program itself has that file loaded (it linked
/// or opened the library before epx loads it as a plugin): loading a second copy would give the
/// library two sets of globals, so the program's is used, as `dlopen` of the path would.
/// Objects loaded here from sealed copies are not the program's.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn loaded_elsewhere(path: &Path) -> Option<std::ffi::CString> {
    use std::ffi::{CStr, CString, c_int, c_void};
    use std::os::unix::fs::MetadataExt;
    struct Search {
        dev: u64,
        ino: u64,
        ours: Vec<usize>,
        found: Option<CString>,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `Search` passed to dl_iterate_phdr below; `info` the loader's
        // description of one object, valid for this call.
        let (search, info) = unsafe { (&mut *data.cast::<Search>(), &*info) };
        if info.dlpi_name.is_null() || search.ours.contains(&(info.dlpi_addr as usize)) {
            return 0;
        }
        // SAFETY: a NUL-terminated name owned by the loader.
        let name = unsafe { CStr::from_ptr(info.dlpi_name) };
        let p = Path::new(std::ffi::OsStr::from_bytes(name.to_bytes()));
        if p.as_os_str().is_empty() {
            return 0;
        }
        if let Ok(m) = std::fs::metadata(p) {
            if m.dev() == search.dev && m.ino() == search.ino {
                search.found = Some(name.to_owned());
                return 1;
            }
        }
        0
    }
    use std::os::unix::ffi::OsStrExt;
    let m = std::fs::metadata(path).ok()?;
    let mut search = Search {
        dev: m.dev(),
        ino: m.ino(),
        ours: OURS.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        found: None,
    };
    // SAFETY: `visit` only reads what the loader hands it and writes `search`.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut search as *mut Search).cast()) };
    search.found
}

/// Keeps `image` (and its descriptor) for the rest of the process: its library could not be
/// unloaded, so the loader still knows it by its `/proc/self/fd/N` name.
pub(crate) fn pin(image: Arc<SealedFile>) {
    static PINNED: std::sync::Mutex<Vec<Arc<SealedFile>>> = std::sync::Mutex::new(Vec::new());
    let mut pinned = PINNED.lock().unwrap_or_else(|p| p.into_inner());
    if !pinned.iter().any(|p| Arc::ptr_eq(p, &image)) {
        pinned.push(image);
    }
}

/// Seals the regular file `path` (see the module docs): `Ok(None)` where this target or kernel
/// cannot (the caller opens the path itself), an error when the file cannot be read or is not a
/// regular file.
pub fn seal(path: &Path) -> std::io::Result<Option<Arc<SealedFile>>> {
    #[cfg(target_os = "linux")]
    {
        linux::seal(path)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        Ok(None)
    }
}

/// Seals `path` and checks that its SHA-256 is `expected` (the digest a parent process checked):
/// a file changed since is an error saying so, and nothing of it is opened.
pub fn seal_expecting(path: &Path, expected: &str) -> Result<Option<Arc<SealedFile>>, String> {
    let image = seal(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if let Some(image) = &image {
        if image.sha256() != expected {
            return Err(format!(
                "{} changed after it was checked (its SHA-256 is now {}, {} was checked); it was \
                 not opened",
                path.display(),
                image.sha256(),
                expected
            ));
        }
    }
    Ok(image)
}

#[cfg(target_os = "linux")]
mod linux {
    use std::collections::HashMap;
    use std::ffi::CString;
    use std::io::{Read, Seek, Write};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::path::Path;
    use std::sync::{Arc, Mutex, Weak};

    use sha2::{Digest, Sha256};

    use super::{MAX_LIBRARY_BYTES, SealedFile};

    /// Copies alive in this process, by SHA-256.
    static BY_DIGEST: Mutex<Option<HashMap<String, Weak<SealedFile>>>> = Mutex::new(None);

    /// An anonymous memory file that may be sealed and mapped executable. `None` when the
    /// kernel refuses executable memfds (`vm.memfd_noexec = 2`).
    fn memfd(path: &Path) -> std::io::Result<Option<OwnedFd>> {
        let base = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let name = CString::new(format!("epx:{}", base.replace('\0', "")))
            .unwrap_or_else(|_| CString::from(c"epx:library"));
        let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
        // MFD_EXEC says the file will be mapped executable (Linux 6.3); older kernels do not
        // know it (EINVAL) and allow that by default.
        for extra in [libc::MFD_EXEC, 0] {
            // SAFETY: a NUL-terminated name and plain flags; the result is a new descriptor or -1.
            let fd = unsafe { libc::memfd_create(name.as_ptr(), flags | extra) };
            if fd >= 0 {
                // SAFETY: a descriptor memfd_create just returned, owned by nothing else.
                return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }));
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINVAL) if extra != 0 => continue,
                Some(libc::EACCES | libc::EPERM) => return Ok(None),
                _ => return Err(e),
            }
        }
        Ok(None)
    }

    /// What tells whether a file was written while it was read: size, and the modification
    /// and change times (nanoseconds).
    fn stamp(m: &std::fs::Metadata) -> (u64, i64, i64, i64, i64) {
        use std::os::unix::fs::MetadataExt;
        (
            m.len(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        )
    }

    /// Tries to read a file written in place (`cp` over it) this many times before refusing it.
    const ATTEMPTS: usize = 20;

    /// Whether `file` holds the `len` bytes of `copy` (both read from the start) and no more.
    fn same_bytes(
        file: &mut std::fs::File,
        copy: &mut std::fs::File,
        len: u64,
        buf: &mut [u8],
    ) -> std::io::Result<bool> {
        file.seek(std::io::SeekFrom::Start(0))?;
        copy.seek(std::io::SeekFrom::Start(0))?;
        let mut theirs = vec![0u8; buf.len()];
        let mut left = len;
        while left > 0 {
            let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            if file.read_exact(&mut buf[..n]).is_err() {
                return Ok(false);
            }
            copy.read_exact(&mut theirs[..n])?;
            if buf[..n] != theirs[..n] {
                return Ok(false);
            }
            left -= n as u64;
        }
        // Nothing beyond: a file that grew is not the one copied.
        Ok(file.read(&mut buf[..1])? == 0)
    }

    pub(super) fn seal(path: &Path) -> std::io::Result<Option<Arc<SealedFile>>> {
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(std::time::Duration::from_millis(5 * attempt as u64));
            }
            if let Some(done) = seal_once(path)? {
                return Ok(done);
            }
        }
        Err(std::io::Error::other(format!(
            "it was being written while it was read, {ATTEMPTS} times; it was not opened (try \
             again once the file is in place: installing it by renaming a finished copy over it \
             avoids this)"
        )))
    }

    /// One attempt: `None` when the file changed while it was read (the copy may mix two
    /// versions and is thrown away).
    #[allow(clippy::type_complexity)]
    fn seal_once(path: &Path) -> std::io::Result<Option<Option<Arc<SealedFile>>>> {
        let (mut file, meta) = crate::files::open_regular(path)?;
        if meta.len() > MAX_LIBRARY_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                format!(
                    "{} bytes, more than the {MAX_LIBRARY_BYTES} a library may have",
                    meta.len()
                ),
            ));
        }
        let Some(fd) = memfd(path)? else {
            // Where nothing can be sealed, nothing is read here either.
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    "this kernel refuses executable memory files (vm.memfd_noexec): plugin \
                     libraries are opened by path, so one rewritten on disk while it is checked \
                     could run unchecked bytes"
                )
            });
            return Ok(Some(None));
        };
        let mut copy = std::fs::File::from(fd);
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut len = 0u64;
        // Read no further than the size when opened: a file growing under the read is cut.
        let mut limited = (&mut file).take(meta.len());
        loop {
            let n = limited.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            copy.write_all(&buf[..n])?;
            len += n as u64;
        }
        if len != meta.len() || stamp(&file.metadata()?) != stamp(&meta) {
            return Ok(None);
        }
        let sha256: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        // File times are kept to a coarse clock tick, so a write in the same tick as the read
        // leaves them as they were: read the file once more, and keep the copy only if it is
        // the same bytes.
        if !same_bytes(&mut file, &mut copy, len, &mut buf)? {
            return Ok(None);
        }
        let seals =
            libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor this function owns; no memory is passed.
        if unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut table = BY_DIGEST.lock().unwrap_or_else(|p| p.into_inner());
        let table = table.get_or_insert_with(HashMap::new);
        if let Some(same) = table.get(&sha256).and_then(Weak::upgrade) {
            // These bytes are sealed already: one copy, one name for the loader.
            return Ok(Some(Some(same)));
        }
        table.retain(|_, w| w.strong_count() > 0);
        let sealed = Arc::new(SealedFile {
            fd: OwnedFd::from(copy),
            sha256: sha256.clone(),
            len,
        });
        table.insert(sha256, Arc::downgrade(&sealed));
        Ok(Some(Some(sealed)))
    }
}

/// How an admitted ONNX Runtime plugin-EP library is opened: the adapter's sealed copy and the
/// settings of its entry.
#[derive(Clone, Debug)]
pub struct Hosting {
    pub adapter: LibraryImage,
    /// ONNX Runtime's names of the EPs, in order.
    pub ep_names: Vec<String>,
    /// epx's names of them, in the same order.
    pub providers: Vec<String>,
    /// The oldest ONNX Runtime the library works with.
    pub onnxruntime: String,
    /// The plugin's name and version, as its manifest gives them (what listings show).
    pub name: String,
    pub version: String,
}

impl Hosting {
    pub fn new(
        adapter: LibraryImage,
        spec: &super::manifest::OrtEpSpec,
        manifest: &super::manifest::PluginManifest,
    ) -> Hosting {
        Hosting {
            adapter,
            ep_names: spec.ep_names.clone(),
            providers: manifest.providers.clone(),
            onnxruntime: spec.onnxruntime.to_string(),
            name: manifest.name.clone(),
            version: manifest.version.to_string(),
        }
    }

    /// The adapter's settings for hosting `library` (the vendor library's sealed copy, opened
    /// from `load_path`).
    pub fn settings(&self, library: &LibraryImage) -> Vec<(String, String)> {
        vec![
            (
                "library".to_owned(),
                library.load_path().to_string_lossy().into_owned(),
            ),
            (
                "library_file".to_owned(),
                library.path.to_string_lossy().into_owned(),
            ),
            ("ep_names".to_owned(), self.ep_names.join(",")),
            ("providers".to_owned(), self.providers.join(",")),
            ("onnxruntime".to_owned(), self.onnxruntime.clone()),
            ("name".to_owned(), self.name.clone()),
            ("version".to_owned(), self.version.clone()),
        ]
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_copy_keeps_its_bytes_when_the_file_changes_and_cannot_be_written() {
        let dir = std::env::temp_dir().join(format!("epx-sealed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("lib.so");
        std::fs::write(&f, b"first version").unwrap();
        let a = seal(&f).unwrap().expect("memfd");
        std::fs::write(&f, b"second").unwrap();
        assert_eq!(std::fs::read(a.load_path()).unwrap(), b"first version");
        assert_eq!(a.len(), 13);
        // Sealed: not even this process can write it.
        let w = std::fs::OpenOptions::new().write(true).open(a.load_path());
        if let Ok(mut w) = w {
            use std::io::Write;
            assert!(w.write_all(b"x").is_err(), "a sealed copy took a write");
        }
        // The same bytes give the same copy; other bytes another one.
        let b = seal(&f).unwrap().expect("memfd");
        assert_ne!(a.sha256(), b.sha256());
        std::fs::write(&f, b"first version").unwrap();
        let c = seal(&f).unwrap().expect("memfd");
        assert!(Arc::ptr_eq(&a, &c), "one copy per content");
        // A digest that does not match is refused by name.
        let e = seal_expecting(&f, &"0".repeat(64)).unwrap_err();
        assert!(e.contains("changed after it was checked"), "{e}");
        assert!(seal_expecting(&f, a.sha256()).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
