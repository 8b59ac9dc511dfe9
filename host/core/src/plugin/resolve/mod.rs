//! Dependency preflight: before `dlopen`, find every library a plugin library needs.
//!
//! A plugin that wraps a vendor runtime (ONNX Runtime, CUDA, OpenVINO, TensorRT…) needs libraries
//! the system loader usually cannot find on its own: they live next to the plugin, in a vendor
//! folder, or inside a Python wheel. `dlopen` failing on one of them says only "cannot open shared
//! object file" (or "error 126" on Windows) about *some* library. Instead, the host reads the
//! plugin library's needs (ELF `DT_NEEDED`, with `DT_RUNPATH`/`DT_RPATH`) and looks each one up in
//! a fixed order (see [`resolve_dependencies`]). What is found is preloaded by absolute path
//! ([`DependencyReport::preload_order`]) so that the loader finds it already loaded (glibc matches
//! loaded libraries by soname); what is missing is reported by name together with every folder
//! searched ([`MissingDependencies`]).
//!
//! The ELF reader reads only the file header, the program headers, the dynamic segment and the
//! few strings it needs, with every offset checked against the file size: vendor libraries can
//! be gigabytes, and a corrupt file must give an error, never a panic or a huge allocation.
//!
//! Reading needs is implemented for ELF (Linux) only; on other targets [`needed_libraries`]
//! returns an empty list and only the manifest's `[[dependencies]]` are checked.
//!
//! The parts: [`report`] says what was found and what is missing; [`needs`] reads what a
//! library needs from its ELF file; [`search`] lists the folders of each search rule from the
//! process environment (`ld.so.conf`, site-packages, `python3`); the resolver here walks the
//! needs through those folders.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Component, Path, PathBuf};

use super::manifest::DependencySpec;

mod needs;
mod report;
mod search;

pub use needs::{ElfDependencies, needed_libraries};
use needs::{ElfIdentity, elf_identity};
pub use report::{
    DependencyEntry, DependencyReport, DependencyStatus, MissingDependencies, ResolveError,
    SearchPlace,
};
pub(crate) use search::site_packages_dirs;
use search::*;
pub use search::{LIBRARY_PATH_ENV, installation_site_packages};

/// How deep transitive dependencies are followed (plugin → its deps → theirs …).
const MAX_DEPTH: usize = 16;

/// Finds every library `lib` needs, transitively, and where each is.
///
/// For each `DT_NEEDED` name (and each `deps` name not among them), in order:
/// 1. the plugin's own folder `plugin_dir`;
/// 2. the manifest's `hints` (those of the dependency itself first, then every other
///    dependency's hints); relative hints are relative to `plugin_dir`, `$VAR`/`${VAR}` are
///    expanded from the environment (`$ORIGIN` is the plugin folder);
/// 3. `DT_RUNPATH` (or `DT_RPATH`) of the library that needs it, with `$ORIGIN` expanded;
/// 4. each folder of `EPX_LIBRARY_PATH`;
/// 5. the system loader path: `LD_LIBRARY_PATH`, `/etc/ld.so.conf` (with its `include`s) and
///    the default library folders;
/// 6. Python `site-packages` folders (the one this epx is installed in first, then `VIRTUAL_ENV`, `CONDA_PREFIX`, `PYTHONPATH`, the user
///    and system site folders, and, only if still not found, what `python3` reports) and their
///    vendor subfolders (`onnxruntime/capi`, `nvidia/*/lib`, `openvino/libs`, `tensorrt_libs`,
///    `tensorrt`) plus the manifest's `python_packages`.
///
/// A file with the right name but for another architecture (or not ELF at all) is passed over,
/// as the loader would. Libraries the host process already has (glibc, libstdc++, libgcc_s, the
/// dynamic loader) are [`DependencyStatus::System`]. Libraries found by rules 1–4 and 6 are
/// scanned for their own needs, up to a fixed depth.
///
/// Errors only when `lib` itself cannot be read or is not an ELF library; problems with
/// dependencies end up in the report.
pub fn resolve_dependencies(
    lib: &Path,
    plugin_dir: &Path,
    deps: &[DependencySpec],
) -> Result<DependencyReport, ResolveError> {
    resolve_dependencies_of(lib, lib, plugin_dir, deps)
}

