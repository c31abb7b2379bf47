//! Unit tests of the parent module.

use super::*;
use crate::cni::json::ShapeError;

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

fn entry() -> Map<String, Value> {
    plugin_entry(None).expect("the default entry")
}

fn types(list: &Map<String, Value>) -> Vec<&str> {
    plugins(list)
        .expect("a list")
        .iter()
        .map(|p| plugin_type(p).expect("a type"))
        .collect()
}

fn bridge_with(port_plugins: &[Value]) -> Map<String, Value> {
    let mut entries = vec![json!({"type": "bridge", "bridge": "cni0",
        "ipam": {"type": "host-local", "subnet": "10.244.0.0/24"}})];
    entries.extend(port_plugins.iter().cloned());
    object(json!({"cniVersion": "1.0.0", "name": "mynet", "plugins": entries}))
}

#[test]
fn config_names_are_the_ones_libcni_loads() {
    for name in [
        "10-kindnet.conflist",
        "10-flannel.conflist",
        "87-podman.conf",
        "99-loopback.conf",
        "10-x.json",
        ".conf",
    ] {
        assert!(is_config_name(OsStr::new(name)), "{name} is loaded");
    }
    for name in [
        "10-kindnet.conflist.ebpf-portmap.bak",
        ".10-kindnet.conflist.123.ebpf-portmap.tmp",
        "calico-kubeconfig",
        "10-a.CONF",
        "10-a.conf~",
        "conf",
    ] {
        assert!(!is_config_name(OsStr::new(name)), "{name} is not loaded");
    }
}

#[test]
fn chained_and_backup_paths() {
    assert_eq!(
        chained_path(Path::new("/d/10-bridge.conf")),
        Path::new("/d/10-bridge.conflist")
    );
    assert_eq!(
        chained_path(Path::new("/d/10-x.json")),
        Path::new("/d/10-x.conflist")
    );
    assert_eq!(
        chained_path(Path::new("/d/10-k.conflist")),
        Path::new("/d/10-k.conflist")
    );
    let backup = backup_path(Path::new("/d/10-bridge.conf"));
    assert_eq!(backup, Path::new("/d/10-bridge.conf.ebpf-portmap.bak"));
    assert_eq!(original_of(&backup), Path::new("/d/10-bridge.conf"));
    assert!(!is_config_name(backup.as_os_str()));
}

#[test]
fn the_default_entry_asks_for_port_mappings() {
    assert_eq!(
        Value::Object(entry()),
        json!({"type": "ebpf-portmap", "capabilities": {"portMappings": true}})
    );
}

#[test]
fn operator_keys_are_added_to_the_entry() {
    let entry = plugin_entry(Some(
        r#"{"hostPortListeners": "allow", "type": "ebpf-portmap",
            "capabilities": {"io.kubernetes.cri.pod-annotations": true}}"#,
    ))
    .expect("valid keys");
    assert_eq!(
        Value::Object(entry),
        json!({"type": "ebpf-portmap",
               "capabilities": {"portMappings": true, "io.kubernetes.cri.pod-annotations": true},
               "hostPortListeners": "allow"})
    );
}

