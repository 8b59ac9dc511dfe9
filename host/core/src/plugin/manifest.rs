//! `plugin.toml`: what a plugin is, read without loading its library.
//!
//! Listing and filtering plugins must be cheap and must not run plugin code, so everything the
//! host needs to decide whether (and how) to load a plugin is in this small TOML file next to
//! the library:
//!
//! ```toml
//! name = "cpu"
//! version = "0.1.0"
//! abi = "1.0"
//! providers = ["cpu"]
//! # Optional: the SHA-256 of the library file below (64 hex digits, as `sha256sum` prints it).
//! # A library that does not match is refused before it is opened.
//! sha256 = "3f4c…"
//! # Optional: run this plugin's EPs in a child process (`epx serve-plugin`), so a crash or hang
//! # in it fails a run instead of killing the program. Host-memory EPs only.
//! isolate = true
//!
//! [library]
//! linux = "libepx_cpu.so"
//!
//! [[dependencies]]
//! name = "libonnxruntime.so.1"
//! hints = ["lib", "$ORT_HOME/lib"]
//! python_packages = ["onnxruntime/capi"]
//!
//! [default_options.cpu]
//! threads = "4"
//! ```
//!
//! **ONNX Runtime plugin-EP libraries** (the `CreateEpFactories` libraries vendors ship in
//! `onnxruntime-ep-*` wheels) have a manifest of the same form with an `[onnxruntime_ep]` table
//! and no `abi`: `[library]` names the vendor's library, which passes every check an epx plugin
//! does (ownership, the `sha256` pin, its dependencies), and epx hosts it through its ONNX
//! Runtime adapter:
//!
//! ```toml
//! name = "openvino"
//! version = "1.8.1"
//! providers = ["ov"]             # epx's names of its EPs, in the order of `ep_names`
//!
//! [library]
//! linux = "libonnxruntime_providers_openvino_plugin.so"
//!
//! [onnxruntime_ep]
//! ep_names = ["OpenVINOExecutionProvider"]   # ONNX Runtime's names of them
//! onnxruntime = "1.23"           # the oldest ONNX Runtime it works with (1.23 if not said)
//! ```
//!
//! Unknown keys are errors (a typo such as `provider = [...]` must not be silently ignored), and
//! every error names the manifest file.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

/// Manifests are a few hundred bytes; anything far larger is not a manifest and is not read
/// into memory whole.
const MAX_MANIFEST_BYTES: u64 = 1024 * 1024;

/// A parsed and validated `plugin.toml`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginManifest {
    /// Plugin name (non-empty).
    pub name: String,
    /// Version of the plugin itself.
    pub version: semver::Version,
    /// Plugin ABI version the library was built against. `"1.0"` in the file reads as `1.0.0`.
    pub abi: semver::Version,
    /// Free text for listings.
    pub description: Option<String>,
    /// Execution-provider names the library provides (non-empty, no empty names, no duplicates).
    pub providers: Vec<String>,
    /// SHA-256 of the library file (the `[library]` entry of the running OS), lowercase hex
    /// (64 characters), when the manifest pins it. The file is hashed and compared before the
    /// library is opened ([`crate::plugin::discover::PluginCandidate::verify_sha256`]).
    pub sha256: Option<String>,
    /// Library file name per OS, relative to the manifest's folder.
    pub library: LibraryFiles,
    /// Libraries the plugin library needs, with hints on where to find them.
    pub dependencies: Vec<DependencySpec>,
    /// Default options per EP name (`[default_options.<ep>]`); every EP named is in `providers`.
    pub default_options: BTreeMap<String, BTreeMap<String, String>>,
    /// The library is opened, and its EPs run, only in a child process
    /// ([`crate::plugin::isolate`]).
    pub isolate: bool,
    /// `[onnxruntime_ep]`: the library is an ONNX Runtime plugin-EP library, hosted through
    /// epx's ONNX Runtime adapter (its `abi` is then the host's).
    pub onnxruntime_ep: Option<OrtEpSpec>,
}