/// [`resolve_dependencies`] of `lib` reading its ELF headers from `read_from` (the sealed copy
/// admission checks and loading opens); `lib` stays the library's name (`$ORIGIN` is its
/// folder) in the report.
pub fn resolve_dependencies_of(
    lib: &Path,
    read_from: &Path,
    plugin_dir: &Path,
    deps: &[DependencySpec],
) -> Result<DependencyReport, ResolveError> {
    let env = SearchEnv::from_process();
    resolve_with(&env, lib, read_from, plugin_dir, deps)
}

/// One folder to look in and the rule it belongs to.
struct Place {
    dir: PathBuf,
    place: SearchPlace,
    /// List it among the searched folders even if it does not exist (configured explicitly).
    always_list: bool,
}

fn resolve_with(
    env: &SearchEnv,
    lib: &Path,
    read_from: &Path,
    plugin_dir: &Path,
    specs: &[DependencySpec],
) -> Result<DependencyReport, ResolveError> {
    let mut root = needed_libraries(read_from).map_err(|e| e.naming(read_from, lib))?;
    root.path = lib.to_path_buf();
    let span = tracing::debug_span!("resolve_dependencies", library = %lib.display());
    let _guard = span.enter();

    let mut resolver = Resolver {
        env,
        plugin_dir,
        specs,
        target: root.identity(),
        entries: Vec::new(),
        index: HashMap::new(),
        needs: BTreeMap::new(),
    };

    let mut root_needs = root.needed.clone();
    for spec in specs {
        if !root_needs.contains(&spec.name) {
            root_needs.push(spec.name.clone());
        }
    }
    let mut queue: VecDeque<(ElfDependencies, Vec<String>, usize)> = VecDeque::new();
    queue.push_back((root, root_needs, 0));

    while let Some((needer, names, depth)) = queue.pop_front() {
        resolver.needs.insert(needer.path.clone(), names.clone());
        for name in names {
            let found = if let Some(&i) = resolver.index.get(&name) {
                resolver.again(i, &needer, lib)
            } else {
                let optional = needer.path == lib
                    && !needer.needed.contains(&name)
                    && is_optional_spec(specs, &name);
                let status = resolver.locate(&name, &needer);
                tracing::debug!(dependency = %name, needed_by = %needer.path.display(), ?status);
                let found = scan_target(&status);
                resolver.index.insert(name.clone(), resolver.entries.len());
                resolver.entries.push(DependencyEntry {
                    name,
                    needed_by: needer.path.clone(),
                    status,
                    optional,
                });
                found
            };
            let Some(path) = found else { continue };
            if depth + 1 >= MAX_DEPTH {
                tracing::warn!(library = %path.display(), "dependency chain too deep; not followed further");
                continue;
            }
            match needed_libraries(&path) {
                Ok(deps) => {
                    let needs = deps.needed.clone();
                    queue.push_back((deps, needs, depth + 1));
                }
                Err(e) => tracing::warn!("cannot read the needs of a dependency: {e}"),
            }
        }
    }

    Ok(DependencyReport {
        library: lib.to_path_buf(),
        entries: resolver.entries,
        needs: resolver.needs,
    })
}

fn is_optional_spec(specs: &[DependencySpec], name: &str) -> bool {
    specs.iter().any(|s| s.name == name && s.optional)
}

struct Resolver<'a> {
    env: &'a SearchEnv,
    plugin_dir: &'a Path,
    specs: &'a [DependencySpec],
    target: Option<ElfIdentity>,
    entries: Vec<DependencyEntry>,
    index: HashMap<String, usize>,
    needs: BTreeMap<PathBuf, Vec<String>>,
}

/// The library to scan for further needs, if `status` found one the system loader would not
/// find by itself.
fn scan_target(status: &DependencyStatus) -> Option<PathBuf> {
    match status {
        DependencyStatus::Found { path, place } if *place != SearchPlace::SystemLoader => {
            Some(path.clone())
        }
        _ => None,
    }
}

