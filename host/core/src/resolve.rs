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

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::manifest::DependencySpec;

/// Environment variable with extra folders to search for plugin dependencies (a path list).
pub const LIBRARY_PATH_ENV: &str = "EPX_LIBRARY_PATH";

/// How deep transitive dependencies are followed (plugin → its deps → theirs …).
const MAX_DEPTH: usize = 16;
/// Dynamic segments are a few hundred bytes; a larger one means a corrupt file.
const MAX_DYNAMIC_BYTES: u64 = 1 << 20;
/// Longest library name or run path read from the string table.
const MAX_STRING_BYTES: u64 = 4096;
/// How long the `python3` site-packages query may take.
const PYTHON_TIMEOUT: Duration = Duration::from_secs(5);

/// Python `site-packages` subfolders that vendor wheels put shared libraries in.
const PYTHON_LIBRARY_FOLDERS: &[&str] = &[
    "onnxruntime/capi",
    "nvidia/*/lib",
    "openvino/libs",
    "tensorrt_libs",
    "tensorrt",
];

/// What a library needs from the dynamic loader, as recorded in its ELF dynamic section.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ElfDependencies {
    /// The file read.
    pub path: PathBuf,
    /// `DT_SONAME`, the name other libraries use to ask for this one.
    pub soname: Option<String>,
    /// `DT_NEEDED` entries, in file order.
    pub needed: Vec<String>,
    /// `DT_RPATH` folders, unexpanded (`$ORIGIN` left as is). Ignored when `runpath` is set.
    pub rpath: Vec<String>,
    /// `DT_RUNPATH` folders, unexpanded.
    pub runpath: Vec<String>,
    /// ELF `e_machine` (62 = x86-64, 183 = AArch64); 0 when not read (non-Linux targets).
    pub machine: u16,
    /// ELFCLASS64.
    pub is_64bit: bool,
    /// ELFDATA2LSB.
    pub little_endian: bool,
}

impl ElfDependencies {
    /// The run path the loader uses for this library's own needs: `DT_RUNPATH` if present,
    /// otherwise `DT_RPATH`.
    pub fn search_path(&self) -> &[String] {
        if self.runpath.is_empty() {
            &self.rpath
        } else {
            &self.runpath
        }
    }

    fn identity(&self) -> Option<ElfIdentity> {
        (self.machine != 0).then_some(ElfIdentity {
            machine: self.machine,
            is_64bit: self.is_64bit,
            little_endian: self.little_endian,
        })
    }
}

/// Which rule of the search order found a library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SearchPlace {
    /// The plugin's own folder.
    PluginDir,
    /// A `hints` folder from the manifest's `[[dependencies]]`.
    ManifestHint,
    /// `DT_RUNPATH`/`DT_RPATH` of the library that needs it.
    RunPath,
    /// `EPX_LIBRARY_PATH`.
    EnvLibraryPath,
    /// `LD_LIBRARY_PATH`, `/etc/ld.so.conf` or the default system folders; the system loader
    /// finds these on its own, so they are neither preloaded nor scanned further.
    SystemLoader,
    /// A Python `site-packages` folder of a vendor wheel.
    PythonPackage,
}

impl fmt::Display for SearchPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SearchPlace::PluginDir => "plugin folder",
            SearchPlace::ManifestHint => "manifest hint",
            SearchPlace::RunPath => "run path",
            SearchPlace::EnvLibraryPath => LIBRARY_PATH_ENV,
            SearchPlace::SystemLoader => "system loader path",
            SearchPlace::PythonPackage => "Python package",
        })
    }
}

/// The outcome for one needed library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DependencyStatus {
    /// Found at `path` by rule `place`.
    Found { path: PathBuf, place: SearchPlace },
    /// Provided by the system and already loaded in the host process (glibc, libstdc++,
    /// libgcc_s, the dynamic loader…); `path` is where it is, when found in the system folders.
    System { path: Option<PathBuf> },
    /// Not found; `searched` lists the folders looked in, in order.
    Missing { searched: Vec<PathBuf> },
}

