//! Unit tests of the parent module.

use super::*;
use crate::cni::env::{CniArgsWarning, parse_cni_args};
use crate::model::{HostIp, PortMapping, Protocol};
use portmap_common::POD_NAME_LEN;
use std::collections::HashMap;
use std::path::Path;

/// What the fake plugin was asked to do.
#[derive(Debug, Clone)]
enum Call {
    Add(Request),
    Del(Request),
    Check(Request),
    Gc(GcRequest),
    Status(NetConf),
}

/// Records every call; optionally fails or panics. A fake is right here:
/// these tests are about dispatch, not the dataplane.
#[derive(Default)]
struct RecordingPlugin {
    calls: Vec<Call>,
    fail_with: Option<CniError>,
    panic: bool,
}

impl RecordingPlugin {
    fn record(&mut self, call: Call) -> Result<(), CniError> {
        self.calls.push(call);
        if self.panic {
            panic!("fake plugin asked to panic");
        }
        self.fail_with.clone().map_or(Ok(()), Err)
    }

    fn only_call(&self) -> &Call {
        assert_eq!(
            self.calls.len(),
            1,
            "exactly one plugin call expected, got {:?}",
            self.calls
        );
        &self.calls[0]
    }
}

impl Plugin for RecordingPlugin {
    fn add(&mut self, req: &Request) -> Result<(), CniError> {
        self.record(Call::Add(req.clone()))
    }
    fn del(&mut self, req: &Request) -> Result<(), CniError> {
        self.record(Call::Del(req.clone()))
    }
    fn check(&mut self, req: &Request) -> Result<(), CniError> {
        self.record(Call::Check(req.clone()))
    }
    fn gc(&mut self, req: &GcRequest) -> Result<(), CniError> {
        self.record(Call::Gc(req.clone()))
    }
    fn status(&mut self, conf: &NetConf) -> Result<(), CniError> {
        self.record(Call::Status(conf.clone()))
    }
}

/// A namespace path that exists without root.
const LIVE_NETNS: &str = "/proc/self/ns/net";
const GONE_NETNS: &str = "/var/run/netns/ebpf-portmap-test-no-such-namespace";

/// The full environment of an attachment verb; tests remove or override entries.
fn attachment_env(command: &str) -> Vec<(&'static str, String)> {
    vec![
        ("CNI_COMMAND", command.to_string()),
        ("CNI_CONTAINERID", "3f6940ab5ab4".to_string()),
        ("CNI_IFNAME", "eth0".to_string()),
        ("CNI_PATH", "/opt/cni/bin".to_string()),
        ("CNI_NETNS", LIVE_NETNS.to_string()),
    ]
}

fn set(env: &mut Vec<(&'static str, String)>, name: &'static str, value: Option<&str>) {
    env.retain(|(key, _)| *key != name);
    if let Some(value) = value {
        env.push((name, value.to_string()));
    }
}

struct Outcome {
    exit: i32,
    stdout: Vec<u8>,
}

impl Outcome {
    /// Asserts success with nothing on stdout.
    fn assert_silent_success(&self) {
        assert_eq!(
            self.exit,
            0,
            "expected success, stdout: {}",
            String::from_utf8_lossy(&self.stdout)
        );
        assert!(
            self.stdout.is_empty(),
            "stdout must be empty, got {}",
            String::from_utf8_lossy(&self.stdout)
        );
    }

    /// Asserts success and returns the one JSON document on stdout.
    fn success_document(&self) -> Value {
        assert_eq!(
            self.exit,
            0,
            "expected success, stdout: {}",
            String::from_utf8_lossy(&self.stdout)
        );
        serde_json::from_slice(&self.stdout).expect("stdout must be exactly one JSON document")
    }

    /// Asserts failure with `code` and exactly one spec error object on
    /// stdout; returns it.
    fn error(&self, code: u32) -> Value {
        assert_eq!(
            self.exit,
            1,
            "errors exit 1, stdout: {}",
            String::from_utf8_lossy(&self.stdout)
        );
        let error: Value = serde_json::from_slice(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout must be exactly one JSON document ({e}): {:?}",
                String::from_utf8_lossy(&self.stdout)
            )
        });
        let keys: Vec<&str> = error
            .as_object()
            .expect("error must be an object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys.len(), 4, "error object keys: {keys:?}");
        for key in ["cniVersion", "code", "msg", "details"] {
            assert!(keys.contains(&key), "error object lacks {key}: {error}");
        }
        assert_eq!(error["code"], code, "wrong error code in {error}");
        error
    }
}

