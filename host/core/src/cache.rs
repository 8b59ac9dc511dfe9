//! The compiled-kernel cache: bytes an EP serialized for a compiled kernel (ABI 1.6), kept in
//! files under `<cache dir>/kernels/` so a later session of the same group skips compiling.
//!
//! An entry is trusted for nothing: its name is the key (a SHA-256 the session computes over the
//! graph and the group, the EP, its plugin and library, options and device), its text header repeats
//! the key and carries the payload's length and SHA-256, and a lookup that finds anything else
//! (a short file, another key, a digest that does not match, an unknown format) reports the
//! entry damaged and deletes it; the session compiles and stores a new one. The plugin checks
//! the payload once more when it rebuilds the kernel. Writes go to a temporary file renamed
//! into place, so a reader never sees half an entry; the folder is held under a size limit by
//! evicting the entries used least recently (a hit refreshes an entry's modification time).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

/// The first line of every entry; another format version is a miss.
const MAGIC: &str = "epx kernel cache 1";
/// The longest header read (the text before the payload).
const MAX_HEADER: usize = 4096;
/// Default limit of the folder's size: 2 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 2 << 30;
/// Temporary files older than this are leftovers of a writer that died, and are removed.
const STALE_TMP: Duration = Duration::from_secs(3600);

/// A folder of serialized kernels with a size limit.
#[derive(Clone, Debug)]
pub struct KernelCache {
    dir: PathBuf,
    max_bytes: u64,
}

/// What an entry says about itself, besides its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryMeta {
    /// What the entry holds: `kernel` (a serialized kernel) or `partition` (an EP's recorded
    /// capability answer for a graph).
    pub kind: String,
    /// The EP that made it.
    pub provider: String,
    /// `<plugin name> <plugin version>`.
    pub plugin: String,
    /// Nodes in the fused group.
    pub nodes: usize,
}

/// One entry of [`KernelCache::entries`].
#[derive(Clone, Debug)]
pub struct CacheEntry {
    pub key: String,
    pub path: PathBuf,
    /// The file's size.
    pub bytes: u64,
    /// When a session last stored or used it.
    pub last_used: SystemTime,
    /// `Err(why)` when the header cannot be read (the next lookup deletes the entry).
    pub meta: Result<EntryMeta, String>,
}

/// What a lookup found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The payload, its digest checked.
    Hit(Vec<u8>),
    Miss,
    /// An entry was there but could not be trusted (it is deleted); why.
    Damaged(String),
}

