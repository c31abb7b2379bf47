//! Chaining ebpf-portmap into a node's CNI network configuration, the job of
//! a Kubernetes node installer (`deploy/install.sh` runs it in a loop).
//!
//! By default the file chained is the one a runtime that takes the first
//! network uses: the lexically first `*.conf`, `*.conflist` or `*.json` file
//! of its configuration directory (libcni's `ConfFiles`, sorted, as
//! containerd, kubelet and CRI-O without `cni_default_network` load it).
//! Runtimes that choose a network by name (CRI-O's `cni_default_network`,
//! podman, Nomad's `cni/<name>`) get [`Selection::Network`], which finds the
//! file the way libcni's `LoadConfList` does; [`Selection::File`] names the
//! file outright. That file gets an `ebpf-portmap` entry:
//!
//! - in place of an upstream `portmap` entry (same position, its
//!   capabilities kept), or else appended after the main plugin's entries;
//! - a single-plugin `.conf`/`.json` becomes `<stem>.conflist`, built the way
//!   libcni's `ConfListFromConf` builds it, and the single file is removed.
//!
//! The file as the main plugin wrote it is kept as `<file>.ebpf-portmap.bak`
//! (an extension no runtime loads), so [`remove`] restores it byte for byte.
//! The edit ([`chain_list`]) is a pure, idempotent function of the file and
//! the wanted entry, so re-applying it after the main plugin rewrites its
//! file (kindnet, flannel and calico do on restart) converges, and applying
//! it to a chained file changes nothing. Every write is a temp file renamed
//! over the target in the same directory. Before anything is written, the
//! entry is checked with the plugin's own configuration parser as libcni
//! would hand it over: a conflist on which every ADD would fail is never
//! produced.

use std::{
    ffi::{OsStr, OsString},
    fs, io,
    io::Write,
    os::unix::{ffi::OsStrExt, fs::PermissionsExt},
    path::{Path, PathBuf},
};

use serde_json::{Map, Value, json};

use crate::cni::netconf::{self, ConfigError};

pub mod crio;

/// The plugin's `type`.
pub const PLUGIN_TYPE: &str = "ebpf-portmap";
/// The upstream plugin ours replaces.
pub const UPSTREAM_TYPE: &str = "portmap";
/// Where kubelet, containerd and CRI-O look for network configurations.
pub const DEFAULT_NET_DIR: &str = "/etc/cni/net.d";
/// Extensions of the files runtimes load (libcni's `ConfFiles`).
pub const CONFIG_EXTENSIONS: [&str; 3] = ["conf", "conflist", "json"];
/// Appended to a configuration's name for the copy of its original.
pub const BACKUP_SUFFIX: &str = ".ebpf-portmap.bak";
/// Appended to the temp files of atomic writes (hidden, never loaded).
const TEMP_SUFFIX: &str = ".ebpf-portmap.tmp";

/// What is wrong with the operator's keys for the entry (`--entry`).
#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    #[error("the entry is not valid JSON")]
    InvalidJson(#[source] serde_json::Error),
    #[error("the entry must be a JSON object, found {found}")]
    NotAnObject { found: &'static str },
    #[error("the entry's type must be {PLUGIN_TYPE:?}, found {found}")]
    WrongType { found: String },
    #[error("the entry's capabilities must be an object, found {found}")]
    CapabilitiesNotAnObject { found: String },
    #[error(
        "the entry's capabilities.portMappings must be true (without it the runtime passes no port mappings)"
    )]
    PortMappingsOff,
}

/// What is wrong with a network configuration file's contents.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error("not valid JSON")]
    InvalidJson(#[source] serde_json::Error),
    #[error("must be a JSON object, found {found}")]
    NotAnObject { found: &'static str },
    #[error("a single-plugin configuration needs a string \"type\"")]
    NoType,
    #[error("\"plugins\" must be a non-empty array of objects")]
    NoPlugins,
    #[error("plugins[{index}] has no string \"type\"")]
    PluginWithoutType { index: usize },
    #[error(
        "no main plugin: every entry is {PLUGIN_TYPE} or {UPSTREAM_TYPE}, there is nothing to chain after"
    )]
    NoMainPlugin,
}