/// The `[onnxruntime_ep]` table of a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrtEpSpec {
    /// ONNX Runtime's names of the library's EPs, one per entry of `providers`, in order.
    pub ep_names: Vec<String>,
    /// The oldest ONNX Runtime the library works with.
    pub onnxruntime: semver::Version,
}

/// The first ONNX Runtime with plugin-EP libraries.
pub const MIN_ORT_FOR_PLUGIN_EPS: semver::Version = semver::Version::new(1, 23, 0);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOrtEp {
    ep_names: Vec<String>,
    #[serde(default)]
    onnxruntime: Option<String>,
}

/// The `[library]` table: one file name per OS.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LibraryFiles {
    pub linux: Option<String>,
    pub macos: Option<String>,
    pub windows: Option<String>,
}

/// One `[[dependencies]]` entry: a library the plugin needs and where to look for it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DependencySpec {
    /// File name as the loader asks for it, e.g. `libonnxruntime.so.1`.
    pub name: String,
    /// Folders to search. Relative ones are relative to the plugin folder; `$VAR` and `${VAR}`
    /// are expanded from the environment when searching (a hint naming an unset variable is
    /// skipped).
    #[serde(default)]
    pub hints: Vec<String>,
    /// Subfolders of Python `site-packages` to search, e.g. `onnxruntime/capi`.
    #[serde(default)]
    pub python_packages: Vec<String>,
    /// An optional dependency that is missing does not stop the plugin from loading.
    #[serde(default)]
    pub optional: bool,
}

/// What can go wrong reading a manifest. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read plugin manifest {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("plugin manifest {} is not valid TOML for a plugin manifest: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    #[error("plugin manifest {}: field `{field}`: {message}", path.display())]
    Invalid {
        path: PathBuf,
        field: String,
        message: String,
    },
}

/// An I/O error again, with its kind and message (`std::io::Error` is not `Clone`).
pub(crate) fn io_again(e: &std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), e.to_string())
}

impl Clone for ManifestError {
    fn clone(&self) -> Self {
        match self {
            ManifestError::Io { path, source } => ManifestError::Io {
                path: path.clone(),
                source: io_again(source),
            },
            ManifestError::Syntax { path, message } => ManifestError::Syntax {
                path: path.clone(),
                message: message.clone(),
            },
            ManifestError::Invalid {
                path,
                field,
                message,
            } => ManifestError::Invalid {
                path: path.clone(),
                field: field.clone(),
                message: message.clone(),
            },
        }
    }
}

impl ManifestError {
    /// The manifest file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            ManifestError::Io { path, .. }
            | ManifestError::Syntax { path, .. }
            | ManifestError::Invalid { path, .. } => path,
        }
    }
}

/// The file as written; turned into a [`PluginManifest`] by [`RawManifest::validate`] so that
/// semver and other checks can report the field that is wrong.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    name: String,
    version: String,
    #[serde(default)]
    abi: Option<String>,
    #[serde(default)]
    description: Option<String>,
    providers: Vec<String>,
    #[serde(default)]
    sha256: Option<String>,
    library: LibraryFiles,
    #[serde(default)]
    dependencies: Vec<DependencySpec>,
    #[serde(default)]
    default_options: BTreeMap<String, BTreeMap<String, String>>,
    #[serde(default)]
    isolate: bool,
    #[serde(default)]
    onnxruntime_ep: Option<RawOrtEp>,
}

/// Reads and validates the manifest at `path` (the `plugin.toml` file itself).
pub fn read_manifest(path: &Path) -> Result<PluginManifest, ManifestError> {
    let io_err = |source| ManifestError::Io {
        path: path.to_path_buf(),
        source,
    };
    // A folder, FIFO or device named plugin.toml is refused here without blocking.
    let (file, _) = crate::files::open_regular(path).map_err(io_err)?;
    let mut bytes = Vec::new();
    file.take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io_err)?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(ManifestError::Syntax {
            path: path.to_path_buf(),
            message: format!(
                "file is larger than {MAX_MANIFEST_BYTES} bytes; this is not a plugin manifest"
            ),
        });
    }
    let text = String::from_utf8(bytes).map_err(|e| ManifestError::Syntax {
        path: path.to_path_buf(),
        message: format!(
            "not UTF-8 text (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        ),
    })?;
    parse_manifest(&text, path)
}

