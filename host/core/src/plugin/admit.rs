//! Admission: every check a plugin library must pass before any of its code runs, in one
//! place. Loading ([`crate::Environment::load`]) and `epx doctor` both call [`admit`] and read
//! the same [`AdmissionReport`], so the tool that explains a refusal and the loader that refuses
//! cannot disagree.
//!
//! The checks, in order (the first that fails is the refusal; later ones are not run):
//! 1. nobody but root and the current user can replace the library or a folder on its way
//!    ([`trust::check`]; discovery checks folders and manifests while scanning, a library
//!    given by path is checked here);
//! 2. the manifest's `abi` has the host's ABI major;
//! 3. the library is read once into a sealed copy ([`sealed`](super::sealed)), and every check
//!    below reads that copy, which is also what the probe child and loading open;
//! 4. the library's SHA-256 is the one the manifest pins (`sha256`), when it pins one;
//! 5. every library it needs is found ([`resolve`]), in the order they are to be preloaded,
//!    and each one to preload passes the check of step 1 and is sealed too;
//! 6. for an ONNX Runtime plugin-EP library (`[onnxruntime_ep]`), epx's adapter that hosts it
//!    is found ([`hosted`](super::hosted)), passes the check of step 1 and is sealed.
//!
//! Once the library is open, [`compare_with_manifest`] checks what it reports against what its
//! manifest says: EP names that differ refuse it (the manifest is what requests are routed by),
//! an ABI version that differs is a warning.

use std::path::{Path, PathBuf};

use epx_plugin_api::abi::{EPX_ABI_VERSION_MAJOR, EPX_ABI_VERSION_MINOR};

use super::discover::{MANIFEST_FILE, PluginCandidate};
use super::hosted;
use super::library::PluginLibrary;
use super::manifest::PluginManifest;
use super::refusal::Refusal;
use super::resolve::{self, DependencyReport};
use super::sealed::{Hosting, LibraryImage};
use super::trust;
use crate::error::PluginLoadErrorKind as Kind;

/// What admission found out about one library.
#[derive(Clone, Debug)]
pub struct AdmissionReport {
    pub library: PathBuf,
    /// The SHA-256 of the library when it matched the manifest's pin; `None` without a pin or
    /// when an earlier check refused the library.
    pub sha256: Option<String>,
    /// Where each dependency was found; `None` when an earlier check refused the library or
    /// its dependencies could not be read (the refusal says why).
    pub dependencies: Option<DependencyReport>,
    /// Why the library is refused; `None` when it may be opened.
    pub refusal: Option<Refusal>,
    /// The copy of the library the checks read and loading opens; `None` when an earlier check
    /// refused it.
    pub image: Option<LibraryImage>,
    /// The copies of the libraries to preload, in order (empty when refused).
    pub preloads: Vec<LibraryImage>,
}

impl AdmissionReport {
    pub fn admitted(&self) -> bool {
        self.refusal.is_none()
    }

    /// The libraries to preload, dependencies first (empty when refused).
    pub fn preload_order(&self) -> Vec<PathBuf> {
        match (&self.refusal, &self.dependencies) {
            (None, Some(d)) => d.preload_order(),
            _ => Vec::new(),
        }
    }

    fn preload_order_unchecked(&self) -> Vec<PathBuf> {
        self.dependencies
            .as_ref()
            .map(DependencyReport::preload_order)
            .unwrap_or_default()
    }
}

/// Runs every admission check on a candidate, without opening the library.
pub fn admit(candidate: &PluginCandidate) -> AdmissionReport {
    let _span = tracing::debug_span!("admit", plugin = %candidate.library.display()).entered();
    let mut report = AdmissionReport {
        library: candidate.library.clone(),
        sha256: None,
        dependencies: None,
        refusal: None,
        image: None,
        preloads: Vec::new(),
    };
    if let Err(refusal) = run_checks(candidate, &mut report) {
        tracing::debug!(kind = ?refusal.kind, "refused: {}", refusal.message);
        report.refusal = Some(refusal);
        report.image = None;
        report.preloads.clear();
    }
    report
}

