//! Temporary directories named like every other harness resource
//! (`<prefix>-<kind>-<pid>-<n>` under the system temp dir), removed on drop.

use std::path::{Path, PathBuf};

/// A directory removed recursively when dropped.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `<tmp>/<prefix>-<kind>-<pid>-<n>`.
    ///
    /// # Panics
    /// If the directory cannot be created.
    pub fn new(kind: &str) -> TempDir {
        crate::naming::reap_stale();
        let path = std::env::temp_dir().join(crate::naming::unique_name(kind));
        std::fs::create_dir(&path)
            .unwrap_or_else(|e| panic!("creating temp dir {}: {e}", path.display()));
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!(
                "harness: could not remove temp dir {}: {e}",
                self.path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_on_drop_with_contents() {
        let dir = TempDir::new("tmp-unit");
        let path = dir.path().to_path_buf();
        std::fs::create_dir(path.join("sub")).unwrap();
        std::fs::write(path.join("sub/file"), b"x").unwrap();
        drop(dir);
        assert!(!path.exists(), "{} still exists after drop", path.display());
    }
}
