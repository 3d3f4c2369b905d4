//! Tells whether an ELF executable is statically linked: no program
//! interpreter (`PT_INTERP`) and no shared-library dependency (`DT_NEEDED`).
//! A binary that fails this would not start on an image without a libc.

use anyhow::{Result, bail};

const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NEEDED: u64 = 1;

/// How an executable is linked.
#[derive(Debug, PartialEq, Eq)]
pub enum Linking {
    /// Needs nothing from the filesystem to start.
    Static {
        /// Position-independent (`static-pie`).
        pie: bool,
    },
    /// Needs a loader or shared libraries: what it asks for.
    Dynamic(String),
}

fn u16_at(b: &[u8], at: usize) -> Result<u16> {
    match b.get(at..at + 2) {
        Some(s) => Ok(u16::from_le_bytes([s[0], s[1]])),
        None => bail!("truncated ELF file"),
    }
}

fn u32_at(b: &[u8], at: usize) -> Result<u32> {
    match b.get(at..at + 4) {
        Some(s) => Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]])),
        None => bail!("truncated ELF file"),
    }
}

fn u64_at(b: &[u8], at: usize) -> Result<u64> {
    match b.get(at..at + 8) {
        Some(s) => {
            let mut a = [0u8; 8];
            a.copy_from_slice(s);
            Ok(u64::from_le_bytes(a))
        }
        None => bail!("truncated ELF file"),
    }
}

fn usize_at(b: &[u8], at: usize) -> Result<usize> {
    Ok(usize::try_from(u64_at(b, at)?)?)
}

/// Reads the linking of a 64-bit little-endian ELF executable.
pub fn linking(elf: &[u8]) -> Result<Linking> {
    if elf.get(0..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        bail!("not a 64-bit little-endian ELF file");
    }
    let kind = u16_at(elf, 16)?; // ET_EXEC = 2, ET_DYN = 3
    let phoff = usize_at(elf, 32)?;
    let phentsize = usize::from(u16_at(elf, 54)?);
    let phnum = usize::from(u16_at(elf, 56)?);
    let mut needed = 0;
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        match u32_at(elf, ph)? {
            PT_INTERP => {
                let off = usize_at(elf, ph + 8)?;
                let size = usize_at(elf, ph + 32)?;
                let interp = elf.get(off..off + size).unwrap_or_default();
                let interp = String::from_utf8_lossy(interp);
                return Ok(Linking::Dynamic(format!(
                    "interpreter {}",
                    interp.trim_end_matches('\0')
                )));
            }
            PT_DYNAMIC => {
                let off = usize_at(elf, ph + 8)?;
                let size = usize_at(elf, ph + 32)?;
                for entry in (off..off + size).step_by(16) {
                    match u64_at(elf, entry)? {
                        0 => break,
                        DT_NEEDED => needed += 1,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    if needed > 0 {
        return Ok(Linking::Dynamic(format!("{needed} shared libraries")));
    }
    Ok(Linking::Static { pie: kind == 3 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_test_binary_is_classified() -> Result<()> {
        // Test binaries are linked like everything else on the host: whatever
        // they are, the reader must understand them without failing.
        let me = std::fs::read(std::env::current_exe()?)?;
        linking(&me)?;
        Ok(())
    }

    #[test]
    fn garbage_is_refused() {
        assert!(linking(b"#!/bin/sh\n").is_err());
    }
}