fn invoke(env: &[(&'static str, String)], stdin: &str, plugin: &mut RecordingPlugin) -> Outcome {
    invoke_with_reader(env, &mut stdin.as_bytes(), plugin)
}

fn invoke_with_reader(
    env: &[(&'static str, String)],
    stdin: &mut dyn Read,
    plugin: &mut RecordingPlugin,
) -> Outcome {
    let env: HashMap<&str, String> = env.iter().cloned().collect();
    let lookup = |name: &str| env.get(name).cloned();
    let mut stdout = Vec::new();
    let exit = run(&lookup, stdin, &mut stdout, plugin);
    Outcome { exit, stdout }
}

fn prev_result(version: &str) -> Value {
    json!({
        "cniVersion": version,
        "interfaces": [
            {"name": "cni-podman0", "mac": "aa:bb:cc:dd:ee:ff"},
            {"name": "eth0", "mac": "aa:bb:cc:dd:ee:01", "sandbox": LIVE_NETNS}
        ],
        "ips": [
            {"interface": 1, "address": "10.88.0.5/16", "gateway": "10.88.0.1"},
            {"interface": 1, "address": "fd00::5/64"}
        ],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {}
    })
}

fn config(version: &str, mappings: Value, prev: Option<Value>) -> String {
    let mut conf = json!({
        "cniVersion": version,
        "name": "podman",
        "type": "ebpf-portmap",
        "capabilities": {"portMappings": true},
        "runtimeConfig": {"portMappings": mappings},
    });
    if let Some(prev) = prev {
        conf["prevResult"] = prev;
    }
    conf.to_string()
}

fn http_mapping() -> Value {
    json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}])
}

#[test]
fn version_without_stdin() {
    let mut plugin = RecordingPlugin::default();
    let document = invoke(&[("CNI_COMMAND", "VERSION".into())], "", &mut plugin).success_document();
    assert_eq!(
        document,
        json!({"cniVersion": "1.1.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}),
        "VERSION with empty stdin answers in the newest version"
    );
    assert!(plugin.calls.is_empty(), "VERSION never reaches the plugin");
}

#[test]
fn version_with_stdin() {
    let mut plugin = RecordingPlugin::default();
    let env = [("CNI_COMMAND", "VERSION".to_string())];
    let document = invoke(&env, r#"{"cniVersion":"0.4.0"}"#, &mut plugin).success_document();
    assert_eq!(
        document["cniVersion"], "0.4.0",
        "VERSION answers in the caller's version"
    );
    assert_eq!(
        document["supportedVersions"],
        json!(SUPPORTED_VERSIONS),
        "supportedVersions lists SUPPORTED_VERSIONS"
    );

    let document = invoke(&env, r#"{"cniVersion":"0.2.0"}"#, &mut plugin).success_document();
    assert_eq!(
        document["cniVersion"], "1.1.0",
        "an unsupported caller version falls back"
    );
    let document = invoke(&env, "not json", &mut plugin).success_document();
    assert_eq!(document["cniVersion"], "1.1.0", "garbage stdin falls back");
}

#[test]
fn add_echoes_prev_result_with_config_version() {
    let mut plugin = RecordingPlugin::default();
    // prevResult is in an older version than the config on purpose, to see
    // that only cniVersion changes.
    let prev = prev_result("0.4.0");
    let stdin = config("1.0.0", http_mapping(), Some(prev.clone()));
    let document = invoke(&attachment_env("ADD"), &stdin, &mut plugin).success_document();

    let mut expected = prev;
    expected["cniVersion"] = json!("1.0.0");
    assert_eq!(
        document, expected,
        "ADD must echo prevResult with the config's cniVersion"
    );

    let Call::Add(req) = plugin.only_call() else {
        panic!("ADD must call plugin.add, got {:?}", plugin.calls);
    };
    assert_eq!(
        req.owner,
        Owner {
            network: "podman".into(),
            container_id: "3f6940ab5ab4".into(),
            ifname: "eth0".into()
        },
        "owner is network + container ID + ifname"
    );
    assert_eq!(
        req.netns.as_deref(),
        Some(Path::new(LIVE_NETNS)),
        "netns passed through"
    );
    assert_eq!(
        req.container,
        ContainerAddrs {
            v4: Some("10.88.0.5".parse().unwrap()),
            v6: Some("fd00::5".parse().unwrap())
        },
        "container addresses come from the sandbox interface"
    );
    assert_eq!(
        req.conf.port_mappings,
        vec![PortMapping {
            host_ip: HostIp::Any,
            host_port: 8080,
            container_port: 80,
            protocol: Protocol::Tcp
        }],
        "validated mappings reach the plugin"
    );
}

#[test]
fn add_with_0_3_1_prev_result() {
    let mut plugin = RecordingPlugin::default();
    let prev = json!({
        "cniVersion": "0.3.1",
        "interfaces": [{"name": "eth0", "sandbox": LIVE_NETNS}],
        "ips": [{"version": "4", "interface": 0, "address": "10.0.0.9/24"}]
    });
    let stdin = config("0.3.1", http_mapping(), Some(prev.clone()));
    let document = invoke(&attachment_env("ADD"), &stdin, &mut plugin).success_document();
    assert_eq!(
        document, prev,
        "same-version chain: prevResult comes back unchanged"
    );
    let Call::Add(req) = plugin.only_call() else {
        panic!("expected add")
    };
    assert_eq!(
        req.container.v4,
        Some("10.0.0.9".parse().unwrap()),
        "0.3.1 ips are read"
    );
}

#[test]
fn add_without_prev_result_is_refused() {
    let mut plugin = RecordingPlugin::default();
    let error = invoke(
        &attachment_env("ADD"),
        &config("1.0.0", http_mapping(), None),
        &mut plugin,
    )
    .error(code::INVALID_NETWORK_CONFIG);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .contains("chained after an interface plugin"),
        "{error}"
    );
    assert_eq!(
        error["cniVersion"], "1.0.0",
        "errors answer in the config's version"
    );
    assert!(
        plugin.calls.is_empty(),
        "plugin must not be called: {:?}",
        plugin.calls
    );
}

#[test]
fn add_with_mappings_but_no_container_address_is_refused() {
    let mut plugin = RecordingPlugin::default();
    let prev = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/x"}], "ips": []});
    let error = invoke(
        &attachment_env("ADD"),
        &config("1.0.0", http_mapping(), Some(prev)),
        &mut plugin,
    )
    .error(code::INVALID_NETWORK_CONFIG);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .contains("no IPv4 or IPv6 address"),
        "{error}"
    );
    assert!(plugin.calls.is_empty(), "plugin must not be called");
}

#[test]
fn add_without_mappings_or_address_is_fine() {
    let mut plugin = RecordingPlugin::default();
    let prev = json!({"cniVersion": "1.0.0", "ips": []});
    let stdin =
        json!({"cniVersion": "1.0.0", "name": "n", "type": "t", "prevResult": prev}).to_string();
    let document = invoke(&attachment_env("ADD"), &stdin, &mut plugin).success_document();
    assert_eq!(document, prev, "nothing to map is not an error");
    assert!(
        matches!(plugin.only_call(), Call::Add(req) if req.conf.port_mappings.is_empty()),
        "ADD reaches the plugin with no mappings"
    );
}

#[test]
fn add_with_host_ip_family_the_container_lacks_is_refused() {
    let mut plugin = RecordingPlugin::default();
    let prev = json!({"cniVersion": "1.0.0", "ips": [{"address": "fd00::5/64"}]});
    let mappings = json!([{"hostPort": 8080, "containerPort": 80, "hostIP": "1.2.3.4"}]);
    let error = invoke(
        &attachment_env("ADD"),
        &config("1.0.0", mappings, Some(prev)),
        &mut plugin,
    )
    .error(code::INVALID_NETWORK_CONFIG);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .contains("portMappings[0].hostIP: 1.2.3.4"),
        "{error}"
    );
    assert!(plugin.calls.is_empty(), "plugin must not be called");
}

#[test]
fn add_invalid_config_never_reaches_the_plugin() {
    let mut plugin = RecordingPlugin::default();
    let mappings = json!([{"hostPort": 70000, "containerPort": 80}]);
    let error = invoke(
        &attachment_env("ADD"),
        &config("1.0.0", mappings, Some(prev_result("1.0.0"))),
        &mut plugin,
    )
    .error(code::INVALID_NETWORK_CONFIG);
    assert_eq!(
        error["msg"], "runtimeConfig.portMappings[0].hostPort: 70000 is out of range 1-65535",
        "the message names the entry and the range"
    );
    assert!(plugin.calls.is_empty(), "plugin must not be called");
}

#[test]
fn plugin_errors_are_reported_in_the_config_version() {
    let mut plugin = RecordingPlugin {
        fail_with: Some(CniError::new(11, "map busy", "try later")),
        ..Default::default()
    };
    let stdin = config("0.4.0", http_mapping(), Some(prev_result("0.4.0")));
    let error = invoke(&attachment_env("ADD"), &stdin, &mut plugin).error(11);
    assert_eq!(
        error,
        json!({"cniVersion": "0.4.0", "code": 11, "msg": "map busy", "details": "try later"}),
        "the plugin's error is passed through in the config's version"
    );
}

#[test]
fn plugin_panic_becomes_one_error_document() {
    let mut plugin = RecordingPlugin {
        panic: true,
        ..Default::default()
    };
    let stdin = config("1.0.0", http_mapping(), Some(prev_result("1.0.0")));
    let error = invoke(&attachment_env("ADD"), &stdin, &mut plugin).error(code::INTERNAL);
    assert_eq!(
        error["details"], "fake plugin asked to panic",
        "panic message goes to details"
    );
}

#[test]
fn del_without_runtime_config_or_prev_result_reaches_the_plugin() {
    let mut plugin = RecordingPlugin::default();
    let stdin = r#"{"cniVersion":"1.0.0","name":"podman","type":"ebpf-portmap"}"#;
    invoke(&attachment_env("DEL"), stdin, &mut plugin).assert_silent_success();
    let Call::Del(req) = plugin.only_call() else {
        panic!("DEL must call plugin.del")
    };
    assert_eq!(
        req.owner.container_id, "3f6940ab5ab4",
        "owner carries CNI_CONTAINERID"
    );
    assert_eq!(
        req.container,
        ContainerAddrs::default(),
        "no prevResult, no addresses"
    );
    assert!(
        req.conf.port_mappings.is_empty(),
        "no runtimeConfig, no mappings"
    );
}

#[test]
fn del_with_prev_result_passes_container_addresses() {
    let mut plugin = RecordingPlugin::default();
    let stdin = config("1.0.0", http_mapping(), Some(prev_result("1.0.0")));
    invoke(&attachment_env("DEL"), &stdin, &mut plugin).assert_silent_success();
    let Call::Del(req) = plugin.only_call() else {
        panic!("expected del")
    };
    assert_eq!(
        req.container.v4,
        Some("10.88.0.5".parse().unwrap()),
        "DEL gets the IPv4 address from prevResult"
    );
    assert_eq!(
        req.conf.port_mappings.len(),
        1,
        "valid mappings are still passed on DEL"
    );
}

#[test]
fn del_tolerates_missing_or_gone_netns_and_bad_request_data() {
    for netns in [None, Some(""), Some(GONE_NETNS), Some("relative/ns")] {
        let mut plugin = RecordingPlugin::default();
        let mut env = attachment_env("DEL");
        set(&mut env, "CNI_NETNS", netns);
        let stdin = config(
            "1.0.0",
            json!([{"hostPort": 0}]),
            Some(json!("not an object")),
        );
        invoke(&env, &stdin, &mut plugin).assert_silent_success();
        let Call::Del(req) = plugin.only_call() else {
            panic!("expected del for netns {netns:?}")
        };
        let expected = netns.filter(|n| n.starts_with('/')).map(PathBuf::from);
        assert_eq!(req.netns, expected, "netns {netns:?}");
        assert!(
            req.conf.port_mappings.is_empty(),
            "invalid mappings are dropped on DEL"
        );
    }
}

#[test]
fn check_on_0_3_1_is_refused() {
    let mut plugin = RecordingPlugin::default();
    let stdin = config("0.3.1", http_mapping(), Some(prev_result("0.3.1")));
    let error =
        invoke(&attachment_env("CHECK"), &stdin, &mut plugin).error(code::INCOMPATIBLE_VERSION);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .contains("does not allow CHECK"),
        "{error}"
    );
    assert_eq!(
        error["cniVersion"], "0.3.1",
        "the error answers in the config's version"
    );
    assert!(plugin.calls.is_empty(), "plugin must not be called");
}

#[test]
fn check_succeeds_silently() {
    let mut plugin = RecordingPlugin::default();
    let stdin = config("0.4.0", http_mapping(), Some(prev_result("0.4.0")));
    invoke(&attachment_env("CHECK"), &stdin, &mut plugin).assert_silent_success();
    let Call::Check(req) = plugin.only_call() else {
        panic!("CHECK must call plugin.check")
    };
    assert_eq!(
        req.container.v6,
        Some("fd00::5".parse().unwrap()),
        "CHECK gets the IPv6 address from prevResult"
    );
}

#[test]
fn check_without_prev_result_is_refused() {
    let mut plugin = RecordingPlugin::default();
    invoke(
        &attachment_env("CHECK"),
        &config("1.0.0", http_mapping(), None),
        &mut plugin,
    )
    .error(code::INVALID_NETWORK_CONFIG);
    assert!(plugin.calls.is_empty(), "plugin must not be called");
}

#[test]
fn gc_and_status_on_1_0_0_are_refused() {
    for command in ["GC", "STATUS"] {
        let mut plugin = RecordingPlugin::default();
        let stdin = r#"{"cniVersion":"1.0.0","name":"podman","type":"ebpf-portmap"}"#;
        let error = invoke(&[("CNI_COMMAND", command.into())], stdin, &mut plugin)
            .error(code::INCOMPATIBLE_VERSION);
        assert!(
            error["msg"]
                .as_str()
                .unwrap()
                .contains(&format!("does not allow {command}")),
            "{error}"
        );
        assert!(
            plugin.calls.is_empty(),
            "{command}: plugin must not be called"
        );
    }
}

#[test]
fn gc_passes_the_keep_list() {
    let mut plugin = RecordingPlugin::default();
    let stdin = json!({
        "cniVersion": "1.1.0", "name": "podman", "type": "ebpf-portmap",
        "cni.dev/valid-attachments": [{"containerID": "a1", "ifname": "eth0"}, {"containerID": "b2", "ifname": "net1"}],
        "cni.dev/attachments": [{"containerID": "a1", "ifname": "eth0"}, {"containerID": "b2", "ifname": "net1"}]
    });
    invoke(
        &[("CNI_COMMAND", "GC".into())],
        &stdin.to_string(),
        &mut plugin,
    )
    .assert_silent_success();
    let Call::Gc(req) = plugin.only_call() else {
        panic!("GC must call plugin.gc")
    };
    assert_eq!(
        req.valid,
        vec![
            Attachment {
                container_id: "a1".into(),
                ifname: "eth0".into()
            },
            Attachment {
                container_id: "b2".into(),
                ifname: "net1".into()
            },
        ],
        "keep-list passed in order"
    );
}

#[test]
fn gc_without_keep_list_means_nothing_is_valid() {
    let mut plugin = RecordingPlugin::default();
    let stdin = r#"{"cniVersion":"1.1.0","name":"podman","type":"ebpf-portmap"}"#;
    invoke(&[("CNI_COMMAND", "GC".into())], stdin, &mut plugin).assert_silent_success();
    assert!(
        matches!(plugin.only_call(), Call::Gc(req) if req.valid.is_empty()),
        "GC without a keep-list passes an empty list"
    );
}

#[test]
fn gc_with_malformed_keep_list_is_refused() {
    let mut plugin = RecordingPlugin::default();
    let stdin = r#"{"cniVersion":"1.1.0","name":"p","type":"t","cni.dev/valid-attachments":[{"containerID":"a"}]}"#;
    let error = invoke(&[("CNI_COMMAND", "GC".into())], stdin, &mut plugin)
        .error(code::INVALID_NETWORK_CONFIG);
    assert!(
        error["msg"]
            .as_str()
            .unwrap()
            .contains("cni.dev/valid-attachments[0].ifname"),
        "{error}"
    );
    assert!(plugin.calls.is_empty(), "plugin must not be called");
}

#[test]
fn status_reaches_the_plugin_and_passes_its_error() {
    let stdin =
        r#"{"cniVersion":"1.1.0","name":"podman","type":"ebpf-portmap","pinRoot":"/sys/fs/bpf/x"}"#;
    let mut plugin = RecordingPlugin::default();
    invoke(&[("CNI_COMMAND", "STATUS".into())], stdin, &mut plugin).assert_silent_success();
    assert!(
        matches!(plugin.only_call(), Call::Status(conf) if conf.pin_root == Path::new("/sys/fs/bpf/x")),
        "STATUS passes the parsed config"
    );

    let mut plugin = RecordingPlugin {
        fail_with: Some(CniError::new(
            code::PLUGIN_NOT_AVAILABLE,
            "programs not loaded",
            "",
        )),
        ..Default::default()
    };
    let error = invoke(&[("CNI_COMMAND", "STATUS".into())], stdin, &mut plugin)
        .error(code::PLUGIN_NOT_AVAILABLE);
    assert_eq!(
        error["cniVersion"], "1.1.0",
        "the error answers in the config's version"
    );
}

#[test]
fn environment_failures() {
    let stdin = config("1.0.0", http_mapping(), Some(prev_result("1.0.0")));
    /// (label, command, variable, value (None = unset), code, message needle)
    type EnvCase = (
        &'static str,
        &'static str,
        &'static str,
        Option<&'static str>,
        u32,
        &'static str,
    );
    let cases: Vec<EnvCase> = vec![
        (
            "no command",
            "ADD",
            "CNI_COMMAND",
            None,
            4,
            "CNI_COMMAND is not set",
        ),
        (
            "lower-case command",
            "ADD",
            "CNI_COMMAND",
            Some("add"),
            4,
            "CNI_COMMAND \"add\" is not a CNI verb",
        ),
        (
            "unknown command",
            "ADD",
            "CNI_COMMAND",
            Some("UPDATE"),
            4,
            "\"UPDATE\"",
        ),
        (
            "no container ID",
            "ADD",
            "CNI_CONTAINERID",
            None,
            4,
            "CNI_CONTAINERID is not set",
        ),
        (
            "empty container ID",
            "DEL",
            "CNI_CONTAINERID",
            Some(""),
            4,
            "CNI_CONTAINERID \"\"",
        ),
        (
            "container ID with slash",
            "ADD",
            "CNI_CONTAINERID",
            Some("a/../b"),
            4,
            "CNI_CONTAINERID \"a/../b\"",
        ),
        (
            "container ID starting with dot",
            "CHECK",
            "CNI_CONTAINERID",
            Some(".a"),
            4,
            "first character",
        ),
        (
            "no ifname",
            "ADD",
            "CNI_IFNAME",
            None,
            4,
            "CNI_IFNAME is not set",
        ),
        (
            "ifname too long",
            "DEL",
            "CNI_IFNAME",
            Some("abcdefghijklmnop"),
            4,
            "CNI_IFNAME \"abcdefghijklmnop\"",
        ),
        (
            "ifname with slash",
            "ADD",
            "CNI_IFNAME",
            Some("eth/0"),
            4,
            "CNI_IFNAME \"eth/0\"",
        ),
        ("ifname ..", "ADD", "CNI_IFNAME", Some(".."), 4, "reserved"),
        (
            "no CNI_PATH",
            "ADD",
            "CNI_PATH",
            None,
            4,
            "CNI_PATH is not set",
        ),
        (
            "no CNI_PATH on DEL",
            "DEL",
            "CNI_PATH",
            None,
            4,
            "CNI_PATH is not set",
        ),
        (
            "no netns on ADD",
            "ADD",
            "CNI_NETNS",
            None,
            4,
            "CNI_NETNS is not set",
        ),
        (
            "empty netns on ADD",
            "ADD",
            "CNI_NETNS",
            Some(""),
            4,
            "CNI_NETNS is not set",
        ),
        (
            "no netns on CHECK",
            "CHECK",
            "CNI_NETNS",
            None,
            4,
            "CNI_NETNS is not set",
        ),
        (
            "relative netns",
            "ADD",
            "CNI_NETNS",
            Some("proc/1/ns/net"),
            4,
            "not an absolute path",
        ),
        (
            "gone netns on ADD",
            "ADD",
            "CNI_NETNS",
            Some(GONE_NETNS),
            3,
            "container unknown or does not exist",
        ),
        (
            "gone netns on CHECK",
            "CHECK",
            "CNI_NETNS",
            Some(GONE_NETNS),
            3,
            GONE_NETNS,
        ),
    ];
    for (label, command, variable, value, code, needle) in cases {
        let mut plugin = RecordingPlugin::default();
        let mut env = attachment_env(command);
        set(&mut env, variable, value);
        let error = invoke(&env, &stdin, &mut plugin).error(code);
        let message = error["msg"].as_str().unwrap();
        assert!(
            message.contains(needle),
            "{label}: {message:?} should mention {needle:?}"
        );
        assert!(
            plugin.calls.is_empty(),
            "{label}: plugin must not be called: {:?}",
            plugin.calls
        );
    }
}

#[test]
fn undecodable_stdin_is_code_6_in_the_fallback_version() {
    let mut plugin = RecordingPlugin::default();
    let error = invoke(
        &attachment_env("ADD"),
        r#"{"cniVersion":"1.0.0","#,
        &mut plugin,
    )
    .error(code::DECODING_FAILURE);
    assert_eq!(
        error["cniVersion"], FALLBACK_VERSION,
        "config did not parse: fallback version"
    );
    assert!(
        !error["details"].as_str().unwrap().is_empty(),
        "parser position goes to details: {error}"
    );
    assert!(plugin.calls.is_empty(), "plugin must not be called");
}

#[test]
fn oversized_stdin_is_refused_without_reading_it_all() {
    let mut plugin = RecordingPlugin::default();
    // An endless reader: only the bound stops it.
    let mut endless = std::io::repeat(b' ');
    let error = invoke_with_reader(&attachment_env("ADD"), &mut endless, &mut plugin)
        .error(code::DECODING_FAILURE);
    assert!(
        error["msg"].as_str().unwrap().contains("1048576 bytes"),
        "{error}"
    );
    assert!(plugin.calls.is_empty(), "plugin must not be called");
}

#[test]
fn unreadable_stdin_is_an_io_failure() {
    struct Broken;
    impl Read for Broken {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("pipe broke"))
        }
    }
    let mut plugin = RecordingPlugin::default();
    let error = invoke_with_reader(&attachment_env("DEL"), &mut Broken, &mut plugin)
        .error(code::IO_FAILURE);
    assert_eq!(
        error["details"], "pipe broke",
        "the I/O error goes to details, not msg"
    );
    assert!(plugin.calls.is_empty(), "plugin must not be called");
}