/// One needed library and what became of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DependencyEntry {
    /// The name asked for (`DT_NEEDED` or the manifest's `name`).
    pub name: String,
    /// The library that needs it (the plugin library for manifest-only dependencies).
    pub needed_by: PathBuf,
    pub status: DependencyStatus,
    /// A manifest dependency marked `optional = true` that no library lists in `DT_NEEDED`;
    /// when missing it does not make the report incomplete.
    pub optional: bool,
}

/// Everything a plugin library needs, transitively, and where each piece was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DependencyReport {
    /// The plugin library.
    pub library: PathBuf,
    /// One entry per library name, in discovery order (breadth first).
    pub entries: Vec<DependencyEntry>,
    /// For the plugin library and each scanned dependency: the names it needs. Kept so that
    /// [`DependencyReport::preload_order`] respects every edge, not only the first one that
    /// found a library.
    needs: BTreeMap<PathBuf, Vec<String>>,
}

/// The error for a plugin whose required libraries are missing; its `Display` lists each
/// missing library with every folder searched, one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingDependencies {
    pub library: PathBuf,
    pub missing: Vec<DependencyEntry>,
}

/// Why dependencies could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {reason}", path.display())]
    NotElf { path: PathBuf, reason: String },
}

impl DependencyReport {
    /// Required libraries that were not found (optional manifest dependencies excluded).
    pub fn missing(&self) -> Vec<&DependencyEntry> {
        self.entries
            .iter()
            .filter(|e| !e.optional && matches!(e.status, DependencyStatus::Missing { .. }))
            .collect()
    }

    /// Every required library was found.
    pub fn is_complete(&self) -> bool {
        self.missing().is_empty()
    }

    /// `Ok` when complete, otherwise the error to show the operator.
    pub fn check(&self) -> Result<(), MissingDependencies> {
        let missing: Vec<DependencyEntry> = self.missing().into_iter().cloned().collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(MissingDependencies {
                library: self.library.clone(),
                missing,
            })
        }
    }

    /// Libraries to `dlopen` by absolute path before the plugin library: every found library
    /// the system loader would not find on its own (not [`DependencyStatus::System`], not
    /// [`SearchPlace::SystemLoader`]), each after the libraries it needs.
    pub fn preload_order(&self) -> Vec<PathBuf> {
        let by_name: HashMap<&str, &Path> = self
            .entries
            .iter()
            .filter_map(|e| match &e.status {
                DependencyStatus::Found { path, place } if *place != SearchPlace::SystemLoader => {
                    Some((e.name.as_str(), path.as_path()))
                }
                _ => None,
            })
            .collect();

        let mut order = Vec::new();
        let mut done: HashSet<&Path> = HashSet::new();
        // Iterative post-order walk; `in_progress` breaks cycles (which the loader tolerates).
        let mut in_progress: HashSet<&Path> = HashSet::new();
        let roots: Vec<&Path> = self
            .needs
            .get(&self.library)
            .into_iter()
            .flatten()
            .filter_map(|n| by_name.get(n.as_str()).copied())
            .chain(
                self.entries
                    .iter()
                    .filter_map(|e| by_name.get(e.name.as_str()).copied()),
            )
            .collect();
        for root in roots {
            let mut stack: Vec<(&Path, usize)> = vec![(root, 0)];
            while let Some((node, child)) = stack.pop() {
                if child == 0 && (done.contains(node) || !in_progress.insert(node)) {
                    continue;
                }
                let children: Vec<&Path> = self
                    .needs
                    .get(node)
                    .into_iter()
                    .flatten()
                    .filter_map(|n| by_name.get(n.as_str()).copied())
                    .collect();
                if let Some(next) = children.get(child) {
                    stack.push((node, child + 1));
                    if !done.contains(next) && !in_progress.contains(next) {
                        stack.push((next, 0));
                    }
                } else {
                    in_progress.remove(node);
                    if done.insert(node) {
                        order.push(node.to_path_buf());
                    }
                }
            }
        }
        order
    }
}

