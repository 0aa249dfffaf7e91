//! The DVM key file (`DVMKeyFile`): written once by `pctl keygen`, read by every daemon and
//! tool of the DVM's owner. Like ssh with a private key, a file anyone else could read or
//! replace is refused rather than trusted.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use dvmlab_proto::secure::{DvmKey, KEY_LEN};

/// Largest key file read: a key is one line.
const MAX_KEY_FILE: u64 = 1024;

/// Reads the key at `path`, refusing a file that is not a regular file, that this user does
/// not own, or that group or others may read or write. As ssh does, the checks are made on
/// the file actually opened (a link is followed), so nothing can swap it in between. Errors
/// name the file and the fix.
pub fn load(path: &Path) -> Result<DvmKey, String> {
    let p = path.display();
    let f = std::fs::File::open(path).map_err(|e| format!("DVM key file {p}: {e}"))?;
    let meta = f.metadata().map_err(|e| format!("DVM key file {p}: {e}"))?;
    if !meta.file_type().is_file() {
        return Err(format!("DVM key file {p}: not a regular file"));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(format!(
            "DVM key file {p}: owned by uid {}, not by this user (uid {me}); refusing it",
            meta.uid()
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "DVM key file {p}: mode {mode:04o} lets group or others read or change it; refusing it (chmod 600 {p})"
        ));
    }
    let mut text = String::new();
    f.take(MAX_KEY_FILE)
        .read_to_string(&mut text)
        .map_err(|e| format!("DVM key file {p}: {e}"))?;
    DvmKey::parse(&text).map_err(|e| format!("DVM key file {p}: {e}"))
}

/// Writes a fresh random key to `path` (mode 0600), never over an existing file.
pub fn generate(path: &Path) -> Result<(), String> {
    let p = path.display();
    let mut bytes = [0u8; KEY_LEN];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for a key: {e}"))?;
    let key = DvmKey::from_bytes(bytes);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => {
                format!("{p} exists already; remove it first to replace the DVM's key")
            }
            _ => format!("{p}: {e}"),
        })?;
    f.write_all(key.to_text().as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("{p}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("dvmlab-key-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_generated_key_is_private_loads_back_and_is_never_overwritten() {
        let d = dir("gen");
        let k = d.join("dvm.key");
        generate(&k).unwrap();
        let mode = std::fs::metadata(&k).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let first = load(&k).unwrap();
        assert!(generate(&k).unwrap_err().contains("exists already"));
        assert_eq!(load(&k).unwrap(), first);
        let other = d.join("other.key");
        generate(&other).unwrap();
        assert_ne!(load(&other).unwrap(), first, "fresh randomness each time");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_key_file_others_may_read_or_that_is_no_key_is_refused_with_the_fix() {
        let d = dir("perm");
        let k = d.join("dvm.key");
        generate(&k).unwrap();
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load(&k).unwrap_err();
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&k, "not a key\n").unwrap();
        assert!(load(&k).unwrap_err().contains("64 hexadecimal digits"));
        assert!(load(&d).unwrap_err().contains("not a regular file"));
        // A link is judged by the file it leads to, as ssh judges its keys.
        let link = d.join("link.key");
        std::os::unix::fs::symlink(&k, &link).unwrap();
        assert!(load(&link).unwrap_err().contains("64 hexadecimal digits"));
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(load(&link).unwrap_err().contains("mode 0640"));
        assert!(load(&d.join("missing")).unwrap_err().contains("missing"));
        if nix::unistd::geteuid().is_root() {
            generate(&d.join("theirs.key")).unwrap();
            let nobody = Some(nix::unistd::Uid::from_raw(65534));
            nix::unistd::chown(&d.join("theirs.key"), nobody, None).unwrap();
            let e = load(&d.join("theirs.key")).unwrap_err();
            assert!(e.contains("owned by uid 65534"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