#[test]
fn unwritable_stdout_fails_the_invocation() {
    struct Full;
    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk full"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut plugin = RecordingPlugin::default();
    let env: HashMap<&str, String> = attachment_env("ADD").into_iter().collect();
    let lookup = |name: &str| env.get(name).cloned();
    let stdin = config("1.0.0", http_mapping(), Some(prev_result("1.0.0")));
    let exit = run(&lookup, &mut stdin.as_bytes(), &mut Full, &mut plugin);
    assert_eq!(exit, 1, "a result the runtime never sees is a failure");
}

#[test]
fn cni_error_json_and_conversions() {
    let error = CniError::new(7, "bad", "why");
    assert_eq!(
        error.to_json("0.4.0"),
        json!({"cniVersion": "0.4.0", "code": 7, "msg": "bad", "details": "why"}),
        "error document has the four spec fields"
    );
    assert_eq!(
        error.to_string(),
        "CNI error 7: bad (why)",
        "Display shows code, msg and details"
    );

    let from_config: CniError = netconf::parse_netconf(b"[").unwrap_err().into();
    assert_eq!(
        from_config.code,
        code::DECODING_FAILURE,
        "invalid JSON maps to code 6"
    );
    assert!(
        !from_config.details.is_empty(),
        "serde's position must be in details"
    );
    assert!(
        !from_config.msg.contains(&from_config.details),
        "msg must not repeat details"
    );

    let from_request: CniError = RequestError::VersionTooOld {
        command: Command::Gc,
        version: "1.0.0".into(),
        minimum: "1.1.0",
    }
    .into();
    assert_eq!(
        from_request.code,
        code::INCOMPATIBLE_VERSION,
        "VersionTooOld maps to code 1"
    );
    assert_eq!(from_request.details, "", "no source, no details");
}

