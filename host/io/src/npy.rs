//! Reading and writing numpy `.npy` files (format versions 1.0, 2.0 and 3.0).
//!
//! A `.npy` file is the magic string `\x93NUMPY`, a version, a little-endian header length,
//! a header (a Python dict literal such as `{'descr': '<f4', 'fortran_order': False,
//! 'shape': (2, 3), }`, padded with spaces and ended by a newline) and the raw array data.
//!
//! Supported dtypes: bool, signed and unsigned integers of 1, 2, 4 and 8 bytes, float16,
//! float32, float64, complex64 and complex128, in either byte order. Arrays are always
//! returned as little-endian data in C (row-major) order: big-endian data is byte-swapped and
//! Fortran-ordered data is reordered. Written files are little-endian, C order, version 1.0
//! (2.0 when the header is too long for 1.0), laid out as numpy itself lays them out.
//!
//! Nothing here panics on malformed input; every problem is an [`NpyError`].

use std::path::{Path, PathBuf};

use epx::ElementType;

/// The first six bytes of every `.npy` file.
const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// numpy aligns the start of the data to this many bytes.
const ALIGN: usize = 64;
/// numpy leaves this much room in the header so the shape can grow in place.
const GROWTH_ROOM: usize = 21;
/// Deepest nesting of tuples and lists accepted in a header.
const MAX_DEPTH: usize = 16;

/// A dense array read from, or to be written to, a `.npy` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyArray {
    pub elem_type: ElementType,
    pub shape: Vec<usize>,
    /// little-endian, C order
    pub data: Vec<u8>,
    /// The file's dtype was raw bytes (`V1`, `V2`): numpy saves `ml_dtypes` arrays (bfloat16,
    /// the 8-bit floats, the 4- and 2-bit types) this way. `elem_type` is then `uint8` or
    /// `uint16` until [`NpyArray::as_type`] names the type the bytes hold.
    pub untyped: bool,
    /// The elements of a string array (`elem_type` string, `data` empty): numpy's unicode
    /// (`<U`) strings as UTF-8, or its byte strings (`|S`) as they are, NUL padding removed.
    pub strings: Vec<Vec<u8>>,
}

impl NpyArray {
    /// The array read as `ty`: for raw-byte (`untyped`) arrays, the `ml_dtypes` type of that
    /// width (`V2`: bfloat16; `V1`: an 8-bit float, or a 4- or 2-bit type one element per byte,
    /// which is packed here as ONNX packs it). Typed arrays come back unchanged.
    pub fn as_type(self, ty: ElementType) -> Result<NpyArray, NpyError> {
        if !self.untyped {
            return Ok(self);
        }
        let width = self.elem_type.byte_size().unwrap_or(0);
        let mismatch = || NpyError::UntypedBytes {
            width,
            elem_type: ty,
        };
        let data = match ty.bits() {
            Some(bits) if bits == width * 8 && ml_dtypes_only(ty) => self.data,
            Some(bits @ (2 | 4)) if width == 1 => {
                let per = 8 / bits;
                let mut packed = try_zeros(self.data.len().div_ceil(per))?;
                for (i, c) in self.data.iter().enumerate() {
                    packed[i / per] |= (c & ((1 << bits) - 1)) << ((i % per) * bits);
                }
                packed
            }
            _ => return Err(mismatch()),
        };
        Ok(NpyArray {
            elem_type: ty,
            shape: self.shape,
            data,
            untyped: false,
            strings: Vec::new(),
        })
    }
}

/// The types numpy lacks and `ml_dtypes` adds, saved as raw bytes.
fn ml_dtypes_only(ty: ElementType) -> bool {
    use ElementType::*;
    matches!(
        ty,
        Bfloat16
            | Float8E4M3FN
            | Float8E4M3FNUZ
            | Float8E5M2
            | Float8E5M2FNUZ
            | Float8E8M0
            | Float4E2M1
            | Int4
            | Uint4
            | Int2
            | Uint2
    )
}

/// What went wrong reading or writing a `.npy` file.
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    /// The file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Another error, about the file at `path`.
    #[error("{}: {source}", path.display())]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<NpyError>,
    },
    /// The bytes do not start with `\x93NUMPY`.
    #[error(
        "not a .npy file: it should start with the bytes \\x93NUMPY but starts with {}",
        show_bytes(found)
    )]
    BadMagic { found: Vec<u8> },
    /// The file ends before the part named by `what` does.
    #[error(
        "the file is truncated: the {what} needs {needed} bytes but only {available} are there"
    )]
    Truncated {
        what: &'static str,
        needed: usize,
        available: usize,
    },
    /// A format version other than 1.0, 2.0 and 3.0.
    #[error("unsupported .npy format version {major}.{minor} (versions 1.0, 2.0 and 3.0 are read)")]
    UnsupportedVersion { major: u8, minor: u8 },
    /// The header dict could not be parsed or lacks a key.
    #[error("malformed .npy header: {reason} (header: {header})")]
    BadHeader { reason: String, header: String },
    /// The header names a dtype that has no ONNX element type here.
    #[error("unsupported dtype '{descr}': {reason}")]
    UnsupportedDtype { descr: String, reason: String },
    /// The memory for the data could not be had (an address-space or container limit).
    #[error("cannot allocate {bytes} bytes for the array's data: the memory is not there")]
    OutOfMemory { bytes: usize },
    /// The number of elements does not fit in memory's address range.
    #[error("the shape {shape:?} has more bytes than this machine can address")]
    ShapeTooLarge { shape: Vec<usize> },
    /// The data does not have the size the shape and dtype call for.
    #[error(
        "data length mismatch: shape {shape:?} of {elem_type} needs {expected} bytes of data but \
         {found} are there"
    )]
    DataLength {
        elem_type: ElementType,
        shape: Vec<usize>,
        expected: usize,
        found: usize,
    },
    /// A raw-byte array read as a type of another width.
    #[error(
        "the array holds raw {width}-byte elements (numpy's form of an ml_dtypes array), which \
         cannot be read as {elem_type}: save it with the ml_dtypes type the model declares \
         (bfloat16 as 2 bytes; the 8-bit floats and the 4- and 2-bit types as 1)"
    )]
    UntypedBytes {
        width: usize,
        elem_type: ElementType,
    },
    /// An element type numpy has no dtype for (strings).
    #[error("element type {elem_type} cannot be written to a .npy file: {reason}")]
    UnsupportedElementType {
        elem_type: ElementType,
        reason: &'static str,
    },
}

impl NpyError {
    /// The file the error is about, where known.
    pub fn path(&self) -> Option<&Path> {
        match self {
            NpyError::Io { path, .. } | NpyError::InFile { path, .. } => Some(path),
            _ => None,
        }
    }

    /// The error itself, without the file it is about.
    pub fn kind(&self) -> &NpyError {
        match self {
            NpyError::InFile { source, .. } => source.kind(),
            other => other,
        }
    }

    fn in_file(self, path: &Path) -> NpyError {
        match self {
            e @ (NpyError::Io { .. } | NpyError::InFile { .. }) => e,
            e => NpyError::InFile {
                path: path.to_owned(),
                source: Box::new(e),
            },
        }
    }
}

fn show_bytes(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "nothing (the input is empty)".to_owned();
    }
    let mut s = String::from("b\"");
    for &b in bytes {
        s.extend(std::ascii::escape_default(b).map(char::from));
    }
    s.push('"');
    s
}

