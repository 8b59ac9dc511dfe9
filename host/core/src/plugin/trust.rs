//! Who could change the code a plugin runs. A plugin's library is trusted only when nobody but
//! root and the user running epx can replace it, or anything on the way to it: the library,
//! every symlink met while resolving its path, the folder each of them is in, and every folder
//! above, up to `/` (the reasoning of `sudo` and the Vulkan loader).
//!
//! On each path the walk resolves, one component at a time:
//! - every file, folder and symlink must be owned by root or by the current (effective) user;
//! - nothing may be writable by other users: not by everyone (`o+w`), and not by a group other
//!   than root's or the user's own (`g+w`);
//! - one exception: a folder *above* the thing checked may be writable by everyone when it has
//!   the sticky bit (`/tmp`), since then others can add entries but not replace ours. The thing
//!   checked itself (a search folder, a plugin folder, a library) gets no such exception.

use std::path::{Component, Path, PathBuf};

/// Why nobody should run the code at `path`: someone else could change it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Untrusted {
    /// The path where the walk found the problem (the thing checked, a folder above it, a
    /// symlink or a symlink's target).
    pub path: PathBuf,
    pub reason: String,
}

impl std::fmt::Display for Untrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.reason)
    }
}

/// Symlinks followed on one path before giving up (Linux's own limit).
const MAX_LINKS: usize = 40;

/// Checks `path` and everything its resolution passes through. A path that does not exist is
/// not this check's business (the caller reports it missing): its existing part is checked.
#[cfg(unix)]
pub fn check(path: &Path) -> Result<(), Untrusted> {
    check_guarding(path, "the plugin's code")
}

/// [`check`] for a path that guards something else than a plugin's code, named by `stake` in
/// the reasons (`"the kernels epx loads from it"` for the compiled-kernel cache).
#[cfg(unix)]
pub fn check_guarding(path: &Path, stake: &'static str) -> Result<(), Untrusted> {
    let who = Who::current(stake);
    let start = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut resolved = PathBuf::from("/");
    let mut links = 0;
    who.check_one(&resolved, true)?;
    let mut queue = components(&start);
    while let Some(name) = queue.pop_front() {
        if name == ".." {
            resolved.pop();
            continue;
        }
        let next = resolved.join(&name);
        let Ok(meta) = std::fs::symlink_metadata(&next) else {
            return Ok(());
        };
        let last = queue.is_empty();
        if meta.file_type().is_symlink() {
            who.check_meta(&next, &meta, "symlink", true)?;
            links += 1;
            if links > MAX_LINKS {
                return Err(Untrusted {
                    path: start.clone(),
                    reason: format!(
                        "{} goes through more than {MAX_LINKS} symlinks",
                        start.display()
                    ),
                });
            }
            let Ok(target) = std::fs::read_link(&next) else {
                return Ok(());
            };
            if target.is_absolute() {
                resolved = PathBuf::from("/");
            }
            for c in components(&target).into_iter().rev() {
                queue.push_front(c);
            }
            continue;
        }
        who.check_one_meta(&next, &meta, !last)?;
        resolved = next;
    }
    Ok(())
}

/// The most entries [`check_tree`] looks at before refusing a tree as too large to check.
pub const MAX_TREE_ENTRIES: usize = 20_000;

/// [`check_guarding`] for the folder `dir`, then every file, folder and symlink inside it
/// (recursively; a symlink's whole path is walked): code that runs from a folder (a Python
/// package's modules) is trusted only when nobody else could change any of it. A tree past
/// [`MAX_TREE_ENTRIES`] entries is refused, not half-checked.
#[cfg(unix)]
pub fn check_tree(dir: &Path, stake: &'static str) -> Result<(), Untrusted> {
    check_guarding(dir, stake)?;
    let who = Who::current(stake);
    let mut pending = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    while let Some(folder) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > MAX_TREE_ENTRIES {
                return Err(Untrusted {
                    path: dir.to_path_buf(),
                    reason: format!(
                        "{} holds more than {MAX_TREE_ENTRIES} entries, too many to check who                          could change {stake}",
                        dir.display()
                    ),
                });
            }
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                check_guarding(&path, stake)?;
            } else {
                who.check_one_meta(&path, &meta, false)?;
                if meta.is_dir() {
                    pending.push(path);
                }
            }
        }
    }
    Ok(())
}

#[cfg(not(unix))]
pub fn check_tree(_dir: &Path, _stake: &'static str) -> Result<(), Untrusted> {
    Ok(())
}

#[cfg(not(unix))]
pub fn check(_path: &Path) -> Result<(), Untrusted> {
    // Windows has no owner/mode bits to read here; ACLs are left to the OS.
    Ok(())
}