/// Everything that stops an install, removal or check.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("cannot list {dir}")]
    ReadDir {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "no network configuration (*.conf, *.conflist, *.json) in {dir}: the main CNI plugin has not written one yet"
    )]
    NoConfig { dir: PathBuf },
    #[error(
        "no network named {name:?} in {dir} (its configurations name: {found}); pass the conflist's \"name\""
    )]
    NoNetwork {
        dir: PathBuf,
        name: String,
        found: String,
    },
    #[error(
        "{path} is not a network configuration a runtime loads: its name must end in .conf, .conflist or .json"
    )]
    NotAConfigName { path: PathBuf },
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a usable network configuration; left as it is")]
    Malformed {
        path: PathBuf,
        #[source]
        source: ListError,
    },
    #[error(
        "the plugin would refuse the entry chained into {path}, so every pod would fail to start; left as it is"
    )]
    Refused {
        path: PathBuf,
        #[source]
        source: ConfigError,
    },
    #[error(
        "cannot turn {source_file} into {target}: that file exists and is not one this installer wrote"
    )]
    TargetTaken {
        source_file: PathBuf,
        target: PathBuf,
    },
    #[error(
        "{target} would not be the configuration the runtime uses: {first} sorts before it; rename one of them"
    )]
    NotFirst { target: PathBuf, first: PathBuf },
    #[error("{path} changed while it was being chained; nothing written (run again)")]
    Changed { path: PathBuf },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot remove {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path}, the configuration the runtime uses, still names {PLUGIN_TYPE} and has no backup from this installer; edit it by hand before removing the plugin binary"
    )]
    StillChained { path: PathBuf },
}

/// How a configuration file holds its plugins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `*.conflist`: `{"plugins": [...]}`.
    List,
    /// `*.conf`, `*.json`: one plugin object.
    Single,
}

impl Layout {
    /// libcni's rule: `.conflist` is a list, anything else one plugin.
    pub fn of(path: &Path) -> Layout {
        if extension(path.as_os_str()) == Some(b"conflist".as_slice()) {
            Layout::List
        } else {
            Layout::Single
        }
    }
}

/// Where the entry went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// In place of the first `portmap` or `ebpf-portmap` entry.
    Replaced { index: usize, replaced: String },
    /// After the last entry.
    Appended { index: usize },
}

/// A chained list and where the entry went in it.
#[derive(Debug, Clone, PartialEq)]
pub struct Chained {
    pub list: Map<String, Value>,
    pub placement: Placement,
    /// Keys of the replaced entry the new one took over (see [`CARRIED`]).
    pub carried: Vec<String>,
    /// Keys of a replaced upstream `portmap` entry left out, each with why.
    pub dropped: Vec<(String, &'static str)>,
}

/// Keys of a replaced entry that mean the same to ebpf-portmap, carried
/// over unless the operator's entry sets them: `snat` (masquerade hairpin
/// flows), `conditionsV4`/`conditionsV6` (enforced by the programs). Also
/// when the replaced entry is ours, so that chaining a chained list again
/// keeps them.
pub const CARRIED: [&str; 3] = ["snat", "conditionsV4", "conditionsV6"];

/// Why an upstream `portmap` key with no equivalent is left out.
fn why_dropped(key: &str) -> &'static str {
    match key {
        "markMasqBit" | "externalSetMarkChain" => {
            "ebpf-portmap marks no packets and uses no iptables chain: its programs masquerade hairpin flows themselves (snat, masqAll)"
        }
        "backend" => "ebpf-portmap uses neither iptables nor nftables",
        _ => "not a key of ebpf-portmap",
    }
}

/// Keys every plugin entry has, which the entry sets itself.
const ENTRY_OWN: [&str; 4] = ["type", "capabilities", "name", "cniVersion"];

impl Chained {
    pub fn plugin_count(&self) -> usize {
        plugins(&self.list).map_or(0, <[Value]>::len)
    }

    /// The entry's index in the list.
    pub fn position(&self) -> usize {
        match self.placement {
            Placement::Replaced { index, .. } | Placement::Appended { index } => index,
        }
    }
}

/// The extension as Go's `filepath.Ext` sees it: after the last dot of the
/// name (so `.conf` alone has one), as bytes.
fn extension(name: &OsStr) -> Option<&[u8]> {
    let bytes = name.as_bytes();
    let base = bytes.rsplit(|&b| b == b'/').next().unwrap_or(bytes);
    let dot = base.iter().rposition(|&b| b == b'.')?;
    Some(&base[dot + 1..])
}