/// Reads a `.npy` file: a regular file only (not a device, FIFO or socket, whose reads need not
/// end), read to its length as it was when opened.
pub fn read_npy(path: &Path) -> Result<NpyArray, NpyError> {
    let bytes = crate::read_regular_file(path).map_err(|source| NpyError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse_npy_owned(bytes).map_err(|e| e.in_file(path))
}

/// Writes `data` (little-endian, C order) as a `.npy` file.
pub fn write_npy(
    path: &Path,
    elem_type: ElementType,
    shape: &[usize],
    data: &[u8],
) -> Result<(), NpyError> {
    let bytes = encode_npy(elem_type, shape, data).map_err(|e| e.in_file(path))?;
    std::fs::write(path, bytes).map_err(|source| NpyError::Io {
        path: path.to_owned(),
        source,
    })
}

/// How the elements of a dtype are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Dtype {
    elem_type: ElementType,
    /// Bytes per element.
    size: usize,
    /// Bytes per byte-swapped unit (half of `size` for complex numbers).
    unit: usize,
    big_endian: bool,
    /// Raw bytes (`V1`, `V2`).
    untyped: bool,
    /// Strings: numpy's unicode (UTF-32, `true`) or byte strings, `size` bytes each.
    text: Option<bool>,
}

/// Parses the bytes of a `.npy` file.
pub fn parse_npy(bytes: &[u8]) -> Result<NpyArray, NpyError> {
    let layout = parse_layout(bytes)?;
    let data = try_copy(&bytes[layout.data_start..])?;
    finish(layout, data)
}

/// [`parse_npy`] of a file's bytes, reusing their buffer for the data (no second copy of an
/// input that may be most of the machine's memory).
fn parse_npy_owned(mut bytes: Vec<u8>) -> Result<NpyArray, NpyError> {
    let layout = parse_layout(&bytes)?;
    bytes.drain(..layout.data_start);
    finish(layout, bytes)
}

/// `len` zero bytes, or an error (not an abort) when the memory is not there.
fn try_zeros(len: usize) -> Result<Vec<u8>, NpyError> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| NpyError::OutOfMemory { bytes: len })?;
    v.resize(len, 0);
    Ok(v)
}

/// A copy of `data`, or an error (not an abort) when the memory is not there.
fn try_copy(data: &[u8]) -> Result<Vec<u8>, NpyError> {
    let mut v = Vec::new();
    v.try_reserve_exact(data.len())
        .map_err(|_| NpyError::OutOfMemory { bytes: data.len() })?;
    v.extend_from_slice(data);
    Ok(v)
}

/// What the header says, and where the data starts (checked to be as long as the shape says).
struct Layout {
    dtype: Dtype,
    fortran_order: bool,
    shape: Vec<usize>,
    data_start: usize,
}

fn parse_layout(bytes: &[u8]) -> Result<Layout, NpyError> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(NpyError::BadMagic {
            found: bytes[..bytes.len().min(MAGIC.len())].to_vec(),
        });
    }
    let version = bytes.get(6..8).ok_or(NpyError::Truncated {
        what: "format version",
        needed: 8,
        available: bytes.len(),
    })?;
    let (major, minor) = (version[0], version[1]);
    let len_bytes = match (major, minor) {
        (1, 0) => 2,
        (2, 0) | (3, 0) => 4,
        _ => return Err(NpyError::UnsupportedVersion { major, minor }),
    };
    let len_field = bytes.get(8..8 + len_bytes).ok_or(NpyError::Truncated {
        what: "header length",
        needed: 8 + len_bytes,
        available: bytes.len(),
    })?;
    let header_len = len_field
        .iter()
        .rev()
        .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
    let header_start = 8 + len_bytes;
    let data_start = header_start + header_len;
    let header_bytes = bytes
        .get(header_start..data_start)
        .ok_or(NpyError::Truncated {
            what: "header",
            needed: data_start,
            available: bytes.len(),
        })?;
    let header: String = if major == 3 {
        std::str::from_utf8(header_bytes)
            .map_err(|e| NpyError::BadHeader {
                reason: format!("a version 3.0 header must be UTF-8 ({e})"),
                header: String::from_utf8_lossy(header_bytes).into_owned(),
            })?
            .to_owned()
    } else {
        // Versions 1.0 and 2.0 use latin-1, whose bytes are the first 256 code points.
        header_bytes.iter().map(|&b| char::from(b)).collect()
    };
    let (descr, fortran_order, shape) = parse_header(&header)?;
    let dtype = parse_descr(&descr)?;

    let data = &bytes[data_start..];
    let expected = byte_count(&shape, dtype.size)?;
    if data.len() != expected {
        return Err(NpyError::DataLength {
            elem_type: dtype.elem_type,
            shape,
            expected,
            found: data.len(),
        });
    }
    Ok(Layout {
        dtype,
        fortran_order,
        shape,
        data_start,
    })
}

/// The array from its layout and its data bytes (`data` is the part of the file after the
/// header, reused in place).
fn finish(layout: Layout, data: Vec<u8>) -> Result<NpyArray, NpyError> {
    let Layout {
        dtype,
        fortran_order,
        shape,
        ..
    } = layout;
    let mut data = if fortran_order && shape.len() > 1 {
        fortran_to_c(&data, &shape, dtype.size)?
    } else {
        data
    };
    if dtype.big_endian && dtype.unit > 1 {
        for unit in data.chunks_exact_mut(dtype.unit) {
            unit.reverse();
        }
    }
    if dtype.elem_type == ElementType::Bool {
        for b in &mut data {
            *b = u8::from(*b != 0);
        }
    }
    let strings = match dtype.text {
        None => Vec::new(),
        Some(unicode) => decode_strings(&data, dtype.size.max(1), unicode)?,
    };
    if dtype.text.is_some() {
        data = Vec::new();
    }
    Ok(NpyArray {
        elem_type: dtype.elem_type,
        shape,
        data,
        untyped: dtype.untyped,
        strings,
    })
}

/// The strings of a unicode (UTF-32 little-endian after byte swapping) or byte-string array,
/// without their NUL padding.
fn decode_strings(data: &[u8], size: usize, unicode: bool) -> Result<Vec<Vec<u8>>, NpyError> {
    let count = data.len() / size;
    let mut out: Vec<Vec<u8>> = Vec::new();
    // Each string costs its bookkeeping too: refuse what cannot be held, not abort on it.
    out.try_reserve_exact(count)
        .map_err(|_| NpyError::OutOfMemory {
            bytes: count.saturating_mul(std::mem::size_of::<Vec<u8>>()),
        })?;
    for item in data.chunks_exact(size).enumerate().map(|(i, item)| {
        if !unicode {
            let end = item.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
            return Ok(item[..end].to_vec());
        }
        let mut s = String::new();
        for unit in item.chunks_exact(4) {
            let code = u32::from_le_bytes([unit[0], unit[1], unit[2], unit[3]]);
            if code == 0 {
                continue;
            }
            s.push(char::from_u32(code).ok_or_else(|| NpyError::BadHeader {
                reason: format!("string element {i} holds {code:#x}, not a Unicode scalar"),
                header: String::new(),
            })?);
        }
        // numpy pads with NULs at the end only; inner NULs are kept by Python too, but a
        // trailing run is padding.
        Ok(s.trim_end_matches('\0').as_bytes().to_vec())
    }) {
        out.push(item?);
    }
    Ok(out)
}

