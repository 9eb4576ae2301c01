//! The file store's on-disk form of one pool: a file of two equal slots, each
//! holding one version of the pool. A commit overwrites the slot that does NOT
//! hold the current version, in place, and makes it durable with one
//! `fdatasync`; the current version stays intact until the new one is complete.
//!
//! Why not temp file + rename: on ext4 that costs three journal commits per pool
//! update (the new inode's data, the rename, the directory), ~2 ms of a CNI call.
//! Writing into blocks the file already owns changes no metadata, so the flush is
//! data only. A slot whose write was cut short (kill -9, power loss) fails its
//! checksum and readers take the other slot, which is the previous version.
//!
//! Slot layout (the slot size is half the file size, a multiple of 4 KiB):
//! ```text
//! TPOOL1 <version: 20 digits> <payload length: 12 digits> <crc32: 8 hex>\n
//! <payload: the pool as JSON, {"range": ..., "allocations": {...}}>
//! <zero padding to the end of the slot>
//! ```
//! The checksum covers the version and the payload. When a new version does not
//! fit a slot, the file is rebuilt larger (temp file, fsync, rename, directory
//! fsync): sizes double, so that happens a handful of times in a pool's life.

use std::fs::File;
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileExt;

const MAGIC: &[u8; 6] = b"TPOOL1";
/// `TPOOL1 ` + 20 + ` ` + 12 + ` ` + 8 + `\n`.
pub const HEADER_LEN: usize = 50;
/// Smallest slot: one page.
const MIN_SLOT: u64 = 4096;

/// One intact version of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// Which half of the file holds it (0 or 1).
    pub index: u64,
    pub version: u64,
    pub payload: Vec<u8>,
}