#[cfg(not(unix))]
pub fn check_guarding(_path: &Path, _stake: &'static str) -> Result<(), Untrusted> {
    Ok(())
}

/// The normal and `..` components of a path, as owned names (`.` and the root are dropped: the
/// walk starts at `/`, and a link target that is absolute restarts it there).
fn components(path: &Path) -> std::collections::VecDeque<std::ffi::OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect()
}

/// The user epx runs as.
#[cfg(unix)]
struct Who {
    uid: u32,
    gid: u32,
    /// What someone who could change the path could change, for the reasons.
    stake: &'static str,
}

#[cfg(unix)]
impl Who {
    fn current(stake: &'static str) -> Self {
        // SAFETY: geteuid and getegid take no arguments, cannot fail and touch no memory of ours.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Who { uid, gid, stake }
    }

    fn check_one(&self, path: &Path, above: bool) -> Result<(), Untrusted> {
        match std::fs::metadata(path) {
            Ok(meta) => self.check_one_meta(path, &meta, above),
            Err(_) => Ok(()),
        }
    }

    /// A file or folder on the way: `above` is true for a folder above the thing checked.
    fn check_one_meta(
        &self,
        path: &Path,
        meta: &std::fs::Metadata,
        above: bool,
    ) -> Result<(), Untrusted> {
        let what = if meta.is_dir() { "folder" } else { "file" };
        self.check_meta(path, meta, what, !above)
    }

    fn check_meta(
        &self,
        path: &Path,
        meta: &std::fs::Metadata,
        what: &str,
        strict: bool,
    ) -> Result<(), Untrusted> {
        use std::os::unix::fs::MetadataExt;
        let mode = meta.mode();
        let untrusted = |reason: String| Untrusted {
            path: path.to_path_buf(),
            reason,
        };
        let is_link = meta.file_type().is_symlink();
        if meta.uid() != 0 && meta.uid() != self.uid {
            return Err(untrusted(format!(
                "{what} {} is owned by {}, who is neither root nor the user running epx ({}), \
                 so they could replace {}; have root or yourself own it (chown)",
                path.display(),
                user_name(meta.uid()),
                user_name(self.uid),
                self.stake,
            )));
        }
        // A symlink's own mode is always 0777 and means nothing; its folder is checked.
        if is_link {
            return Ok(());
        }
        let sticky_folder = meta.is_dir() && mode & 0o1000 != 0;
        if mode & 0o002 != 0 && (strict || !sticky_folder) {
            return Err(untrusted(format!(
                "{what} {} is writable by every user (mode {:04o}), so any of them could replace \
                 {}; remove their write permission (chmod o-w {})",
                path.display(),
                mode & 0o7777,
                self.stake,
                path.display()
            )));
        }
        if mode & 0o020 != 0 && meta.gid() != 0 && meta.gid() != self.gid {
            return Err(untrusted(format!(
                "{what} {} is writable by group {} (mode {:04o}), whose members could replace \
                 {}; remove the group's write permission (chmod g-w {})",
                path.display(),
                meta.gid(),
                mode & 0o7777,
                self.stake,
                path.display()
            )));
        }
        Ok(())
    }
}