impl fmt::Display for DependencyReport {
    /// A listing of every entry, for `epx plugins --check`-style output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.library.display())?;
        for e in &self.entries {
            match &e.status {
                DependencyStatus::Found { path, place } => {
                    writeln!(f, "  {}: {} ({place})", e.name, path.display())?;
                }
                DependencyStatus::System { path: Some(path) } => {
                    writeln!(f, "  {}: system ({})", e.name, path.display())?;
                }
                DependencyStatus::System { path: None } => writeln!(f, "  {}: system", e.name)?,
                DependencyStatus::Missing { searched } => {
                    let what = if e.optional {
                        "not found (optional)"
                    } else {
                        "NOT FOUND"
                    };
                    writeln!(
                        f,
                        "  {}: {what}, needed by {}; searched:",
                        e.name,
                        e.needed_by.display()
                    )?;
                    for dir in searched {
                        writeln!(f, "      {}", dir.display())?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for MissingDependencies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.missing.len();
        writeln!(
            f,
            "{} cannot be loaded: {n} required librar{} not found",
            self.library.display(),
            if n == 1 { "y is" } else { "ies are" }
        )?;
        for e in &self.missing {
            write!(
                f,
                "  {} (needed by {}): not found; searched:",
                e.name,
                e.needed_by.display()
            )?;
            match &e.status {
                DependencyStatus::Missing { searched } if !searched.is_empty() => {
                    for dir in searched {
                        write!(f, "\n    {}", dir.display())?;
                    }
                }
                _ => write!(f, " nothing")?,
            }
            writeln!(f)?;
        }
        write!(
            f,
            "Put each missing library in one of the folders above, add its folder to \
             {LIBRARY_PATH_ENV}, or name its folder in `hints` under [[dependencies]] in plugin.toml."
        )
    }
}

impl std::error::Error for MissingDependencies {}

// ---------------------------------------------------------------------------------------------
// Reading the ELF dynamic section
// ---------------------------------------------------------------------------------------------

/// Reads `DT_NEEDED`, `DT_RPATH`, `DT_RUNPATH` and `DT_SONAME` of the library at `lib`.
///
/// A file that is not an ELF shared library or executable, or is truncated or corrupt, gives
/// [`ResolveError::NotElf`] naming the file. On targets other than Linux this returns an empty
/// list without reading the file (PE imports and Mach-O load commands are not read yet).
pub fn needed_libraries(lib: &Path) -> Result<ElfDependencies, ResolveError> {
    #[cfg(target_os = "linux")]
    {
        read_elf_dependencies(lib)
    }
    #[cfg(not(target_os = "linux"))]
    {
        Ok(ElfDependencies {
            path: lib.to_path_buf(),
            ..ElfDependencies::default()
        })
    }
}

/// Class, byte order and machine: a library is only usable if these match the plugin's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ElfIdentity {
    machine: u16,
    is_64bit: bool,
    little_endian: bool,
}

impl fmt::Display for ElfIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let arch = match self.machine {
            elf::abi::EM_386 => "x86".to_owned(),
            elf::abi::EM_X86_64 => "x86-64".to_owned(),
            elf::abi::EM_ARM => "arm".to_owned(),
            elf::abi::EM_AARCH64 => "aarch64".to_owned(),
            elf::abi::EM_RISCV => "riscv".to_owned(),
            elf::abi::EM_PPC64 => "ppc64".to_owned(),
            other => format!("machine {other}"),
        };
        let bits = if self.is_64bit { 64 } else { 32 };
        let order = if self.little_endian { "little" } else { "big" };
        write!(f, "{arch}, {bits}-bit, {order}-endian")
    }
}

/// Reads the identity of a candidate library from its first 20 bytes; `Err` says why it is not
/// a usable ELF file.
fn elf_identity(path: &Path) -> Result<ElfIdentity, String> {
    let mut head = [0u8; 20];
    let n = File::open(path)
        .and_then(|mut f| read_up_to(&mut f, &mut head))
        .map_err(|e| format!("cannot read it: {e}"))?;
    if n < 4 || head[..4] != elf::abi::ELFMAGIC {
        return Err("not an ELF file (bad magic)".to_owned());
    }
    if n < head.len() {
        return Err("truncated ELF header".to_owned());
    }
    let is_64bit = match head[elf::abi::EI_CLASS] {
        elf::abi::ELFCLASS32 => false,
        elf::abi::ELFCLASS64 => true,
        other => return Err(format!("unknown ELF class {other}")),
    };
    let little_endian = match head[elf::abi::EI_DATA] {
        elf::abi::ELFDATA2LSB => true,
        elf::abi::ELFDATA2MSB => false,
        other => return Err(format!("unknown ELF byte order {other}")),
    };
    let machine_bytes = [head[18], head[19]];
    let machine = if little_endian {
        u16::from_le_bytes(machine_bytes)
    } else {
        u16::from_be_bytes(machine_bytes)
    };
    Ok(ElfIdentity {
        machine,
        is_64bit,
        little_endian,
    })
}

