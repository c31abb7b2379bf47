//! The plugin's own entry of the node's CNI configuration, read the way a
//! runtime would hand it to the plugin, so that the agent (and `reconcile`)
//! act with exactly the settings the plugin's runs use (`pinRoot`,
//! `interfaces`, `cgroupPath`, `snat`, capacities ...).
//! Read again on every pass: a configuration chained or changed after the
//! agent started is taken up without a restart.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{
    cni::netconf::{self as config, ConfigError, NetConf},
    ops::chain::{self, Layout, ListError},
};

#[derive(Debug, thiserror::Error)]
pub enum ConfError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a CNI configuration")]
    List {
        path: PathBuf,
        #[source]
        source: ListError,
    },
    #[error(
        "{path} has no ebpf-portmap entry; chain the plugin in (`ebpf-portmap chain install`) or pass --cni-conf"
    )]
    NotChained { path: PathBuf },
    #[error(
        "no configuration file in {dir} names ebpf-portmap; chain the plugin in (`ebpf-portmap chain install`) or pass --cni-conf"
    )]
    NoneInDir { dir: PathBuf },
    #[error("cannot list {dir}")]
    Dir {
        dir: PathBuf,
        #[source]
        source: Box<chain::ChainError>,
    },
    #[error("the ebpf-portmap entry of {path} is invalid")]
    Invalid {
        path: PathBuf,
        #[source]
        source: ConfigError,
    },
}

/// Where the configuration comes from.
#[derive(Debug, Clone)]
pub enum ConfSource {
    /// This file (a conflist or a single-plugin configuration).
    File(PathBuf),
    /// The first file of this directory, in libcni's order, that names the
    /// plugin (the runtime's `/etc/cni/net.d`).
    Dir(PathBuf),
}

impl ConfSource {
    /// The plugin's configuration as its runs see it (no request data).
    pub fn load(&self) -> Result<NetConf, ConfError> {
        match self {
            ConfSource::File(path) => {
                let list = read_list(path)?;
                entry_conf(path, &list)?.ok_or_else(|| ConfError::NotChained { path: path.clone() })
            }
            ConfSource::Dir(dir) => {
                let files = chain::config_files(dir).map_err(|source| ConfError::Dir {
                    dir: dir.clone(),
                    source: Box::new(source),
                })?;
                for path in files {
                    // Files another tool left half-written or invalid are
                    // the runtime's problem; ours is the first that names us.
                    let Ok(list) = read_list(&path) else { continue };
                    if let Some(conf) = entry_conf(&path, &list)? {
                        return Ok(conf);
                    }
                }
                Err(ConfError::NoneInDir { dir: dir.clone() })
            }
        }
    }
}

fn read_list(path: &Path) -> Result<serde_json::Map<String, Value>, ConfError> {
    let bytes = std::fs::read(path).map_err(|source| ConfError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    chain::parse_list(&bytes, Layout::of(path)).map_err(|source| ConfError::List {
        path: path.to_path_buf(),
        source,
    })
}

/// Our entry of `list` as the plugin's stdin: the entry with the list's
/// `cniVersion` and `name`, as libcni builds it.
fn entry_conf(
    path: &Path,
    list: &serde_json::Map<String, Value>,
) -> Result<Option<NetConf>, ConfError> {
    let Some(entry) = list
        .get("plugins")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
        .find(|plugin| plugin.get("type").and_then(Value::as_str) == Some(chain::PLUGIN_TYPE))
    else {
        return Ok(None);
    };
    let mut stdin = entry.clone();
    for key in ["cniVersion", "name"] {
        if let Some(value) = list.get(key) {
            stdin.insert(key.into(), value.clone());
        }
    }
    let bytes = serde_json::to_vec(&Value::Object(stdin)).unwrap_or_default();
    config::parse_netconf_for_teardown(&bytes)
        .map(|(conf, _)| Some(conf))
        .map_err(|source| ConfError::Invalid {
            path: path.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("epm-agent-conf-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_entry_takes_the_lists_name_and_version() {
        let dir = temp_dir("entry");
        let path = write(
            &dir,
            "10-net.conflist",
            r#"{"cniVersion":"1.0.0","name":"kind","plugins":[{"type":"bridge"},
               {"type":"ebpf-portmap","pinRoot":"/sys/fs/bpf/x","interfaces":["eth*"],"snat":false}]}"#,
        );
        let conf = ConfSource::File(path).load().expect("a valid entry");
        assert_eq!(conf.name, "kind");
        assert_eq!(conf.pin_root, Path::new("/sys/fs/bpf/x"));
        assert_eq!(conf.interfaces, Some(vec!["eth*".to_owned()]));
        assert!(!conf.snat);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_directory_gives_the_first_file_that_names_the_plugin() {
        let dir = temp_dir("dir");
        write(
            &dir,
            "05-other.conflist",
            r#"{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge"}]}"#,
        );
        write(&dir, "07-broken.conflist", "{");
        write(
            &dir,
            "10-ours.conflist",
            r#"{"cniVersion":"1.0.0","name":"ours","plugins":[{"type":"ebpf-portmap"}]}"#,
        );
        let conf = ConfSource::Dir(dir.clone()).load().expect("found");
        assert_eq!(conf.name, "ours");
        std::fs::remove_file(dir.join("10-ours.conflist")).unwrap();
        let error = ConfSource::Dir(dir.clone()).load().expect_err("none left");
        assert!(matches!(error, ConfError::NoneInDir { .. }), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_invalid_entry_names_the_file() {
        let dir = temp_dir("invalid");
        let path = write(
            &dir,
            "10-net.conflist",
            r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ebpf-portmap","pinRoot":"relative"}]}"#,
        );
        let error = ConfSource::File(path).load().expect_err("relative pinRoot");
        assert!(error.to_string().contains("10-net.conflist"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
