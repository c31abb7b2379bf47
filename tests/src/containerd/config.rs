//! containerd's files: its `config.toml` with everything under the test
//! directory, the conflist a user drops in, and what containerd says it
//! loaded.

use std::path::Path;

use serde_json::{Value, json};

use crate::plugins::PLUGIN_TYPE;
use crate::runtime::conf_dir::toml_string;
use crate::topology::{BRIDGE_NAME, POD_SUBNET4, POD_SUBNET6};

/// The image the driver imports when it starts: the pods' sandbox image (its
/// entrypoint is a static `pause`) and the image of every app container.
pub const IMAGE: &str = "localhost/epm-ctrd:1";
/// The CNI network (the conflist's `name`).
pub const NETWORK: &str = "epm-ctrd";
/// The Kubernetes namespace of every pod.
pub const POD_NAMESPACE: &str = "e2e";
/// The conflist's file in the CNI config directory.
pub const CONFLIST_FILE: &str = "10-epm-ctrd.conflist";

/// The conflist a user drops in: `bridge` + dual-stack `host-local` + the
/// port-mapping plugin with only the `portMappings` capability. ebpf-portmap
/// also gets `cgroupPath` (its default, the root of the cgroup2 hierarchy,
/// would hook every process of the machine); everything else is left to the
/// defaults, which the private mount namespace keeps on the node.
pub fn conflist(port_plugin_type: &str, hooks_cgroup: &Path, cni_version: &str) -> Value {
    let mut port_plugin =
        json!({ "type": port_plugin_type, "capabilities": { "portMappings": true } });
    if port_plugin_type == PLUGIN_TYPE {
        port_plugin["cgroupPath"] = Value::from(hooks_cgroup.to_string_lossy().into_owned());
    }
    json!({
        "cniVersion": cni_version,
        "name": NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE_NAME,
                "isGateway": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": POD_SUBNET4 }], [{ "subnet": POD_SUBNET6 }]],
                    "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }],
                },
            },
            port_plugin,
        ]
    })
}

/// containerd's `config.toml` (version 2) with everything under `root`.
pub fn config_toml(root: &Path) -> String {
    let path = |sub: &str| toml_string(&root.join(sub));
    format!(
        r#"version = 2
root = {root_dir}
state = {state}
# Snapshotters and tracing this test does not use: quieter, faster start.
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  restrict_oom_score_adj = true
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = {bin}
  conf_dir = {net_d}
  max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "/usr/sbin/runc"
  Root = {runc}
"#,
        root_dir = path("root"),
        state = path("state"),
        socket = path("containerd.sock"),
        ttrpc = path("containerd.sock.ttrpc"),
        opt = path("opt"),
        bin = path("bin"),
        net_d = path("net.d"),
        runc = path("runc"),
    )
}

/// The plugin types of every network in containerd's verbose `cniconfig`
/// (go-cni's `ConfigResult`: `Networks[].Config.Plugins[].Network.type`).
pub fn loaded_plugin_types(cniconfig: &Value) -> Vec<String> {
    cniconfig["Networks"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|network| {
            network["Config"]["Plugins"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .filter_map(|plugin| plugin["Network"]["type"].as_str().map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflists_are_the_minimal_drop_in() {
        let hooks = Path::new("/sys/fs/cgroup/unified/ct-ctrd-1-2/hooks");
        let ours = conflist("ebpf-portmap", hooks, "1.1.0");
        assert_eq!(ours["cniVersion"], "1.1.0");
        assert_eq!(ours["name"], NETWORK);
        assert_eq!(ours["plugins"][0]["type"], "bridge");
        assert_eq!(ours["plugins"][0]["ipam"]["type"], "host-local");
        assert_eq!(
            ours["plugins"][0]["ipam"]["ranges"],
            json!([[{ "subnet": "10.244.0.0/24" }], [{ "subnet": "fd44::/64" }]])
        );
        assert_eq!(
            ours["plugins"][1],
            json!({
                "type": "ebpf-portmap",
                "capabilities": { "portMappings": true },
                "cgroupPath": "/sys/fs/cgroup/unified/ct-ctrd-1-2/hooks",
            })
        );
        let upstream = conflist("portmap", hooks, "1.0.0");
        assert_eq!(upstream["cniVersion"], "1.0.0");
        assert_eq!(
            upstream["plugins"][1],
            json!({ "type": "portmap", "capabilities": { "portMappings": true } })
        );
        assert_eq!(upstream["plugins"][0], ours["plugins"][0]);
    }

    #[test]
    fn containerd_config_keeps_everything_under_the_test_dir() {
        let toml = config_toml(Path::new("/tmp/c"));
        for line in [
            "root = \"/tmp/c/root\"",
            "state = \"/tmp/c/state\"",
            "  address = \"/tmp/c/containerd.sock\"",
            "  address = \"/tmp/c/containerd.sock.ttrpc\"",
            "  path = \"/tmp/c/opt\"",
            "  bin_dir = \"/tmp/c/bin\"",
            "  conf_dir = \"/tmp/c/net.d\"",
            "  max_conf_num = 1",
            "  netns_mounts_under_state_dir = true",
            "  sandbox_image = \"localhost/epm-ctrd:1\"",
            "  SystemdCgroup = false",
            "  Root = \"/tmp/c/runc\"",
        ] {
            assert!(toml.lines().any(|l| l == line), "{line:?} missing:\n{toml}");
        }
    }

    #[test]
    fn loaded_plugin_types_come_from_cniconfig() {
        let cniconfig = json!({
            "PluginDirs": ["/tmp/c/bin"],
            "Networks": [
                { "Config": { "Name": "cni-loopback", "Plugins": [{ "Network": { "type": "loopback" } }] }, "IFName": "lo" },
                { "Config": { "Name": "epm-ctrd", "Plugins": [
                    { "Network": { "type": "bridge" } },
                    { "Network": { "type": "ebpf-portmap" } },
                ] }, "IFName": "eth0" },
            ]
        });
        assert_eq!(
            loaded_plugin_types(&cniconfig),
            ["loopback", "bridge", "ebpf-portmap"]
        );
        assert!(loaded_plugin_types(&Value::Null).is_empty());
    }
}