/// Parses and validates manifest text; `path` is only used in error messages.
pub fn parse_manifest(text: &str, path: &Path) -> Result<PluginManifest, ManifestError> {
    let raw: RawManifest = toml::from_str(text).map_err(|e| ManifestError::Syntax {
        path: path.to_path_buf(),
        message: e.to_string().trim_end().to_owned(),
    })?;
    raw.validate(path)
}

impl PluginManifest {
    /// The library file name for the OS this host was built for, if the manifest names one.
    /// Manifests returned by [`read_manifest`] always have one.
    pub fn library_for_current_os(&self) -> Option<&str> {
        self.library.for_current_os()
    }

    /// Default options for one EP, if the manifest has any.
    pub fn default_options_for(&self, provider: &str) -> Option<&BTreeMap<String, String>> {
        self.default_options.get(provider)
    }
}

impl LibraryFiles {
    /// The entry for the OS this host was built for (`None` on OSes other than Linux, macOS
    /// and Windows).
    pub fn for_current_os(&self) -> Option<&str> {
        let entry = if cfg!(target_os = "linux") {
            &self.linux
        } else if cfg!(target_os = "macos") {
            &self.macos
        } else if cfg!(target_os = "windows") {
            &self.windows
        } else {
            return None;
        };
        entry.as_deref()
    }
}

/// The key of the current OS in `[library]`, for messages.
fn current_os_key() -> &'static str {
    if cfg!(target_os = "linux") {
        "linux"
    } else if cfg!(target_os = "macos") {
        "macos"
    } else if cfg!(target_os = "windows") {
        "windows"
    } else {
        std::env::consts::OS
    }
}

/// `"1.0"` is accepted for the ABI (major.minor is how ABI versions are usually written).
fn parse_abi_version(text: &str) -> Result<semver::Version, semver::Error> {
    let trimmed = text.trim();
    if trimmed.bytes().filter(|&b| b == b'.').count() == 1
        && trimmed.bytes().all(|b| b.is_ascii_digit() || b == b'.')
    {
        semver::Version::parse(&format!("{trimmed}.0"))
    } else {
        semver::Version::parse(trimmed)
    }
}

/// A `sha256` pin as written (64 hex digits, any case, surrounding blanks ignored) in the
/// lowercase form [`sha256_file`] returns.
fn parse_sha256(text: &str) -> Result<String, String> {
    const HINT: &str = "the SHA-256 of the library file, as `sha256sum` prints it";
    let hex = text.trim();
    if let Some(bad) = hex.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(format!(
            "\"{text}\" is not a hexadecimal digest: {bad:?} is not a hex digit; expected 64 hex digits, {HINT}"
        ));
    }
    if hex.len() != 64 {
        return Err(format!(
            "\"{text}\" has {} hex digits; expected 64, {HINT}",
            hex.len()
        ));
    }
    Ok(hex.to_ascii_lowercase())
}

/// The SHA-256 of a file, as 64 lowercase hex digits (what `sha256sum` prints). The file is
/// streamed through the hasher, never read into memory whole; nothing in it is run.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};

    /// `sha2` has no `std::io::Write` impl without its `std` feature; this is all it takes.
    struct HashWriter(Sha256);
    impl std::io::Write for HashWriter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.update(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let (mut file, _) = crate::files::open_regular(path)?;
    let mut hasher = HashWriter(Sha256::new());
    std::io::copy(&mut file, &mut hasher)?;
    let digest = hasher.0.finalize();
    let mut hex = String::with_capacity(2 * digest.len());
    for byte in digest.iter() {
        use std::fmt::Write as _;
        let _ = write!(hex, "{byte:02x}");
    }
    Ok(hex)
}