impl Resolver<'_> {
    /// Entry `i` is needed again, by `needer`. Anything but the plugin's manifest needing it
    /// makes it required; if it was missing, `needer`'s run path may still find it (once the
    /// library that found it is loaded, the loader reuses it by soname for everyone).
    /// Returns a newly found library to scan.
    fn again(&mut self, i: usize, needer: &ElfDependencies, lib: &Path) -> Option<PathBuf> {
        let name = self.entries.get(i)?.name.clone();
        if needer.path != lib {
            if let Some(entry) = self.entries.get_mut(i) {
                entry.optional = false;
            }
        }
        if !matches!(
            self.entries.get(i)?.status,
            DependencyStatus::Missing { .. }
        ) {
            return None;
        }
        let status = self.locate(&name, needer);
        let entry = self.entries.get_mut(i)?;
        match (&mut entry.status, status) {
            (
                DependencyStatus::Missing { searched },
                DependencyStatus::Missing { searched: more },
            ) => {
                for dir in more {
                    if !searched.contains(&dir) {
                        searched.push(dir);
                    }
                }
                None
            }
            (_, status) => {
                tracing::debug!(dependency = %name, needed_by = %needer.path.display(), ?status);
                entry.needed_by = needer.path.clone();
                entry.status = status;
                scan_target(&entry.status)
            }
        }
    }

    fn locate(&self, name: &str, needer: &ElfDependencies) -> DependencyStatus {
        if is_host_provided(name) {
            let path = self
                .env
                .system_dirs
                .iter()
                .map(|d| d.join(name))
                .find(|p| p.is_file());
            return DependencyStatus::System { path };
        }
        // A name with a slash is a path, used as is by the loader (relative to the current
        // folder, which a host cannot vouch for, so only absolute ones are accepted).
        if name.contains('/') {
            let path = PathBuf::from(name);
            return if path.is_absolute() && self.usable(&path) {
                DependencyStatus::Found {
                    path,
                    place: SearchPlace::SystemLoader,
                }
            } else {
                DependencyStatus::Missing {
                    searched: vec![path],
                }
            };
        }

        let mut searched = Vec::new();
        let mut seen = HashSet::new();
        let places = self.places(name, needer);
        if let Some(found) = self.search(name, places, &mut searched, &mut seen) {
            return found;
        }
        if self.env.ask_python {
            let extra: Vec<PathBuf> = python_site_packages()
                .iter()
                .filter(|d| !self.env.site_packages.contains(d))
                .cloned()
                .collect();
            let places = self.python_places(name, &extra);
            if let Some(found) = self.search(name, places, &mut searched, &mut seen) {
                return found;
            }
        }
        DependencyStatus::Missing { searched }
    }

    fn search(
        &self,
        name: &str,
        places: Vec<Place>,
        searched: &mut Vec<PathBuf>,
        seen: &mut HashSet<PathBuf>,
    ) -> Option<DependencyStatus> {
        for Place {
            dir,
            place,
            always_list,
        } in places
        {
            if !seen.insert(dir.clone()) {
                continue;
            }
            if always_list || dir.is_dir() {
                searched.push(dir.clone());
            }
            let candidate = dir.join(name);
            if candidate.is_file() && self.usable(&candidate) {
                return Some(DependencyStatus::Found {
                    path: candidate,
                    place,
                });
            }
        }
        None
    }

    /// A file of the right name is only what the loader would take if it is ELF for the same
    /// machine as the plugin library.
    fn usable(&self, candidate: &Path) -> bool {
        let Some(target) = self.target else {
            return true;
        };
        match elf_identity(candidate) {
            Ok(found) if found == target => true,
            Ok(found) => {
                tracing::warn!(
                    candidate = %candidate.display(),
                    "skipped: built for {found}, the plugin is {target}"
                );
                false
            }
            Err(reason) => {
                tracing::warn!(candidate = %candidate.display(), "skipped: {reason}");
                false
            }
        }
    }

    /// Rules 1–6 for `name`, in order.
    fn places(&self, name: &str, needer: &ElfDependencies) -> Vec<Place> {
        let mut places = vec![Place {
            dir: self.plugin_dir.to_path_buf(),
            place: SearchPlace::PluginDir,
            always_list: true,
        }];

        let own = self.specs.iter().filter(|s| s.name == name);
        let others = self.specs.iter().filter(|s| s.name != name);
        for hint in own.chain(others).flat_map(|s| &s.hints) {
            match expand_vars(hint, |var| {
                if var == "ORIGIN" {
                    Some(self.plugin_dir.as_os_str().to_owned())
                } else {
                    self.env.vars.get(var).cloned()
                }
            }) {
                Some(expanded) => {
                    let dir = PathBuf::from(expanded);
                    let dir = if dir.is_absolute() {
                        dir
                    } else {
                        self.plugin_dir.join(dir)
                    };
                    places.push(Place {
                        dir,
                        place: SearchPlace::ManifestHint,
                        always_list: true,
                    });
                }
                None => tracing::debug!(%hint, "manifest hint skipped: it names an unset variable"),
            }
        }

        let origin = needer.path.parent().unwrap_or(Path::new("/"));
        for entry in needer.search_path() {
            if let Some(dir) = expand_run_path(entry, origin, needer.is_64bit) {
                places.push(Place {
                    dir,
                    place: SearchPlace::RunPath,
                    always_list: true,
                });
            }
        }

        for dir in &self.env.library_path {
            places.push(Place {
                dir: dir.clone(),
                place: SearchPlace::EnvLibraryPath,
                always_list: true,
            });
        }
        for dir in &self.env.system_dirs {
            places.push(Place {
                dir: dir.clone(),
                place: SearchPlace::SystemLoader,
                always_list: false,
            });
        }
        places.extend(self.python_places(name, &self.env.site_packages));
        places
    }

    fn python_places(&self, name: &str, site_packages: &[PathBuf]) -> Vec<Place> {
        let own = self.specs.iter().filter(|s| s.name == name);
        let others = self.specs.iter().filter(|s| s.name != name);
        let subfolders: Vec<&str> = own
            .chain(others)
            .flat_map(|s| s.python_packages.iter().map(String::as_str))
            .chain(PYTHON_LIBRARY_FOLDERS.iter().copied())
            .collect();
        let mut places = Vec::new();
        for site in site_packages {
            for sub in &subfolders {
                let relative = Path::new(sub);
                // A manifest entry may not climb out of site-packages.
                if relative.is_absolute()
                    || relative
                        .components()
                        .any(|c| matches!(c, Component::ParentDir))
                {
                    continue;
                }
                for dir in glob_paths(&site.join(relative)) {
                    places.push(Place {
                        dir,
                        place: SearchPlace::PythonPackage,
                        always_list: false,
                    });
                }
            }
        }
        places
    }
}