/// Hex of a SHA-256.
pub fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// One header line's value: newlines and other control characters would break the format.
fn field(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

impl KernelCache {
    /// The cache in `root/kernels`, held to `max_bytes`.
    pub fn new(root: &Path, max_bytes: u64) -> Self {
        KernelCache {
            dir: root.join("kernels"),
            max_bytes,
        }
    }

    /// The folder holding the entries.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The size limit.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.kernel"))
    }

    /// The payload stored under `key`, checked against its header. A damaged entry is
    /// deleted and reported; a hit refreshes the entry's time of last use.
    pub fn get(&self, key: &str) -> Lookup {
        let path = self.path(key);
        // Only a regular file of at most the cache's size is read, opened without following a
        // link and told by what was opened: not a FIFO (which would block), a device or a link
        // to one (which would not end), nor an entry someone else could have written.
        let (mut file, md) = match crate::files::open_regular_nofollow(&path) {
            Ok(opened) => opened,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Miss,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                return Lookup::Damaged(format!("{}: {e}", path.display()));
            }
            Err(e) => {
                tracing::debug!(path = %path.display(), "kernel cache entry unreadable: {e}");
                return Lookup::Miss;
            }
        };
        if md.len() > self.max_bytes {
            let _ = std::fs::remove_file(&path);
            return Lookup::Damaged(format!(
                "{}: it is {} bytes, more than the cache's limit",
                path.display(),
                md.len()
            ));
        }
        if let Err(why) = private_entry(&md) {
            let _ = std::fs::remove_file(&path);
            return Lookup::Damaged(format!("{}: {why}", path.display()));
        }
        let result = (|| -> Result<Vec<u8>, String> {
            let len = md.len();
            let mut bytes = Vec::new();
            bytes
                .try_reserve_exact(usize::try_from(len).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
            // Bounded: a file that grew since is cut at the limit, and then fails its checks.
            (&mut file)
                .take(self.max_bytes)
                .read_to_end(&mut bytes)
                .map_err(|e| e.to_string())?;
            let (header, payload) = split(&bytes)?;
            let h = parse_header(header)?;
            if h.key != key {
                return Err(format!("it holds the entry of key {}", h.key));
            }
            if payload.len() as u64 != h.payload_len {
                return Err(format!(
                    "its payload is {} bytes, its header says {}",
                    payload.len(),
                    h.payload_len
                ));
            }
            let digest = hex(&Sha256::digest(payload));
            if digest != h.payload_sha256 {
                return Err(format!(
                    "its payload's SHA-256 is {digest}, its header says {}",
                    h.payload_sha256
                ));
            }
            // The payload moved to the front of the buffer read, not copied to a new one
            // (compiled models run to tens of megabytes).
            let start = bytes.len() - payload.len();
            bytes.drain(..start);
            Ok(bytes)
        })();
        match result {
            Ok(payload) => {
                // Last use, for eviction; failing to record it only makes eviction less exact.
                let _ = file.set_modified(SystemTime::now());
                Lookup::Hit(payload)
            }
            Err(why) => {
                let _ = std::fs::remove_file(&path);
                Lookup::Damaged(format!("{}: {why}", path.display()))
            }
        }
    }

    /// Deletes the entry of `key`, if there is one.
    pub fn remove(&self, key: &str) {
        let _ = std::fs::remove_file(self.path(key));
    }

    /// Stores `payload` under `key`, atomically, then evicts the entries used least recently
    /// until the folder is within its limit. Returns how many entries were evicted.
    pub fn put(&self, key: &str, meta: &EntryMeta, payload: &[u8]) -> std::io::Result<usize> {
        let header = format!(
            "{MAGIC}\nkey {key}\nkind {}\nprovider {}\nplugin {}\nnodes {}\npayload {} {}\n\n",
            field(&meta.kind),
            field(&meta.provider),
            field(&meta.plugin),
            meta.nodes,
            payload.len(),
            hex(&Sha256::digest(payload)),
        );
        let total = (header.len() + payload.len()) as u64;
        if total > self.max_bytes {
            return Err(std::io::Error::other(format!(
                "the kernel takes {total} bytes, more than the cache's limit of {} bytes",
                self.max_bytes
            )));
        }
        private_dir(&self.dir)?;
        // Unique among writers: other processes (pid, time), other threads of this one (counter);
        // created exclusively, so a clash is an error, never two writers in one file.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let tmp = self
            .dir
            .join(format!(".{key}.{}.{nanos}.{n}.tmp", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = new_private_file(&tmp)?;
            f.write_all(header.as_bytes())?;
            f.write_all(payload)?;
            f.sync_data()?;
            std::fs::rename(&tmp, self.path(key))
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(self.evict(key))
    }

    /// Removes the entries used least recently (never `keep`) until the folder is within its
    /// limit, and temporary files a dead writer left.
    fn evict(&self, keep: &str) -> usize {
        let Ok(mut entries) = self.files() else {
            return 0;
        };
        self.remove_stale_tmp();
        let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
        entries.sort_by_key(|e| e.last_used);
        let mut evicted = 0;
        for e in entries {
            if total <= self.max_bytes {
                break;
            }
            if e.key != keep && std::fs::remove_file(&e.path).is_ok() {
                total = total.saturating_sub(e.bytes);
                evicted += 1;
            }
        }
        evicted
    }

    fn remove_stale_tmp(&self) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in dir.flatten() {
            let name = e.file_name();
            let is_tmp = name.to_str().is_some_and(|n| n.ends_with(".tmp"));
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_TMP);
            if is_tmp && old {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// Every entry, with what its header says (not its payload: that is checked on use).
    pub fn entries(&self) -> std::io::Result<Vec<CacheEntry>> {
        let mut out = self.files()?;
        for e in &mut out {
            e.meta = read_meta(&e.path);
        }
        Ok(out)
    }

    /// Every entry's file (name, size, time of last use), most recently used first; `meta` is
    /// left unread.
    fn files(&self) -> std::io::Result<Vec<CacheEntry>> {
        let dir = match std::fs::read_dir(&self.dir) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for e in dir.flatten() {
            let path = e.path();
            // Only names the cache writes: 64 hex digits.
            let Some(key) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".kernel"))
                .filter(|k| k.len() == 64 && k.bytes().all(|b| b.is_ascii_hexdigit()))
                .map(str::to_string)
            else {
                continue;
            };
            let Ok(md) = e.metadata() else { continue };
            if !md.is_file() {
                continue;
            }
            out.push(CacheEntry {
                meta: Err("not read".into()),
                key,
                path,
                bytes: md.len(),
                last_used: md.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            });
        }
        out.sort_by_key(|e| std::cmp::Reverse(e.last_used));
        Ok(out)
    }

    /// Deletes every entry (and leftover temporary files); returns how many entries and bytes.
    pub fn clear(&self) -> std::io::Result<(usize, u64)> {
        let mut removed = (0, 0);
        for e in self.files()? {
            match std::fs::remove_file(&e.path) {
                Ok(()) => {
                    removed.0 += 1;
                    removed.1 += e.bytes;
                }
                // Removed meanwhile by another process: gone either way.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        if let Ok(dir) = std::fs::read_dir(&self.dir) {
            for e in dir.flatten() {
                if e.file_name().to_str().is_some_and(|n| n.ends_with(".tmp")) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        Ok(removed)
    }
}

/// The `measure` policy's remembered choices under the cache folder `root` (one file each).
pub fn measured_choices(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    match std::fs::read_dir(root.join("selection")) {
        Ok(d) => Ok(d
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "txt"))
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Makes `dir` (and its parents), private to the user where the OS has modes: compiled kernels
/// hold the model's weights.
/// An entry is read only when the user running epx wrote it for itself: owned by that user and
/// neither readable nor writable by anyone else (mode 0600, as [`new_private_file`] makes it).
fn private_entry(md: &std::fs::Metadata) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid takes no arguments, cannot fail and touches no memory of ours.
        let uid = unsafe { libc::geteuid() };
        if md.uid() != uid {
            return Err(format!(
                "it is owned by uid {}, not by the user running epx (uid {uid}); not trusted",
                md.uid()
            ));
        }
        if md.mode() & 0o077 != 0 {
            return Err(format!(
                "its mode is {:04o}, open to other users (epx writes entries 0600); not trusted",
                md.mode() & 0o7777
            ));
        }
    }
    let _ = md;
    Ok(())
}

/// Whether the cache folder `root` may be used: nobody but root and the user running epx can
/// change it or a folder above it ([`trust::check_guarding`], the rule plugins are held to), and
/// the folders epx keeps in it are real folders, not symbolic links leading elsewhere. `Err` says
/// what is wrong and how to fix it.
///
/// [`trust::check_guarding`]: crate::plugin::trust::check_guarding
pub fn check_folder(root: &Path) -> Result<(), String> {
    const STAKE: &str = "the compiled kernels epx loads from it";
    crate::plugin::trust::check_guarding(root, STAKE).map_err(|u| {
        format!(
            "the cache folder {} is not used: {}",
            root.display(),
            u.reason
        )
    })?;
    for sub in ["kernels", "selection"] {
        let p = root.join(sub);
        match std::fs::symlink_metadata(&p) {
            Ok(md) if md.file_type().is_symlink() => {
                return Err(format!(
                    "the cache folder {} is not used: {} is a symbolic link, and the cache \
                     follows none inside it; remove the link (rm {})",
                    root.display(),
                    p.display(),
                    p.display()
                ));
            }
            // A file in the way is no trust problem: storing fails and says so.
            Ok(md) if !md.is_dir() => {}
            Ok(_) => {
                crate::plugin::trust::check_guarding(&p, STAKE).map_err(|u| {
                    format!(
                        "the cache folder {} is not used: {}",
                        root.display(),
                        u.reason
                    )
                })?;
            }
            Err(_) => {}
        }
    }
    Ok(())
}

fn private_dir(dir: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
}

/// Creates `path`, which must not exist, readable by the user alone where the OS has modes.
fn new_private_file(path: &Path) -> std::io::Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(path)
}

struct Header {
    key: String,
    meta: EntryMeta,
    payload_len: u64,
    payload_sha256: String,
}

/// Header and payload: the header ends at the first blank line, within [`MAX_HEADER`] bytes.
fn split(bytes: &[u8]) -> Result<(&str, &[u8]), String> {
    let window = &bytes[..bytes.len().min(MAX_HEADER)];
    let end = window
        .windows(2)
        .position(|w| w == b"\n\n")
        .ok_or("no header (not an epx kernel cache entry, or cut short)")?;
    let header = std::str::from_utf8(&bytes[..end]).map_err(|_| "its header is not UTF-8")?;
    Ok((header, &bytes[end + 2..]))
}

fn parse_header(header: &str) -> Result<Header, String> {
    let mut lines = header.lines();
    if lines.next() != Some(MAGIC) {
        return Err(format!("not in the format `{MAGIC}`"));
    }
    let mut get = |name: &str| -> Result<String, String> {
        let line = lines
            .next()
            .ok_or_else(|| format!("its header lacks `{name}`"))?;
        line.strip_prefix(name)
            .and_then(|v| v.strip_prefix(' '))
            .map(str::to_string)
            .ok_or_else(|| format!("its header has `{line}` where `{name}` belongs"))
    };
    let key = get("key")?;
    let kind = get("kind")?;
    let provider = get("provider")?;
    let plugin = get("plugin")?;
    let nodes = get("nodes")?
        .parse()
        .map_err(|_| "its node count is not a number")?;
    let payload = get("payload")?;
    let (len, sha) = payload
        .split_once(' ')
        .ok_or("its payload line is not `<bytes> <sha256>`")?;
    let payload_len = len
        .parse()
        .map_err(|_| "its payload length is not a number")?;
    Ok(Header {
        key,
        meta: EntryMeta {
            kind,
            provider,
            plugin,
            nodes,
        },
        payload_len,
        payload_sha256: sha.to_string(),
    })
}

/// What an entry's header says, reading no more than the header.
fn read_meta(path: &Path) -> Result<EntryMeta, String> {
    let mut head = Vec::with_capacity(MAX_HEADER);
    crate::files::open_regular_nofollow(path)
        .and_then(|(f, _)| f.take(MAX_HEADER as u64).read_to_end(&mut head))
        .map_err(|e| e.to_string())?;
    let (header, _) = split(&head)?;
    parse_header(header).map(|h| h.meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> EntryMeta {
        EntryMeta {
            kind: "kernel".into(),
            provider: "toy".into(),
            plugin: "toy 1.0.0".into(),
            nodes: 3,
        }
    }

    fn key(n: u8) -> String {
        hex(&Sha256::digest([n]))
    }

    fn cache(name: &str, max: u64) -> (crate::plugin::discover::TestDir, KernelCache) {
        let dir = crate::plugin::discover::TestDir::new(name);
        let c = KernelCache::new(dir.path(), max);
        (dir, c)
    }

    #[test]
    fn stored_bytes_come_back_and_are_listed() {
        let (_d, c) = cache("kcache-roundtrip", 1 << 20);
        assert_eq!(c.get(&key(1)), Lookup::Miss);
        assert_eq!(c.put(&key(1), &meta(), b"compiled\nbytes\n\n").unwrap(), 0);
        assert_eq!(c.get(&key(1)), Lookup::Hit(b"compiled\nbytes\n\n".to_vec()));
        let entries = c.entries().unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].key, key(1));
        assert_eq!(entries[0].meta, Ok(meta()));
        // Nothing but the entry is left in the folder (no temporary file).
        assert_eq!(std::fs::read_dir(c.dir()).unwrap().count(), 1);
    }

    #[test]
    fn damaged_entries_are_reported_deleted_and_never_returned() {
        let (_d, c) = cache("kcache-damaged", 1 << 20);
        let payload = vec![7u8; 1000];
        type Damage = fn(&mut Vec<u8>);
        let damage: [(&str, Damage); 5] = [
            ("flipped payload byte", |b| {
                let n = b.len() - 10;
                b[n] ^= 1
            }),
            ("truncated", |b| b.truncate(b.len() - 1)),
            ("cut inside the header", |b| b.truncate(20)),
            ("another format", |b| b[17] = b'9'),
            ("garbage", |b| *b = vec![0xff; 64]),
        ];
        for (what, f) in damage {
            c.put(&key(2), &meta(), &payload).unwrap();
            let path = c.dir().join(format!("{}.kernel", key(2)));
            let mut bytes = std::fs::read(&path).unwrap();
            f(&mut bytes);
            std::fs::write(&path, &bytes).unwrap();
            match c.get(&key(2)) {
                Lookup::Damaged(why) => assert!(why.contains(&key(2)), "{what}: {why}"),
                other => panic!("{what}: {other:?}"),
            }
            assert!(!path.exists(), "{what}: the damaged entry is deleted");
            assert_eq!(c.get(&key(2)), Lookup::Miss, "{what}");
        }
        // An entry renamed to another key is not that key's entry.
        c.put(&key(3), &meta(), &payload).unwrap();
        std::fs::rename(
            c.dir().join(format!("{}.kernel", key(3))),
            c.dir().join(format!("{}.kernel", key(4))),
        )
        .unwrap();
        assert!(
            matches!(c.get(&key(4)), Lookup::Damaged(w) if w.contains("holds the entry of key"))
        );
    }

    /// A FIFO or a device where an entry belongs is not read (it would block or never end);
    /// a file over the limit is not read either; a name the cache does not write is not listed.
    #[cfg(unix)]
    #[test]
    fn entries_that_are_not_small_regular_files_are_not_read() {
        let (_d, c) = cache("kcache-special", 4096);
        c.put(&key(1), &meta(), b"x").unwrap();
        let fifo = c.dir().join(format!("{}.kernel", key(2)));
        let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        assert!(matches!(c.get(&key(2)), Lookup::Damaged(w) if w.contains("not a regular file")));
        std::os::unix::fs::symlink("/dev/zero", c.dir().join(format!("{}.kernel", key(3))))
            .unwrap();
        assert!(matches!(c.get(&key(3)), Lookup::Damaged(_)));
        std::fs::write(c.dir().join(format!("{}.kernel", key(4))), vec![0u8; 5000]).unwrap();
        assert!(matches!(c.get(&key(4)), Lookup::Damaged(w) if w.contains("more than")));
        std::fs::write(c.dir().join("ünïcode€€.kernel"), b"x").unwrap();
        let keys: Vec<String> = c.entries().unwrap().into_iter().map(|e| e.key).collect();
        assert!(
            keys.contains(&key(1)) && !keys.iter().any(|k| k.contains('€')),
            "{keys:?}"
        );
    }

    #[test]
    fn the_least_recently_used_entries_go_first_when_over_the_limit() {
        // Each entry is a little over 1000 bytes; the limit holds two.
        let (_d, c) = cache("kcache-evict", 2500);
        let old = SystemTime::now() - Duration::from_secs(100);
        for n in 0..2 {
            c.put(&key(n), &meta(), &[n; 1000]).unwrap();
            let f = std::fs::File::options()
                .write(true)
                .open(c.dir().join(format!("{}.kernel", key(n))))
                .unwrap();
            f.set_modified(old + Duration::from_secs(n as u64)).unwrap();
        }
        // Using entry 0 makes entry 1 the least recently used.
        assert!(matches!(c.get(&key(0)), Lookup::Hit(_)));
        assert_eq!(c.put(&key(2), &meta(), &[2; 1000]).unwrap(), 1);
        assert!(matches!(c.get(&key(0)), Lookup::Hit(_)));
        assert_eq!(c.get(&key(1)), Lookup::Miss);
        assert!(matches!(c.get(&key(2)), Lookup::Hit(_)));
        // An entry larger than the whole limit is refused, saying why.
        let err = c.put(&key(5), &meta(), &[0; 3000]).unwrap_err();
        assert!(err.to_string().contains("limit of 2500 bytes"), "{err}");
    }

    #[test]
    fn clear_removes_every_entry_and_says_how_much() {
        let (_d, c) = cache("kcache-clear", 1 << 20);
        c.put(&key(1), &meta(), &[1; 10]).unwrap();
        c.put(&key(2), &meta(), &[2; 10]).unwrap();
        let (n, bytes) = c.clear().unwrap();
        assert_eq!(n, 2);
        assert!(bytes > 20);
        assert!(c.entries().unwrap().is_empty());
        // Clearing a cache that was never written is not an error.
        let (_d2, empty) = cache("kcache-clear-none", 1 << 20);
        assert_eq!(empty.clear().unwrap(), (0, 0));
    }

    #[test]
    fn header_fields_cannot_break_the_format() {
        let (_d, c) = cache("kcache-fields", 1 << 20);
        let m = EntryMeta {
            kind: "kernel".into(),
            provider: "evil\nkey 00".into(),
            plugin: "p\r\n1".into(),
            nodes: 1,
        };
        c.put(&key(9), &m, b"x").unwrap();
        assert_eq!(c.get(&key(9)), Lookup::Hit(b"x".to_vec()));
        let listed = c.entries().unwrap()[0].meta.clone().unwrap();
        assert_eq!(listed.provider, "evil key 00");
    }
}