/// Encodes strings (UTF-8) as a numpy unicode (`<U`) array, as `np.array([...])` makes one.
pub fn encode_npy_strings(shape: &[usize], strings: &[Vec<u8>]) -> Result<Vec<u8>, NpyError> {
    let count = byte_count(shape, 1)?;
    if count != strings.len() {
        return Err(NpyError::DataLength {
            elem_type: ElementType::String,
            shape: shape.to_vec(),
            expected: count,
            found: strings.len(),
        });
    }
    let texts: Vec<std::borrow::Cow<'_, str>> =
        strings.iter().map(|s| String::from_utf8_lossy(s)).collect();
    if strings.iter().any(|s| std::str::from_utf8(s).is_err()) {
        return Err(NpyError::UnsupportedElementType {
            elem_type: ElementType::String,
            reason: "a string is not UTF-8, which numpy's unicode arrays cannot hold",
        });
    }
    let width = texts
        .iter()
        .map(|t| t.chars().count())
        .max()
        .unwrap_or(0)
        .max(1);
    // Fixed-width, as numpy's `<U`: one long string widens every element.
    let bytes = count
        .checked_mul(width)
        .and_then(|n| n.checked_mul(4))
        .ok_or(NpyError::OutOfMemory { bytes: usize::MAX })?;
    let mut data = Vec::new();
    data.try_reserve_exact(bytes)
        .map_err(|_| NpyError::OutOfMemory { bytes })?;
    for t in &texts {
        let mut n = 0;
        for c in t.chars() {
            data.extend_from_slice(&u32::from(c).to_le_bytes());
            n += 1;
        }
        data.extend(std::iter::repeat_n(0u8, (width - n) * 4));
    }
    let mut out = preamble(&format!("<U{width}"), shape, data.len())?;
    out.extend_from_slice(&data);
    Ok(out)
}

/// Encodes `data` (little-endian, C order) as the bytes of a `.npy` file.
pub fn encode_npy(
    elem_type: ElementType,
    shape: &[usize],
    data: &[u8],
) -> Result<Vec<u8>, NpyError> {
    let descr = descr_for(elem_type)?;
    let count = byte_count(shape, 1)?;
    let expected = elem_type
        .storage_bytes(count)
        .ok_or_else(|| NpyError::ShapeTooLarge {
            shape: shape.to_vec(),
        })?;
    if data.len() != expected {
        return Err(NpyError::DataLength {
            elem_type,
            shape: shape.to_vec(),
            expected,
            found: data.len(),
        });
    }

    let mut out = preamble(descr, shape, data.len())?;
    if elem_type == ElementType::Bool {
        out.extend(data.iter().map(|&b| u8::from(b != 0)));
    } else if let Some(bits) = elem_type.bits().filter(|&b| b < 8) {
        // One element per byte, as ml_dtypes holds them.
        let per = 8 / bits;
        out.extend((0..count).map(|i| (data[i / per] >> ((i % per) * bits)) & ((1 << bits) - 1)));
    } else {
        out.extend_from_slice(data);
    }
    Ok(out)
}

/// The magic, version, header length and header of a `.npy` file, padded as numpy pads them.
fn preamble(descr: &str, shape: &[usize], data_len: usize) -> Result<Vec<u8>, NpyError> {
    let dims = match shape {
        [] => "()".to_owned(),
        [d] => format!("({d},)"),
        _ => {
            let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
            format!("({})", dims.join(", "))
        }
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}");
    // Room to grow, then pad so that magic + version + length + header + '\n' is aligned.
    // Version 1.0 has a 2-byte header length, 2.0 a 4-byte one.
    let padded = |len_bytes: usize| {
        let preamble = MAGIC.len() + 2 + len_bytes;
        let total = (preamble + header.len() + GROWTH_ROOM + 1).next_multiple_of(ALIGN);
        (total, total - preamble)
    };
    let (major, len_bytes, (total, header_len)) = match padded(2) {
        (total, len) if len <= usize::from(u16::MAX) => (1u8, 2usize, (total, len)),
        _ => (2u8, 4usize, padded(4)),
    };
    header.extend(std::iter::repeat_n(' ', header_len - header.len() - 1));
    header.push('\n');
    let header_len = u32::try_from(header_len).map_err(|_| NpyError::ShapeTooLarge {
        shape: shape.to_vec(),
    })?;

    let mut out = Vec::new();
    out.try_reserve_exact(total + data_len)
        .map_err(|_| NpyError::OutOfMemory {
            bytes: total + data_len,
        })?;
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[major, 0]);
    out.extend_from_slice(&header_len.to_le_bytes()[..len_bytes]);
    out.extend_from_slice(header.as_bytes());
    Ok(out)
}

/// The numpy dtype string for `elem_type`, little-endian.
fn descr_for(elem_type: ElementType) -> Result<&'static str, NpyError> {
    use ElementType::*;
    Ok(match elem_type {
        Bool => "|b1",
        Int8 => "|i1",
        Uint8 => "|u1",
        Int16 => "<i2",
        Uint16 => "<u2",
        Int32 => "<i4",
        Uint32 => "<u4",
        Int64 => "<i8",
        Uint64 => "<u8",
        Float16 => "<f2",
        Float => "<f4",
        Double => "<f8",
        Complex64 => "<c8",
        Complex128 => "<c16",
        // As numpy saves ml_dtypes arrays: raw bytes of the element's width.
        Bfloat16 => "<V2",
        Float8E4M3FN | Float8E4M3FNUZ | Float8E5M2 | Float8E5M2FNUZ | Float8E8M0 | Float4E2M1
        | Uint4 | Int4 | Uint2 | Int2 => "|V1",
        String => {
            return Err(NpyError::UnsupportedElementType {
                elem_type,
                reason: "ONNX strings have no fixed-size numpy dtype",
            });
        }
        Undefined => {
            return Err(NpyError::UnsupportedElementType {
                elem_type,
                reason: "the element type is undefined",
            });
        }
    })
}