/// A library path from `[library]` must stay inside the plugin folder.
fn check_relative_file(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("is empty".to_owned());
    }
    let path = Path::new(name);
    for component in path.components() {
        match component {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => {
                return Err(format!(
                    "\"{name}\" leaves the plugin folder (`..`); name a file inside it"
                ));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "\"{name}\" is an absolute path; name a file relative to the plugin folder"
                ));
            }
        }
    }
    Ok(())
}

impl RawManifest {
    fn validate(self, path: &Path) -> Result<PluginManifest, ManifestError> {
        let invalid = |field: &str, message: String| ManifestError::Invalid {
            path: path.to_path_buf(),
            field: field.to_owned(),
            message,
        };

        if self.name.trim().is_empty() {
            return Err(invalid(
                "name",
                "is empty; give the plugin a name".to_owned(),
            ));
        }
        let version = semver::Version::parse(self.version.trim()).map_err(|e| {
            invalid(
                "version",
                format!(
                    "\"{}\" is not a semantic version such as 0.1.0: {e}",
                    self.version
                ),
            )
        })?;
        let abi = match (&self.abi, &self.onnxruntime_ep) {
            (Some(text), None) => parse_abi_version(text).map_err(|e| {
                invalid(
                    "abi",
                    format!("\"{text}\" is not an ABI version such as 1.0: {e}"),
                )
            })?,
            (None, None) => {
                return Err(invalid(
                    "abi",
                    "is missing: give the epx plugin ABI the library was built for (`abi = \"1.8\"`), \
                     or, for an ONNX Runtime plugin-EP library, an [onnxruntime_ep] table"
                        .to_owned(),
                ));
            }
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "abi",
                    "an ONNX Runtime plugin-EP library ([onnxruntime_ep]) has no epx ABI: \
                     remove `abi`"
                        .to_owned(),
                ));
            }
            // Hosted through the adapter built with this host: the host's ABI.
            (None, Some(_)) => semver::Version::new(
                u64::from(epx_plugin_api::abi::EPX_ABI_VERSION_MAJOR),
                u64::from(epx_plugin_api::abi::EPX_ABI_VERSION_MINOR),
                0,
            ),
        };

        if self.providers.is_empty() {
            return Err(invalid(
                "providers",
                "is empty; list the execution providers the library provides".to_owned(),
            ));
        }
        for (i, provider) in self.providers.iter().enumerate() {
            if provider.trim().is_empty() {
                return Err(invalid("providers", format!("entry {} is empty", i + 1)));
            }
            if self.providers[..i].contains(provider) {
                return Err(invalid(
                    "providers",
                    format!("\"{provider}\" is listed twice"),
                ));
            }
        }

        let sha256 = match self.sha256 {
            None => None,
            Some(text) => Some(parse_sha256(&text).map_err(|message| invalid("sha256", message))?),
        };

        for (key, value) in [
            ("library.linux", &self.library.linux),
            ("library.macos", &self.library.macos),
            ("library.windows", &self.library.windows),
        ] {
            if let Some(name) = value {
                check_relative_file(name).map_err(|message| invalid(key, message))?;
            }
        }
        if self.library.for_current_os().is_none() {
            let os = current_os_key();
            return Err(invalid(
                &format!("library.{os}"),
                format!("no library file for this OS; add `{os} = \"<file>\"` under [library]"),
            ));
        }

        for (i, dep) in self.dependencies.iter().enumerate() {
            let field = format!("dependencies[{i}].name");
            if dep.name.trim().is_empty() {
                return Err(invalid(&field, "is empty".to_owned()));
            }
            if dep.name.contains('/') || dep.name.contains('\\') {
                return Err(invalid(
                    &field,
                    format!(
                        "\"{}\" must be a file name only; put folders in `hints`",
                        dep.name
                    ),
                ));
            }
        }

        for provider in self.default_options.keys() {
            if !self.providers.contains(provider) {
                return Err(invalid(
                    &format!("default_options.{provider}"),
                    format!(
                        "\"{provider}\" is not one of the providers [{}]",
                        self.providers.join(", ")
                    ),
                ));
            }
        }

        let onnxruntime_ep = match self.onnxruntime_ep {
            None => None,
            Some(raw) => {
                Some(validate_ort_ep(raw, &self.providers).map_err(|(f, m)| invalid(f, m))?)
            }
        };

        Ok(PluginManifest {
            name: self.name,
            version,
            abi,
            description: self.description,
            providers: self.providers,
            sha256,
            library: self.library,
            dependencies: self.dependencies,
            default_options: self.default_options,
            isolate: self.isolate,
            onnxruntime_ep,
        })
    }
}