/// Reads until `buf` is full or the file ends; returns the number of bytes read.
fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn read_elf_dependencies(path: &Path) -> Result<ElfDependencies, ResolveError> {
    use elf::endian::AnyEndian;
    use elf::file::{Class, FileHeader};

    let io = |source| ResolveError::Io {
        path: path.to_path_buf(),
        source,
    };
    let not_elf = |reason: &str| ResolveError::NotElf {
        path: path.to_path_buf(),
        reason: reason.to_owned(),
    };
    let truncated =
        || not_elf("truncated or corrupt ELF file (a table points past the end of the file)");

    let mut file = File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();

    let mut head = [0u8; 64];
    let n = read_up_to(&mut file, &mut head).map_err(io)?;
    if n < 4 || head[..4] != elf::abi::ELFMAGIC {
        return Err(not_elf("not an ELF shared library (bad magic)"));
    }
    if n < elf::abi::EI_NIDENT {
        return Err(truncated());
    }
    let ident = elf::file::parse_ident::<AnyEndian>(&head[..elf::abi::EI_NIDENT])
        .map_err(|e| not_elf(&format!("unsupported ELF identification: {e}")))?;
    let (tail_len, phentsize) = match ident.1 {
        Class::ELF32 => (elf::file::ELF32_EHDR_TAILSIZE, 32usize),
        Class::ELF64 => (elf::file::ELF64_EHDR_TAILSIZE, 56usize),
    };
    let tail = head
        .get(elf::abi::EI_NIDENT..elf::abi::EI_NIDENT + tail_len)
        .filter(|_| n >= elf::abi::EI_NIDENT + tail_len)
        .ok_or_else(truncated)?;
    let ehdr = FileHeader::parse_tail(ident, tail).map_err(|_| truncated())?;
    match ehdr.e_type {
        elf::abi::ET_DYN | elf::abi::ET_EXEC => {}
        elf::abi::ET_REL => {
            return Err(not_elf(
                "an ELF relocatable object (.o), not a shared library",
            ));
        }
        elf::abi::ET_CORE => return Err(not_elf("an ELF core dump, not a shared library")),
        other => {
            return Err(not_elf(&format!(
                "ELF file of type {other}, not a shared library"
            )));
        }
    }

    let mut deps = ElfDependencies {
        path: path.to_path_buf(),
        machine: ehdr.e_machine,
        is_64bit: ehdr.class == Class::ELF64,
        little_endian: head[elf::abi::EI_DATA] == elf::abi::ELFDATA2LSB,
        ..ElfDependencies::default()
    };

    // The loader works from program headers, not sections (which may be stripped), so do we.
    if ehdr.e_phnum == 0 {
        return Err(not_elf(
            "has no program headers; not a loadable shared library",
        ));
    }
    if usize::from(ehdr.e_phentsize) != phentsize {
        return Err(not_elf(&format!(
            "program header entries are {} bytes, expected {phentsize}",
            ehdr.e_phentsize
        )));
    }
    let ph_len = (usize::from(ehdr.e_phnum) * phentsize) as u64;
    let ph_bytes = read_range(&mut file, file_len, ehdr.e_phoff, ph_len)
        .map_err(|e| e.map_or_else(truncated, io))?;
    let phdrs: Vec<elf::segment::ProgramHeader> =
        elf::segment::SegmentTable::new(ehdr.endianness, ehdr.class, &ph_bytes)
            .iter()
            .collect();

    let Some(dynamic) = phdrs.iter().find(|p| p.p_type == elf::abi::PT_DYNAMIC) else {
        // Statically linked: needs nothing.
        return Ok(deps);
    };
    if dynamic.p_filesz > MAX_DYNAMIC_BYTES {
        return Err(not_elf(
            "dynamic segment is implausibly large; corrupt file",
        ));
    }
    let dyn_bytes = read_range(&mut file, file_len, dynamic.p_offset, dynamic.p_filesz)
        .map_err(|e| e.map_or_else(truncated, io))?;

    let mut strtab_addr = None;
    let mut strtab_size = None;
    let mut needed = Vec::new();
    let mut rpath = Vec::new();
    let mut runpath = Vec::new();
    let mut soname = None;
    for entry in elf::dynamic::DynamicTable::new(ehdr.endianness, ehdr.class, &dyn_bytes).iter() {
        match entry.d_tag {
            elf::abi::DT_NULL => break,
            elf::abi::DT_NEEDED => needed.push(entry.d_val()),
            elf::abi::DT_RPATH => rpath.push(entry.d_val()),
            elf::abi::DT_RUNPATH => runpath.push(entry.d_val()),
            elf::abi::DT_SONAME => soname = Some(entry.d_val()),
            elf::abi::DT_STRTAB => strtab_addr = Some(entry.d_ptr()),
            elf::abi::DT_STRSZ => strtab_size = Some(entry.d_val()),
            _ => {}
        }
    }
    if needed.is_empty() && rpath.is_empty() && runpath.is_empty() && soname.is_none() {
        return Ok(deps);
    }
    let strtab_addr = strtab_addr.ok_or_else(|| not_elf("dynamic segment has no DT_STRTAB"))?;
    // DT_STRTAB is a virtual address; find the file offset through the PT_LOAD that maps it.
    let strtab_offset = phdrs
        .iter()
        .filter(|p| p.p_type == elf::abi::PT_LOAD)
        .find_map(|p| {
            let delta = strtab_addr.checked_sub(p.p_vaddr)?;
            (delta < p.p_filesz)
                .then(|| p.p_offset.checked_add(delta))
                .flatten()
        })
        .ok_or_else(|| not_elf("DT_STRTAB points outside every loaded segment; corrupt file"))?;
    if strtab_offset >= file_len {
        return Err(truncated());
    }
    let strtab_size = strtab_size
        .unwrap_or(file_len - strtab_offset)
        .min(file_len - strtab_offset);

    let mut string_at = |offset: u64| -> Result<String, ResolveError> {
        if offset >= strtab_size {
            return Err(not_elf(
                "dynamic string offset past the string table; corrupt file",
            ));
        }
        let len = (strtab_size - offset).min(MAX_STRING_BYTES);
        let bytes = read_range(&mut file, file_len, strtab_offset + offset, len)
            .map_err(|e| e.map_or_else(truncated, io))?;
        let end = bytes.iter().position(|&b| b == 0).ok_or_else(|| {
            not_elf("unterminated string in the dynamic string table; corrupt file")
        })?;
        Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
    };

    for offset in needed {
        let name = string_at(offset)?;
        if !name.is_empty() && !deps.needed.contains(&name) {
            deps.needed.push(name);
        }
    }
    for (offsets, out) in [(rpath, &mut deps.rpath), (runpath, &mut deps.runpath)] {
        for offset in offsets {
            out.extend(
                string_at(offset)?
                    .split(':')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            );
        }
    }
    deps.soname = soname.map(&mut string_at).transpose()?;
    Ok(deps)
}