#[cfg(test)]
mod tests {
    use super::needs::read_elf_dependencies;
    use super::*;
    use crate::plugin::discover::TestDir;
    use std::ffi::OsString;

    #[test]
    fn wildcards() {
        assert!(wildcard_match("*.conf", "libc.conf"));
        assert!(!wildcard_match("*.conf", "libc.conf~"));
        assert!(wildcard_match("python3*", "python3.11"));
        assert!(wildcard_match("a?c*", "abcdef"));
        assert!(wildcard_match("*", ""));
        assert!(!wildcard_match("?", ""));
        assert!(wildcard_match("*a*b", "xxaxxb"));
        assert!(!wildcard_match("*a*b", "xxaxxbc"));
    }

    #[test]
    fn variables_expand_or_skip() {
        let lookup = |v: &str| (v == "HOME").then(|| OsString::from("/home/me"));
        assert_eq!(
            expand_vars("$HOME/lib", lookup),
            Some("/home/me/lib".into())
        );
        assert_eq!(
            expand_vars("${HOME}x/lib", lookup),
            Some("/home/mex/lib".into())
        );
        assert_eq!(expand_vars("$NOPE/lib", lookup), None);
        assert_eq!(expand_vars("${HOME", lookup), None);
        assert_eq!(expand_vars("a$/b$", lookup), Some("a$/b$".into()));
        assert_eq!(
            expand_run_path("$ORIGIN/../lib", Path::new("/p/x"), true),
            Some(PathBuf::from("/p/x/../lib"))
        );
        assert_eq!(expand_run_path("relative", Path::new("/p"), true), None);
    }

    #[test]
    fn host_provided_names() {
        if !cfg!(target_os = "linux") {
            return;
        }
        for name in [
            "libc.so.6",
            "libm.so.6",
            "libstdc++.so.6",
            "libgcc_s.so.1",
            "ld-linux-x86-64.so.2",
            "libpthread.so.0",
        ] {
            assert!(is_host_provided(name), "{name}");
        }
        for name in [
            "libcudart.so.12",
            "libonnxruntime.so.1",
            "libcrypt.so.1",
            "libc",
        ] {
            assert!(!is_host_provided(name), "{name}");
        }
    }