/// Whether a runtime would load a file of this name.
pub fn is_config_name(name: &OsStr) -> bool {
    extension(name).is_some_and(|ext| CONFIG_EXTENSIONS.iter().any(|c| c.as_bytes() == ext))
}

/// The entry to chain: `{"type": "ebpf-portmap", "capabilities":
/// {"portMappings": true}}` plus the operator's keys (`--entry`), which
/// may set any plugin key but not another type or portMappings off.
pub fn plugin_entry(overrides: Option<&str>) -> Result<Map<String, Value>, EntryError> {
    let mut entry = Map::new();
    entry.insert("type".into(), json!(PLUGIN_TYPE));
    entry.insert("capabilities".into(), json!({ "portMappings": true }));
    let Some(overrides) = overrides else {
        return Ok(entry);
    };
    let overrides = match serde_json::from_str::<Value>(overrides) {
        Ok(Value::Object(map)) => map,
        Ok(other) => {
            return Err(EntryError::NotAnObject {
                found: json_kind(&other),
            });
        }
        Err(source) => return Err(EntryError::InvalidJson(source)),
    };
    for (key, value) in overrides {
        match key.as_str() {
            "type" if value != json!(PLUGIN_TYPE) => {
                return Err(EntryError::WrongType {
                    found: value.to_string(),
                });
            }
            "type" => {}
            "capabilities" => {
                let Value::Object(capabilities) = value else {
                    return Err(EntryError::CapabilitiesNotAnObject {
                        found: value.to_string(),
                    });
                };
                if capabilities
                    .get("portMappings")
                    .is_some_and(|on| on != &Value::Bool(true))
                {
                    return Err(EntryError::PortMappingsOff);
                }
                let ours = entry["capabilities"]
                    .as_object_mut()
                    .expect("built above as an object");
                ours.extend(capabilities);
            }
            _ => {
                entry.insert(key, value);
            }
        }
    }
    Ok(entry)
}

/// Parses a configuration file's bytes into a list, converting a
/// single-plugin configuration as libcni's `ConfListFromConf` does: the
/// whole object becomes the only plugin, and the list takes its `name`
/// and `cniVersion`.
pub fn parse_list(bytes: &[u8], layout: Layout) -> Result<Map<String, Value>, ListError> {
    let object = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(object)) => object,
        Ok(other) => {
            return Err(ListError::NotAnObject {
                found: json_kind(&other),
            });
        }
        Err(source) => return Err(ListError::InvalidJson(source)),
    };
    let list = match layout {
        Layout::List => object,
        Layout::Single => {
            if !object.get("type").is_some_and(Value::is_string) {
                return Err(ListError::NoType);
            }
            let mut list = Map::new();
            for key in ["cniVersion", "name"] {
                if let Some(value) = object.get(key) {
                    list.insert(key.into(), value.clone());
                }
            }
            list.insert("plugins".into(), Value::Array(vec![Value::Object(object)]));
            list
        }
    };
    let entries = plugins(&list).ok_or(ListError::NoPlugins)?;
    if entries.is_empty() {
        return Err(ListError::NoPlugins);
    }
    for (index, plugin) in entries.iter().enumerate() {
        if plugin_type(plugin).is_none() {
            return Err(ListError::PluginWithoutType { index });
        }
    }
    Ok(list)
}

fn plugins(list: &Map<String, Value>) -> Option<&[Value]> {
    list.get("plugins")?.as_array().map(Vec::as_slice)
}

fn plugin_type(plugin: &Value) -> Option<&str> {
    plugin.as_object()?.get("type")?.as_str()
}

/// Whether a list names our plugin.
pub fn names_plugin(list: &Map<String, Value>) -> bool {
    plugins(list).is_some_and(|entries| entries.iter().any(|p| plugin_type(p) == Some(PLUGIN_TYPE)))
}