fn run_checks(candidate: &PluginCandidate, report: &mut AdmissionReport) -> Result<(), Refusal> {
    check_permissions(&candidate.library)?;
    check_manifest_abi(candidate)?;
    let image = LibraryImage::of(&candidate.library).map_err(|e| {
        Refusal::new(
            Kind::Open,
            format!("cannot read {}: {e}", candidate.library.display()),
        )
    })?;
    report.sha256 = check_pin(candidate, image.sha256())?;
    if let Some(digest) = &report.sha256 {
        tracing::debug!(sha256 = %digest, "library matches its sha256 pin");
    }
    let specs = candidate
        .manifest
        .as_ref()
        .map(|m| m.dependencies.as_slice())
        .unwrap_or(&[]);
    let deps = resolve::resolve_dependencies_of(
        &candidate.library,
        &image.load_path(),
        &candidate.dir,
        specs,
    )
    .map_err(|e| Refusal::new(Kind::Open, e.to_string()))?;
    report.image = Some(image);
    let complete = deps.is_complete();
    let text = deps.to_string();
    report.dependencies = Some(deps);
    if !complete {
        return Err(Refusal::new(Kind::MissingDependency, text));
    }
    // The libraries preloaded for it run code too (the system loader's own are root's).
    for dep in report.preload_order_unchecked() {
        trust::check(&dep).map_err(|u| {
            Refusal::new(
                Kind::Refused,
                format!("its dependency {}: {}", dep.display(), u.reason),
            )
        })?;
        let image = LibraryImage::of(&dep).map_err(|e| {
            Refusal::new(
                Kind::Open,
                format!("cannot read its dependency {}: {e}", dep.display()),
            )
        })?;
        report.preloads.push(image);
    }
    if let Some((spec, m)) = candidate
        .manifest
        .as_ref()
        .and_then(|m| m.onnxruntime_ep.as_ref().map(|s| (s, m)))
    {
        let adapter =
            hosted::locate_adapter().map_err(|why| Refusal::new(Kind::MissingDependency, why))?;
        trust::check(&adapter).map_err(|u| {
            Refusal::new(
                Kind::Refused,
                format!(
                    "epx's ONNX Runtime adapter {}: {}",
                    adapter.display(),
                    u.reason
                ),
            )
        })?;
        let image = LibraryImage::of(&adapter).map_err(|e| {
            Refusal::new(
                Kind::Open,
                format!(
                    "cannot read epx's ONNX Runtime adapter {}: {e}",
                    adapter.display()
                ),
            )
        })?;
        if let Some(library) = report.image.as_mut() {
            library.hosted_by = Some(std::sync::Arc::new(Hosting::new(image, spec, m)));
        }
    }
    Ok(())
}

/// A library someone else could replace is not trusted ([`trust::check`]).
fn check_permissions(library: &Path) -> Result<(), Refusal> {
    trust::check(library).map_err(|u| Refusal::new(Kind::Refused, u.reason))
}

/// The manifest says which ABI the library was built for: a wrong major is refused without
/// running any of the library's code.
fn check_manifest_abi(candidate: &PluginCandidate) -> Result<(), Refusal> {
    let Some(m) = &candidate.manifest else {
        return Ok(());
    };
    if m.abi.major == u64::from(EPX_ABI_VERSION_MAJOR) {
        return Ok(());
    }
    Err(Refusal::new(
        Kind::AbiMismatch,
        format!(
            "its plugin.toml declares epx plugin ABI {}, but this host speaks ABI \
             {EPX_ABI_VERSION_MAJOR}.{EPX_ABI_VERSION_MINOR}",
            m.abi
        ),
    ))
}

impl PluginCandidate {
    /// Checks the library file against the manifest's `sha256` pin, without opening it as a
    /// library: `Ok(None)` when there is no pin, `Ok(Some(digest))` when the file matches.
    ///
    /// # Errors
    /// [`Error::PluginLoad`](crate::Error::PluginLoad) of kind
    /// [`ChecksumMismatch`](crate::PluginLoadErrorKind::ChecksumMismatch) naming the library, the
    /// pinned and the actual digest, or of kind [`Open`](crate::PluginLoadErrorKind::Open) when
    /// the file cannot be read.
    pub fn verify_sha256(&self) -> crate::Result<Option<String>> {
        check_sha256(self).map_err(|r| r.into_error(&self.library))
    }
}