/// Reads `len` bytes at `offset`; `Err(None)` when the range is outside the file.
fn read_range(
    file: &mut File,
    file_len: u64,
    offset: u64,
    len: u64,
) -> Result<Vec<u8>, Option<std::io::Error>> {
    let end = offset.checked_add(len).ok_or(None)?;
    if end > file_len {
        return Err(None);
    }
    let len = usize::try_from(len).map_err(|_| None)?;
    file.seek(SeekFrom::Start(offset)).map_err(Some)?;
    let mut buf = vec![0u8; len];
    file.read_exact(&mut buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            None
        } else {
            Some(e)
        }
    })?;
    Ok(buf)
}

// ---------------------------------------------------------------------------------------------
// Resolution
// ---------------------------------------------------------------------------------------------

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
/// 6. Python `site-packages` folders (`VIRTUAL_ENV`, `CONDA_PREFIX`, `PYTHONPATH`, the user
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
    let env = SearchEnv::from_process();
    resolve_with(&env, lib, plugin_dir, deps)
}

/// The environment resolution depends on, captured once so tests can supply their own.
#[derive(Debug, Clone, Default)]
struct SearchEnv {
    /// Environment variables, for hint expansion.
    vars: HashMap<String, OsString>,
    /// `EPX_LIBRARY_PATH`, absolute entries only.
    library_path: Vec<PathBuf>,
    /// `LD_LIBRARY_PATH`, ld.so.conf folders and default folders.
    system_dirs: Vec<PathBuf>,
    /// Known `site-packages` folders (existing ones).
    site_packages: Vec<PathBuf>,
    /// Ask `python3` for more `site-packages` folders when a library is still missing.
    ask_python: bool,
}