/// The list with `entry` chained in (see the module docs). Pure and
/// idempotent: chaining a chained list with the same entry returns it
/// unchanged. `list` must have passed [`parse_list`].
///
/// The entry takes the place of the first `portmap` or `ebpf-portmap`
/// entry, keeping the capabilities that entry declared (ours win where
/// both set one); every other entry of either type is dropped (two
/// port-mapping plugins would both translate). Without one, it goes last.
pub fn chain_list(
    list: &Map<String, Value>,
    entry: &Map<String, Value>,
) -> Result<Chained, ListError> {
    let entries = plugins(list).ok_or(ListError::NoPlugins)?;
    let is_port_plugin = |p: &Value| matches!(plugin_type(p), Some(PLUGIN_TYPE | UPSTREAM_TYPE));
    if entries.iter().all(is_port_plugin) {
        return Err(ListError::NoMainPlugin);
    }
    let mut chained = Vec::with_capacity(entries.len() + 1);
    let mut placement = None;
    let mut carried = Vec::new();
    let mut dropped = Vec::new();
    for plugin in entries {
        if !is_port_plugin(plugin) {
            chained.push(plugin.clone());
            continue;
        }
        if placement.is_some() {
            continue;
        }
        placement = Some(Placement::Replaced {
            index: chained.len(),
            replaced: plugin_type(plugin).unwrap_or_default().to_owned(),
        });
        let (taken, carried_keys, dropped_keys) = carry_over(entry, plugin);
        carried = carried_keys;
        dropped = dropped_keys;
        chained.push(Value::Object(taken));
    }
    let placement = placement.unwrap_or_else(|| {
        chained.push(Value::Object(entry.clone()));
        Placement::Appended {
            index: chained.len() - 1,
        }
    });
    let mut list = list.clone();
    list.insert("plugins".into(), Value::Array(chained));
    Ok(Chained {
        list,
        placement,
        carried,
        dropped,
    })
}