fn checksum(version: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&version.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

fn header(version: u64, payload: &[u8]) -> Vec<u8> {
    let text = format!("TPOOL1 {version:020} {:012} {:08x}\n", payload.len(), checksum(version, payload));
    debug_assert_eq!(text.len(), HEADER_LEN);
    text.into_bytes()
}

/// `(version, payload length, checksum)` of a well-formed header.
fn parse_header(bytes: &[u8]) -> Option<(u64, u64, u32)> {
    if bytes.len() != HEADER_LEN || &bytes[..6] != MAGIC || bytes[HEADER_LEN - 1] != b'\n' {
        return None;
    }
    let text = std::str::from_utf8(&bytes[7..HEADER_LEN - 1]).ok()?;
    let mut fields = text.split(' ');
    let version = fields.next().filter(|f| f.len() == 20)?.parse().ok()?;
    let length = fields.next().filter(|f| f.len() == 12)?.parse().ok()?;
    let crc = u32::from_str_radix(fields.next().filter(|f| f.len() == 8)?, 16).ok()?;
    fields.next().is_none().then_some((version, length, crc))
}

/// The slot size of a file `file_len` bytes long, if that is a valid pool file size.
pub fn slot_size(file_len: u64) -> Option<u64> {
    let slot = file_len / 2;
    (file_len.is_multiple_of(2) && slot >= MIN_SLOT && slot.is_multiple_of(MIN_SLOT)).then_some(slot)
}

/// The slot size for a new file that must hold `payload_len` bytes: room for the
/// pool to double before the file is rebuilt again.
pub fn slot_size_for(payload_len: usize) -> u64 {
    let needed = (HEADER_LEN + payload_len) as u64;
    needed.saturating_mul(2).next_power_of_two().max(MIN_SLOT)
}

/// Whether a payload fits a slot of `slot_size` bytes.
pub fn fits(slot_size: u64, payload_len: usize) -> bool {
    (HEADER_LEN + payload_len) as u64 <= slot_size
}

/// The newest intact slot of a pool file; `None` if neither slot is intact
/// (which a reader racing a writer can see: it should read again).
pub fn read_newest(file: &File, file_len: u64) -> io::Result<Option<Slot>> {
    newest_slot(file_len, |buf, at| file.read_exact_at(buf, at))
}

/// The newest intact slot of the pool file held in `bytes` (what
/// [`read_newest`] reads, from memory: for checks of a file's bytes).
pub fn newest_in(bytes: &[u8]) -> io::Result<Option<Slot>> {
    newest_slot(bytes.len() as u64, |buf, at| {
        let start = usize::try_from(at).map_err(|_| io::Error::from(ErrorKind::UnexpectedEof))?;
        let part = start.checked_add(buf.len()).and_then(|end| bytes.get(start..end)).ok_or_else(|| io::Error::from(ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(part);
        Ok(())
    })
}

/// The slot choice, over a reader of `file_len` bytes at an offset.
fn newest_slot(file_len: u64, read_at: impl Fn(&mut [u8], u64) -> io::Result<()>) -> io::Result<Option<Slot>> {
    let Some(slot) = slot_size(file_len) else {
        return Err(io::Error::new(ErrorKind::InvalidData, format!("{file_len} bytes is not a pool file size (two slots of 4 KiB multiples)")));
    };
    let mut candidates = Vec::with_capacity(2);
    for index in 0..2 {
        let mut head = [0u8; HEADER_LEN];
        read_at(&mut head, index * slot)?;
        if let Some((version, length, crc)) = parse_header(&head)
            && fits(slot, usize::try_from(length).unwrap_or(usize::MAX))
        {
            candidates.push((version, index, length, crc));
        }
    }
    // Newest first; the older one is the fallback for a torn newest slot.
    candidates.sort_unstable_by_key(|c| std::cmp::Reverse(c.0));
    for (version, index, length, crc) in candidates {
        let mut payload = vec![0u8; usize::try_from(length).unwrap_or(0)];
        read_at(&mut payload, index * slot + HEADER_LEN as u64)?;
        if checksum(version, &payload) == crc {
            return Ok(Some(Slot { index, version, payload }));
        }
    }
    Ok(None)
}

/// Overwrites slot `index` with a version (header and payload in one write).
/// The caller makes it durable (`sync_data`).
pub fn write_slot(file: &File, slot_size: u64, index: u64, version: u64, payload: &[u8]) -> io::Result<()> {
    let mut bytes = header(version, payload);
    bytes.extend_from_slice(payload);
    file.write_all_at(&bytes, index * slot_size)
}

/// The whole content of a new pool file: the version in slot 0, then zeros.
/// The zeros are written (not a sparse hole) so that later slot writes land in
/// blocks the file already owns and need no metadata update.
pub fn new_file(slot_size: u64, version: u64, payload: &[u8]) -> Vec<u8> {
    let mut bytes = header(version, payload);
    bytes.extend_from_slice(payload);
    bytes.resize(usize::try_from(slot_size * 2).unwrap_or(usize::MAX), 0);
    bytes
}

/// The newest intact version in the pool file at `path` as `(version, payload)`
/// (for tools and tests that inspect a data dir).
pub fn read_path(path: &std::path::Path) -> io::Result<Option<(u64, Vec<u8>)>> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    Ok(read_newest(&file, len)?.map(|slot| (slot.version, slot.payload)))
}

/// Writes a whole new pool file at `path` holding one version (for tools and
/// tests that seed a data dir; the store itself replaces files atomically).
pub fn write_path(path: &std::path::Path, version: u64, payload: &[u8]) -> io::Result<()> {
    std::fs::write(path, new_file(slot_size_for(payload.len()), version, payload))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(bytes: &[u8], tag: &str) -> (File, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!("thereabouts-poolfile-{tag}-{}", std::process::id()));
        std::fs::File::create(&path).unwrap().write_all(bytes).unwrap();
        (File::open(&path).unwrap(), path)
    }

    #[test]
    fn header_round_trips_and_has_fixed_width() {
        let h = header(7, b"{}");
        assert_eq!(h.len(), HEADER_LEN);
        assert_eq!(parse_header(&h), Some((7, 2, checksum(7, b"{}"))));
        assert_eq!(parse_header(&header(u64::MAX, &[0; 3])).map(|p| p.0), Some(u64::MAX));
        assert_eq!(parse_header(&[0u8; HEADER_LEN]), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(slot_size_for(10), 4096);
        assert_eq!(slot_size_for(3000), 8192);
        assert!(fits(slot_size_for(100_000), 100_000));
        assert_eq!(slot_size(8192), Some(4096));
        assert_eq!(slot_size(4096), None);
        assert_eq!(slot_size(8193), None);
    }

    #[test]
    fn the_newest_intact_slot_wins_and_a_torn_one_falls_back() {
        let slot = 4096;
        let mut bytes = new_file(slot, 1, b"{\"v\":1}");
        let (_, path) = file_with(&bytes, "torn");
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        write_slot(&file, slot, 1, 2, b"{\"v\":2}").unwrap();
        let newest = read_newest(&file, 2 * slot).unwrap().unwrap();
        assert_eq!((newest.index, newest.version, newest.payload.as_slice()), (1, 2, &b"{\"v\":2}"[..]));
        // A cut-short write of version 3 into slot 0: header written, payload not.
        file.write_all_at(&header(3, b"{\"v\":3}"), 0).unwrap();
        let fallback = read_newest(&file, 2 * slot).unwrap().unwrap();
        assert_eq!(fallback.version, 2);
        // Both torn: nothing intact.
        file.write_all_at(b"X", slot + HEADER_LEN as u64).unwrap();
        assert_eq!(read_newest(&file, 2 * slot).unwrap(), None);
        // A header claiming more than the slot holds is not a candidate.
        bytes[..HEADER_LEN].copy_from_slice(&header(9, &vec![b' '; 5000])[..HEADER_LEN]);
        let (small, long_path) = file_with(&bytes, "long");
        assert_eq!(read_newest(&small, 2 * slot).unwrap(), None);
        std::fs::remove_file(path).unwrap();
        std::fs::remove_file(long_path).unwrap();
    }

    #[test]
    fn a_files_bytes_read_as_the_file_does() {
        let mut bytes = new_file(4096, 1, b"{\"v\":1}");
        bytes[4096..].copy_from_slice(&new_file(4096, 2, b"{\"v\":2}")[..4096]);
        let (file, path) = file_with(&bytes, "bytes");
        assert_eq!(newest_in(&bytes).unwrap(), read_newest(&file, 8192).unwrap());
        assert_eq!(newest_in(&bytes).unwrap().map(|s| s.version), Some(2));
        assert_eq!(newest_in(&bytes[..8000]).unwrap_err().kind(), ErrorKind::InvalidData);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn bad_sizes_are_invalid_data() {
        let (file, path) = file_with(b"{\"range\": \"192.0.2.0/24\"}", "size");
        assert_eq!(read_newest(&file, 25).unwrap_err().kind(), ErrorKind::InvalidData);
        std::fs::remove_file(path).unwrap();
    }
}
