//! The lab image, built locally `FROM scratch` (no registry is reachable): the build context
//! is assembled in memory as a tar of `docker/Dockerfile` and a `rootfs/` holding the static
//! runtime binaries, a static busybox with its applet links, and the `/etc` files a scratch
//! image lacks.

use std::path::{Path, PathBuf};

/// The image every lab container runs.
pub const IMAGE: &str = "dvmlab-lab:latest";

const DOCKERFILE: &str = include_str!("../../docker/Dockerfile");

/// Commands job processes may use in the lab, all served by busybox.
const APPLETS: &[&str] = &[
    "sh", "ash", "hostname", "sleep", "true", "false", "cat", "echo", "printf", "ls", "ps", "kill",
    "pkill", "pgrep", "env", "date", "uname", "id", "test", "[", "touch", "rm", "mkdir", "grep",
    "sed", "head", "tail", "wc", "ip", "ping", "nc", "top", "uptime", "seq", "xargs",
];

/// `/etc` files. A statically linked glibc resolves host names itself (no NSS modules to
/// load) and, without `multi on`, returns only the first address family it finds.
const ETC: &[(&str, &str)] = &[
    ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
    ("etc/group", "root:x:0:\n"),
    ("etc/host.conf", "multi on\n"),
    ("etc/nsswitch.conf", "hosts: files dns\n"),
];

/// Where the build takes its files from.
pub struct Sources {
    /// Directory with the statically linked runtime binaries (`prted`, the tools, `plaunch`).
    pub bin_dir: PathBuf,
    /// A statically linked busybox (Debian's `busybox-static` installs `/bin/busybox`).
    pub busybox: PathBuf,
}

/// The build context as an uncompressed tar.
pub fn context(src: &Sources) -> Result<Vec<u8>, String> {
    let mut tar = tar::Builder::new(Vec::new());
    add_bytes(&mut tar, "Dockerfile", DOCKERFILE.as_bytes(), 0o644)?;
    for bin in ["prted", "pctl", "prun", "palloc", "pevent", "plaunch"] {
        let path = src.bin_dir.join(bin);
        add_static_binary(&mut tar, &format!("rootfs/bin/{bin}"), &path)?;
    }
    add_static_binary(&mut tar, "rootfs/bin/busybox", &src.busybox)?;
    for applet in APPLETS {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        tar.append_link(&mut h, format!("rootfs/bin/{applet}"), "busybox")
            .map_err(|e| format!("image context: {e}"))?;
    }
    for (path, text) in ETC {
        add_bytes(&mut tar, &format!("rootfs/{path}"), text.as_bytes(), 0o644)?;
    }
    for dir in ["rootfs/tmp", "rootfs/root"] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        h.set_mode(if dir.ends_with("tmp") { 0o1777 } else { 0o700 });
        tar.append_data(&mut h, dir, std::io::empty())
            .map_err(|e| format!("image context: {e}"))?;
    }
    tar.into_inner().map_err(|e| format!("image context: {e}"))
}

fn add_bytes(
    tar: &mut tar::Builder<Vec<u8>>,
    path: &str,
    data: &[u8],
    mode: u32,
) -> Result<(), String> {
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    tar.append_data(&mut h, path, data)
        .map_err(|e| format!("image context: {path}: {e}"))
}

/// Adds an executable after checking it can run in a scratch image: an ELF file with no
/// program interpreter (a dynamically linked one would fail there with a baffling "no such
/// file or directory").
fn add_static_binary(
    tar: &mut tar::Builder<Vec<u8>>,
    path: &str,
    file: &Path,
) -> Result<(), String> {
    let data = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    if !is_static_elf(&data) {
        return Err(format!(
            "{}: not a statically linked executable (build with `make lab-bins`; for busybox \
             install Debian's busybox-static)",
            file.display()
        ));
    }
    add_bytes(tar, path, &data, 0o755)
}

/// Whether `data` is a 64-bit little-endian ELF without a PT_INTERP program header.
fn is_static_elf(data: &[u8]) -> bool {
    let u16_at = |o: usize| data.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        data.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        data.get(o..o + 8)
            .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    };
    if data.get(..6) != Some(b"\x7fELF\x02\x01") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    const PT_INTERP: u32 = 3;
    (0..usize::from(phnum)).all(|i| {
        let at = phoff as usize + i * usize::from(phentsize);
        u32_at(at).is_some_and(|t| t != PT_INTERP)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamically_linked_binary_is_refused() {
        let sh = std::fs::read("/bin/sh").unwrap();
        assert!(!is_static_elf(&sh), "/bin/sh is dynamic on Debian");
        assert!(!is_static_elf(b"#!/bin/sh\n"));
        assert!(!is_static_elf(b""));
    }
}
