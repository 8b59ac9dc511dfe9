//! Where a plugin library was loaded from, for a plugin that ships files beside itself (a vendor
//! runtime, kernels, a license file).
//!
//! The host opens a plugin from a sealed copy of the file it checked, so `/proc/self/maps` shows
//! an anonymous memory file there (`/memfd:epx:...`), not the plugin's folder. The loader's own
//! record does name the file (the host sets it), and `dladdr` reads it: ask this module rather
//! than the maps.

use std::path::{Path, PathBuf};

/// The file of the library holding `address` (of a function or static of the caller's: `f as
/// usize`), as the loader names it: absolute for a plugin library; for code linked into the
/// program, the program's path. `None` where the platform cannot tell.
pub fn library_path_of(address: usize) -> Option<PathBuf> {
    #[cfg(unix)]
    {
        use std::ffi::{CStr, c_char, c_int, c_void};
        /// POSIX `Dl_info`.
        #[repr(C)]
        struct DlInfo {
            dli_fname: *const c_char,
            dli_fbase: *mut c_void,
            dli_sname: *const c_char,
            dli_saddr: *mut c_void,
        }
        unsafe extern "C" {
            fn dladdr(addr: *const c_void, info: *mut DlInfo) -> c_int;
        }
        let mut info = DlInfo {
            dli_fname: std::ptr::null(),
            dli_fbase: std::ptr::null_mut(),
            dli_sname: std::ptr::null(),
            dli_saddr: std::ptr::null_mut(),
        };
        // SAFETY: dladdr only looks the address up in the loader's tables (it does not read
        // memory there) and fills `info`.
        let found = unsafe { dladdr(address as *const c_void, &mut info) };
        if found == 0 || info.dli_fname.is_null() {
            return None;
        }
        // SAFETY: a NUL-terminated name owned by the loader, copied at once.
        let name = unsafe { CStr::from_ptr(info.dli_fname) };
        let path = PathBuf::from(std::ffi::OsStr::new(&*name.to_string_lossy()));
        if path.is_absolute() {
            return Some(path);
        }
        // The main program is named as it was started (argv[0]).
        std::env::current_exe().ok()
    }
    #[cfg(not(unix))]
    {
        let _ = address;
        None
    }
}

/// The folder of the library holding `address` ([`library_path_of`]), symbolic links resolved.
pub fn library_folder_of(address: usize) -> Option<PathBuf> {
    let path = library_path_of(address)?;
    let path = path.canonicalize().unwrap_or(path);
    path.parent().map(PathBuf::from)
}

/// The Python environment's package folder a file lies in: the nearest folder above `path`
/// named `site-packages` (or Debian's `dist-packages`). A plugin installed by a wheel
/// (`site-packages/epx/lib/epx/plugins/<name>/`) looks for the vendor runtime installed beside
/// it there first (`site-packages/onnxruntime/capi/`, `site-packages/openvino/libs/`), whether
/// or not that environment is activated.
pub fn site_packages_above(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .skip(1)
        .find(|a| {
            a.file_name()
                .is_some_and(|n| n == "site-packages" || n == "dist-packages")
        })
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn site_packages_above_a_file_is_the_nearest_package_folder() {
        use super::site_packages_above as above;
        let plugin =
            Path::new("/srv/venv/lib/python3.11/site-packages/epx/lib/epx/plugins/ort_cpu");
        assert_eq!(
            above(plugin).as_deref(),
            Some(Path::new("/srv/venv/lib/python3.11/site-packages"))
        );
        let deb = Path::new("/usr/lib/python3/dist-packages/epx/bin/epx");
        assert_eq!(
            above(deb).as_deref(),
            Some(Path::new("/usr/lib/python3/dist-packages"))
        );
        assert_eq!(above(Path::new("/usr/local/bin/epx")), None);
        // The folder itself is not "above" it.
        assert_eq!(above(Path::new("/x/site-packages")), None);
    }

    #[test]
    fn code_of_this_test_program_is_located_in_its_folder() {
        let here = super::library_folder_of(
            code_of_this_test_program_is_located_in_its_folder as fn() as usize,
        );
        let exe = std::env::current_exe().unwrap().canonicalize().unwrap();
        assert_eq!(here.as_deref(), exe.parent());
    }
}