    #[test]
    fn ld_so_conf_follows_includes() {
        let root = TestDir::new("ldconf");
        let d = root.path().join("ld.so.conf.d");
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(
            root.path().join("ld.so.conf"),
            "# comment\n/opt/first\ninclude ld.so.conf.d/*.conf\n/opt/last # trailing\nhwcap 0 nosegneg\n",
        )
        .expect("write");
        std::fs::write(d.join("b.conf"), "/opt/b1:/opt/b2\n").expect("write");
        std::fs::write(d.join("a.conf"), "/opt/a\ninclude ../ld.so.conf\n").expect("write");
        std::fs::write(d.join("ignored.txt"), "/opt/ignored\n").expect("write");
        let dirs = ld_so_conf_dirs(&root.path().join("ld.so.conf"));
        let expected: Vec<PathBuf> = ["/opt/first", "/opt/a", "/opt/b1", "/opt/b2", "/opt/last"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(dirs, expected);
        // The real one parses (whatever it holds) without panicking.
        let _ = ld_so_conf_dirs(Path::new("/etc/ld.so.conf"));
    }

    #[test]
    fn glob_finds_nested_wildcards() {
        let root = TestDir::new("glob");
        for d in [
            "nvidia/cublas/lib",
            "nvidia/cudnn/lib",
            "nvidia/nolib/include",
            "nvidia/.hidden/lib",
        ] {
            std::fs::create_dir_all(root.path().join(d)).expect("mkdir");
        }
        let got = glob_paths(&root.path().join("nvidia/*/lib"));
        assert_eq!(
            got,
            [
                root.path().join("nvidia/cublas/lib"),
                root.path().join("nvidia/cudnn/lib")
            ]
        );
        assert!(glob_paths(&root.path().join("nothing/*/lib")).is_empty());
        assert_eq!(
            glob_paths(&root.path().join("nvidia")),
            [root.path().join("nvidia")]
        );
    }

    #[test]
    fn non_elf_files_are_rejected_with_the_file_named() {
        let root = TestDir::new("notelf");
        let text = root.path().join("libtext.so");
        std::fs::write(&text, "INPUT(libc.so.6)\n").expect("write");
        let err = read_elf_dependencies(&text).expect_err("not elf");
        assert!(matches!(err, ResolveError::NotElf { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("libtext.so") && msg.contains("not an ELF shared library (bad magic)"),
            "{msg}"
        );

        let empty = root.path().join("empty.so");
        std::fs::write(&empty, b"").expect("write");
        assert!(matches!(
            read_elf_dependencies(&empty),
            Err(ResolveError::NotElf { .. })
        ));

        let short = root.path().join("short.so");
        std::fs::write(&short, b"\x7fELF\x02\x01\x01").expect("write");
        assert!(matches!(
            read_elf_dependencies(&short),
            Err(ResolveError::NotElf { .. })
        ));

        let err = read_elf_dependencies(&root.path().join("absent.so")).expect_err("absent");
        assert!(matches!(err, ResolveError::Io { .. }));

        #[cfg(target_os = "linux")]
        {
            let err = resolve_dependencies(&text, root.path(), &[]).expect_err("not elf");
            assert!(matches!(err, ResolveError::NotElf { .. }));
        }
    }

    /// Builds small shared libraries with the system C compiler; `None` (and a note) when
    /// there is no `cc`.
    fn cc(dir: &Path, args: &[&str]) -> Option<()> {
        let status = std::process::Command::new("cc")
            .args(args)
            .current_dir(dir)
            .status();
        match status {
            Ok(s) if s.success() => Some(()),
            Ok(s) => panic!("cc {args:?} failed: {s}"),
            Err(e) => {
                eprintln!("note: skipping ELF test, no usable `cc`: {e}");
                None
            }
        }
    }

    fn write(path: &Path, text: &str) {
        std::fs::write(path, text).expect("write");
    }

    fn test_env() -> SearchEnv {
        let mut system_dirs = default_library_dirs();
        system_dirs.extend(ld_so_conf_dirs(Path::new("/etc/ld.so.conf")));
        SearchEnv {
            system_dirs,
            ..SearchEnv::default()
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn finds_in_plugin_folder_then_reports_missing() {
        let root = TestDir::new("resolve-basic");
        let dir = root.path();
        write(
            &dir.join("bar.c"),
            "int epx_test_bar(void) { return 42; }\n",
        );
        write(
            &dir.join("foo.c"),
            "#include <stdlib.h>\nint epx_test_bar(void);\nint foo(void) { return epx_test_bar() + (getenv(\"EPX_T\") != 0); }\n",
        );
        if cc(
            dir,
            &[
                "-shared",
                "-fPIC",
                "-o",
                "libepxtestbar.so",
                "bar.c",
                "-Wl,-soname,libepxtestbar.so",
            ],
        )
        .is_none()
        {
            return;
        }
        cc(
            dir,
            &[
                "-shared",
                "-fPIC",
                "-o",
                "libepx_foo.so",
                "foo.c",
                "-L.",
                "-lepxtestbar",
                "-Wl,-soname,libepx_foo.so",
            ],
        );
        let lib = dir.join("libepx_foo.so");

        let deps = needed_libraries(&lib).expect("elf");
        assert_eq!(deps.soname.as_deref(), Some("libepx_foo.so"));
        assert!(
            deps.needed.contains(&"libepxtestbar.so".to_owned()),
            "{deps:?}"
        );
        assert!(deps.needed.contains(&"libc.so.6".to_owned()), "{deps:?}");
        assert!(deps.runpath.is_empty() && deps.rpath.is_empty());

        let report = resolve_dependencies(&lib, dir, &[]).expect("resolve");
        assert!(report.is_complete(), "{report}");
        let bar = report
            .entries
            .iter()
            .find(|e| e.name == "libepxtestbar.so")
            .expect("bar entry");
        assert_eq!(
            bar.status,
            DependencyStatus::Found {
                path: dir.join("libepxtestbar.so"),
                place: SearchPlace::PluginDir
            }
        );
        assert_eq!(bar.needed_by, lib);
        let libc = report
            .entries
            .iter()
            .find(|e| e.name == "libc.so.6")
            .expect("libc entry");
        assert!(
            matches!(libc.status, DependencyStatus::System { .. }),
            "{libc:?}"
        );
        assert_eq!(report.preload_order(), [dir.join("libepxtestbar.so")]);
        assert!(report.check().is_ok());

        std::fs::remove_file(dir.join("libepxtestbar.so")).expect("rm");
        let report = resolve_with(&test_env(), &lib, &lib, dir, &[]).expect("resolve");
        assert!(!report.is_complete());
        let missing = report.missing();
        assert_eq!(missing.len(), 1);
        let DependencyStatus::Missing { searched } = &missing[0].status else {
            panic!("{report}")
        };
        assert_eq!(searched.first(), Some(&dir.to_path_buf()));
        assert!(
            searched.iter().any(|p| p == Path::new("/usr/lib")),
            "{searched:?}"
        );
        let err = report.check().expect_err("missing");
        let text = err.to_string();
        eprintln!("{text}\n---\n{report}");
        assert!(
            text.contains(&format!(
                "libepxtestbar.so (needed by {}): not found; searched:",
                lib.display()
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!("\n    {}\n", dir.display())),
            "{text}"
        );
        assert!(report.preload_order().is_empty());

        // The real environment (python3 included) gives the same verdict.
        let report = resolve_dependencies(&lib, dir, &[]).expect("resolve");
        assert_eq!(report.missing().len(), 1, "{report}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn hints_run_paths_transitive_and_preload_order() {
        let root = TestDir::new("resolve-transitive");
        let dir = root.path();
        let deps_dir = dir.join("deps");
        let deps2 = dir.join("deps2");
        std::fs::create_dir_all(&deps_dir).expect("mkdir");
        std::fs::create_dir_all(&deps2).expect("mkdir");
        write(&deps2.join("bar.c"), "int bar(void) { return 1; }\n");
        write(
            &deps_dir.join("foo.c"),
            "int bar(void);\nint foo(void) { return bar(); }\n",
        );
        write(
            &dir.join("x.c"),
            "int foo(void); int bar(void);\nint x(void) { return foo() + bar(); }\n",
        );
        if cc(
            &deps2,
            &[
                "-shared",
                "-fPIC",
                "-o",
                "libepxtbar.so",
                "bar.c",
                "-Wl,-soname,libepxtbar.so",
            ],
        )
        .is_none()
        {
            return;
        }
        cc(
            &deps_dir,
            &[
                "-shared",
                "-fPIC",
                "-o",
                "libepxtfoo.so",
                "foo.c",
                "-L../deps2",
                "-lepxtbar",
                "-Wl,-soname,libepxtfoo.so",
                "-Wl,--enable-new-dtags,-rpath,$ORIGIN/../deps2",
            ],
        );
        cc(
            dir,
            &[
                "-shared",
                "-fPIC",
                "-o",
                "libepx_x.so",
                "x.c",
                "-Ldeps",
                "-Ldeps2",
                "-Wl,--no-as-needed",
                "-lepxtfoo",
                "-lepxtbar",
                "-Wl,-rpath-link,deps2",
            ],
        );
        let foo_deps = needed_libraries(&deps_dir.join("libepxtfoo.so")).expect("elf");
        assert_eq!(foo_deps.runpath, ["$ORIGIN/../deps2"]);

        let lib = dir.join("libepx_x.so");
        let specs = [
            DependencySpec {
                name: "libepxtfoo.so".into(),
                hints: vec!["deps".into()],
                ..Default::default()
            },
            DependencySpec {
                name: "libepxtoptional.so.3".into(),
                optional: true,
                ..Default::default()
            },
        ];
        let env = test_env();

        // The plugin's own DT_NEEDED for libbar finds nothing, but libfoo's RUNPATH does, and
        // once libfoo's dependencies are loaded the loader reuses libbar for the plugin too.
        let report = resolve_with(&env, &lib, &lib, dir, &specs).expect("resolve");
        assert!(report.is_complete(), "{report}");
        let bar = report
            .entries
            .iter()
            .find(|e| e.name == "libepxtbar.so")
            .expect("bar");
        assert_eq!(
            bar.status,
            DependencyStatus::Found {
                path: deps_dir.join("../deps2/libepxtbar.so"),
                place: SearchPlace::RunPath
            }
        );
        assert_eq!(bar.needed_by, deps_dir.join("libepxtfoo.so"));
        assert_eq!(
            report.preload_order(),
            [
                deps_dir.join("../deps2/libepxtbar.so"),
                deps_dir.join("libepxtfoo.so")
            ]
        );

        let specs2 = [
            DependencySpec {
                name: "libepxtfoo.so".into(),
                hints: vec!["deps".into(), "${EPXT_DEPS2}".into()],
                ..Default::default()
            },
            specs[1].clone(),
        ];
        let mut env2 = env.clone();
        env2.vars
            .insert("EPXT_DEPS2".into(), deps2.clone().into_os_string());
        let report = resolve_with(&env2, &lib, &lib, dir, &specs2).expect("resolve");
        assert!(report.is_complete(), "{report}");
        let foo = report
            .entries
            .iter()
            .find(|e| e.name == "libepxtfoo.so")
            .expect("foo");
        assert_eq!(
            foo.status,
            DependencyStatus::Found {
                path: deps_dir.join("libepxtfoo.so"),
                place: SearchPlace::ManifestHint
            }
        );
        let opt = report
            .entries
            .iter()
            .find(|e| e.name == "libepxtoptional.so.3")
            .expect("optional");
        assert!(opt.optional && matches!(opt.status, DependencyStatus::Missing { .. }));
        // libbar before libfoo, although the plugin lists libfoo first.
        assert_eq!(
            report.preload_order(),
            [deps2.join("libepxtbar.so"), deps_dir.join("libepxtfoo.so")]
        );

        // Through EPX_LIBRARY_PATH instead of hints: libfoo is found there, and libbar (needed
        // by the plugin itself first) also there.
        let mut env3 = env.clone();
        env3.library_path = vec![deps_dir.clone(), deps2.clone()];
        let report = resolve_with(&env3, &lib, &lib, dir, &[]).expect("resolve");
        assert!(report.is_complete(), "{report}");
        assert!(report.entries.iter().all(|e| !matches!(
            e.status,
            DependencyStatus::Found { place, .. } if place != SearchPlace::EnvLibraryPath
        )));

        // Run path only: a plugin that needs only libfoo gets libbar via libfoo's RUNPATH.
        write(
            &dir.join("y.c"),
            "int foo(void);\nint y(void) { return foo(); }\n",
        );
        cc(
            dir,
            &[
                "-shared",
                "-fPIC",
                "-o",
                "libepx_y.so",
                "y.c",
                "-Ldeps",
                "-lepxtfoo",
                "-Wl,-rpath-link,deps2",
            ],
        );
        let report = resolve_with(
            &env,
            &dir.join("libepx_y.so"),
            &dir.join("libepx_y.so"),
            dir,
            &specs[..1],
        )
        .expect("resolve");
        assert!(report.is_complete(), "{report}");
        let bar = report
            .entries
            .iter()
            .find(|e| e.name == "libepxtbar.so")
            .expect("bar");
        assert!(matches!(
            bar.status,
            DependencyStatus::Found {
                place: SearchPlace::RunPath,
                ..
            }
        ));

        // Without libbar anywhere, both needers' searches are listed.
        std::fs::remove_file(deps2.join("libepxtbar.so")).expect("rm");
        let report = resolve_with(&env, &lib, &lib, dir, &specs).expect("resolve");
        let bar = report
            .missing()
            .into_iter()
            .find(|e| e.name == "libepxtbar.so")
            .cloned()
            .expect("bar");
        let DependencyStatus::Missing { searched } = &bar.status else {
            panic!("{report}")
        };
        assert!(searched.contains(&deps_dir), "{searched:?}");
        assert!(
            searched.contains(&deps_dir.join("../deps2")),
            "{searched:?}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn wrong_architecture_and_corrupt_candidates_are_passed_over() {
        let root = TestDir::new("resolve-arch");
        let dir = root.path();
        write(&dir.join("x.c"), "int x(void) { return 0; }\n");
        if cc(dir, &["-shared", "-fPIC", "-o", "libepx_x.so", "x.c"]).is_none() {
            return;
        }
        let lib = dir.join("libepx_x.so");
        // A text file where a library is expected, with the manifest asking for it.
        write(&dir.join("libepxtwanted.so.1"), "not a library");
        let specs = [DependencySpec {
            name: "libepxtwanted.so.1".into(),
            ..Default::default()
        }];
        let report = resolve_with(&test_env(), &lib, &lib, dir, &specs).expect("resolve");
        assert_eq!(report.missing().len(), 1, "{report}");

        // Same file, but another machine in its header.
        let mut bytes = std::fs::read(&lib).expect("read");
        bytes[18] ^= 0x55;
        std::fs::write(dir.join("libepxtwanted.so.1"), &bytes).expect("write");
        let report = resolve_with(&test_env(), &lib, &lib, dir, &specs).expect("resolve");
        assert_eq!(report.missing().len(), 1, "{report}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn corrupt_elf_never_panics() {
        let Ok(real) = std::fs::read("/bin/ls") else {
            return;
        };
        let root = TestDir::new("resolve-fuzz");
        let path = root.path().join("lib.so");
        let mut cuts: Vec<usize> = (0..200).collect();
        cuts.extend((200..real.len()).step_by(997));
        for cut in cuts {
            std::fs::write(&path, &real[..cut]).expect("write");
            let _ = read_elf_dependencies(&path);
        }
        // Flip bytes through the headers and the start of the file.
        let mut state = 0x2545_f491_u32;
        for _ in 0..400 {
            let mut bytes = real.clone();
            for _ in 0..4 {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                let at = (state as usize) % bytes.len().min(8192);
                bytes[at] = (state >> 8) as u8;
            }
            std::fs::write(&path, &bytes).expect("write");
            let _ = read_elf_dependencies(&path);
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn system_libraries_are_system() {
        let ls = Path::new("/bin/ls");
        let Ok(deps) = needed_libraries(ls) else {
            eprintln!("note: /bin/ls is not a readable ELF file here; skipped");
            return;
        };
        assert!(deps.needed.contains(&"libc.so.6".to_owned()), "{deps:?}");
        let report = resolve_dependencies(ls, Path::new("/bin"), &[]).expect("resolve");
        let libc = report
            .entries
            .iter()
            .find(|e| e.name == "libc.so.6")
            .expect("libc");
        let DependencyStatus::System { path } = &libc.status else {
            panic!("{report}")
        };
        assert!(path.is_some(), "{report}");
        assert!(
            report
                .preload_order()
                .iter()
                .all(|p| !p.starts_with("/lib") && !p.starts_with("/usr"))
        );
    }
}
