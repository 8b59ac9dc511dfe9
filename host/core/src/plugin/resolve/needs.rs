//! Reading what a library needs from the dynamic loader: the ELF file header, the program
//! headers, the dynamic segment and the few strings it names, with every offset checked against
//! the file size.

use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::report::ResolveError;

/// Dynamic segments are a few hundred bytes; a larger one means a corrupt file.
pub(super) const MAX_DYNAMIC_BYTES: u64 = 1 << 20;
/// Longest library name or run path read from the string table.
pub(super) const MAX_STRING_BYTES: u64 = 4096;

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

    pub(super) fn identity(&self) -> Option<ElfIdentity> {
        (self.machine != 0).then_some(ElfIdentity {
            machine: self.machine,
            is_64bit: self.is_64bit,
            little_endian: self.little_endian,
        })
    }
}

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
pub(super) struct ElfIdentity {
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

/// Reads the identity of a candidate library from its file header; `Err` says why it is not a
/// usable ELF file.
pub(super) fn elf_identity(path: &Path) -> Result<ElfIdentity, String> {
    let mut head = [0u8; 64];
    let n = crate::files::open_regular(path)
        .and_then(|(mut f, _)| read_up_to(&mut f, &mut head))
        .map_err(|e| format!("cannot read it: {e}"))?;
    let header = parse_header(&head[..n]).map_err(|e| e.reason().to_owned())?;
    Ok(ElfIdentity {
        machine: header.e_machine,
        is_64bit: header.class == elf::file::Class::ELF64,
        little_endian: header.endianness == elf::endian::AnyEndian::Little,
    })
}

/// Why the first bytes of a file are not an ELF header.
enum HeaderError {
    BadMagic,
    Truncated,
    Identification(String),
}

impl HeaderError {
    fn reason(&self) -> &str {
        match self {
            HeaderError::BadMagic => "not an ELF shared library (bad magic)",
            HeaderError::Truncated => {
                "truncated or corrupt ELF file (a table points past the end of the file)"
            }
            HeaderError::Identification(e) => e,
        }
    }
}

/// The ELF file header at the start of `head` (the file's first bytes, up to 64), parsed by the
/// `elf` crate.
fn parse_header(head: &[u8]) -> Result<elf::file::FileHeader<elf::endian::AnyEndian>, HeaderError> {
    use elf::endian::AnyEndian;
    use elf::file::{Class, FileHeader};
    if head.len() < 4 || head[..4] != elf::abi::ELFMAGIC {
        return Err(HeaderError::BadMagic);
    }
    let ident = head
        .get(..elf::abi::EI_NIDENT)
        .ok_or(HeaderError::Truncated)?;
    let ident = elf::file::parse_ident::<AnyEndian>(ident)
        .map_err(|e| HeaderError::Identification(format!("unsupported ELF identification: {e}")))?;
    let tail_len = match ident.1 {
        Class::ELF32 => elf::file::ELF32_EHDR_TAILSIZE,
        Class::ELF64 => elf::file::ELF64_EHDR_TAILSIZE,
    };
    let tail = head
        .get(elf::abi::EI_NIDENT..elf::abi::EI_NIDENT + tail_len)
        .ok_or(HeaderError::Truncated)?;
    FileHeader::parse_tail(ident, tail).map_err(|_| HeaderError::Truncated)
}

/// The most a library's loaded segments may span (a larger span is a corrupt size, which a
/// loader maps or fails to map depending on where it puts it).
const MAX_LOAD_SPAN: u64 = 64 << 30;

/// The loadable segments as a loader needs them (the ELF specification's rules, which `ld.so`
/// relies on without checking them all): each one's file part inside the file and no larger
/// than its memory part, its alignment a power of two that its address and offset agree on,
/// the segments in ascending address order without overlapping, and their span plausible.
fn check_segments(phdrs: &[elf::segment::ProgramHeader], file_len: u64) -> Result<(), String> {
    let loads: Vec<_> = phdrs
        .iter()
        .filter(|p| p.p_type == elf::abi::PT_LOAD)
        .collect();
    let (Some(first), Some(_)) = (loads.first(), loads.last()) else {
        return Err("it has no loadable segment".into());
    };
    let mut end_before = first.p_vaddr;
    for (i, p) in loads.iter().enumerate() {
        if p.p_filesz > p.p_memsz {
            return Err(format!(
                "loadable segment {i} has more bytes in the file ({:#x}) than in memory ({:#x})",
                p.p_filesz, p.p_memsz
            ));
        }
        if p.p_offset
            .checked_add(p.p_filesz)
            .is_none_or(|e| e > file_len)
        {
            return Err(format!(
                "loadable segment {i} ({:#x} bytes at offset {:#x}) runs past the end of the file",
                p.p_filesz, p.p_offset
            ));
        }
        if p.p_align > 1
            && (!p.p_align.is_power_of_two() || p.p_vaddr % p.p_align != p.p_offset % p.p_align)
        {
            return Err(format!(
                "loadable segment {i}'s alignment {:#x} does not fit its address {:#x} and \
                 offset {:#x}",
                p.p_align, p.p_vaddr, p.p_offset
            ));
        }
        let end = p.p_vaddr.checked_add(p.p_memsz).ok_or_else(|| {
            format!("loadable segment {i} ends past the end of the address space")
        })?;
        if p.p_vaddr < end_before {
            return Err(format!(
                "loadable segment {i} (at {:#x}) overlaps or comes before the one before it \
                 (which ends at {end_before:#x})",
                p.p_vaddr
            ));
        }
        end_before = end;
    }
    if end_before - first.p_vaddr > MAX_LOAD_SPAN {
        return Err(format!(
            "its loadable segments span {:#x} bytes, implausibly many",
            end_before - first.p_vaddr
        ));
    }
    Ok(())
}

/// The most relocation bytes read to check them (a few MiB for the largest runtimes).
const MAX_RELA_BYTES: u64 = 256 << 20;

/// Where a 64-bit library's `Elf64_Rela` tables are, from its dynamic section.
#[derive(Debug, Default)]
struct Relocations {
    rela: Option<u64>,
    rela_size: u64,
    rela_entry: Option<u64>,
    plt: Option<u64>,
    plt_size: u64,
    plt_kind: Option<u64>,
}

impl Relocations {
    fn take(&mut self, tag: i64, value: u64) {
        match tag {
            elf::abi::DT_RELA => self.rela = Some(value),
            elf::abi::DT_RELASZ => self.rela_size = value,
            elf::abi::DT_RELAENT => self.rela_entry = Some(value),
            elf::abi::DT_JMPREL => self.plt = Some(value),
            elf::abi::DT_PLTRELSZ => self.plt_size = value,
            elf::abi::DT_PLTREL => self.plt_kind = Some(value),
            _ => {}
        }
    }