#[test]
fn operator_keys_that_would_break_the_chain_are_refused() {
    let cases = [
        ("{", "InvalidJson"),
        ("[]", "NotAnObject"),
        (r#"{"type": "portmap"}"#, "WrongType"),
        (r#"{"capabilities": true}"#, "CapabilitiesNotAnObject"),
        (
            r#"{"capabilities": {"portMappings": false}}"#,
            "PortMappingsOff",
        ),
    ];
    for (input, expected) in cases {
        let error = plugin_entry(Some(input)).expect_err(input);
        assert!(
            format!("{error:?}").starts_with(expected),
            "{input}: {error:?}, expected {expected}"
        );
    }
}

#[test]
fn upstream_portmap_is_replaced_in_place_keeping_its_capabilities() {
    let list = bridge_with(&[
        json!({"type": "portmap", "snat": true,
               "capabilities": {"portMappings": true, "io.kubernetes.cri.pod-annotations": true}}),
        json!({"type": "bandwidth", "capabilities": {"bandwidth": true}}),
    ]);
    let chained = chain_list(&list, &entry()).expect("chained");
    assert_eq!(
        types(&chained.list),
        ["bridge", "ebpf-portmap", "bandwidth"]
    );
    assert_eq!(
        chained.placement,
        Placement::Replaced {
            index: 1,
            replaced: "portmap".into()
        }
    );
    assert_eq!(
        chained.list["plugins"][1],
        json!({"type": "ebpf-portmap", "snat": true,
               "capabilities": {"portMappings": true, "io.kubernetes.cri.pod-annotations": true}}),
        "snat, which means the same to ebpf-portmap, is carried over, capabilities kept"
    );
    assert_eq!(chained.carried, ["snat"]);
    assert_eq!(chained.dropped, []);
    assert_eq!(chained.list["plugins"][0], list["plugins"][0]);
    assert_eq!(chained.list["name"], "mynet");
}

#[test]
fn without_portmap_the_entry_goes_last() {
    let list = bridge_with(&[json!({"type": "tuning", "sysctl": {}})]);
    let chained = chain_list(&list, &entry()).expect("chained");
    assert_eq!(types(&chained.list), ["bridge", "tuning", "ebpf-portmap"]);
    assert_eq!(chained.placement, Placement::Appended { index: 2 });
}

#[test]
fn chaining_is_idempotent() {
    let custom = plugin_entry(Some(r#"{"snat": false}"#)).expect("valid");
    for list in [
        bridge_with(&[]),
        bridge_with(&[json!({"type": "portmap", "capabilities": {"portMappings": true}})]),
        bridge_with(&[
            json!({"type": "ebpf-portmap", "capabilities": {"portMappings": true}}),
            json!({"type": "portmap", "capabilities": {"portMappings": true}}),
        ]),
    ] {
        for entry in [entry(), custom.clone()] {
            let once = chain_list(&list, &entry).expect("once");
            let twice = chain_list(&once.list, &entry).expect("twice");
            assert_eq!(once.list, twice.list, "chaining {list:?} again changed it");
            let index = |placement: &Placement| match placement {
                Placement::Replaced { index, .. } | Placement::Appended { index } => *index,
            };
            assert_eq!(
                twice.placement,
                Placement::Replaced {
                    index: index(&once.placement),
                    replaced: PLUGIN_TYPE.into()
                },
                "the second run finds the entry where the first put it"
            );
        }
    }
}

#[test]
fn a_second_port_plugin_is_dropped() {
    let list = bridge_with(&[
        json!({"type": "portmap", "capabilities": {"portMappings": true}}),
        json!({"type": "firewall"}),
        json!({"type": "ebpf-portmap", "capabilities": {"portMappings": true}}),
    ]);
    let chained = chain_list(&list, &entry()).expect("chained");
    assert_eq!(types(&chained.list), ["bridge", "ebpf-portmap", "firewall"]);
}

#[test]
fn a_list_of_port_plugins_only_has_nothing_to_chain_after() {
    let list = object(json!({"cniVersion": "1.0.0", "name": "n",
        "plugins": [{"type": "portmap"}]}));
    assert!(matches!(
        chain_list(&list, &entry()),
        Err(ListError::NoMainPlugin)
    ));
}

#[test]
fn keys_keep_the_order_the_main_plugin_wrote() {
    let text = r#"{"name": "z", "cniVersion": "0.3.1", "plugins": [
        {"type": "ptp", "mtu": 1500, "ipMasq": false, "ipam": {"type": "host-local"}}]}"#;
    let list = parse_list(text.as_bytes(), Layout::List).expect("a list");
    let rendered = String::from_utf8(render(&chain_list(&list, &entry()).expect("chained").list))
        .expect("UTF-8");
    let at = |key: &str| {
        rendered
            .find(&format!("\"{key}\""))
            .unwrap_or_else(|| panic!("{key} in {rendered}"))
    };
    assert!(at("name") < at("cniVersion"), "{rendered}");
    assert!(
        at("mtu") < at("ipMasq") && at("ipMasq") < at("ipam"),
        "{rendered}"
    );
    assert!(rendered.ends_with("}\n"));
}

#[test]
fn a_single_plugin_configuration_becomes_a_list_as_libcni_builds_it() {
    let text = r#"{"cniVersion": "0.4.0", "name": "podman", "type": "bridge",
        "bridge": "cni-podman0", "ipam": {"type": "host-local"}}"#;
    let list = parse_list(text.as_bytes(), Layout::Single).expect("converted");
    assert_eq!(
        Value::Object(list),
        json!({"cniVersion": "0.4.0", "name": "podman", "plugins": [
            {"cniVersion": "0.4.0", "name": "podman", "type": "bridge",
             "bridge": "cni-podman0", "ipam": {"type": "host-local"}}]})
    );
}

#[test]
fn unusable_configurations_are_named() {
    let cases: [(&str, Layout, &str); 7] = [
        ("{\"plugins\": [", Layout::List, "InvalidJson"),
        ("[1]", Layout::List, "NotAnObject"),
        ("{\"name\": \"n\"}", Layout::List, "NoPlugins"),
        ("{\"plugins\": []}", Layout::List, "NoPlugins"),
        (
            "{\"plugins\": [{\"type\": \"ptp\"}, {}]}",
            Layout::List,
            "PluginWithoutType",
        ),
        (
            "{\"plugins\": [\"ptp\"]}",
            Layout::List,
            "PluginWithoutType",
        ),
        (
            "{\"name\": \"n\", \"bridge\": \"b\"}",
            Layout::Single,
            "NoType",
        ),
    ];
    for (text, layout, expected) in cases {
        let error = parse_list(text.as_bytes(), layout).expect_err(text);
        assert!(
            format!("{error:?}").starts_with(expected),
            "{text}: {error:?}, expected {expected}"
        );
    }
}

#[test]
fn the_chained_entry_is_checked_with_the_plugins_parser() {
    let good = chain_list(&bridge_with(&[]), &entry()).expect("chained");
    validate_entry(&good).expect("a plain entry in a 1.0.0 list is accepted");

    let mut old = bridge_with(&[]);
    old.insert("cniVersion".into(), json!("0.2.0"));
    let chained = chain_list(&old, &entry()).expect("chained");
    assert!(matches!(
        validate_entry(&chained),
        Err(ConfigError::UnsupportedVersion { .. })
    ));

    let mut nameless = bridge_with(&[]);
    nameless.remove("name");
    let chained = chain_list(&nameless, &entry()).expect("chained");
    assert!(matches!(
        validate_entry(&chained),
        Err(ConfigError::Shape(ShapeError::MissingField { .. }))
    ));

    let relative = plugin_entry(Some(r#"{"pinRoot": "bpf/pm"}"#)).expect("keys");
    let chained = chain_list(&bridge_with(&[]), &relative).expect("chained");
    assert!(matches!(
        validate_entry(&chained),
        Err(ConfigError::InvalidPinRoot { .. })
    ));
}

/// A directory under the system temp dir, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let path = std::env::temp_dir().join(format!("chain-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("creating a temp dir");
        Dir(path)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        fs::write(&path, text).expect("writing a file");
        path
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&self.0)
            .expect("listing")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

const BRIDGE: &str = r#"{"cniVersion": "1.0.0", "name": "n", "type": "bridge"}"#;
const CHAINED: &str = r#"{"cniVersion": "1.0.0", "name": "n", "plugins":
    [{"type": "bridge"}, {"type": "ebpf-portmap", "capabilities": {"portMappings": true}}]}"#;

fn named(name: &str, main: &str) -> String {
    format!(r#"{{"cniVersion": "1.0.0", "name": "{name}", "plugins": [{{"type": "{main}"}}]}}"#)
}

fn plugin_types_of(path: &Path) -> Vec<String> {
    let list = parse_list(&fs::read(path).expect("reading"), Layout::of(path)).expect("a list");
    types(&list).into_iter().map(str::to_owned).collect()
}

#[test]
fn a_network_is_chosen_by_name_not_by_sort_order() {
    let dir = Dir::new("by-name");
    let first = dir.write("10-kindnet.conflist", &named("kindnet", "ptp"));
    let crio = dir.write("20-crio.conflist", &named("crio", "bridge"));
    let selection = Selection::Network("crio".into());
    let installed = install(&dir.0, &selection, &entry()).expect("chained");
    assert_eq!(installed.plan.target, crio);
    assert_eq!(plugin_types_of(&crio), ["bridge", "ebpf-portmap"]);
    assert_eq!(
        plugin_types_of(&first),
        ["ptp"],
        "the first file is left alone"
    );
    assert!(
        plan(&dir.0, &selection, &entry())
            .expect("plan")
            .is_unchanged(),
        "installing twice changes nothing"
    );
    let removed = remove(&dir.0, &selection).expect("removed");
    assert_eq!(removed.restored.len(), 1);
    assert_eq!(
        fs::read_to_string(&crio).expect("restored"),
        named("crio", "bridge")
    );
}

#[test]
fn by_name_a_conflist_wins_over_a_conf_as_in_libcni() {
    let dir = Dir::new("by-name-order");
    // Sorts first, but libcni looks at .conflist files before .conf ones.
    dir.write(
        "00-net.conf",
        r#"{"cniVersion": "1.0.0", "name": "net", "type": "ptp"}"#,
    );
    let list = dir.write("50-net.conflist", &named("net", "bridge"));
    let installed = install(&dir.0, &Selection::Network("net".into()), &entry()).expect("chained");
    assert_eq!(installed.plan.target, list);
}

#[test]
fn by_name_a_single_conf_is_converted_even_when_not_first() {
    let dir = Dir::new("by-name-conf");
    dir.write("00-other.conflist", &named("other", "ptp"));
    dir.write(
        "10-net.conf",
        r#"{"cniVersion": "1.0.0", "name": "net", "type": "bridge"}"#,
    );
    let installed = install(&dir.0, &Selection::Network("net".into()), &entry()).expect("chained");
    assert_eq!(installed.plan.target, dir.0.join("10-net.conflist"));
    assert_eq!(
        plugin_types_of(&dir.0.join("10-net.conflist")),
        ["bridge", "ebpf-portmap"]
    );
    assert!(
        matches!(install(&dir.0, &Selection::First, &entry()), Ok(ref i) if i.plan.target == dir.0.join("00-other.conflist")),
        "the first file is still what the default picks"
    );
}

#[test]
fn an_unknown_network_is_refused_naming_the_ones_there() {
    let dir = Dir::new("by-name-missing");
    dir.write("10-a.conflist", &named("alpha", "bridge"));
    dir.write("20-b.conflist", &named("beta", "ptp"));
    let error = install(&dir.0, &Selection::Network("gamma".into()), &entry())
        .expect_err("no such network");
    let text = error.to_string();
    assert!(matches!(error, ChainError::NoNetwork { .. }), "{text}");
    assert!(
        text.contains("\"gamma\"") && text.contains("\"alpha\", \"beta\""),
        "{text}"
    );
    assert_eq!(
        dir.names(),
        ["10-a.conflist", "20-b.conflist"],
        "nothing written"
    );
}

#[test]
fn an_explicit_file_is_chained_wherever_it_sorts() {
    let dir = Dir::new("by-file");
    dir.write("10-a.conflist", &named("alpha", "ptp"));
    let second = dir.write("20-b.conflist", &named("beta", "bridge"));
    let selection = Selection::File(second.clone());
    let installed = install(Path::new("/nonexistent"), &selection, &entry()).expect("chained");
    assert_eq!(installed.plan.target, second);
    assert_eq!(plugin_types_of(&second), ["bridge", "ebpf-portmap"]);
    assert_eq!(plugin_types_of(&dir.0.join("10-a.conflist")), ["ptp"]);
    let not_config = dir.write("notes.txt", "{}");
    assert!(matches!(
        install(&dir.0, &Selection::File(not_config), &entry()),
        Err(ChainError::NotAConfigName { .. })
    ));
}

#[test]
fn a_conflist_of_someone_else_is_not_overwritten_by_a_conversion() {
    let dir = Dir::new("taken");
    dir.write("10-a.conf", BRIDGE);
    dir.write(
        "10-a.conflist",
        r#"{"cniVersion": "1.0.0", "name": "other", "plugins": [{"type": "ptp"}]}"#,
    );
    assert!(matches!(
        install(&dir.0, &Selection::First, &entry()),
        Err(ChainError::TargetTaken { .. })
    ));
    assert_eq!(dir.names(), ["10-a.conf", "10-a.conflist"]);
}

#[test]
fn a_conversion_that_would_not_be_loaded_first_is_refused() {
    let dir = Dir::new("not-first");
    dir.write("10-a.conf", BRIDGE);
    // Sorts after 10-a.conf but before 10-a.conflist.
    dir.write("10-a.conf.b.conf", BRIDGE);
    assert!(matches!(
        install(&dir.0, &Selection::First, &entry()),
        Err(ChainError::NotFirst { .. })
    ));
    assert_eq!(dir.names(), ["10-a.conf", "10-a.conf.b.conf"]);
}

#[test]
fn the_main_plugin_rewriting_a_converted_conf_is_chained_again() {
    let dir = Dir::new("reconvert");
    dir.write("10-a.conf", BRIDGE);
    install(&dir.0, &Selection::First, &entry()).expect("first install");
    let newer = BRIDGE.replace("bridge\"", "bridge\", \"mtu\": 1400");
    dir.write("10-a.conf", &newer);
    let installed = install(&dir.0, &Selection::First, &entry()).expect("second install");
    assert_eq!(installed.plan.target, dir.0.join("10-a.conflist"));
    assert_eq!(dir.names(), ["10-a.conf.ebpf-portmap.bak", "10-a.conflist"]);
    assert_eq!(
        fs::read_to_string(dir.0.join("10-a.conf.ebpf-portmap.bak")).expect("read"),
        newer,
        "the backup is the main plugin's latest file"
    );
}

#[test]
fn remove_drops_backups_of_files_the_main_plugin_replaced() {
    let dir = Dir::new("stale");
    let original = dir.write("10-a.conflist", KINDNET_LIKE);
    install(&dir.0, &Selection::First, &entry()).expect("install");
    // The main plugin writes its file again; nobody chains it.
    let newer = KINDNET_LIKE.replace("1500", "1400");
    fs::write(&original, &newer).expect("write");
    let removed = remove(&dir.0, &Selection::First).expect("remove");
    assert!(removed.restored.is_empty());
    assert_eq!(removed.stale, [backup_path(&original)]);
    assert_eq!(fs::read_to_string(&original).expect("read"), newer);
    assert_eq!(dir.names(), ["10-a.conflist"]);
}

#[test]
fn remove_fails_while_the_runtimes_config_names_the_plugin_without_a_backup() {
    let dir = Dir::new("foreign");
    dir.write("10-a.conflist", CHAINED);
    dir.write("20-b.conflist", CHAINED);
    assert!(matches!(
        remove(&dir.0, &Selection::First),
        Err(ChainError::StillChained { path }) if path.ends_with("10-a.conflist")
    ));
    // Once another file is the runtime's, the hand-chained ones are only
    // reported.
    dir.write("05-first.conf", BRIDGE);
    let removed = remove(&dir.0, &Selection::First).expect("only files the runtime does not use");
    assert_eq!(
        removed.foreign,
        [dir.0.join("10-a.conflist"), dir.0.join("20-b.conflist")]
    );
}

#[test]
fn a_failed_precondition_writes_nothing() {
    let dir = Dir::new("precondition");
    let path = dir.write("10-a.conflist", "old");
    assert!(matches!(
        write_atomically_if(&path, b"new", 0o644, || false),
        Err(WriteError::Precondition)
    ));
    assert_eq!(fs::read_to_string(&path).expect("read"), "old");
    assert_eq!(dir.names(), ["10-a.conflist"], "no temp file left");
    write_atomically_if(&path, b"new", 0o600, || true).unwrap_or_else(|_| panic!("write"));
    assert_eq!(fs::read_to_string(&path).expect("read"), "new");
    let mode = fs::metadata(&path).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

const KINDNET_LIKE: &str = r#"{"cniVersion": "0.3.1", "name": "kindnet", "plugins": [
    {"type": "ptp", "mtu": 1500}, {"type": "portmap", "capabilities": {"portMappings": true}}]}"#;