/// `entry` in place of `replaced`: the capabilities `replaced` declared
/// added under its own, the [`CARRIED`] keys it set and `entry` does not
/// taken over; with the keys carried and, for an upstream `portmap`
/// entry, those left out and why (never dropped without a word).
#[allow(clippy::type_complexity, reason = "one private call site")]
fn carry_over(
    entry: &Map<String, Value>,
    replaced: &Value,
) -> (Map<String, Value>, Vec<String>, Vec<(String, &'static str)>) {
    let mut taken = with_capabilities_of(entry, replaced);
    let mut carried = Vec::new();
    let mut dropped = Vec::new();
    let upstream = plugin_type(replaced) == Some(UPSTREAM_TYPE);
    for (key, value) in replaced.as_object().into_iter().flatten() {
        if ENTRY_OWN.contains(&key.as_str()) {
            continue;
        }
        if CARRIED.contains(&key.as_str()) {
            if !taken.contains_key(key) {
                taken.insert(key.clone(), value.clone());
                carried.push(key.clone());
            }
        } else if upstream {
            dropped.push((key.clone(), why_dropped(key)));
        }
    }
    (taken, carried, dropped)
}

/// `entry` with the capabilities `replaced` declared added under its own.
fn with_capabilities_of(entry: &Map<String, Value>, replaced: &Value) -> Map<String, Value> {
    let mut entry = entry.clone();
    let Some(theirs) = replaced.get("capabilities").and_then(Value::as_object) else {
        return entry;
    };
    let ours = entry
        .entry("capabilities")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(ours) = ours {
        for (name, value) in theirs {
            ours.entry(name.clone()).or_insert_with(|| value.clone());
        }
    }
    entry
}

/// The configuration libcni hands our plugin for this list (the entry with
/// the list's `name` and `cniVersion`, before runtime data), checked with
/// the plugin's own parser.
pub fn validate_entry(chained: &Chained) -> Result<(), ConfigError> {
    let index = match chained.placement {
        Placement::Replaced { index, .. } | Placement::Appended { index } => index,
    };
    let mut stdin = plugins(&chained.list)
        .and_then(|entries| entries.get(index))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for key in ["cniVersion", "name"] {
        if let Some(value) = chained.list.get(key) {
            stdin.insert(key.into(), value.clone());
        }
    }
    let bytes = serde_json::to_vec(&Value::Object(stdin)).expect("a JSON map serialises");
    netconf::parse_netconf(&bytes).map(drop)
}

/// The file a chained configuration is written to: a `.conflist` stays
/// where it is, a single-plugin file becomes `<stem>.conflist`.
pub fn chained_path(config: &Path) -> PathBuf {
    match Layout::of(config) {
        Layout::List => config.to_path_buf(),
        Layout::Single => config.with_extension("conflist"),
    }
}

/// Where the original of `config` is kept.
pub fn backup_path(config: &Path) -> PathBuf {
    let mut name: OsString = config.as_os_str().to_owned();
    name.push(BACKUP_SUFFIX);
    PathBuf::from(name)
}

/// The configuration files of `dir` in the order the runtime tries them:
/// every entry but directories whose extension is `conf`, `conflist` or
/// `json`, sorted byte-wise (libcni's `ConfFiles`, then `sort.Strings`).
pub fn config_files(dir: &Path) -> Result<Vec<PathBuf>, ChainError> {
    let read_dir = |source| ChainError::ReadDir {
        dir: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_dir)? {
        let entry = entry.map_err(read_dir)?;
        if entry.file_type().map_err(read_dir)?.is_dir() {
            continue;
        }
        if is_config_name(&entry.file_name()) {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// Which configuration of a directory the runtime uses, so which one to chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// The lexically first file ([`config_files`]): containerd, kubelet and
    /// CRI-O without `cni_default_network` use it.
    First,
    /// The network whose `"name"` is this, found as libcni's `LoadConfList`
    /// finds it: the first `.conflist` (sorted) of that name, else the first
    /// `.conf`/`.json` of that name (which is then converted).
    Network(String),
    /// Exactly this file.
    File(PathBuf),
}

impl Selection {
    /// The file the runtime uses under `dir`.
    pub fn config(&self, dir: &Path) -> Result<PathBuf, ChainError> {
        match self {
            Selection::First => {
                config_files(dir)?
                    .first()
                    .cloned()
                    .ok_or_else(|| ChainError::NoConfig {
                        dir: dir.to_path_buf(),
                    })
            }
            Selection::Network(name) => network_config(dir, name),
            Selection::File(path) => {
                if !path.file_name().is_some_and(is_config_name) {
                    return Err(ChainError::NotAConfigName { path: path.clone() });
                }
                Ok(path.clone())
            }
        }
    }

    /// The directory the selected file lives in (`dir`, or the parent of
    /// an explicit file).
    pub fn dir<'a>(&'a self, dir: &'a Path) -> &'a Path {
        match self {
            Selection::File(path) => path.parent().unwrap_or(Path::new(".")),
            _ => dir,
        }
    }
}

/// The network `name` of `dir`, as libcni's `LoadConfList` picks it. A file
/// that cannot be read or parsed is an error, as it is for libcni.
fn network_config(dir: &Path, name: &str) -> Result<PathBuf, ChainError> {
    let files = config_files(dir)?;
    let mut found = Vec::new();
    let (lists, singles): (Vec<&PathBuf>, Vec<&PathBuf>) = files
        .iter()
        .partition(|file| Layout::of(file) == Layout::List);
    for file in lists.into_iter().chain(singles) {
        let bytes = fs::read(file).map_err(|source| ChainError::Read {
            path: file.clone(),
            source,
        })?;
        let list =
            parse_list(&bytes, Layout::of(file)).map_err(|source| ChainError::Malformed {
                path: file.clone(),
                source,
            })?;
        match list.get("name").and_then(Value::as_str) {
            Some(found_name) if found_name == name => return Ok(file.clone()),
            Some(found_name) => found.push(format!("{found_name:?}")),
            None => {}
        }
    }
    if files.is_empty() {
        return Err(ChainError::NoConfig {
            dir: dir.to_path_buf(),
        });
    }
    found.dedup();
    Err(ChainError::NoNetwork {
        dir: dir.to_path_buf(),
        name: name.to_owned(),
        found: if found.is_empty() {
            "no name at all".to_owned()
        } else {
            found.join(", ")
        },
    })
}

/// What [`install`] would do to the configuration the runtime uses.
#[derive(Debug)]
pub struct Plan {
    /// The configuration the runtime uses now.
    pub source: PathBuf,
    source_bytes: Vec<u8>,
    /// Where the chained configuration goes (the source, or its `.conflist`).
    pub target: PathBuf,
    pub chained: Chained,
    /// The bytes to write, `None` when the source is already chained so.
    write: Option<Vec<u8>>,
    /// Whether the source is the main plugin's own file (it does not name
    /// our plugin), to be kept as the backup.
    pub source_is_original: bool,
}

impl Plan {
    pub fn is_unchanged(&self) -> bool {
        self.write.is_none()
    }
}

/// Works out how to chain `entry` into the configuration of `dir` that
/// `selection` picks, checking everything that can be checked before writing.
pub fn plan(
    dir: &Path,
    selection: &Selection,
    entry: &Map<String, Value>,
) -> Result<Plan, ChainError> {
    let source = selection.config(dir)?;
    let files = config_files(selection.dir(dir))?;
    let source_bytes = fs::read(&source).map_err(|source_err| ChainError::Read {
        path: source.clone(),
        source: source_err,
    })?;
    let malformed = |source_err| ChainError::Malformed {
        path: source.clone(),
        source: source_err,
    };
    let layout = Layout::of(&source);
    let list = parse_list(&source_bytes, layout).map_err(malformed)?;
    let chained = chain_list(&list, entry).map_err(malformed)?;
    validate_entry(&chained).map_err(|source_err| ChainError::Refused {
        path: source.clone(),
        source: source_err,
    })?;
    let target = chained_path(&source);
    if layout == Layout::Single {
        // Only a runtime that takes the first file can lose the converted
        // file to one sorting before it; by name, a .conflist is found first.
        if *selection == Selection::First
            && let Some(first) = files
                .iter()
                .find(|f| **f != source && **f != target && **f < target)
        {
            return Err(ChainError::NotFirst {
                target,
                first: first.clone(),
            });
        }
        // Ours if an earlier install converted this very source into it.
        if target.exists() && !(backup_path(&source).exists() && file_names_plugin(&target)) {
            return Err(ChainError::TargetTaken {
                source_file: source,
                target,
            });
        }
    }
    let unchanged = layout == Layout::List && chained.list == list;
    let write = (!unchanged).then(|| render(&chained.list));
    Ok(Plan {
        source_is_original: !names_plugin(&list),
        source,
        source_bytes,
        target,
        chained,
        write,
    })
}

fn file_names_plugin(path: &Path) -> bool {
    fs::read(path)
        .ok()
        .and_then(|bytes| parse_list(&bytes, Layout::of(path)).ok())
        .is_some_and(|list| names_plugin(&list))
}

/// Pretty JSON with a final newline.
fn render(list: &Map<String, Value>) -> Vec<u8> {
    let mut bytes =
        serde_json::to_vec_pretty(&Value::Object(list.clone())).expect("a JSON map serialises");
    bytes.push(b'\n');
    bytes
}

/// What [`install`] did.
#[derive(Debug)]
pub struct Installed {
    pub plan: Plan,
    /// Where the original was saved, if this run saved it.
    pub backup: Option<PathBuf>,
}

/// Chains `entry` into the configuration the runtime uses (see the module
/// docs). Writes nothing when it is already chained so, or when anything
/// is wrong.
pub fn install(
    dir: &Path,
    selection: &Selection,
    entry: &Map<String, Value>,
) -> Result<Installed, ChainError> {
    let plan = plan(dir, selection, entry)?;
    let Some(bytes) = &plan.write else {
        return Ok(Installed { plan, backup: None });
    };
    let mode = fs::metadata(&plan.source)
        .map_err(|source| ChainError::Read {
            path: plan.source.clone(),
            source,
        })?
        .permissions()
        .mode()
        & 0o7777;
    let backup = if plan.source_is_original {
        let backup = backup_path(&plan.source);
        write_atomically(&backup, &plan.source_bytes, mode)?;
        Some(backup)
    } else {
        None
    };
    // The main plugin may rewrite its file at any time: if it did since we
    // read it, our edit would overwrite its new content. Re-read right
    // before the rename; the window left is the rename itself.
    let unchanged_since_read = || fs::read(&plan.source).is_ok_and(|now| now == plan.source_bytes);
    write_atomically_if(&plan.target, bytes, mode, unchanged_since_read).map_err(|e| match e {
        WriteError::Precondition => ChainError::Changed {
            path: plan.source.clone(),
        },
        WriteError::Io(source) => ChainError::Write {
            path: plan.target.clone(),
            source,
        },
    })?;
    if plan.target != plan.source {
        // The runtime now sees the .conflist first only once this is gone;
        // until then it keeps using the original, which is consistent.
        fs::remove_file(&plan.source).map_err(|source| ChainError::Remove {
            path: plan.source.clone(),
            source,
        })?;
    }
    Ok(Installed { plan, backup })
}

/// What [`remove`] did.
#[derive(Debug, Default)]
pub struct Removed {
    /// (original restored, chained file removed if it was another file).
    pub restored: Vec<(PathBuf, Option<PathBuf>)>,
    /// Backups dropped because their chained file is gone or no longer
    /// names our plugin (the main plugin rewrote or removed it).
    pub stale: Vec<PathBuf>,
    /// Configurations other than the runtime's that still name our plugin
    /// (chained by hand); left alone.
    pub foreign: Vec<PathBuf>,
}

/// Undoes [`install`] in `dir`: every backup whose chained file still names
/// our plugin is renamed back over its original (exact bytes and mode) and
/// a converted `.conflist` removed. Fails if the configuration the runtime
/// then uses (the one `selection` picks) still names our plugin, so the
/// binary is not removed under it.
pub fn remove(dir: &Path, selection: &Selection) -> Result<Removed, ChainError> {
    let dir = selection.dir(dir);
    let read_dir = |source| ChainError::ReadDir {
        dir: dir.to_path_buf(),
        source,
    };
    let mut backups = Vec::new();
    for entry in fs::read_dir(dir).map_err(read_dir)? {
        let entry = entry.map_err(read_dir)?;
        let name = entry.file_name();
        if name.as_bytes().ends_with(BACKUP_SUFFIX.as_bytes())
            && !entry.file_type().map_err(read_dir)?.is_dir()
        {
            backups.push(entry.path());
        }
    }
    backups.sort();
    let mut removed = Removed::default();
    for backup in backups {
        let original = original_of(&backup);
        let chained = chained_path(&original);
        let chained_is_ours = match fs::read(&chained) {
            Ok(bytes) => {
                let list = parse_list(&bytes, Layout::of(&chained)).map_err(|source| {
                    ChainError::Malformed {
                        path: chained.clone(),
                        source,
                    }
                })?;
                names_plugin(&list)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(source) => {
                return Err(ChainError::Read {
                    path: chained,
                    source,
                });
            }
        };
        if !chained_is_ours {
            remove_file(&backup)?;
            removed.stale.push(backup);
            continue;
        }
        fs::rename(&backup, &original).map_err(|source| ChainError::Write {
            path: original.clone(),
            source,
        })?;
        sync_dir(&original);
        let also_removed = if chained != original {
            remove_file(&chained)?;
            Some(chained)
        } else {
            None
        };
        removed.restored.push((original, also_removed));
    }
    let files = config_files(dir)?;
    for file in &files {
        if file_names_plugin(file) {
            removed.foreign.push(file.clone());
        }
    }
    // The file the runtime now uses; none (the network is gone) is fine.
    if let Ok(used) = selection.config(dir)
        && removed.foreign.contains(&used)
    {
        return Err(ChainError::StillChained { path: used });
    }
    Ok(removed)
}

fn original_of(backup: &Path) -> PathBuf {
    let bytes = backup.as_os_str().as_bytes();
    let original = bytes
        .strip_suffix(BACKUP_SUFFIX.as_bytes())
        .unwrap_or(bytes);
    PathBuf::from(OsStr::from_bytes(original))
}

fn remove_file(path: &Path) -> Result<(), ChainError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(ChainError::Remove {
            path: path.to_path_buf(),
            source,
        }),
    }
}

enum WriteError {
    Precondition,
    Io(io::Error),
}

fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), ChainError> {
    write_atomically_if(path, bytes, mode, || true).map_err(|e| ChainError::Write {
        path: path.to_path_buf(),
        source: match e {
            WriteError::Io(source) => source,
            WriteError::Precondition => unreachable!("the precondition always holds"),
        },
    })
}

/// Writes `bytes` to a temp file beside `path` (flushed to disk) and
/// renames it over `path` if `precondition` still holds, so readers see
/// the old or the new file, never a part.
fn write_atomically_if(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    precondition: impl FnOnce() -> bool,
) -> Result<(), WriteError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut temp_name = OsString::from(".");
    temp_name.push(path.file_name().unwrap_or_default());
    temp_name.push(format!(".{}{TEMP_SUFFIX}", std::process::id()));
    let temp = dir.join(temp_name);
    let written = (|| {
        let mut file = fs::File::create(&temp)?;
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(bytes)?;
        file.sync_all()
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&temp);
        return Err(WriteError::Io(e));
    }
    if !precondition() {
        let _ = fs::remove_file(&temp);
        return Err(WriteError::Precondition);
    }
    if let Err(e) = fs::rename(&temp, path) {
        let _ = fs::remove_file(&temp);
        return Err(WriteError::Io(e));
    }
    sync_dir(path);
    Ok(())
}

/// Makes a rename in `path`'s directory durable; best effort (a failure
/// leaves the rename done, only not yet on disk).
fn sync_dir(path: &Path) {
    if let Some(dir) = path.parent()
        && let Ok(dir) = fs::File::open(dir)
    {
        let _ = dir.sync_all();
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
