//! What the operator tests (`tests/operator.rs`) run the verbs with: the
//! verbs run in a test world with their output read as JSON, the rows of
//! `list`, the plugin's log lines, a bounded wait for a condition, and the
//! attachments those tests hand the plugin (a fake owner with a hand-made
//! prevResult, a pod as containerd 1.6 passes it, the README's hand-run
//! example).

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::{ExitStatus, Output};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::topology::PLUGIN_LOG;
use crate::world::{World, fake_prev_result};
use crate::{Container, PortMapping, RuntimeAttachment};

/// Upper bound for anything that has to happen (a child exiting, the kernel
/// freeing a program); never a timing assertion.
pub const BOUND: Duration = Duration::from_secs(20);

/// Runs `ebpf-portmap <args> --pin-root <root>` in the node namespace.
pub fn op(world: &World, args: &[&str]) -> Output {
    world.operator(args)
}

/// [`op`], which must succeed: its stdout.
pub fn op_ok(world: &World, args: &[&str]) -> String {
    let out = op(world, args);
    assert!(
        out.status.success(),
        "ebpf-portmap {args:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// [`op_ok`], whose stdout must be JSON.
pub fn json_of(world: &World, args: &[&str]) -> Value {
    let text = op_ok(world, args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {text}"))
}

/// `status --json`: its exit status and the JSON it printed.
pub fn status_json(world: &World) -> (ExitStatus, Value) {
    let out = op(world, &["status", "--json"]);
    let status = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "status --json is not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status, status)
}

/// The `list --json` row of `host` (e.g. `0.0.0.0:8080/tcp`).
pub fn row<'a>(list: &'a Value, host: &str) -> &'a Value {
    list.as_array()
        .expect("list is an array")
        .iter()
        .find(|r| r["host"] == host)
        .unwrap_or_else(|| panic!("no row {host} in {list:#}"))
}

/// The `host` of every `list --json` row, in order.
pub fn hosts(list: &Value) -> Vec<String> {
    list.as_array()
        .expect("list is an array")
        .iter()
        .map(|r| r["host"].as_str().expect("host").to_owned())
        .collect()
}

/// `value[key]`, which must be a number.
pub fn num(value: &Value, key: &str) -> u64 {
    value[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a number in {value:#}"))
}

/// Waits until `condition` holds, up to [`BOUND`].
pub fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + BOUND;
    while !condition() {
        assert!(Instant::now() < deadline, "{what}: not within {BOUND:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The operator tests' world: [`World::bridge`].
pub fn tcx_world() -> World {
    World::bridge()
}

/// A fake owner for the plugin alone (hand-made prevResult).
pub fn fake_owner(
    world: &World,
    id: &str,
    last_octet: u8,
    mappings: &[PortMapping],
) -> (RuntimeAttachment, Value) {
    let netns = world.node.ns.path();
    let rt = RuntimeAttachment {
        container_id: id.to_owned(),
        netns_path: netns.to_path_buf(),
        ifname: "eth0".to_owned(),
        capability_args: json!({"portMappings": mappings.iter().map(PortMapping::to_json).collect::<Vec<_>>()}),
        cni_args: Vec::new(),
    };
    let prev = fake_prev_result(
        netns,
        "eth0",
        Some(IpAddr::V4(Ipv4Addr::new(10, 250, 0, last_octet))),
        None,
    );
    (rt, prev)
}

/// The lines of the plugin's log under `data_dir` (none when it has none yet).
pub fn log_lines(data_dir: &Path) -> Vec<String> {
    std::fs::read_to_string(data_dir.join(PLUGIN_LOG))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// What containerd 1.6 passes for a pod (issue #13): portMappings with Go
/// field names (`HostIP` always there, `""` when unset) and the pod in
/// CNI_ARGS, in the order a Go map gives.
pub fn containerd_pod(
    container: &Container,
    namespace: &str,
    pod: &str,
    host_port: u16,
) -> RuntimeAttachment {
    let mut rt = container.attachment(json!({"portMappings": [
        {"HostPort": host_port, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}
    ]}));
    rt.cni_args = vec![
        ("K8S_POD_INFRA_CONTAINER_ID".into(), container.id.clone()),
        (
            "K8S_POD_UID".into(),
            "5c9e8a4e-7d6b-4c1a-9a53-0f2f4e6b8c10".into(),
        ),
        ("IgnoreUnknown".into(), "1".into()),
        ("K8S_POD_NAMESPACE".into(), namespace.into()),
        ("K8S_POD_NAME".into(), pod.into()),
    ];
    rt
}

/// The `add.json` of the README's "One container, with only the binary"
/// (issue 38 item 15), as written: only the namespace path is this test's,
/// and its own pin root, cgroup and log are added. The topology is the
/// README's, built in this test's namespaces.
pub fn readme_hand_run_json() -> Value {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("read README.md");
    let section = readme
        .split_once("#### One container, with only the binary")
        .expect("the README's hand-run section")
        .1;
    let block = section
        .split_once("```json\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the section's add.json block")
        .0;
    serde_json::from_str(block).expect("add.json is JSON")
}