#[test]
fn cni_args_of_containerd_in_any_order_give_the_pod() {
    let pairs = [
        "IgnoreUnknown=1",
        "K8S_POD_NAMESPACE=default",
        "K8S_POD_NAME=web-7f9c",
        "K8S_POD_INFRA_CONTAINER_ID=3a1b2c3d4e5f",
        "K8S_POD_UID=5c9e8a4e-7d6b-4c1a-9a53-0f2f4e6b8c10",
    ];
    let expected = PodIdentity {
        pod_namespace: Some("default".into()),
        pod_name: Some("web-7f9c".into()),
        pod_uid: Some("5c9e8a4e-7d6b-4c1a-9a53-0f2f4e6b8c10".into()),
        ..Default::default()
    };
    // containerd builds CNI_ARGS from a Go map: every order happens.
    for rotation in 0..pairs.len() {
        let mut order = pairs.to_vec();
        order.rotate_left(rotation);
        order.swap(0, pairs.len() - 1);
        let (identity, warnings) = parse_cni_args(&order.join(";"));
        assert_eq!(identity, expected, "{order:?}");
        assert!(warnings.is_empty(), "{order:?}: {warnings:?}");
    }
    assert_eq!(expected.label().as_deref(), Some("default/web-7f9c"));
    assert_eq!(expected.to_string(), "pod default/web-7f9c");
}