/// The element type and layout a numpy dtype string (`'<f4'`, `'|b1'`, ...) denotes.
fn parse_descr(descr: &str) -> Result<Dtype, NpyError> {
    let unsupported = |reason: &str| NpyError::UnsupportedDtype {
        descr: descr.to_owned(),
        reason: reason.to_owned(),
    };
    let (order, rest) = match descr.chars().next() {
        Some(c @ ('<' | '>' | '|' | '=')) => (c, &descr[1..]),
        _ => ('=', descr),
    };
    let kind = rest
        .chars()
        .next()
        .ok_or_else(|| unsupported("the dtype string is empty"))?;
    let digits = &rest[kind.len_utf8()..];
    let size: Option<usize> = if digits.is_empty() {
        None
    } else if digits.bytes().all(|b| b.is_ascii_digit()) {
        digits.parse().ok()
    } else {
        None
    };
    use ElementType::*;
    let elem_type = match (kind, size) {
        ('b', Some(1)) | ('?', None) => Bool,
        ('i', Some(1)) | ('b', None) => Int8,
        ('i', Some(2)) => Int16,
        ('i', Some(4)) => Int32,
        ('i', Some(8)) => Int64,
        ('u', Some(1)) | ('B', None) => Uint8,
        ('u', Some(2)) => Uint16,
        ('u', Some(4)) => Uint32,
        ('u', Some(8)) => Uint64,
        ('f', Some(2)) | ('e', None) => Float16,
        ('f', Some(4)) => Float,
        ('f', Some(8)) => Double,
        ('c', Some(8)) => Complex64,
        ('c', Some(16)) => Complex128,
        ('O', _) => {
            return Err(unsupported(
                "object arrays hold pickled Python objects, which are not read; save a numeric \
                 array instead",
            ));
        }
        ('S' | 'a' | 'U', Some(n)) => {
            let unicode = kind == 'U';
            let size = if unicode { n.checked_mul(4) } else { Some(n) }
                .ok_or_else(|| unsupported("the string width is too large"))?;
            return Ok(Dtype {
                elem_type: String,
                size,
                unit: if unicode { 4 } else { 1 },
                big_endian: order == '>' || (order == '=' && cfg!(target_endian = "big")),
                untyped: false,
                text: Some(unicode),
            });
        }
        ('S' | 'a' | 'U', None) => {
            return Err(unsupported("a string dtype needs a width, as in '<U8'"));
        }
        ('V', Some(1)) => Uint8,
        ('V', Some(2)) => Uint16,
        ('V', _) => {
            return Err(unsupported(
                "raw void data of this width is not read (only 1- and 2-byte elements, as \
                 numpy saves ml_dtypes' bfloat16, float8 and 4-bit arrays)",
            ));
        }
        ('M' | 'm', _) => {
            return Err(unsupported(
                "datetime and timedelta arrays are not supported",
            ));
        }
        ('f', Some(_)) => {
            return Err(unsupported("only 2-, 4- and 8-byte floats are supported"));
        }
        ('i' | 'u', Some(_)) => {
            return Err(unsupported(
                "only 1-, 2-, 4- and 8-byte integers are supported",
            ));
        }
        _ => {
            return Err(unsupported(
                "it is not a bool, integer, float or complex dtype this reader knows",
            ));
        }
    };
    let size = elem_type.byte_size().unwrap_or(1);
    let unit = if matches!(elem_type, Complex64 | Complex128) {
        size / 2
    } else {
        size
    };
    let big_endian = match order {
        '>' => true,
        '<' | '|' => false,
        _ => cfg!(target_endian = "big"),
    };
    if order == '|' && size > 1 {
        return Err(unsupported(
            "'|' (no byte order) is only valid for 1-byte types; use '<' or '>'",
        ));
    }
    // Raw bytes are bit patterns, swapped as units of their width like any number.
    Ok(Dtype {
        elem_type,
        size,
        unit,
        big_endian,
        untyped: kind == 'V',
        text: None,
    })
}

/// Total bytes of an array, or an error when it overflows.
fn byte_count(shape: &[usize], elem_size: usize) -> Result<usize, NpyError> {
    shape
        .iter()
        .try_fold(elem_size, |acc, &d| acc.checked_mul(d))
        .filter(|&n| isize::try_from(n).is_ok())
        .ok_or_else(|| NpyError::ShapeTooLarge {
            shape: shape.to_vec(),
        })
}

/// Reorders Fortran-order (column-major) `data` to C order. `data` has exactly the right size.
fn fortran_to_c(data: &[u8], shape: &[usize], elem_size: usize) -> Result<Vec<u8>, NpyError> {
    let mut out = Vec::new();
    out.try_reserve_exact(data.len())
        .map_err(|_| NpyError::OutOfMemory { bytes: data.len() })?;
    if data.is_empty() {
        return Ok(out);
    }
    // Element strides of the Fortran layout.
    // bounded: one per axis.
    let mut strides = Vec::with_capacity(shape.len());
    let mut stride = 1usize;
    for &d in shape {
        strides.push(stride);
        stride *= d;
    }
    // bounded: one per axis.
    let mut index = vec![0usize; shape.len()];
    let mut offset = 0usize;
    loop {
        let start = offset * elem_size;
        out.extend_from_slice(&data[start..start + elem_size]);
        // Advance the C-order index, last axis fastest.
        let mut axis = shape.len();
        loop {
            if axis == 0 {
                return Ok(out);
            }
            axis -= 1;
            index[axis] += 1;
            offset += strides[axis];
            if index[axis] < shape[axis] {
                break;
            }
            offset -= strides[axis] * shape[axis];
            index[axis] = 0;
        }
    }
}

/// A value in a header dict: the few Python literals `.npy` headers use.
#[derive(Clone, Debug, PartialEq)]
enum Literal {
    Str(String),
    Bool(bool),
    Int(i128),
    None,
    Tuple(Vec<Literal>),
    List(Vec<Literal>),
}

struct HeaderParser<'a> {
    text: &'a str,
    pos: usize,
}