/// Checks the library file against the manifest's `sha256` pin: `Ok(None)` when there is no
/// pin, `Ok(Some(digest))` when the file matches.
pub(crate) fn check_sha256(candidate: &PluginCandidate) -> Result<Option<String>, Refusal> {
    check_pin(candidate, None)
}

/// [`check_sha256`] with the digest of the copy that will be opened, when there is one (the file
/// is hashed otherwise).
fn check_pin(candidate: &PluginCandidate, sealed: Option<&str>) -> Result<Option<String>, Refusal> {
    let Some(expected) = candidate
        .manifest
        .as_ref()
        .and_then(|m| m.sha256.as_deref())
    else {
        return Ok(None);
    };
    let library = &candidate.library;
    let actual = match sealed {
        Some(d) => d.to_string(),
        None => super::manifest::sha256_file(library).map_err(|e| {
            Refusal::new(
                Kind::Open,
                format!(
                    "cannot read {} to check it against the sha256 pinned in its \
                     {MANIFEST_FILE}: {e}",
                    library.display()
                ),
            )
        })?,
    };
    if actual != expected {
        return Err(Refusal::new(
            Kind::ChecksumMismatch,
            format!(
                "SHA-256 mismatch: {} has SHA-256 {actual}, but {} pins sha256 = \"{expected}\". \
                 The file is not the library this plugin was packaged with, so it was not opened. \
                 Reinstall the plugin, or, if this library is the one you mean to run, update the pin to \"{actual}\"",
                library.display(),
                candidate.dir.join(MANIFEST_FILE).display(),
            ),
        ));
    }
    Ok(Some(actual))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::discover::{SearchOrigin, TestDir};
    use crate::plugin::manifest::parse_manifest;

    /// A candidate for `lib` in `dir`, with a manifest of `abi` and an optional pin.
    fn candidate(dir: &Path, lib: &str, abi: &str, sha256: Option<&str>) -> PluginCandidate {
        let pin = sha256.map_or_else(String::new, |s| format!("sha256 = \"{s}\"\n"));
        let text = format!(
            "name = \"t\"\nversion = \"0.1.0\"\nabi = \"{abi}\"\nproviders = [\"t\"]\n{pin}\
             [library]\nlinux = \"{lib}\"\nmacos = \"{lib}\"\nwindows = \"{lib}\"\n"
        );
        let manifest = parse_manifest(&text, &dir.join(MANIFEST_FILE)).expect("manifest");
        PluginCandidate {
            name: "t".into(),
            dir: dir.to_path_buf(),
            library: dir.join(lib),
            manifest: Some(manifest),
            origin: SearchOrigin::Explicit,
        }
    }

    #[test]
    fn each_check_refuses_with_its_kind_and_stops_the_later_ones() {
        let dir = TestDir::new("admit");
        let lib = dir.path().join("libt.so");
        std::fs::write(&lib, b"not a library").expect("write");

        let wrong_abi = admit(&candidate(dir.path(), "libt.so", "2.0.0", None));
        let refusal = wrong_abi.refusal.as_ref().expect("refused");
        assert_eq!(refusal.kind, Kind::AbiMismatch);
        assert!(refusal.message.contains("ABI 2.0.0"), "{}", refusal.message);
        assert!(wrong_abi.dependencies.is_none(), "later checks did not run");

        let pin = "0".repeat(64);
        let mismatch = admit(&candidate(dir.path(), "libt.so", "1.0.0", Some(&pin)));
        let refusal = mismatch.refusal.as_ref().expect("refused");
        assert_eq!(refusal.kind, Kind::ChecksumMismatch);
        assert!(mismatch.sha256.is_none() && mismatch.dependencies.is_none());

        let actual = crate::plugin::manifest::sha256_file(&lib).expect("hash");
        let not_elf = admit(&candidate(dir.path(), "libt.so", "1.0.0", Some(&actual)));
        assert_eq!(
            not_elf.sha256.as_deref(),
            Some(actual.as_str()),
            "the pin matched"
        );
        let refusal = not_elf.refusal.as_ref().expect("refused");
        assert_eq!(refusal.kind, Kind::Open);
        assert!(refusal.message.contains("libt.so"), "{}", refusal.message);
        assert!(!not_elf.admitted() && not_elf.preload_order().is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn a_library_anyone_may_replace_is_refused_before_anything_else() {
        use std::os::unix::fs::PermissionsExt;
        let dir = TestDir::new("admit-perm");
        let lib = dir.path().join("libt.so");
        std::fs::write(&lib, b"x").expect("write");
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let report = admit(&candidate(dir.path(), "libt.so", "2.0.0", None));
        let refusal = report.refusal.expect("refused");
        assert_eq!(refusal.kind, Kind::Refused);
        assert!(refusal.message.contains("chmod o-w"), "{}", refusal.message);
    }

    #[test]
    fn a_real_library_with_its_dependencies_found_is_admitted() {
        // The test binary itself is an ELF file whose needs (libc) the system provides.
        let exe = std::env::current_exe().expect("exe");
        let dir = exe.parent().expect("dir");
        let name = exe
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let report = admit(&candidate(dir, &name, "1.3.0", None));
        assert!(report.admitted(), "{:?}", report.refusal);
        assert!(
            report
                .dependencies
                .as_ref()
                .is_some_and(|d| d.is_complete())
        );
    }
}

/// How an opened library differs from its manifest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ManifestDiff {
    /// EPs the manifest lists that the library does not register.
    pub unregistered: Vec<String>,
    /// EPs the library registers that the manifest does not list (unreachable by name).
    pub unlisted: Vec<String>,
    /// Warnings about the `abi` field: it differs from the library's, or is newer than the host's.
    pub abi_warnings: Vec<String>,
}

impl ManifestDiff {
    /// The refusal for EP names that differ, if they do.
    pub fn refusal(&self) -> Option<Refusal> {
        if self.unregistered.is_empty() && self.unlisted.is_empty() {
            return None;
        }
        let mut parts = Vec::new();
        if !self.unregistered.is_empty() {
            parts.push(format!(
                "its {MANIFEST_FILE} lists EP {} that the library does not register",
                quoted(&self.unregistered)
            ));
        }
        if !self.unlisted.is_empty() {
            parts.push(format!(
                "the library registers EP {} that {MANIFEST_FILE} does not list",
                quoted(&self.unlisted)
            ));
        }
        Some(Refusal::new(
            Kind::ManifestMismatch,
            format!(
                "{}; set `providers` in {MANIFEST_FILE} to the EPs the library registers",
                parts.join(", and ")
            ),
        ))
    }
}

fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Compares an opened library with its manifest (see the module docs).
pub fn compare_with_manifest(manifest: &PluginManifest, lib: &PluginLibrary) -> ManifestDiff {
    let registered: Vec<&str> = lib.providers.iter().map(|p| p.name.as_str()).collect();
    let unregistered = manifest
        .providers
        .iter()
        .filter(|p| !registered.contains(&p.as_str()))
        .cloned()
        .collect();
    let unlisted = registered
        .iter()
        .filter(|r| !manifest.providers.iter().any(|p| p == *r))
        .map(|r| r.to_string())
        .collect();
    let mut abi_warnings = Vec::new();
    let (declared, built) = (&manifest.abi, lib.abi_version);
    if (declared.major, declared.minor) != (u64::from(built.major), u64::from(built.minor)) {
        abi_warnings.push(format!(
            "{MANIFEST_FILE} declares ABI {}.{}, but the library was built for ABI {}.{} \
             (set abi = \"{}.{}\")",
            declared.major, declared.minor, built.major, built.minor, built.major, built.minor
        ));
    }
    if declared.major == u64::from(EPX_ABI_VERSION_MAJOR)
        && declared.minor > u64::from(EPX_ABI_VERSION_MINOR)
    {
        abi_warnings.push(format!(
            "{MANIFEST_FILE} declares ABI {}.{}, newer than this host's \
             {EPX_ABI_VERSION_MAJOR}.{EPX_ABI_VERSION_MINOR}",
            declared.major, declared.minor
        ));
    }
    ManifestDiff {
        unregistered,
        unlisted,
        abi_warnings,
    }
}