#[test]
fn cni_args_of_nomad_give_the_allocation() {
    // What Nomad 1.8+ passes on ADD (custom network.cni.args come too).
    let (identity, warnings) = parse_cni_args(
        "IgnoreUnknown=true;NOMAD_REGION=global;NOMAD_NAMESPACE=default;NOMAD_JOB_ID=web;\
         NOMAD_GROUP_NAME=api;NOMAD_ALLOC_ID=5e0c1d2a-8f3b-4c6d-9e7f-0a1b2c3d4e5f;\
         CONSUL_IPTABLES_CONFIG={\"x\":1};my_arg=x",
    );
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        identity,
        PodIdentity {
            nomad_alloc_id: Some("5e0c1d2a-8f3b-4c6d-9e7f-0a1b2c3d4e5f".into()),
            nomad_namespace: Some("default".into()),
            nomad_job: Some("web".into()),
            nomad_group: Some("api".into()),
            ..Default::default()
        }
    );
    assert_eq!(identity.label().as_deref(), Some("nomad:default/web/api"));
    assert_eq!(
        identity.to_string(),
        "Nomad allocation 5e0c1d2a-8f3b-4c6d-9e7f-0a1b2c3d4e5f (job default/web, group api)"
    );
}

#[test]
fn bad_cni_args_are_warnings_and_the_rest_still_counts() {
    let long = "n".repeat(300);
    let (identity, warnings) = parse_cni_args(&format!(
        "garbage;=x;K8S_POD_NAMESPACE=prod;K8S_POD_NAME={long};;FOO=1;K8S_POD_NAME=a\u{7}b"
    ));
    assert_eq!(
        identity,
        PodIdentity {
            pod_namespace: Some("prod".into()),
            ..Default::default()
        },
        "the good pair is kept, the bad ones are not"
    );
    assert_eq!(
        warnings,
        vec![
            CniArgsWarning::Malformed {
                pair: "garbage".into()
            },
            CniArgsWarning::Malformed { pair: "=x".into() },
            CniArgsWarning::TooLong {
                key: "K8S_POD_NAME".into(),
                len: 300,
                max: POD_NAME_LEN
            },
            CniArgsWarning::ControlCharacter {
                key: "K8S_POD_NAME".into()
            },
            CniArgsWarning::Unknown { key: "FOO".into() },
        ]
    );
    let (identity, warnings) = parse_cni_args("");
    assert!(identity.is_empty() && warnings.is_empty());
    assert_eq!(identity.label(), None);
    // A later pair wins, and an empty value means absent.
    let (identity, _) = parse_cni_args("K8S_POD_NAME=a;K8S_POD_NAME=b;K8S_POD_NAMESPACE=");
    assert_eq!(identity.pod_name.as_deref(), Some("b"));
    assert_eq!(identity.pod_namespace, None);
    assert_eq!(identity.label().as_deref(), Some("-/b"));
}