impl SearchEnv {
    fn from_process() -> SearchEnv {
        let vars: HashMap<String, OsString> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v)))
            .collect();
        let absolute_entries = |name: &str| -> Vec<PathBuf> {
            let Some(value) = vars.get(name) else {
                return Vec::new();
            };
            std::env::split_paths(value)
                .filter(|p| {
                    if p.as_os_str().is_empty() {
                        return false;
                    }
                    let absolute = p.is_absolute();
                    if !absolute {
                        tracing::warn!(
                            path = %p.display(),
                            "{name} entry skipped: only absolute paths are searched for libraries"
                        );
                    }
                    absolute
                })
                .collect()
        };
        let library_path = absolute_entries(LIBRARY_PATH_ENV);
        let mut system_dirs = Vec::new();
        if cfg!(target_os = "linux") {
            system_dirs.extend(absolute_entries("LD_LIBRARY_PATH"));
            system_dirs.extend(ld_so_conf_dirs(Path::new("/etc/ld.so.conf")));
            system_dirs.extend(default_library_dirs());
        }
        dedupe(&mut system_dirs);
        let site_packages = site_packages_dirs(&vars);
        SearchEnv {
            vars,
            library_path,
            system_dirs,
            site_packages,
            ask_python: true,
        }
    }
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
    plugin_dir: &Path,
    specs: &[DependencySpec],
) -> Result<DependencyReport, ResolveError> {
    let root = needed_libraries(lib)?;
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

/// Libraries every Linux process (including the host) already has loaded, or that come with
/// the C/C++ toolchain runtime; a plugin must not bring its own.
fn is_host_provided(name: &str) -> bool {
    if !cfg!(target_os = "linux") {
        return false;
    }
    if name.starts_with("ld-linux") || name.starts_with("ld64.so") || name == "linux-vdso.so.1" {
        return true;
    }
    let Some((stem, _)) = name.split_once(".so") else {
        return false;
    };
    matches!(
        stem,
        "libc"
            | "libm"
            | "libdl"
            | "libpthread"
            | "librt"
            | "libutil"
            | "libresolv"
            | "libmvec"
            | "libstdc++"
            | "libgcc_s"
    )
}

/// Expands `$VAR` and `${VAR}`; `None` if a variable is unset (a hint like `$CUDA_HOME/lib`
/// must not turn into `/lib`). A `$` not followed by a name is kept.
fn expand_vars(text: &str, lookup: impl Fn(&str) -> Option<OsString>) -> Option<OsString> {
    let mut out = OsString::new();
    let mut rest = text;
    while let Some(pos) = rest.find('$') {
        out.push(&rest[..pos]);
        let after = &rest[pos + 1..];
        let (name, next) = if let Some(braced) = after.strip_prefix('{') {
            match braced.find('}') {
                Some(end) => (&braced[..end], &braced[end + 1..]),
                None => return None,
            }
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        if name.is_empty() {
            out.push("$");
            rest = after;
            continue;
        }
        out.push(lookup(name)?);
        rest = next;
    }
    out.push(rest);
    Some(out)
}

/// Expands the loader's dynamic string tokens in a run path entry.
fn expand_run_path(entry: &str, origin: &Path, is_64bit: bool) -> Option<PathBuf> {
    let lib = if is_64bit && cfg!(target_pointer_width = "64") {
        "lib64"
    } else {
        "lib"
    };
    let expanded = expand_vars(entry, |var| match var {
        "ORIGIN" => Some(origin.as_os_str().to_owned()),
        "LIB" => Some(OsString::from(lib)),
        "PLATFORM" => Some(OsString::from(std::env::consts::ARCH)),
        _ => None,
    })?;
    let dir = PathBuf::from(expanded);
    // The loader would resolve a relative run path against the current folder; not trusted.
    dir.is_absolute().then_some(dir)
}

fn dedupe(dirs: &mut Vec<PathBuf>) {
    let mut seen = HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
}

/// The default library folders of the dynamic loader for this architecture.
fn default_library_dirs() -> Vec<PathBuf> {
    let triple = match std::env::consts::ARCH {
        "x86" => "i386-linux-gnu".to_owned(),
        "arm" => "arm-linux-gnueabihf".to_owned(),
        "powerpc64" if cfg!(target_endian = "little") => "powerpc64le-linux-gnu".to_owned(),
        "riscv64" => "riscv64-linux-gnu".to_owned(),
        arch => format!("{arch}-linux-gnu"),
    };
    let mut dirs = vec![
        PathBuf::from(format!("/lib/{triple}")),
        PathBuf::from(format!("/usr/lib/{triple}")),
    ];
    if cfg!(target_pointer_width = "64") {
        dirs.push(PathBuf::from("/lib64"));
        dirs.push(PathBuf::from("/usr/lib64"));
    }
    dirs.push(PathBuf::from("/lib"));
    dirs.push(PathBuf::from("/usr/lib"));
    dirs
}

/// Folders listed in an `ld.so.conf`, following `include` lines (globs are relative to the
/// including file's folder when not absolute). Unreadable files are skipped.
fn ld_so_conf_dirs(conf: &Path) -> Vec<PathBuf> {
    fn walk(file: &Path, depth: usize, out: &mut Vec<PathBuf>, visited: &mut HashSet<PathBuf>) {
        let key = file.canonicalize().unwrap_or_else(|_| file.to_path_buf());
        if depth > 8 || !visited.insert(key) {
            return;
        }
        let Ok(bytes) = std::fs::read(file) else {
            return;
        };
        let text = String::from_utf8_lossy(&bytes);
        let base = file.parent().unwrap_or(Path::new("/"));
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            match words.next() {
                Some("include") => {
                    for pattern in words {
                        let pattern = Path::new(pattern);
                        let pattern = if pattern.is_absolute() {
                            pattern.to_path_buf()
                        } else {
                            base.join(pattern)
                        };
                        for included in glob_paths(&pattern) {
                            walk(&included, depth + 1, out, visited);
                        }
                    }
                }
                Some("hwcap") => {}
                _ => {
                    for dir in line.split([':', ',', ' ', '\t']) {
                        // Old syntax allowed `dir=TYPE`.
                        let dir = dir.split('=').next().unwrap_or("");
                        if dir.starts_with('/') {
                            out.push(PathBuf::from(dir));
                        }
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(conf, 0, &mut out, &mut HashSet::new());
    out
}

/// Existing paths matching `pattern`, where any component may contain `*` and `?` (which do
/// not match a leading `.`). Sorted per component, so results are deterministic.
fn glob_paths(pattern: &Path) -> Vec<PathBuf> {
    let mut current = vec![PathBuf::new()];
    for component in pattern.components() {
        let wildcard = match component {
            Component::Normal(part) => part.to_str().filter(|s| s.contains(['*', '?'])),
            _ => None,
        };
        match wildcard {
            None => current.iter_mut().for_each(|p| p.push(component)),
            Some(part) => {
                let mut next = Vec::new();
                for base in &current {
                    let listing = if base.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        base
                    };
                    let Ok(entries) = std::fs::read_dir(listing) else {
                        continue;
                    };
                    let mut names: Vec<String> = entries
                        .filter_map(|e| e.ok()?.file_name().into_string().ok())
                        .filter(|n| {
                            (!n.starts_with('.') || part.starts_with('.'))
                                && wildcard_match(part, n)
                        })
                        .collect();
                    names.sort();
                    next.extend(names.into_iter().map(|n| base.join(n)));
                }
                current = next;
            }
        }
        if current.is_empty() {
            break;
        }
    }
    current.retain(|p| !p.as_os_str().is_empty() && p.exists());
    current
}

/// `*` matches any run of characters, `?` one character.
fn wildcard_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// `site-packages` folders known without running Python (existing ones only).
fn site_packages_dirs(vars: &HashMap<String, OsString>) -> Vec<PathBuf> {
    let mut patterns: Vec<PathBuf> = Vec::new();
    for prefix_var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(prefix) = vars
            .get(prefix_var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
        {
            patterns.push(prefix.join("lib/python3*/site-packages"));
            patterns.push(prefix.join("Lib/site-packages"));
        }
    }
    if let Some(value) = vars.get("PYTHONPATH") {
        patterns.extend(std::env::split_paths(value).filter(|p| p.is_absolute()));
    }
    if let Some(home) = vars
        .get("HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
    {
        patterns.push(home.join(".local/lib/python3*/site-packages"));
    }
    for system in [
        "/usr/local/lib/python3*/dist-packages",
        "/usr/local/lib/python3*/site-packages",
        "/usr/lib/python3/dist-packages",
        "/usr/lib/python3*/site-packages",
    ] {
        patterns.push(PathBuf::from(system));
    }
    let mut dirs: Vec<PathBuf> = patterns
        .iter()
        .flat_map(|p| glob_paths(p))
        .filter(|p| p.is_dir())
        .collect();
    dedupe(&mut dirs);
    dirs
}

/// What `python3` says its site-packages folders are; asked at most once per process, with a
/// timeout, and any failure means "none".
fn python_site_packages() -> &'static [PathBuf] {
    static CACHE: OnceLock<Vec<PathBuf>> = OnceLock::new();
    CACHE.get_or_init(|| {
        let dirs = ask_python().unwrap_or_default();
        tracing::debug!(?dirs, "site-packages folders reported by python3");
        dirs
    })
}

fn ask_python() -> Option<Vec<PathBuf>> {
    use std::process::{Command, Stdio};
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import site,sys; print('\\n'.join(site.getsitepackages()+[site.getusersitepackages()]))",
        ])
        // Not the host's current folder: a stray `site.py` there must not run.
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + PYTHON_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                tracing::debug!(
                    "python3 did not answer in time; its site-packages are not searched"
                );
                return None;
            }
        }
    };
    if !status.success() {
        return None;
    }
    let mut text = String::new();
    child
        .stdout
        .take()?
        .take(1 << 20)
        .read_to_string(&mut text)
        .ok()?;
    let mut dirs: Vec<PathBuf> = text
        .lines()
        .map(|l| PathBuf::from(l.trim()))
        .filter(|p| p.is_absolute() && p.is_dir())
        .collect();
    dedupe(&mut dirs);
    Some(dirs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::TestDir;

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
        let report = resolve_with(&test_env(), &lib, dir, &[]).expect("resolve");
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
        let report = resolve_with(&env, &lib, dir, &specs).expect("resolve");
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
        let report = resolve_with(&env2, &lib, dir, &specs2).expect("resolve");
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
        let report = resolve_with(&env3, &lib, dir, &[]).expect("resolve");
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
        let report =
            resolve_with(&env, &dir.join("libepx_y.so"), dir, &specs[..1]).expect("resolve");
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
        let report = resolve_with(&env, &lib, dir, &specs).expect("resolve");
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
        let report = resolve_with(&test_env(), &lib, dir, &specs).expect("resolve");
        assert_eq!(report.missing().len(), 1, "{report}");

        // Same file, but another machine in its header.
        let mut bytes = std::fs::read(&lib).expect("read");
        bytes[18] ^= 0x55;
        std::fs::write(dir.join("libepxtwanted.so.1"), &bytes).expect("write");
        let report = resolve_with(&test_env(), &lib, dir, &specs).expect("resolve");
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