/// `name (uid N)` from /etc/passwd when it is there, else `uid N`.
#[cfg(unix)]
fn user_name(uid: u32) -> String {
    let name = std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|line| {
                let mut fields = line.split(':');
                let name = fields.next()?;
                let id: u32 = fields.nth(1)?.parse().ok()?;
                (id == uid).then(|| name.to_string())
            })
        });
    match name {
        Some(n) => format!("user {n} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::{PermissionsExt, symlink};

    use super::*;
    use crate::plugin::discover::TestDir;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    fn file(path: &Path) -> PathBuf {
        std::fs::write(path, b"code").expect("write");
        chmod(path, 0o755);
        path.to_path_buf()
    }

    fn mkdir(path: &Path, mode: u32) -> PathBuf {
        std::fs::create_dir_all(path).expect("mkdir");
        chmod(path, mode);
        path.to_path_buf()
    }

    fn refused_at(result: Result<(), Untrusted>, at: &Path) -> String {
        let u = result.expect_err("should be refused");
        assert_eq!(u.path, at, "{}", u.reason);
        u.reason
    }

    #[test]
    fn a_private_tree_under_a_sticky_tmp_is_trusted() {
        let root = TestDir::new("trust-ok");
        let lib = file(&mkdir(&root.path().join("a/b"), 0o755).join("lib.so"));
        assert_eq!(check(&lib), Ok(()));
        // The thing checked may not be world-writable itself, even with the sticky bit.
        let sticky = mkdir(&root.path().join("sticky"), 0o1777);
        let reason = refused_at(check(&sticky), &sticky);
        assert!(
            reason.contains("writable by every user (mode 1777)"),
            "{reason}"
        );
        // Above the thing checked, a sticky world-writable folder (like /tmp) is fine.
        let inside = file(&mkdir(&sticky.join("p"), 0o755).join("lib.so"));
        assert_eq!(check(&inside), Ok(()));
        // A missing path is the caller's to report: its existing part passes.
        assert_eq!(check(&root.path().join("a/none/lib.so")), Ok(()));
    }

    #[test]
    fn a_folder_above_writable_by_everyone_is_refused() {
        let root = TestDir::new("trust-parent");
        let open = mkdir(&root.path().join("open"), 0o777);
        let lib = file(&mkdir(&open.join("plugins/p"), 0o755).join("lib.so"));
        let reason = refused_at(check(&lib), &open);
        assert!(
            reason.starts_with(&format!("folder {} is writable", open.display())),
            "{reason}"
        );
        assert!(reason.contains("chmod o-w"), "{reason}");
        chmod(&open, 0o755);
        assert_eq!(check(&lib), Ok(()));
    }

    #[test]
    fn symlinks_are_followed_and_their_targets_checked() {
        let root = TestDir::new("trust-links");
        // A library linked into a 0777 folder elsewhere.
        let elsewhere = mkdir(&root.path().join("elsewhere"), 0o777);
        let real = file(&elsewhere.join("libreal.so"));
        let plugin = mkdir(&root.path().join("plugin"), 0o755);
        symlink(&real, plugin.join("lib.so")).expect("symlink");
        refused_at(check(&plugin.join("lib.so")), &elsewhere);
        // A relative link, through a linked folder, ending in a world-writable file.
        chmod(&elsewhere, 0o755);
        chmod(&real, 0o757);
        symlink("../elsewhere", plugin.join("deps")).expect("symlink");
        let reason = refused_at(check(&plugin.join("deps/libreal.so")), &real);
        assert!(reason.starts_with("file "), "{reason}");
        chmod(&real, 0o755);
        assert_eq!(check(&plugin.join("deps/libreal.so")), Ok(()));
        // A loop of links ends in an error, not a hang.
        symlink("loop_b", plugin.join("loop_a")).expect("symlink");
        symlink("loop_a", plugin.join("loop_b")).expect("symlink");
        let reason = refused_at(check(&plugin.join("loop_a")), &plugin.join("loop_a"));
        assert!(reason.contains("more than 40 symlinks"), "{reason}");
    }

    #[test]
    fn a_group_other_than_yours_may_not_write() {
        let root = TestDir::new("trust-group");
        let lib = file(&root.path().join("lib.so"));
        chmod(&lib, 0o775);
        // Group-writable by the user's own group (or root's) is fine.
        assert_eq!(check(&lib), Ok(()));
        if Who::current("the test").uid != 0 {
            eprintln!(
                "not root: changing a file's group to another one needs root; only the own-group case was tested"
            );
            return;
        }
        std::os::unix::fs::chown(&lib, None, Some(54321)).expect("chgrp");
        let reason = refused_at(check(&lib), &lib);
        assert!(
            reason.contains("writable by group 54321 (mode 0775)"),
            "{reason}"
        );
        chmod(&lib, 0o755);
        assert_eq!(check(&lib), Ok(()));
    }

    #[test]
    fn files_owned_by_another_user_are_refused() {
        if Who::current("the test").uid != 0 {
            eprintln!(
                "not root: giving a file to another user needs root; this case was not tested here"
            );
            return;
        }
        let root = TestDir::new("trust-owner");
        let dir = mkdir(&root.path().join("theirs"), 0o755);
        let lib = file(&dir.join("lib.so"));
        std::os::unix::fs::chown(&dir, Some(54321), None).expect("chown");
        let reason = refused_at(check(&lib), &dir);
        assert!(
            reason.contains("is owned by uid 54321, who is neither root nor the user running epx"),
            "{reason}"
        );
        std::os::unix::fs::chown(&dir, Some(0), None).expect("chown");
        // A symlink someone else owns (they made it, in a folder they could write to).
        std::os::unix::fs::lchown(&lib, Some(0), None).expect("chown");
        symlink(&lib, root.path().join("link.so")).expect("symlink");
        std::os::unix::fs::lchown(root.path().join("link.so"), Some(54321), None).expect("chown");
        let reason = refused_at(
            check(&root.path().join("link.so")),
            &root.path().join("link.so"),
        );
        assert!(reason.starts_with("symlink "), "{reason}");
    }
}