impl HeaderParser<'_> {
    fn peek(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    fn skip_ws(&mut self) {
        while let Some(c) = self.peek() {
            if c.is_whitespace() {
                self.pos += c.len_utf8();
            } else {
                break;
            }
        }
    }

    fn expect(&mut self, want: char) -> Result<(), String> {
        self.skip_ws();
        match self.peek() {
            Some(c) if c == want => {
                self.pos += c.len_utf8();
                Ok(())
            }
            Some(c) => Err(format!(
                "expected '{want}' at offset {} but found '{c}'",
                self.pos
            )),
            None => Err(format!("expected '{want}' but the header ended")),
        }
    }

    fn value(&mut self, depth: usize) -> Result<Literal, String> {
        if depth > MAX_DEPTH {
            return Err("values are nested too deeply".to_owned());
        }
        self.skip_ws();
        match self.peek() {
            Some(q @ ('\'' | '"')) => {
                self.pos += 1;
                self.string(q).map(Literal::Str)
            }
            Some('(') => {
                self.pos += 1;
                self.sequence(')', depth).map(Literal::Tuple)
            }
            Some('[') => {
                self.pos += 1;
                self.sequence(']', depth).map(Literal::List)
            }
            Some(c) if c == '-' || c == '+' || c.is_ascii_digit() => self.int(),
            Some(c) if c.is_ascii_alphabetic() => {
                let word = self.word();
                match word {
                    "True" => Ok(Literal::Bool(true)),
                    "False" => Ok(Literal::Bool(false)),
                    "None" => Ok(Literal::None),
                    _ => Err(format!("unknown name '{word}'")),
                }
            }
            Some(c) => Err(format!("unexpected '{c}' at offset {}", self.pos)),
            None => Err("the header ended where a value was expected".to_owned()),
        }
    }

    fn word(&mut self) -> &str {
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == '_' {
                self.pos += 1;
            } else {
                break;
            }
        }
        &self.text[start..self.pos]
    }

    fn string(&mut self, quote: char) -> Result<String, String> {
        let mut s = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err("a string is not closed".to_owned());
            };
            self.pos += c.len_utf8();
            match c {
                '\\' => {
                    let Some(e) = self.peek() else {
                        return Err("a string is not closed".to_owned());
                    };
                    self.pos += e.len_utf8();
                    match e {
                        'n' => s.push('\n'),
                        't' => s.push('\t'),
                        other => s.push(other),
                    }
                }
                c if c == quote => return Ok(s),
                c => s.push(c),
            }
        }
    }

    fn int(&mut self) -> Result<Literal, String> {
        let start = self.pos;
        if matches!(self.peek(), Some('-' | '+')) {
            self.pos += 1;
        }
        while matches!(self.peek(), Some(c) if c.is_ascii_digit()) {
            self.pos += 1;
        }
        let digits = &self.text[start..self.pos];
        // Python 2 wrote long integers with an `L` suffix.
        if matches!(self.peek(), Some('L' | 'l')) {
            self.pos += 1;
        }
        digits
            .parse::<i128>()
            .map(Literal::Int)
            .map_err(|_| format!("'{digits}' is not a usable integer"))
    }

    fn sequence(&mut self, close: char, depth: usize) -> Result<Vec<Literal>, String> {
        let mut items = Vec::new();
        loop {
            self.skip_ws();
            if self.peek() == Some(close) {
                self.pos += 1;
                return Ok(items);
            }
            items.push(self.value(depth + 1)?);
            self.skip_ws();
            match self.peek() {
                Some(',') => self.pos += 1,
                Some(c) if c == close => {}
                Some(c) => {
                    return Err(format!(
                        "expected ',' or '{close}' at offset {} but found '{c}'",
                        self.pos
                    ));
                }
                None => return Err(format!("expected '{close}' but the header ended")),
            }
        }
    }

    fn dict(&mut self) -> Result<Vec<(String, Literal)>, String> {
        self.expect('{')?;
        let mut entries = Vec::new();
        loop {
            self.skip_ws();
            match self.peek() {
                Some('}') => {
                    self.pos += 1;
                    break;
                }
                Some(q @ ('\'' | '"')) => {
                    self.pos += 1;
                    let key = self.string(q)?;
                    self.expect(':')?;
                    let value = self.value(0)?;
                    entries.push((key, value));
                    self.skip_ws();
                    match self.peek() {
                        Some(',') => self.pos += 1,
                        Some('}') => {}
                        Some(c) => {
                            return Err(format!(
                                "expected ',' or '}}' at offset {} but found '{c}'",
                                self.pos
                            ));
                        }
                        None => return Err("expected '}' but the header ended".to_owned()),
                    }
                }
                Some(c) => {
                    return Err(format!(
                        "expected a quoted key at offset {} but found '{c}'",
                        self.pos
                    ));
                }
                None => return Err("expected '}' but the header ended".to_owned()),
            }
        }
        self.skip_ws();
        if let Some(c) = self.peek() {
            return Err(format!("unexpected '{c}' after the closing '}}'"));
        }
        Ok(entries)
    }
}

