//! A minimal, deterministic ustar writer: the caller gives the entries, this
//! writes them sorted by path with fixed owner, mode and modification time,
//! so the same inputs always give the same bytes.

use anyhow::{Result, bail};

/// One file or directory of an archive.
pub struct Entry {
    /// The path inside the archive, without a leading `/`; directories end in `/`.
    pub path: String,
    /// Permission bits (e.g. `0o755`).
    pub mode: u32,
    /// File contents; `None` for a directory or a symbolic link.
    pub data: Option<Vec<u8>>,
    /// The target of a symbolic link.
    pub link: Option<String>,
}

impl Entry {
    /// A directory (the trailing `/` is added when missing).
    pub fn dir(path: &str, mode: u32) -> Entry {
        let path = if path.ends_with('/') {
            path.to_owned()
        } else {
            format!("{path}/")
        };
        Entry {
            path,
            mode,
            data: None,
            link: None,
        }
    }

    /// A regular file.
    pub fn file(path: &str, mode: u32, data: Vec<u8>) -> Entry {
        Entry {
            path: path.to_owned(),
            mode,
            data: Some(data),
            link: None,
        }
    }

    /// A symbolic link to `target`.
    pub fn symlink(path: &str, target: &str) -> Entry {
        Entry {
            path: path.to_owned(),
            mode: 0o777,
            data: None,
            link: Some(target.to_owned()),
        }
    }
}

/// The skeleton of a root filesystem: `/etc` with `passwd` and `group`,
/// `/tmp` (sticky, world-writable) and `dirs` (mode 0755).
pub fn skeleton(passwd: &str, group: &str, dirs: &[&str]) -> Vec<Entry> {
    let mut entries = vec![
        Entry::dir("etc", 0o755),
        Entry::file("etc/passwd", 0o644, passwd.as_bytes().to_vec()),
        Entry::file("etc/group", 0o644, group.as_bytes().to_vec()),
        Entry::dir("tmp", 0o1777),
    ];
    entries.extend(dirs.iter().map(|d| Entry::dir(d, 0o755)));
    entries
}

const BLOCK: usize = 512;

/// Writes `entries` (sorted by path) as a ustar archive, every entry owned by
/// 0:0 and modified at `mtime` (seconds since the epoch).
pub fn archive(mut entries: Vec<Entry>, mtime: u64) -> Result<Vec<u8>> {
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    if let Some(w) = entries.windows(2).find(|w| w[0].path == w[1].path) {
        bail!("tar: duplicate entry {}", w[0].path);
    }
    let mut out = Vec::new();
    for entry in &entries {
        out.extend_from_slice(&header(entry, mtime)?);
        if let Some(data) = &entry.data {
            out.extend_from_slice(data);
            out.resize(out.len().next_multiple_of(BLOCK), 0);
        }
    }
    // The end of the archive: two zero blocks.
    out.resize(out.len() + 2 * BLOCK, 0);
    Ok(out)
}

fn header(entry: &Entry, mtime: u64) -> Result<[u8; BLOCK]> {
    let mut h = [0u8; BLOCK];
    let (prefix, name) = split_path(&entry.path)?;
    put(&mut h[0..100], name.as_bytes());
    octal(&mut h[100..108], u64::from(entry.mode & 0o7777));
    octal(&mut h[108..116], 0); // uid
    octal(&mut h[116..124], 0); // gid
    let size = entry.data.as_ref().map_or(0, Vec::len) as u64;
    if size >= 0o77_777_777_777 {
        bail!("tar: {} is too large for ustar", entry.path);
    }
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], mtime);
    h[156] = match (&entry.data, &entry.link) {
        (Some(_), _) => b'0',
        (None, Some(target)) => {
            if target.len() > 100 {
                bail!("tar: link target too long: {target}");
            }
            put(&mut h[157..257], target.as_bytes());
            b'2'
        }
        (None, None) => b'5',
    };
    put(&mut h[257..263], b"ustar\0");
    put(&mut h[263..265], b"00");
    put(&mut h[265..297], b"root");
    put(&mut h[297..329], b"root");
    octal(&mut h[329..337], 0); // devmajor
    octal(&mut h[337..345], 0); // devminor
    put(&mut h[345..500], prefix.as_bytes());
    // The checksum is computed with its own field as eight spaces.
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    let field = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(field.as_bytes());
    Ok(h)
}

/// Splits a long path into ustar's `prefix` (155) and `name` (100) fields.
fn split_path(path: &str) -> Result<(&str, &str)> {
    if path.len() <= 100 {
        return Ok(("", path));
    }
    let trimmed = path.trim_end_matches('/');
    for (i, c) in trimmed.char_indices() {
        if c == '/' && i <= 155 && path.len() - i - 1 <= 100 {
            return Ok((&path[..i], &path[i + 1..]));
        }
    }
    bail!("tar: path too long for ustar: {path}")
}

fn put(field: &mut [u8], value: &[u8]) {
    let n = value.len().min(field.len());
    field[..n].copy_from_slice(&value[..n]);
}

/// A zero-padded octal number ending in NUL, filling the field.
fn octal(field: &mut [u8], value: u64) {
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    put(field, text.as_bytes());
    field[digits] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_padded_and_terminated() -> Result<()> {
        let tar = archive(
            vec![
                Entry::file("b/x", 0o644, b"hello".to_vec()),
                Entry::dir("b", 0o755),
                Entry::dir("a", 0o755),
            ],
            0,
        )?;
        // a/, b/, b/x (header + one data block), two end blocks.
        assert_eq!(tar.len(), 6 * BLOCK);
        assert_eq!(&tar[0..2], b"a/");
        assert_eq!(&tar[BLOCK..BLOCK + 2], b"b/");
        assert_eq!(&tar[2 * BLOCK..2 * BLOCK + 3], b"b/x");
        assert_eq!(&tar[3 * BLOCK..3 * BLOCK + 5], b"hello");
        assert_eq!(tar[2 * BLOCK + 156], b'0');
        assert_eq!(tar[BLOCK + 156], b'5');
        Ok(())
    }

    #[test]
    fn duplicate_paths_are_refused() {
        let dup = vec![Entry::dir("a", 0o755), Entry::dir("a/", 0o755)];
        assert!(archive(dup, 0).is_err());
    }

    #[test]
    fn long_paths_use_the_prefix() -> Result<()> {
        let long = format!("{}/{}", "d".repeat(120), "f".repeat(90));
        let (prefix, name) = split_path(&long)?;
        assert_eq!(prefix.len(), 120);
        assert_eq!(name.len(), 90);
        Ok(())
    }
}
