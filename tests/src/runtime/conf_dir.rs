//! The runtime's CNI configuration directory: the one conflist the test
//! writes, replaced the way a config manager replaces it (written aside,
//! then renamed: a runtime watching the directory never reads half a
//! file). Also the TOML quoting the runtimes' own configuration files need.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// A CNI configuration directory holding one conflist file.
#[derive(Debug, Clone)]
pub struct CniConfDir {
    dir: PathBuf,
    file: String,
}

impl CniConfDir {
    /// The directory `dir` (created if missing), whose conflist is `file`.
    pub fn new(dir: PathBuf, file: &str) -> CniConfDir {
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        CniConfDir {
            dir,
            file: file.to_owned(),
        }
    }

    /// The directory (the runtime's `conf_dir` / `network_config_dir`).
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Writes (or replaces, atomically) the conflist.
    pub fn write(&self, conflist: &Value) {
        let text = serde_json::to_string_pretty(conflist).expect("a Value always serialises");
        let staged = self.dir.join(".conflist.tmp");
        std::fs::write(&staged, text)
            .unwrap_or_else(|e| panic!("writing {}: {e}", staged.display()));
        let target = self.dir.join(&self.file);
        std::fs::rename(&staged, &target).unwrap_or_else(|e| {
            panic!("renaming {} to {}: {e}", staged.display(), target.display())
        });
    }
}

/// A path as a TOML basic string (harness paths need no escapes; refuse any).
pub fn toml_string(path: &Path) -> String {
    let text = path
        .to_str()
        .unwrap_or_else(|| panic!("{} is not UTF-8", path.display()));
    assert!(
        !text.contains(['"', '\\']) && !text.chars().any(char::is_control),
        "{text} needs escaping in TOML"
    );
    format!("\"{text}\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tmp::TempDir;

    #[test]
    fn the_conflist_is_replaced_whole() {
        let tmp = TempDir::new("confdir-unit");
        let dir = CniConfDir::new(tmp.path().join("net.d"), "10-x.conflist");
        dir.write(&serde_json::json!({ "name": "a" }));
        dir.write(&serde_json::json!({ "name": "b" }));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["10-x.conflist"], "no staged file is left");
        let text = std::fs::read_to_string(dir.path().join("10-x.conflist")).unwrap();
        assert!(text.contains("\"b\""), "{text}");
    }

    #[test]
    #[should_panic(expected = "needs escaping in TOML")]
    fn toml_strings_refuse_quotes() {
        toml_string(Path::new("/tmp/a\"b"));
    }
}