/// Parses a header dict into its `descr`, `fortran_order` and `shape`.
fn parse_header(header: &str) -> Result<(String, bool, Vec<usize>), NpyError> {
    let bad = |reason: String| NpyError::BadHeader {
        reason,
        header: header.trim_end().chars().take(200).collect(),
    };
    let entries = HeaderParser {
        text: header,
        pos: 0,
    }
    .dict()
    .map_err(bad)?;
    // numpy refuses a header whose keys are not exactly these three ("Header does not contain
    // the correct keys"): a file that says more than this reader understands is not guessed at.
    if let Some((k, _)) = entries
        .iter()
        .find(|(k, _)| !matches!(k.as_str(), "descr" | "fortran_order" | "shape"))
    {
        return Err(bad(format!(
            "unknown key '{k}': a .npy header holds only 'descr', 'fortran_order' and 'shape'"
        )));
    }
    // A key given twice takes its last value, as Python's dict literal (and so numpy) does.
    let get = |key: &str| {
        entries
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
            .ok_or_else(|| bad(format!("the key '{key}' is missing")))
    };
    let descr = match get("descr")? {
        Literal::Str(s) => s.clone(),
        Literal::List(_) => {
            return Err(NpyError::UnsupportedDtype {
                descr: describe(get("descr")?),
                reason: "structured (record) arrays are not supported, only plain numeric and \
                         bool arrays"
                    .to_owned(),
            });
        }
        other => {
            return Err(bad(format!(
                "'descr' should be a string but is {}",
                describe(other)
            )));
        }
    };
    let fortran_order = match get("fortran_order")? {
        Literal::Bool(b) => *b,
        other => {
            return Err(bad(format!(
                "'fortran_order' should be True or False but is {}",
                describe(other)
            )));
        }
    };
    let shape = match get("shape")? {
        Literal::Tuple(dims) => dims
            .iter()
            .map(|d| match d {
                Literal::Int(n) => usize::try_from(*n)
                    .map_err(|_| bad(format!("the shape has an invalid dimension {n}"))),
                other => Err(bad(format!(
                    "the shape should hold integers but holds {}",
                    describe(other)
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?,
        other => {
            return Err(bad(format!(
                "'shape' should be a tuple but is {}",
                describe(other)
            )));
        }
    };
    Ok((descr, fortran_order, shape))
}

/// A Python-like rendering of a header value, for error messages.
fn describe(value: &Literal) -> String {
    let join = |items: &[Literal]| items.iter().map(describe).collect::<Vec<_>>().join(", ");
    match value {
        Literal::Str(s) => format!("'{s}'"),
        Literal::Bool(true) => "True".to_owned(),
        Literal::Bool(false) => "False".to_owned(),
        Literal::Int(n) => n.to_string(),
        Literal::None => "None".to_owned(),
        Literal::Tuple(items) => format!("({})", join(items)),
        Literal::List(items) => format!("[{}]", join(items)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Files written by numpy 2.4 (`np.save`, or `np.lib.format.write_array` for versions 2.0
    // and 3.0); the comment above each says what array it holds.

    /// `np.arange(6, dtype='<f4').reshape(2, 3) * 0.5`
    const F4_V1: &[u8] = b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }                                                          \n\x00\x00\x00\x00\x00\x00\x00?\x00\x00\x80?\x00\x00\xc0?\x00\x00\x00@\x00\x00 @";
    /// `np.asfortranarray(np.arange(6, dtype='<i2').reshape(2, 3))`
    const I2_FORTRAN: &[u8] = b"\x93NUMPY\x01\x00v\x00{'descr': '<i2', 'fortran_order': True, 'shape': (2, 3), }                                                           \n\x00\x00\x03\x00\x01\x00\x04\x00\x02\x00\x05\x00";
    /// `np.array([1, -2, 70000], dtype='>i4')`
    const I4_BIG: &[u8] = b"\x93NUMPY\x01\x00v\x00{'descr': '>i4', 'fortran_order': False, 'shape': (3,), }                                                            \n\x00\x00\x00\x01\xff\xff\xff\xfe\x00\x01\x11p";
    /// `np.asfortranarray(np.arange(24, dtype='>f8').reshape(2, 3, 4))`
    const F8_BIG_FORTRAN_3D: &[u8] = b"\x93NUMPY\x01\x00v\x00{'descr': '>f8', 'fortran_order': True, 'shape': (2, 3, 4), }                                                        \n\x00\x00\x00\x00\x00\x00\x00\x00@(\x00\x00\x00\x00\x00\x00@\x10\x00\x00\x00\x00\x00\x00@0\x00\x00\x00\x00\x00\x00@ \x00\x00\x00\x00\x00\x00@4\x00\x00\x00\x00\x00\x00?\xf0\x00\x00\x00\x00\x00\x00@*\x00\x00\x00\x00\x00\x00@\x14\x00\x00\x00\x00\x00\x00@1\x00\x00\x00\x00\x00\x00@\"\x00\x00\x00\x00\x00\x00@5\x00\x00\x00\x00\x00\x00@\x00\x00\x00\x00\x00\x00\x00@,\x00\x00\x00\x00\x00\x00@\x18\x00\x00\x00\x00\x00\x00@2\x00\x00\x00\x00\x00\x00@$\x00\x00\x00\x00\x00\x00@6\x00\x00\x00\x00\x00\x00@\x08\x00\x00\x00\x00\x00\x00@.\x00\x00\x00\x00\x00\x00@\x1c\x00\x00\x00\x00\x00\x00@3\x00\x00\x00\x00\x00\x00@&\x00\x00\x00\x00\x00\x00@7\x00\x00\x00\x00\x00\x00";
    /// `np.array([True, False, True])`
    const BOOL: &[u8] = b"\x93NUMPY\x01\x00v\x00{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }                                                            \n\x01\x00\x01";
    /// `np.array([1, 2**40, 2**64 - 1], dtype='<u8')`, version 2.0
    const U8_V2: &[u8] = b"\x93NUMPY\x02\x00t\x00\x00\x00{'descr': '<u8', 'fortran_order': False, 'shape': (3,), }                                                          \n\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff";
    /// `np.array([1.5, -2.0], dtype='<f2')`, version 3.0
    const F2_V3: &[u8] = b"\x93NUMPY\x03\x00t\x00\x00\x00{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }                                                          \n\x00>\x00\xc0";
    /// `np.float64(2.5)`
    const F8_SCALAR: &[u8] = b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (), }                                                              \n\x00\x00\x00\x00\x00\x00\x04@";
    /// `np.zeros((0, 3), dtype='<i8')`
    const EMPTY: &[u8] = b"\x93NUMPY\x01\x00v\x00{'descr': '<i8', 'fortran_order': False, 'shape': (0, 3), }                                                          \n";
    /// `np.array([b'ab'], dtype='S10')`
    const S10: &[u8] = b"\x93NUMPY\x01\x00v\x00{'descr': '|S10', 'fortran_order': False, 'shape': (1,), }                                                           \nab\x00\x00\x00\x00\x00\x00\x00\x00";
    /// `np.array([{'a': 1}], dtype=object)` (header only; the pickle is cut off)
    const OBJECT: &[u8] = b"\x93NUMPY\x01\x00v\x00{'descr': '|O', 'fortran_order': False, 'shape': (1,), }                                                             \n";
    /// `np.zeros(2, dtype=[('a', '<i4'), ('b', '<f4')])`
    const STRUCTURED: &[u8] = b"\x93NUMPY\x01\x00v\x00{'descr': [('a', '<i4'), ('b', '<f4')], 'fortran_order': False, 'shape': (2,), }                                     \n\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00";
    /// `np.array([1 + 2j], dtype='<c8')`
    const C8: &[u8] = b"\x93NUMPY\x01\x00v\x00{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }                                                            \n\x00\x00\x80?\x00\x00\x00@";

    fn le<T: Copy, const N: usize>(values: &[T], to_le: fn(T) -> [u8; N]) -> Vec<u8> {
        values.iter().flat_map(|&v| to_le(v)).collect()
    }

    fn f64s(data: &[u8]) -> Vec<f64> {
        data.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn reads_numpy_files() {
        let a = parse_npy(F4_V1).unwrap();
        assert_eq!(
            (a.elem_type, a.shape.as_slice()),
            (ElementType::Float, &[2, 3][..])
        );
        assert_eq!(
            a.data,
            le(&[0.0f32, 0.5, 1.0, 1.5, 2.0, 2.5], f32::to_le_bytes)
        );

        let a = parse_npy(BOOL).unwrap();
        assert_eq!(
            (a.elem_type, a.shape, a.data),
            (ElementType::Bool, vec![3], vec![1, 0, 1])
        );

        let a = parse_npy(U8_V2).unwrap();
        assert_eq!(a.elem_type, ElementType::Uint64);
        assert_eq!(a.data, le(&[1u64, 1 << 40, u64::MAX], u64::to_le_bytes));

        let a = parse_npy(F2_V3).unwrap();
        assert_eq!(a.elem_type, ElementType::Float16);
        let halves: Vec<f32> = a
            .data
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect();
        assert_eq!(halves, vec![1.5, -2.0]);

        let a = parse_npy(F8_SCALAR).unwrap();
        assert_eq!((a.elem_type, a.shape.len()), (ElementType::Double, 0));
        assert_eq!(f64s(&a.data), vec![2.5]);

        let a = parse_npy(EMPTY).unwrap();
        assert_eq!(
            (a.elem_type, a.shape, a.data.len()),
            (ElementType::Int64, vec![0, 3], 0)
        );

        let a = parse_npy(C8).unwrap();
        assert_eq!(a.elem_type, ElementType::Complex64);
        assert_eq!(a.data, le(&[1.0f32, 2.0], f32::to_le_bytes));
    }

    #[test]
    fn reads_big_endian() {
        let a = parse_npy(I4_BIG).unwrap();
        assert_eq!(a.elem_type, ElementType::Int32);
        assert_eq!(a.data, le(&[1i32, -2, 70000], i32::to_le_bytes));
    }

    #[test]
    fn reads_fortran_order() {
        let a = parse_npy(I2_FORTRAN).unwrap();
        assert_eq!(
            (a.elem_type, a.shape.as_slice()),
            (ElementType::Int16, &[2, 3][..])
        );
        assert_eq!(a.data, le(&[0i16, 1, 2, 3, 4, 5], i16::to_le_bytes));

        let a = parse_npy(F8_BIG_FORTRAN_3D).unwrap();
        assert_eq!(
            (a.elem_type, a.shape.as_slice()),
            (ElementType::Double, &[2, 3, 4][..])
        );
        assert_eq!(f64s(&a.data), (0..24).map(f64::from).collect::<Vec<_>>());
    }

    #[test]
    fn writes_what_numpy_writes() {
        let data = le(&[0.0f32, 0.5, 1.0, 1.5, 2.0, 2.5], f32::to_le_bytes);
        assert_eq!(
            encode_npy(ElementType::Float, &[2, 3], &data).unwrap(),
            F4_V1
        );
        assert_eq!(
            encode_npy(ElementType::Bool, &[3], &[1, 0, 1]).unwrap(),
            BOOL
        );
        assert_eq!(
            encode_npy(ElementType::Double, &[], &2.5f64.to_le_bytes()).unwrap(),
            F8_SCALAR
        );
        assert_eq!(encode_npy(ElementType::Int64, &[0, 3], &[]).unwrap(), EMPTY);
    }

    #[test]
    fn round_trips_every_dtype() {
        use ElementType::*;
        let types = [
            Bool, Int8, Int16, Int32, Int64, Uint8, Uint16, Uint32, Uint64, Float16, Float, Double,
            Complex64, Complex128,
        ];
        for elem_type in types {
            let size = elem_type.byte_size().unwrap();
            for shape in [&[][..], &[0][..], &[5][..], &[2, 3][..], &[2, 1, 3, 2][..]] {
                let count: usize = shape.iter().product();
                let data: Vec<u8> = (0..count * size)
                    .map(|i| {
                        if elem_type == Bool {
                            (i % 2) as u8
                        } else {
                            (i * 37 + 11) as u8
                        }
                    })
                    .collect();
                let bytes = encode_npy(elem_type, shape, &data).unwrap();
                assert_eq!(
                    bytes.len() % ALIGN,
                    data.len() % ALIGN,
                    "{elem_type} {shape:?}"
                );
                let back = parse_npy(&bytes).unwrap();
                assert_eq!(
                    back,
                    NpyArray {
                        elem_type,
                        shape: shape.to_vec(),
                        data,
                        untyped: false,
                        strings: Vec::new(),
                    },
                    "{elem_type}"
                );
            }
        }
    }

    #[test]
    fn long_headers_use_version_2() {
        let shape = vec![1usize; 30_000];
        let bytes = encode_npy(ElementType::Uint8, &shape, &[7]).unwrap();
        assert_eq!(&bytes[6..8], &[2, 0]);
        let back = parse_npy(&bytes).unwrap();
        assert_eq!((back.shape, back.data), (shape, vec![7]));
    }

    #[test]
    fn file_round_trip_and_errors_name_the_path() {
        let dir = std::env::temp_dir().join(format!("epx-npy-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.npy");
        write_npy(
            &path,
            ElementType::Int32,
            &[2],
            &le(&[3i32, 4], i32::to_le_bytes),
        )
        .unwrap();
        let a = read_npy(&path).unwrap();
        assert_eq!(a.data, le(&[3i32, 4], i32::to_le_bytes));

        std::fs::write(&path, &F4_V1[..F4_V1.len() - 1]).unwrap();
        let e = read_npy(&path).unwrap_err();
        assert_eq!(e.path(), Some(path.as_path()));
        assert!(
            matches!(
                e.kind(),
                NpyError::DataLength {
                    expected: 24,
                    found: 23,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("a.npy"), "{e}");

        let e = read_npy(&dir.join("missing.npy")).unwrap_err();
        assert!(
            matches!(e, NpyError::Io { .. }) && e.to_string().contains("missing.npy"),
            "{e}"
        );

        let e = write_npy(&path, ElementType::String, &[1], &[0, 0]).unwrap_err();
        assert!(
            e.to_string().contains("string") && e.to_string().contains("a.npy"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unicode_strings_round_trip_as_numpy_writes_them() {
        let words = vec!["caf\u{e9}".as_bytes().to_vec(), Vec::new(), b"ab".to_vec()];
        let bytes = encode_npy_strings(&[3], &words).unwrap();
        // numpy's unicode arrays: UTF-32LE, as wide as the longest string.
        assert!(String::from_utf8_lossy(&bytes).contains("'descr': '<U4'"));
        let back = parse_npy(&bytes).unwrap();
        assert_eq!(
            (back.elem_type, back.shape, back.strings),
            (ElementType::String, vec![3], words)
        );
        assert!(
            encode_npy_strings(&[1], &[vec![0xff]]).is_err(),
            "not UTF-8"
        );
    }

    #[test]
    fn unsupported_dtypes_are_named() {
        // Byte strings are read (numpy's `np.array([b"ab"])` saves `|S2`; this file says S10).
        let s = parse_npy(S10).unwrap();
        assert_eq!(
            (s.elem_type, s.strings),
            (ElementType::String, vec![b"ab".to_vec()])
        );
        let e = parse_npy(OBJECT).unwrap_err();
        assert!(
            matches!(&e, NpyError::UnsupportedDtype { descr: d, .. } if d == "|O"),
            "{e}"
        );
        assert!(e.to_string().contains("|O"), "{e}");
        let e = parse_npy(STRUCTURED).unwrap_err();
        assert!(matches!(e, NpyError::UnsupportedDtype { .. }), "{e}");
        assert!(e.to_string().contains("structured"), "{e}");
    }

    /// `np.save` of `ml_dtypes` arrays: `np.array([1.0, -2.0], ml_dtypes.bfloat16)` and
    /// `np.array([-1, 7, -8], ml_dtypes.int4)`, as numpy 2 writes them.
    #[test]
    fn ml_dtypes_arrays_read_as_the_declared_type() {
        let bf16 = encode_raw("<V2", "(2,)", &[0x80, 0x3f, 0x00, 0xc0]);
        let a = parse_npy(&bf16).unwrap();
        assert!(a.untyped);
        let a = a.as_type(ElementType::Bfloat16).unwrap();
        assert_eq!(a.elem_type, ElementType::Bfloat16);
        assert_eq!(a.data, [0x80, 0x3f, 0x00, 0xc0]);
        let e = parse_npy(&bf16)
            .unwrap()
            .as_type(ElementType::Float8E4M3FN)
            .unwrap_err();
        assert!(e.to_string().contains("raw 2-byte elements"), "{e}");

        let int4 = encode_raw("<V1", "(3,)", &[0x0f, 0x07, 0x08]);
        let a = parse_npy(&int4)
            .unwrap()
            .as_type(ElementType::Int4)
            .unwrap();
        assert_eq!(
            (a.elem_type, a.data.as_slice()),
            (ElementType::Int4, &[0x7f, 0x08][..])
        );
        // Written back one element per byte, as ml_dtypes holds them.
        let out = encode_npy(ElementType::Int4, &[3], &a.data).unwrap();
        let back = parse_npy(&out).unwrap();
        assert_eq!(back.data, [0x0f, 0x07, 0x08]);
        assert_eq!(back.as_type(ElementType::Int4).unwrap().data, [0x7f, 0x08]);
        // A typed array is not reinterpreted.
        let f = parse_npy(&encode_npy(ElementType::Uint8, &[1], &[3]).unwrap()).unwrap();
        assert_eq!(
            f.as_type(ElementType::Int4).unwrap().elem_type,
            ElementType::Uint8
        );
    }

    fn encode_raw(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        let mut header =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn write_errors() {
        let e = encode_npy(ElementType::String, &[1], &[0]).unwrap_err();
        assert!(matches!(
            e,
            NpyError::UnsupportedElementType {
                elem_type: ElementType::String,
                ..
            }
        ));
        assert!(encode_npy(ElementType::Int4, &[3], &[0]).is_err());
        let e = encode_npy(ElementType::Float, &[2, 2], &[0; 15]).unwrap_err();
        assert!(
            matches!(
                e,
                NpyError::DataLength {
                    expected: 16,
                    found: 15,
                    ..
                }
            ),
            "{e}"
        );
        let e = encode_npy(ElementType::Float, &[usize::MAX, 2], &[]).unwrap_err();
        assert!(matches!(e, NpyError::ShapeTooLarge { .. }), "{e}");
    }

    /// Replaces the header of a version 1.0 file (keeping its length field consistent).
    fn with_header(header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn malformed_inputs_are_errors() {
        assert!(matches!(parse_npy(b""), Err(NpyError::BadMagic { .. })));
        assert!(matches!(
            parse_npy(b"\x93NUM"),
            Err(NpyError::BadMagic { .. })
        ));
        let e = parse_npy(b"PK\x03\x04 not npy").unwrap_err();
        assert!(
            matches!(e, NpyError::BadMagic { .. }) && e.to_string().contains("PK"),
            "{e}"
        );
        assert!(matches!(
            parse_npy(b"\x93NUMPY\x01"),
            Err(NpyError::Truncated { .. })
        ));
        assert!(matches!(
            parse_npy(b"\x93NUMPY\x01\x00v"),
            Err(NpyError::Truncated { .. })
        ));
        assert!(matches!(
            parse_npy(&F4_V1[..60]),
            Err(NpyError::Truncated {
                what: "header",
                needed: 128,
                available: 60
            })
        ));
        assert!(matches!(
            parse_npy(b"\x93NUMPY\x04\x00\x00\x00"),
            Err(NpyError::UnsupportedVersion { major: 4, minor: 0 })
        ));
        let mut extra = F4_V1.to_vec();
        extra.push(0);
        assert!(matches!(
            parse_npy(&extra),
            Err(NpyError::DataLength { found: 25, .. })
        ));

        let bad_headers = [
            "",
            "{",
            "not a dict",
            "{'descr': '<f4', 'fortran_order': False}",
            "{'descr': '<f4', 'shape': (2,)}",
            "{'fortran_order': False, 'shape': (2,)}",
            "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': [2]}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': ('a',)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999999999999999999999,)}",
            "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}",
            "{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}",
            "{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}",
            "{'descr': 4, 'fortran_order': False, 'shape': (2,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} extra",
            "{'descr': '<f4', 'fortran_order': False, 'shape': ((((((((((((((((((((2,),),),),),),),),),),),),),),),),),),),)}",
            // numpy refuses keys beyond the three ("Header does not contain the correct keys").
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'offset': 8}",
        ];
        for header in bad_headers {
            let e = parse_npy(&with_header(header, &[0; 8])).unwrap_err();
            assert!(
                matches!(e, NpyError::BadHeader { .. }),
                "{header:?} gave {e}"
            );
        }
        let bad_descrs = ["", "<", "<f3", "<i16", "<x4", ">M8", "|f4", "<U", "<f4x"];
        for descr in bad_descrs {
            let header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (2,)}}");
            let e = parse_npy(&with_header(&header, &[0; 8])).unwrap_err();
            assert!(
                matches!(e, NpyError::UnsupportedDtype { .. }),
                "{descr:?} gave {e}"
            );
        }
        // Shapes whose size overflows are refused before anything is allocated.
        let header = "{'descr': '<f8', 'fortran_order': True, 'shape': (4294967296, 4294967296)}";
        assert!(matches!(
            parse_npy(&with_header(header, &[])),
            Err(NpyError::ShapeTooLarge { .. })
        ));
        // Valid but unusual spellings numpy and Python 2 produced are accepted.
        let header = "{\"shape\": (2L,), \"fortran_order\": False, \"descr\": \"<i4\",}  \n";
        let a = parse_npy(&with_header(header, &le(&[5i32, 6], i32::to_le_bytes))).unwrap();
        assert_eq!((a.elem_type, a.shape), (ElementType::Int32, vec![2]));
    }

    #[test]
    fn never_panics_on_mangled_files() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for base in [
            F4_V1,
            I2_FORTRAN,
            F8_BIG_FORTRAN_3D,
            U8_V2,
            F2_V3,
            STRUCTURED,
        ] {
            for cut in 0..base.len() {
                let _ = parse_npy(&base[..cut]);
            }
            for _ in 0..2000 {
                let mut bytes = base.to_vec();
                for _ in 0..1 + next() % 4 {
                    let i = (next() % bytes.len() as u64) as usize;
                    bytes[i] = next() as u8;
                }
                let _ = parse_npy(&bytes);
            }
        }
    }

    /// Cross-checks with numpy itself when `python3 -c "import numpy"` works; skipped otherwise.
    #[test]
    fn numpy_reads_what_we_write_and_we_read_what_it_writes() {
        use std::process::Command;
        let has_numpy = Command::new("python3")
            .args(["-c", "import numpy"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !has_numpy {
            println!("skipped: python3 with numpy is not available");
            return;
        }
        let dir = std::env::temp_dir().join(format!("epx-npy-numpy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let values: Vec<i64> = (0..24).map(|i| (i * 7) % 11 - 3).collect();
        let path = dir.join("ours.npy");
        write_npy(
            &path,
            ElementType::Int64,
            &[2, 3, 4],
            &le(&values, i64::to_le_bytes),
        )
        .unwrap();
        let script = r#"
import sys, numpy as np
d = sys.argv[1]
a = np.load(d + "/ours.npy")
assert a.dtype == np.int64 and a.shape == (2, 3, 4), (a.dtype, a.shape)
assert (a.ravel() == (np.arange(24) * 7) % 11 - 3).all(), a
for code in ["b1", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8"]:
    for order in "<>":
        b = (a % 2 == 0) if code == "b1" else np.abs(a).astype(order + code)
        np.save(f"{d}/{code}{'be' if order == '>' else 'le'}.npy", np.asfortranarray(b))
"#;
        let out = Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            std::string::String::from_utf8_lossy(&out.stderr)
        );
        use ElementType::*;
        let expected = [
            ("b1", Bool),
            ("i1", Int8),
            ("u1", Uint8),
            ("i2", Int16),
            ("u2", Uint16),
            ("i4", Int32),
            ("u4", Uint32),
            ("i8", Int64),
            ("u8", Uint64),
            ("f2", Float16),
            ("f4", Float),
            ("f8", Double),
        ];
        for (code, elem_type) in expected {
            for order in ["le", "be"] {
                let a = read_npy(&dir.join(format!("{code}{order}.npy"))).unwrap();
                assert_eq!(
                    (a.elem_type, a.shape.as_slice()),
                    (elem_type, &[2, 3, 4][..])
                );
                let got: Vec<f64> = a
                    .data
                    .chunks_exact(elem_type.byte_size().unwrap())
                    .map(|c| match elem_type {
                        Float16 => f64::from(half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
                        Float => f64::from(f32::from_le_bytes(c.try_into().unwrap())),
                        Double => f64::from_le_bytes(c.try_into().unwrap()),
                        _ => {
                            let mut b = [0u8; 8];
                            b[..c.len()].copy_from_slice(c);
                            u64::from_le_bytes(b) as f64
                        }
                    })
                    .collect();
                let want: Vec<f64> = values
                    .iter()
                    .map(|&v| {
                        if elem_type == Bool {
                            f64::from(u8::from(v % 2 == 0))
                        } else {
                            v.abs() as f64
                        }
                    })
                    .collect();
                assert_eq!(got, want, "{code} {order}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_key_given_twice_takes_its_last_value_as_numpy_does() {
        let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'descr': '<i4', }";
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        let mut text = header.to_string();
        while (10 + text.len() + 1) % 64 != 0 {
            text.push(' ');
        }
        text.push('\n');
        bytes.extend_from_slice(&(text.len() as u16).to_le_bytes());
        bytes.extend_from_slice(text.as_bytes());
        bytes.extend_from_slice(&7i32.to_le_bytes());
        bytes.extend_from_slice(&(-1i32).to_le_bytes());
        let a = parse_npy(&bytes).unwrap();
        assert_eq!(a.elem_type, ElementType::Int32);
    }

    #[test]
    fn devices_and_fifos_are_not_read() {
        let e = read_npy(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