    /// The `Elf64_Rela` tables: what they are, their address and size. A table of another entry
    /// size or kind is left to the loader (it is not what a 64-bit linker writes).
    fn tables(&self) -> Vec<(&'static str, u64, u64)> {
        let mut out = Vec::new();
        if let Some(at) = self
            .rela
            .filter(|_| self.rela_entry.is_none_or(|e| e == RELA_SIZE))
        {
            out.push(("dynamic", at, self.rela_size));
        }
        let rela_kind = elf::abi::DT_RELA as u64;
        if let Some(at) = self
            .plt
            .filter(|_| self.plt_kind.is_none_or(|k| k == rela_kind))
        {
            out.push(("PLT", at, self.plt_size));
        }
        out
    }
}

/// Bytes of one `Elf64_Rela`.
const RELA_SIZE: u64 = 24;

/// The file offset of `len` bytes at address `addr`, inside one loadable segment's file part.
fn file_offset(loads: &[&elf::segment::ProgramHeader], addr: u64, len: u64) -> Option<u64> {
    loads.iter().find_map(|p| {
        let delta = addr.checked_sub(p.p_vaddr)?;
        (delta.checked_add(len)? <= p.p_filesz).then(|| p.p_offset.checked_add(delta))?
    })
}

/// Each relocation of an `Elf64_Rela` table writes inside the library's image, and each
/// relative one (base + addend) points inside it too. A linker writes nothing else; an address
/// outside the image is one the loader writes, or a pointer that lands on whatever is mapped
/// there, which differs from process to process: the library can pass its trial in a child and
/// fault here.
fn check_relocations(
    table: &[u8],
    machine: u16,
    loads: &[&elf::segment::ProgramHeader],
) -> Result<(), String> {
    let (Some(first), Some(last)) = (loads.first(), loads.last()) else {
        return Ok(());
    };
    let (start, end) = (first.p_vaddr, last.p_vaddr.saturating_add(last.p_memsz));
    let relative = match machine {
        elf::abi::EM_X86_64 => Some(8),     // R_X86_64_RELATIVE
        elf::abi::EM_AARCH64 => Some(1027), // R_AARCH64_RELATIVE
        _ => None,
    };
    for (i, entry) in table.chunks_exact(RELA_SIZE as usize).enumerate() {
        let word =
            |k: usize| u64::from_le_bytes(entry[k * 8..k * 8 + 8].try_into().unwrap_or([0; 8]));
        let (offset, info, addend) = (word(0), word(1), word(2));
        if offset < start || offset.checked_add(8).is_none_or(|e| e > end) {
            return Err(format!(
                "relocation {i} writes at {offset:#x}, outside its image [{start:#x}, {end:#x})"
            ));
        }
        if relative == Some(info & 0xffff_ffff) && !(start..=end).contains(&addend) {
            return Err(format!(
                "relative relocation {i} points at {addend:#x}, outside its image \
                 [{start:#x}, {end:#x})"
            ));
        }
    }
    Ok(())
}

/// Reads until `buf` is full or the file ends; returns the number of bytes read.
pub(super) fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
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
pub(super) fn read_elf_dependencies(path: &Path) -> Result<ElfDependencies, ResolveError> {
    use elf::endian::AnyEndian;
    use elf::file::Class;

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

    let (mut file, meta) = crate::files::open_regular(path).map_err(io)?;
    let file_len = meta.len();

    let mut head = [0u8; 64];
    let n = read_up_to(&mut file, &mut head).map_err(io)?;
    let ehdr = parse_header(&head[..n]).map_err(|e| not_elf(e.reason()))?;
    let phentsize = match ehdr.class {
        Class::ELF32 => 32usize,
        Class::ELF64 => 56usize,
    };
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
        little_endian: ehdr.endianness == AnyEndian::Little,
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
    check_segments(&phdrs, file_len).map_err(|why| not_elf(&format!("{why}; corrupt file")))?;

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
    let mut relocations = Relocations::default();
    for entry in elf::dynamic::DynamicTable::new(ehdr.endianness, ehdr.class, &dyn_bytes).iter() {
        relocations.take(entry.d_tag, entry.d_val());
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
    if ehdr.class == Class::ELF64 && ehdr.endianness == AnyEndian::Little {
        let loads: Vec<_> = phdrs
            .iter()
            .filter(|p| p.p_type == elf::abi::PT_LOAD)
            .collect();
        for (what, addr, size) in relocations.tables() {
            let offset = file_offset(&loads, addr, size).ok_or_else(|| {
                not_elf(&format!(
                    "its {what} relocations lie outside every loaded segment; corrupt file"
                ))
            })?;
            if size > MAX_RELA_BYTES {
                return Err(not_elf(&format!(
                    "its {what} relocations are implausibly many; corrupt file"
                )));
            }
            let table = read_range(&mut file, file_len, offset, size)
                .map_err(|e| e.map_or_else(truncated, io))?;
            check_relocations(&table, ehdr.e_machine, &loads)
                .map_err(|why| not_elf(&format!("{why} ({what}); corrupt file")))?;
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
pub(super) fn read_range(
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

#[cfg(test)]
mod relocation_tests {
    use super::*;

    fn load(vaddr: u64, memsz: u64) -> elf::segment::ProgramHeader {
        elf::segment::ProgramHeader {
            p_type: elf::abi::PT_LOAD,
            p_vaddr: vaddr,
            p_memsz: memsz,
            p_filesz: memsz,
            p_flags: 0,
            p_offset: 0,
            p_paddr: vaddr,
            p_align: 0x1000,
        }
    }

    fn rela(offset: u64, kind: u64, addend: u64) -> Vec<u8> {
        [offset, kind, addend]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect()
    }

    #[test]
    fn relocations_outside_the_image_are_refused() {
        let (a, b) = (load(0, 0x2000), load(0x3000, 0x1000));
        let loads = [&a, &b];
        let x86 = elf::abi::EM_X86_64;
        let good = [rela(0x3008, 8, 0x1234), rela(0x3010, 6 | (3 << 32), 0)].concat();
        assert!(check_relocations(&good, x86, &loads).is_ok());
        // A relative addend far past the image (a flipped high byte).
        let far = rela(0x3008, 8, 0x9_0000_1234);
        assert!(
            check_relocations(&far, x86, &loads)
                .unwrap_err()
                .contains("points at 0x900001234")
        );
        // A write outside the image, of any kind.
        let write = rela(0x8000, 6, 0);
        assert!(
            check_relocations(&write, x86, &loads)
                .unwrap_err()
                .contains("writes at 0x8000")
        );
        // An addend one past the end is a linker's end-of-image symbol.
        assert!(check_relocations(&rela(0x3008, 8, 0x4000), x86, &loads).is_ok());
        // Another machine's relative type is not read as x86-64's.
        assert!(check_relocations(&far, elf::abi::EM_AARCH64, &loads).is_ok());
    }
}