#[test]
fn cni_args_reach_the_plugin_and_never_fail_a_verb() {
    for command in ["ADD", "DEL", "CHECK"] {
        let mut plugin = RecordingPlugin::default();
        let mut env = attachment_env(command);
        set(
            &mut env,
            "CNI_ARGS",
            Some("K8S_POD_NAME=web;bogus;K8S_POD_NAMESPACE=default;X=1"),
        );
        let stdin = config("1.0.0", http_mapping(), Some(prev_result("1.0.0")));
        let outcome = invoke(&env, &stdin, &mut plugin);
        assert_eq!(outcome.exit, 0, "{command}");
        let req = match plugin.only_call() {
            Call::Add(req) | Call::Del(req) | Call::Check(req) => req,
            other => panic!("{command}: {other:?}"),
        };
        assert_eq!(
            req.identity.label().as_deref(),
            Some("default/web"),
            "{command}"
        );
    }
}

/// The request containerd 1.6 sends (issue #13): Go field names and its CNI_ARGS.
#[test]
fn containerd_request_is_accepted() {
    let mut plugin = RecordingPlugin::default();
    let mut env = attachment_env("ADD");
    set(
        &mut env,
        "CNI_ARGS",
        Some(
            "K8S_POD_INFRA_CONTAINER_ID=3f6940ab5ab4;K8S_POD_UID=u;IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-7f9c",
        ),
    );
    let stdin = config(
        "1.0.0",
        json!([{"HostPort":18080,"ContainerPort":80,"Protocol":"tcp","HostIP":""}]),
        Some(prev_result("1.0.0")),
    );
    invoke(&env, &stdin, &mut plugin).success_document();
    let Call::Add(req) = plugin.only_call() else {
        panic!("ADD must call plugin.add")
    };
    assert_eq!(
        req.conf.port_mappings,
        vec![PortMapping {
            host_ip: HostIp::Any,
            host_port: 18080,
            container_port: 80,
            protocol: Protocol::Tcp
        }]
    );
    assert_eq!(req.identity.label().as_deref(), Some("default/web-7f9c"));
}

#[test]
fn commands_round_trip() {
    for command in [
        Command::Add,
        Command::Del,
        Command::Check,
        Command::Gc,
        Command::Status,
        Command::Version,
    ] {
        assert_eq!(
            Command::from_env_value(command.as_str()),
            Some(command),
            "{command}"
        );
    }
    assert_eq!(
        Command::from_env_value("Add"),
        None,
        "verbs are upper case only"
    );
}