/// Checks `[onnxruntime_ep]` against the manifest's `providers`: the error's field and message.
fn validate_ort_ep(
    raw: RawOrtEp,
    providers: &[String],
) -> Result<OrtEpSpec, (&'static str, String)> {
    const FIELD: &str = "onnxruntime_ep.ep_names";
    if raw.ep_names.len() != providers.len() {
        return Err((
            FIELD,
            format!(
                "names {} EP(s) and `providers` {}: give ONNX Runtime's name of each of [{}], in order",
                raw.ep_names.len(),
                providers.len(),
                providers.join(", ")
            ),
        ));
    }
    for (i, name) in raw.ep_names.iter().enumerate() {
        if name.trim().is_empty() {
            return Err((FIELD, format!("entry {} is empty", i + 1)));
        }
        if raw.ep_names[..i].contains(name) {
            return Err((FIELD, format!("\"{name}\" is listed twice")));
        }
    }
    let onnxruntime = match raw.onnxruntime {
        None => MIN_ORT_FOR_PLUGIN_EPS,
        Some(text) => {
            let v = parse_abi_version(&text).map_err(|e| {
                (
                    "onnxruntime_ep.onnxruntime",
                    format!("\"{text}\" is not an ONNX Runtime version such as 1.23: {e}"),
                )
            })?;
            if v < MIN_ORT_FOR_PLUGIN_EPS {
                return Err((
                    "onnxruntime_ep.onnxruntime",
                    format!(
                        "{v}: ONNX Runtime has plugin-EP libraries from {MIN_ORT_FOR_PLUGIN_EPS} on"
                    ),
                ));
            }
            v
        }
    };
    Ok(OrtEpSpec {
        ep_names: raw.ep_names,
        onnxruntime,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
name = "cpu"
version = "0.1.0"
abi = "1.0"
description = "reference kernels"
providers = ["cpu", "cuda"]
sha256 = "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789"

[library]
linux = "libepx_cpu.so"
macos = "libepx_cpu.dylib"
windows = "epx_cpu.dll"

[[dependencies]]
name = "libonnxruntime.so.1"
hints = ["lib", "/opt/onnxruntime/lib"]
python_packages = ["onnxruntime/capi"]
optional = false

[[dependencies]]
name = "libcudnn.so.9"
optional = true

[default_options.cuda]
device_id = "0"
"#;

    fn parse(text: &str) -> Result<PluginManifest, ManifestError> {
        parse_manifest(text, Path::new("/plugins/cpu/plugin.toml"))
    }

    fn replace(from: &str, to: &str) -> String {
        assert!(FULL.contains(from), "{from}");
        FULL.replacen(from, to, 1)
    }

    fn invalid_field(result: Result<PluginManifest, ManifestError>) -> String {
        match result {
            Err(ManifestError::Invalid { field, path, .. }) => {
                assert_eq!(path, Path::new("/plugins/cpu/plugin.toml"));
                field
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn full_manifest_parses() {
        let m = parse(FULL).expect("valid");
        assert_eq!(m.name, "cpu");
        assert_eq!(m.version, semver::Version::new(0, 1, 0));
        assert_eq!(m.abi, semver::Version::new(1, 0, 0));
        assert_eq!(m.description.as_deref(), Some("reference kernels"));
        assert_eq!(m.providers, ["cpu", "cuda"]);
        assert_eq!(
            m.sha256.as_deref(),
            Some("abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789")
        );
        assert_eq!(m.dependencies.len(), 2);
        assert_eq!(m.dependencies[0].hints, ["lib", "/opt/onnxruntime/lib"]);
        assert_eq!(m.dependencies[0].python_packages, ["onnxruntime/capi"]);
        assert!(!m.dependencies[0].optional);
        assert!(m.dependencies[1].optional && m.dependencies[1].hints.is_empty());
        assert_eq!(
            m.default_options_for("cuda")
                .and_then(|o| o.get("device_id"))
                .map(String::as_str),
            Some("0")
        );
        #[cfg(target_os = "linux")]
        assert_eq!(m.library_for_current_os(), Some("libepx_cpu.so"));
    }

    #[test]
    fn minimal_manifest_parses() {
        let m = parse(
            "name = \"x\"\nversion = \"1.2.3-beta.1\"\nabi = \"1.0.2\"\nproviders = [\"x\"]\n\
             [library]\nlinux = \"a.so\"\nmacos = \"a.dylib\"\nwindows = \"a.dll\"\n",
        )
        .expect("valid");
        assert_eq!(m.abi, semver::Version::new(1, 0, 2));
        assert!(m.dependencies.is_empty() && m.default_options.is_empty() && m.sha256.is_none());
    }

    #[test]
    fn garbage_is_a_syntax_error_naming_file_and_line() {
        let err = parse("name = \"cpu\"\nthis is not toml\n").expect_err("garbage");
        let text = err.to_string();
        assert!(matches!(err, ManifestError::Syntax { .. }), "{err:?}");
        assert!(text.contains("/plugins/cpu/plugin.toml"), "{text}");
        assert!(text.contains("line 2"), "{text}");

        // binary noise never panics
        let noise: String = (0u8..=255).map(char::from).cycle().take(3000).collect();
        assert!(parse(&noise).is_err());
    }

    #[test]
    fn unknown_key_is_an_error() {
        let err = parse(&replace("providers =", "provider =")).expect_err("typo");
        assert!(matches!(err, ManifestError::Syntax { .. }), "{err:?}");
        assert!(err.to_string().contains("provider"), "{err}");

        let err = parse(&replace("optional = false", "optionall = false")).expect_err("typo");
        assert!(err.to_string().contains("optionall"), "{err}");

        let err = parse(&replace("linux =", "linx =")).expect_err("typo");
        assert!(err.to_string().contains("linx"), "{err}");
    }

    #[test]
    fn bad_semver_is_invalid() {
        assert_eq!(
            invalid_field(parse(&replace("\"0.1.0\"", "\"0.1\""))),
            "version"
        );
        assert_eq!(invalid_field(parse(&replace("\"1.0\"", "\"one\""))), "abi");
        let err = parse(&replace("\"0.1.0\"", "\"banana\"")).expect_err("bad");
        let text = err.to_string();
        assert!(
            text.contains("banana") && text.contains("plugin.toml"),
            "{text}"
        );
    }

    #[test]
    fn other_invalid_fields() {
        assert_eq!(
            invalid_field(parse(&replace("name = \"cpu\"", "name = \"\""))),
            "name"
        );
        assert_eq!(
            invalid_field(parse(&replace("[\"cpu\", \"cuda\"]", "[]"))),
            "providers"
        );
        assert_eq!(
            invalid_field(parse(&replace("[\"cpu\", \"cuda\"]", "[\"cpu\", \"cpu\"]"))),
            "providers"
        );
        assert_eq!(invalid_field(parse(&replace("ABCDEF", "ABCDEX"))), "sha256");
        assert_eq!(invalid_field(parse(&replace("ABCDEF", "ABCD"))), "sha256");
        assert_eq!(
            invalid_field(parse(&replace("\"libepx_cpu.so\"", "\"../libepx_cpu.so\""))),
            "library.linux"
        );
        assert_eq!(
            invalid_field(parse(&replace("\"epx_cpu.dll\"", "\"/abs/epx_cpu.dll\""))),
            "library.windows"
        );
        assert_eq!(
            invalid_field(parse(&replace(
                "[default_options.cuda]",
                "[default_options.cudaa]"
            ))),
            "default_options.cudaa"
        );
        assert_eq!(
            invalid_field(parse(&replace(
                "name = \"libcudnn.so.9\"",
                "name = \"/usr/lib/libcudnn.so.9\""
            ))),
            "dependencies[1].name"
        );
    }

    #[test]
    fn sha256_pin_is_trimmed_and_lowercased() {
        let m = parse(&replace("sha256 = \"ABCDEF", "sha256 = \"  ABCDEF"))
            .expect("leading blanks are fine");
        assert_eq!(
            m.sha256.as_deref(),
            Some("abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789")
        );
    }

    #[test]
    fn malformed_sha256_pin_names_the_field_and_what_is_wrong() {
        let message = |result: Result<PluginManifest, ManifestError>| match result {
            Err(e @ ManifestError::Invalid { .. }) => {
                let text = e.to_string();
                assert!(
                    text.starts_with("plugin manifest /plugins/cpu/plugin.toml: field `sha256`: "),
                    "{text}"
                );
                text
            }
            other => panic!("expected Invalid, got {other:?}"),
        };
        // One digit short.
        let text = message(parse(&replace("ABCDEF", "ABCDE")));
        assert!(
            text.contains("has 63 hex digits; expected 64, the SHA-256 of the library file"),
            "{text}"
        );
        // One too many.
        let text = message(parse(&replace("ABCDEF", "ABCDEF0")));
        assert!(text.contains("has 65 hex digits; expected 64"), "{text}");
        // Right length, not hex.
        let text = message(parse(&replace("ABCDEF", "ABCDEG")));
        assert!(text.contains("'G' is not a hex digit"), "{text}");
        assert!(text.contains("\"ABCDEG0123456789"), "{text}");
        // A `sha256sum` line pasted whole.
        let text = message(parse(&replace(
            "0123456789\"\n",
            "0123456789  libepx_cpu.so\"\n",
        )));
        assert!(text.contains("' ' is not a hex digit"), "{text}");
        // Empty.
        let sha_line = FULL
            .lines()
            .find(|l| l.starts_with("sha256"))
            .expect("FULL pins");
        let text = message(parse(&replace(sha_line, "sha256 = \"\"")));
        assert!(text.contains("has 0 hex digits"), "{text}");
        // Not a string.
        let err = parse(&replace(sha_line, "sha256 = 12")).expect_err("integer");
        assert!(matches!(err, ManifestError::Syntax { .. }), "{err:?}");
    }

    #[test]
    fn sha256_file_streams_known_digests() {
        let dir = crate::plugin::discover::TestDir::new("sha256-file");
        let file = |name: &str, bytes: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).expect("write");
            sha256_file(&path).expect("hash")
        };
        // FIPS 180-2 test vectors.
        assert_eq!(
            file("empty", b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            file("abc", b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        // Much larger than one read: the digest covers every chunk.
        assert_eq!(
            file("million", &vec![b'a'; 1_000_000]),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        );
        // What it returns is what a pin must look like.
        let digest = file("abc2", b"abc");
        assert_eq!(parse_sha256(&digest.to_ascii_uppercase()), Ok(digest));

        let err = sha256_file(&dir.path().join("missing")).expect_err("no file");
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn missing_library_for_this_os_is_invalid() {
        let text = FULL
            .replace("linux = \"libepx_cpu.so\"\n", "")
            .replace("macos = \"libepx_cpu.dylib\"\n", "")
            .replace("windows = \"epx_cpu.dll\"\n", "");
        let err = parse(&text).expect_err("no library");
        let field = invalid_field(Err(err));
        assert_eq!(field, format!("library.{}", current_os_key()));
    }

    #[test]
    fn wrong_types_are_syntax_errors() {
        let err = parse(&replace("device_id = \"0\"", "device_id = 0")).expect_err("int");
        assert!(matches!(err, ManifestError::Syntax { .. }), "{err:?}");
        assert!(parse(&replace("[\"cpu\", \"cuda\"]", "\"cpu\"")).is_err());
    }

    #[test]
    fn read_manifest_reports_io_and_non_utf8() {
        let dir = std::env::temp_dir().join(format!("epx-manifest-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let missing = dir.join("nope.toml");
        let err = read_manifest(&missing).expect_err("missing");
        assert!(matches!(err, ManifestError::Io { .. }));
        assert!(err.to_string().contains("nope.toml"), "{err}");

        let bad = dir.join("bad.toml");
        std::fs::write(&bad, [0xffu8, 0xfe, 0x00, b'a']).expect("write");
        let err = read_manifest(&bad).expect_err("not utf8");
        assert!(matches!(err, ManifestError::Syntax { .. }), "{err:?}");
        assert_eq!(err.path(), bad.as_path());

        let good = dir.join("plugin.toml");
        std::fs::write(&good, FULL).expect("write");
        assert_eq!(read_manifest(&good).expect("ok").name, "cpu");
        let _ = std::fs::remove_dir_all(&dir);
    }

    const ORT_EP: &str = r#"
name = "openvino"
version = "1.8.1"
providers = ["ov", "ov_auto"]

[library]
linux = "libonnxruntime_providers_openvino_plugin.so"

[onnxruntime_ep]
ep_names = ["OpenVINOExecutionProvider", "OpenVINOExecutionProvider.AUTO"]
onnxruntime = "1.24"
"#;

    #[test]
    fn an_onnx_runtime_plugin_ep_manifest_names_its_eps_and_needs_no_abi() {
        let m = parse(ORT_EP).expect("valid");
        let spec = m.onnxruntime_ep.as_ref().expect("[onnxruntime_ep]");
        assert_eq!(
            spec.ep_names,
            [
                "OpenVINOExecutionProvider",
                "OpenVINOExecutionProvider.AUTO"
            ]
        );
        assert_eq!(spec.onnxruntime, semver::Version::new(1, 24, 0));
        // Hosted by the adapter built with this host: the host's ABI.
        assert_eq!(
            m.abi.major,
            u64::from(epx_plugin_api::abi::EPX_ABI_VERSION_MAJOR)
        );
        let no_version = ORT_EP.replace("onnxruntime = \"1.24\"\n", "");
        let m = parse(&no_version).expect("valid");
        assert_eq!(
            m.onnxruntime_ep.expect("spec").onnxruntime,
            MIN_ORT_FOR_PLUGIN_EPS
        );
        // Not hosted: no spec.
        assert!(parse(FULL).expect("valid").onnxruntime_ep.is_none());
    }

    #[test]
    fn onnx_runtime_plugin_ep_manifests_are_checked() {
        let field_of = |text: &str| match parse(text) {
            Err(ManifestError::Invalid { field, message, .. }) => (field, message),
            other => panic!("expected an invalid field, got {other:?}"),
        };
        let (f, m) = field_of(&ORT_EP.replace("providers = ", "abi = \"1.8\"\nproviders = "));
        assert_eq!(f, "abi");
        assert!(m.contains("remove `abi`"), "{m}");
        let (f, m) = field_of(&ORT_EP.replace(", \"ov_auto\"", ""));
        assert_eq!(f, "onnxruntime_ep.ep_names");
        assert!(m.contains("names 2 EP(s) and `providers` 1"), "{m}");
        let (f, m) = field_of(&ORT_EP.replace("\"1.24\"", "\"1.22\""));
        assert_eq!(f, "onnxruntime_ep.onnxruntime");
        assert!(m.contains("from 1.23.0 on"), "{m}");
        let (f, m) = field_of(&ORT_EP.replace(".AUTO\"", "\""));
        assert_eq!(f, "onnxruntime_ep.ep_names");
        assert!(m.contains("listed twice"), "{m}");
        // Neither `abi` nor [onnxruntime_ep].
        let plain = FULL.replace("abi = \"1.0\"\n", "");
        let (f, m) = field_of(&plain);
        assert_eq!(f, "abi");
        assert!(m.contains("[onnxruntime_ep]"), "{m}");
        // An unknown key in the table is refused.
        assert!(matches!(
            parse(&ORT_EP.replace("onnxruntime = ", "onnx_runtime = ")),
            Err(ManifestError::Syntax { .. })
        ));
    }
}
