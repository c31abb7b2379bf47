//! Unit tests of the parent module.

use super::*;
use crate::cni::port_mappings::check_mappings_reachable;
use crate::model::{ContainerAddrs, HostIp, Protocol};

/// A config with the required keys plus `extra` (which starts with a comma).
fn with(extra: &str) -> String {
    format!(r#"{{"cniVersion":"1.0.0","name":"podman","type":"ebpf-portmap"{extra}}}"#)
}

/// A config whose runtimeConfig.portMappings holds `entries`.
fn mappings(entries: &str) -> String {
    with(&format!(
        r#","runtimeConfig":{{"portMappings":[{entries}]}}"#
    ))
}

fn many_mappings(count: usize) -> String {
    many_mappings_within(count, "")
}

/// `count` entries, with `extra` keys of the plugin (e.g. `maxMappings`).
fn many_mappings_within(count: usize, extra: &str) -> String {
    let entries: Vec<String> = (0..count)
        .map(|i| format!(r#"{{"hostPort":{},"containerPort":80}}"#, 10000 + i))
        .collect();
    with(&format!(
        r#"{extra},"runtimeConfig":{{"portMappings":[{}]}}"#,
        entries.join(",")
    ))
}

enum Expect {
    /// Parses; the function checks the result.
    Valid(fn(&NetConf)),
    /// Fails with this CNI code and a message containing every needle.
    Invalid(u32, &'static [&'static str]),
}
use Expect::{Invalid, Valid};

fn mapping_count(expected: usize) -> impl Fn(&NetConf) {
    move |conf| {
        assert_eq!(
            conf.port_mappings.len(),
            expected,
            "mapping count of {conf:?}"
        );
    }
}

#[test]
fn parse_netconf_table() {
    let v = code::INCOMPATIBLE_VERSION;
    let d = code::DECODING_FAILURE;
    let c = code::INVALID_NETWORK_CONFIG;
    let rows: Vec<(&str, String, Expect)> = vec![
        // --- valid ---
        (
            "minimal config, no runtimeConfig",
            with(""),
            Valid(|conf| {
                assert!(conf.port_mappings.is_empty(), "no mappings expected");
                assert_eq!(
                    conf.pin_root,
                    PathBuf::from(DEFAULT_PIN_ROOT),
                    "default pin root"
                );
                assert_eq!(
                    (conf.name.as_str(), conf.plugin_type.as_str()),
                    ("podman", "ebpf-portmap"),
                    "name and type are carried over"
                );
                assert!(
                    conf.prev_result.is_none()
                        && conf.interfaces.is_none()
                        && conf.conntrack_size.is_none(),
                    "optional keys stay None when absent"
                );
                assert_eq!(
                    conf.service_vip_devices,
                    ["kube-ipvs0"],
                    "kube-proxy's IPVS device holds Service VIPs by default"
                );
            }),
        ),
        (
            "one full mapping",
            mappings(
                r#"{"hostPort":8080,"containerPort":80,"protocol":"udp","hostIP":"192.0.2.1"}"#,
            ),
            Valid(|conf| {
                assert_eq!(
                    conf.port_mappings,
                    vec![PortMapping {
                        host_ip: HostIp::Addr("192.0.2.1".parse().unwrap()),
                        host_port: 8080,
                        container_port: 80,
                        protocol: Protocol::Udp,
                    }],
                    "the entry must be carried over field by field"
                );
            }),
        ),
        (
            "protocol is case-insensitive",
            mappings(r#"{"hostPort":1,"containerPort":65535,"protocol":"SCTP"}"#),
            Valid(|conf| {
                assert_eq!(
                    conf.port_mappings[0].protocol,
                    Protocol::Sctp,
                    "SCTP must parse as sctp"
                );
            }),
        ),
        (
            "absent protocol and hostIP default to tcp on every address",
            mappings(r#"{"hostPort":80,"containerPort":80}"#),
            Valid(|conf| {
                assert_eq!(
                    (
                        conf.port_mappings[0].protocol,
                        conf.port_mappings[0].host_ip
                    ),
                    (Protocol::Tcp, HostIp::Any),
                    "absent protocol/hostIP must mean tcp on every address"
                );
            }),
        ),
        (
            "empty protocol and hostIP (Go zero values) mean the defaults",
            mappings(r#"{"hostPort":80,"containerPort":80,"protocol":"","hostIP":""}"#),
            Valid(|conf| {
                assert_eq!(
                    (
                        conf.port_mappings[0].protocol,
                        conf.port_mappings[0].host_ip
                    ),
                    (Protocol::Tcp, HostIp::Any),
                    "empty protocol/hostIP must mean tcp on every address"
                );
            }),
        ),
        (
            "null hostIP is absent",
            mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":null}"#),
            Valid(|conf| {
                assert_eq!(
                    conf.port_mappings[0].host_ip,
                    HostIp::Any,
                    "null must mean every address"
                );
            }),
        ),
        (
            "0.0.0.0 and :: are family wildcards",
            mappings(
                r#"{"hostPort":80,"containerPort":80,"hostIP":"0.0.0.0"},{"hostPort":80,"containerPort":80,"hostIP":"::"}"#,
            ),
            Valid(|conf| {
                assert_eq!(
                    conf.port_mappings[0].host_ip,
                    HostIp::AnyV4,
                    "0.0.0.0 is every IPv4 address"
                );
                assert_eq!(
                    conf.port_mappings[1].host_ip,
                    HostIp::AnyV6,
                    ":: is every IPv6 address"
                );
            }),
        ),
        (
            "IPv4-mapped IPv6 hostIP becomes IPv4",
            mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":"::ffff:198.51.100.7"}"#),
            Valid(|conf| {
                assert_eq!(
                    conf.port_mappings[0].host_ip,
                    HostIp::Addr("198.51.100.7".parse().unwrap()),
                    "::ffff:a.b.c.d must be normalised"
                );
            }),
        ),
        (
            "same hostPort, different protocols",
            mappings(
                r#"{"hostPort":53,"containerPort":53,"protocol":"tcp"},{"hostPort":53,"containerPort":53,"protocol":"udp"}"#,
            ),
            Valid(|conf| mapping_count(2)(conf)),
        ),
        (
            "same hostPort, different explicit hostIPs",
            mappings(
                r#"{"hostPort":80,"containerPort":80,"hostIP":"192.0.2.1"},{"hostPort":80,"containerPort":81,"hostIP":"192.0.2.2"}"#,
            ),
            Valid(|conf| mapping_count(2)(conf)),
        ),
        (
            "IPv4 wildcard next to a specific IPv6 address",
            mappings(
                r#"{"hostPort":80,"containerPort":80,"hostIP":"0.0.0.0"},{"hostPort":80,"containerPort":81,"hostIP":"2001:db8::2"}"#,
            ),
            Valid(|conf| mapping_count(2)(conf)),
        ),
        (
            "wildcard next to a specific address of another protocol",
            mappings(
                r#"{"hostPort":80,"containerPort":80},{"hostPort":80,"containerPort":81,"hostIP":"192.0.2.2","protocol":"udp"}"#,
            ),
            Valid(|conf| mapping_count(2)(conf)),
        ),
        (
            "IPv4 wildcard next to IPv6 wildcard",
            mappings(
                r#"{"hostPort":80,"containerPort":80,"hostIP":"0.0.0.0"},{"hostPort":80,"containerPort":81,"hostIP":"::"}"#,
            ),
            Valid(|conf| mapping_count(2)(conf)),
        ),
        (
            "unknown keys everywhere are ignored",
            with(
                r#","capabilities":{"portMappings":true},"args":{"x":1},"runtimeConfig":{"bandwidth":{},"portMappings":[{"hostPort":80,"containerPort":80,"range":1,"podman":"x"}]}"#,
            ),
            Valid(|conf| mapping_count(1)(conf)),
        ),
        (
            "runtimeConfig without portMappings",
            with(r#","runtimeConfig":{}"#),
            Valid(|conf| mapping_count(0)(conf)),
        ),
        (
            "empty portMappings",
            mappings(""),
            Valid(|conf| mapping_count(0)(conf)),
        ),
        (
            "podman's -p 10000-12000:10000-12000",
            many_mappings(2001),
            Valid(|conf| mapping_count(2001)(conf)),
        ),
        (
            "exactly maxMappings entries",
            many_mappings_within(16, r#","maxMappings":16"#),
            Valid(|conf| mapping_count(16)(conf)),
        ),
        (
            "our own keys, valid",
            with(
                r#","pinRoot":"/run/bpf/pm","interfaces":["eth0","bond0.100","en*"],"conntrackSize":65536"#,
            ),
            Valid(|conf| {
                assert_eq!(conf.pin_root, PathBuf::from("/run/bpf/pm"), "pinRoot");
                assert_eq!(
                    conf.interfaces.as_deref(),
                    Some(
                        &[
                            "eth0".to_string(),
                            "bond0.100".to_string(),
                            "en*".to_string()
                        ][..]
                    ),
                    "interfaces"
                );
                assert_eq!(conf.conntrack_size, Some(65536), "conntrackSize");
            }),
        ),
        (
            "logFile default",
            with(""),
            Valid(|conf| {
                assert_eq!(
                    conf.log_file,
                    PathBuf::from(DEFAULT_LOG_FILE),
                    "default logFile"
                );
            }),
        ),
        (
            "logFile set",
            with(r#","logFile":"/var/log/cni/portmap.log""#),
            Valid(|conf| {
                assert_eq!(
                    conf.log_file,
                    PathBuf::from("/var/log/cni/portmap.log"),
                    "logFile"
                );
            }),
        ),
        (
            "logFile relative",
            with(r#","logFile":"portmap.log""#),
            Invalid(
                code::INVALID_NETWORK_CONFIG,
                &["logFile: \"portmap.log\" is not an absolute path"],
            ),
        ),
        (
            "logFile a directory",
            with(r#","logFile":"/var/log/""#),
            Invalid(
                code::INVALID_NETWORK_CONFIG,
                &["logFile: \"/var/log/\" names a directory"],
            ),
        ),
        (
            "logFile dot-dot",
            with(r#","logFile":"/var/log/..""#),
            Invalid(code::INVALID_NETWORK_CONFIG, &["names a directory"]),
        ),
        (
            "logFile not a string",
            with(r#","logFile":42"#),
            Invalid(
                code::INVALID_NETWORK_CONFIG,
                &["logFile: expected a string, found a number"],
            ),
        ),
        (
            "every supported version",
            with("").replace("1.0.0", "0.3.0"),
            Valid(|conf| assert_eq!(conf.cni_version, "0.3.0", "0.3.0 is supported")),
        ),
        (
            "prevResult kept raw",
            with(r#","prevResult":{"cniVersion":"1.0.0","ips":[]}"#),
            Valid(|conf| {
                assert_eq!(
                    conf.prev_result,
                    Some(serde_json::json!({"cniVersion":"1.0.0","ips":[]})),
                    "prevResult must be kept as given"
                );
            }),
        ),
        (
            "GC keep-list",
            with(r#","cni.dev/valid-attachments":[{"containerID":"abc","ifname":"eth0"}]"#),
            Valid(|conf| {
                assert_eq!(
                    conf.valid_attachments,
                    Some(vec![Attachment {
                        container_id: "abc".into(),
                        ifname: "eth0".into()
                    }]),
                    "keep-list entries are carried over"
                );
            }),
        ),
        (
            "GC keep-list under the legacy key",
            with(r#","cni.dev/attachments":[{"containerID":"abc","ifname":"eth0"}]"#),
            Valid(|conf| {
                assert_eq!(
                    conf.valid_attachments.as_ref().map(Vec::len),
                    Some(1),
                    "legacy key must be read"
                );
            }),
        ),
        // --- invalid: decoding and version ---
        (
            "truncated JSON",
            r#"{"cniVersion":"1.0.0","name":"#.to_string(),
            Invalid(d, &["not valid JSON"]),
        ),
        (
            "empty stdin",
            String::new(),
            Invalid(d, &["not valid JSON"]),
        ),
        (
            "top level is an array",
            "[]".to_string(),
            Invalid(d, &["JSON object", "an array"]),
        ),
        (
            "cniVersion missing",
            r#"{"name":"n","type":"t"}"#.to_string(),
            Invalid(v, &["cniVersion is missing"]),
        ),
        (
            "cniVersion unsupported",
            with("").replace("1.0.0", "0.2.0"),
            Invalid(v, &["cniVersion \"0.2.0\"", "1.1.0"]),
        ),
        (
            "cniVersion not a string",
            r#"{"cniVersion":1,"name":"n","type":"t"}"#.to_string(),
            Invalid(v, &["cniVersion 1 "]),
        ),
        // --- invalid: required keys ---
        (
            "name missing",
            r#"{"cniVersion":"1.0.0","type":"t"}"#.to_string(),
            Invalid(c, &["name is missing"]),
        ),
        (
            "name not a string",
            r#"{"cniVersion":"1.0.0","name":7,"type":"t"}"#.to_string(),
            Invalid(c, &["name: expected a string, found a number"]),
        ),
        (
            "name breaks the spec's rule",
            r#"{"cniVersion":"1.0.0","name":"-net","type":"t"}"#.to_string(),
            Invalid(c, &["name: \"-net\"", "first character"]),
        ),
        (
            "type missing",
            r#"{"cniVersion":"1.0.0","name":"n"}"#.to_string(),
            Invalid(c, &["type is missing"]),
        ),
        (
            "type empty",
            r#"{"cniVersion":"1.0.0","name":"n","type":""}"#.to_string(),
            Invalid(c, &["type must not be empty"]),
        ),
        // --- invalid: runtimeConfig shape ---
        (
            "runtimeConfig not an object",
            with(r#","runtimeConfig":[]"#),
            Invalid(c, &["runtimeConfig: expected an object, found an array"]),
        ),
        (
            "portMappings not an array",
            with(r#","runtimeConfig":{"portMappings":{"hostPort":80}}"#),
            Invalid(c, &["runtimeConfig.portMappings: expected an array"]),
        ),
        (
            "entry not an object",
            mappings(r#"{"hostPort":80,"containerPort":80},"80:80""#),
            Invalid(
                c,
                &["runtimeConfig.portMappings[1]: expected an object, found a string"],
            ),
        ),
        (
            "more entries than maxMappings",
            many_mappings_within(17, r#","maxMappings":16"#),
            Invalid(
                c,
                &[
                    "runtimeConfig.portMappings has 17 entries",
                    "maxMappings 16",
                ],
            ),
        ),
        // --- invalid: ports ---
        (
            "hostPort missing",
            mappings(r#"{"containerPort":80}"#),
            Invalid(c, &["runtimeConfig.portMappings[0].hostPort is missing"]),
        ),
        (
            "hostPort zero",
            mappings(r#"{"hostPort":0,"containerPort":80}"#),
            Invalid(
                c,
                &["runtimeConfig.portMappings[0].hostPort: 0 is out of range 1-65535"],
            ),
        ),
        (
            "hostPort too large, third entry",
            mappings(
                r#"{"hostPort":1,"containerPort":1},{"hostPort":2,"containerPort":2},{"hostPort":70000,"containerPort":80}"#,
            ),
            Invalid(
                c,
                &["runtimeConfig.portMappings[2].hostPort: 70000 is out of range 1-65535"],
            ),
        ),
        (
            "hostPort negative",
            mappings(r#"{"hostPort":-80,"containerPort":80}"#),
            Invalid(
                c,
                &["runtimeConfig.portMappings[0].hostPort: -80 is out of range"],
            ),
        ),
        (
            "hostPort float",
            mappings(r#"{"hostPort":80.5,"containerPort":80}"#),
            Invalid(
                c,
                &["runtimeConfig.portMappings[0].hostPort: 80.5 is not an integer"],
            ),
        ),
        (
            "hostPort float with zero fraction",
            mappings(r#"{"hostPort":80.0,"containerPort":80}"#),
            Invalid(
                c,
                &["runtimeConfig.portMappings[0].hostPort: 80.0 is not an integer"],
            ),
        ),
        (
            "hostPort string",
            mappings(r#"{"hostPort":"80","containerPort":80}"#),
            Invalid(
                c,
                &["runtimeConfig.portMappings[0].hostPort: expected an integer, found a string"],
            ),
        ),
        (
            "containerPort too large",
            mappings(r#"{"hostPort":80,"containerPort":65536}"#),
            Invalid(
                c,
                &["runtimeConfig.portMappings[0].containerPort: 65536 is out of range"],
            ),
        ),
        (
            "containerPort missing",
            mappings(r#"{"hostPort":80}"#),
            Invalid(
                c,
                &["runtimeConfig.portMappings[0].containerPort is missing"],
            ),
        ),
        (
            "huge integer port",
            mappings(r#"{"hostPort":18446744073709551615,"containerPort":80}"#),
            Invalid(c, &["[0].hostPort: 18446744073709551615 is out of range"]),
        ),
        // --- invalid: protocol ---
        (
            "unknown protocol",
            mappings(
                r#"{"hostPort":80,"containerPort":80},{"hostPort":81,"containerPort":80,"protocol":"icmp"}"#,
            ),
            Invalid(
                c,
                &[
                    "runtimeConfig.portMappings[1].protocol: \"icmp\"",
                    "tcp, udp or sctp",
                ],
            ),
        ),
        (
            "protocol with whitespace",
            mappings(r#"{"hostPort":80,"containerPort":80,"protocol":" tcp"}"#),
            Invalid(c, &["[0].protocol: \" tcp\""]),
        ),
        (
            "protocol as a number",
            mappings(r#"{"hostPort":80,"containerPort":80,"protocol":6}"#),
            Invalid(
                c,
                &["runtimeConfig.portMappings[0].protocol: expected a string, found a number"],
            ),
        ),
        (
            "combined protocol list",
            mappings(r#"{"hostPort":80,"containerPort":80,"protocol":"tcp,udp"}"#),
            Invalid(c, &["[0].protocol: \"tcp,udp\""]),
        ),
        // --- invalid: hostIP ---
        (
            "hostIP not an address",
            mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":"1.2.3"}"#),
            Invalid(
                c,
                &["runtimeConfig.portMappings[0].hostIP: \"1.2.3\" is not an IP address"],
            ),
        ),
        (
            "hostIP with zone",
            mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":"fe80::1%eth0"}"#),
            Invalid(c, &["[0].hostIP: \"fe80::1%eth0\""]),
        ),
        (
            "hostIP as a number",
            mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":16909060}"#),
            Invalid(
                c,
                &["runtimeConfig.portMappings[0].hostIP: expected a string"],
            ),
        ),
        (
            "hostIP multicast",
            mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":"ff02::1"}"#),
            Invalid(
                c,
                &["runtimeConfig.portMappings[0].hostIP: ff02::1 is a multicast address"],
            ),
        ),
        (
            "hostIP link-local IPv4",
            mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":"169.254.10.1"}"#),
            Invalid(
                c,
                &["runtimeConfig.portMappings[0].hostIP: 169.254.10.1 is link-local"],
            ),
        ),
        (
            "hostIP link-local IPv6",
            mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":"fe80::1"}"#),
            Invalid(
                c,
                &["runtimeConfig.portMappings[0].hostIP: fe80::1 is link-local"],
            ),
        ),
        (
            "hostIP broadcast",
            mappings(r#"{"hostPort":80,"containerPort":80,"hostIP":"255.255.255.255"}"#),
            Invalid(c, &["[0].hostIP: 255.255.255.255 is the broadcast address"]),
        ),
        // --- invalid: duplicates ---
        (
            "IPv4 wildcard next to a specific IPv4 address",
            mappings(
                r#"{"hostPort":80,"containerPort":80,"hostIP":"0.0.0.0"},{"hostPort":80,"containerPort":81,"hostIP":"192.0.2.2"}"#,
            ),
            Invalid(
                c,
                &[
                    "runtimeConfig.portMappings[1] overlaps runtimeConfig.portMappings[0]",
                    "tcp port 80 on 192.0.2.2 is part of every local IPv4 address",
                ],
            ),
        ),
        (
            "specific IPv6 address before every address",
            mappings(
                r#"{"hostPort":80,"containerPort":81,"hostIP":"2001:db8::2"},{"hostPort":80,"containerPort":80}"#,
            ),
            Invalid(
                c,
                &[
                    "runtimeConfig.portMappings[0] overlaps runtimeConfig.portMappings[1]",
                    "every local IPv6 address",
                ],
            ),
        ),
        (
            "same port twice on every address",
            mappings(r#"{"hostPort":80,"containerPort":80},{"hostPort":80,"containerPort":81}"#),
            Invalid(
                c,
                &[
                    "runtimeConfig.portMappings[1] duplicates runtimeConfig.portMappings[0]",
                    "tcp port 80",
                ],
            ),
        ),
        (
            "every address overlaps 0.0.0.0",
            mappings(
                r#"{"hostPort":8,"containerPort":8},{"hostPort":80,"containerPort":80},{"hostPort":80,"containerPort":81,"hostIP":"0.0.0.0"}"#,
            ),
            Invalid(
                c,
                &[
                    "portMappings[2] duplicates runtimeConfig.portMappings[1]",
                    "every local IPv4 address",
                ],
            ),
        ),
        (
            "every address overlaps ::",
            mappings(
                r#"{"hostPort":80,"containerPort":81,"hostIP":"::","protocol":"udp"},{"hostPort":80,"containerPort":80,"protocol":"UDP"}"#,
            ),
            Invalid(
                c,
                &[
                    "portMappings[1] duplicates runtimeConfig.portMappings[0]",
                    "udp port 80 on every local IPv6 address",
                ],
            ),
        ),
        (
            "same address spelled two ways",
            mappings(
                r#"{"hostPort":80,"containerPort":80,"hostIP":"192.0.2.1"},{"hostPort":80,"containerPort":81,"hostIP":"::ffff:192.0.2.1"}"#,
            ),
            Invalid(
                c,
                &[
                    "portMappings[1] duplicates runtimeConfig.portMappings[0]",
                    "on 192.0.2.1",
                ],
            ),
        ),
        (
            "default protocol equals explicit tcp",
            mappings(
                r#"{"hostPort":80,"containerPort":80},{"hostPort":80,"containerPort":80,"protocol":"TCP"}"#,
            ),
            Invalid(
                c,
                &["portMappings[1] duplicates runtimeConfig.portMappings[0]"],
            ),
        ),
        // --- invalid: our own keys ---
        (
            "pinRoot relative",
            with(r#","pinRoot":"bpf/pm""#),
            Invalid(c, &["pinRoot: \"bpf/pm\" is not an absolute path"]),
        ),
        (
            "pinRoot with ..",
            with(r#","pinRoot":"/sys/fs/bpf/../pm""#),
            Invalid(c, &["pinRoot: \"/sys/fs/bpf/../pm\"", "\"..\""]),
        ),
        (
            "pinRoot with .",
            with(r#","pinRoot":"/sys/fs/bpf/./pm""#),
            Invalid(c, &["pinRoot:", "component"]),
        ),
        (
            "pinRoot not a string",
            with(r#","pinRoot":true"#),
            Invalid(c, &["pinRoot: expected a string, found a boolean"]),
        ),
        (
            "interfaces not an array",
            with(r#","interfaces":"eth0""#),
            Invalid(c, &["interfaces: expected an array"]),
        ),
        (
            "interfaces empty",
            with(r#","interfaces":[]"#),
            Invalid(c, &["interfaces must list at least one"]),
        ),
        (
            "interface name with slash",
            with(r#","interfaces":["eth0","a/b"]"#),
            Invalid(c, &["interfaces[1]: \"a/b\"", "'/'"]),
        ),
        (
            "interface name too long",
            with(r#","interfaces":["abcdefghijklmnop"]"#),
            Invalid(c, &["interfaces[0]", "16 bytes"]),
        ),
        (
            "interface name not a string",
            with(r#","interfaces":["eth0",1]"#),
            Invalid(c, &["interfaces[1]: expected a string, found a number"]),
        ),
        (
            "interface pattern with an unclosed class",
            with(r#","interfaces":["eth*","eth[0"]"#),
            Invalid(
                c,
                &["interfaces[1]: \"eth[0\" is not a valid interface pattern"],
            ),
        ),
        (
            "interface listed twice",
            with(r#","interfaces":["eth0","eth1","eth0"]"#),
            Invalid(c, &["interfaces[2] repeats \"eth0\" from interfaces[0]"]),
        ),
        (
            "serviceVipDevices, names and patterns",
            with(r#","serviceVipDevices":["kube-ipvs0","vip-*"]"#),
            Valid(|conf| assert_eq!(conf.service_vip_devices, ["kube-ipvs0", "vip-*"])),
        ),
        (
            "serviceVipDevices empty: none",
            with(r#","serviceVipDevices":[]"#),
            Valid(|conf| assert!(conf.service_vip_devices.is_empty())),
        ),
        (
            "serviceVipDevices null: the default",
            with(r#","serviceVipDevices":null"#),
            Valid(|conf| assert_eq!(conf.service_vip_devices, ["kube-ipvs0"])),
        ),
        (
            "serviceVipDevices not an array",
            with(r#","serviceVipDevices":"kube-ipvs0""#),
            Invalid(c, &["serviceVipDevices: expected an array"]),
        ),
        (
            "serviceVipDevices with a bad name",
            with(r#","serviceVipDevices":["kube/ipvs0"]"#),
            Invalid(c, &["serviceVipDevices[0]: \"kube/ipvs0\"", "'/'"]),
        ),
        (
            "serviceVipDevices repeats a device",
            with(r#","serviceVipDevices":["kube-ipvs0","kube-ipvs0"]"#),
            Invalid(
                c,
                &["serviceVipDevices[1] repeats \"kube-ipvs0\" from serviceVipDevices[0]"],
            ),
        ),
        (
            "conntrackSize too small",
            with(r#","conntrackSize":10"#),
            Invalid(c, &["conntrackSize: 10 is out of range 1024-16777216"]),
        ),
        (
            "conntrackSize too large",
            with(r#","conntrackSize":16777217"#),
            Invalid(c, &["conntrackSize: 16777217 is out of range"]),
        ),
        (
            "maxMappings too small",
            with(r#","maxMappings":8"#),
            Invalid(c, &["maxMappings: 8 is out of range 16-1048576"]),
        ),
        (
            "maxMappings not an integer",
            with(r#","maxMappings":"many""#),
            Invalid(c, &["maxMappings"]),
        ),
        (
            "snat not a bool",
            with(r#","snat":"yes""#),
            Invalid(c, &["snat", "true or false"]),
        ),
        (
            "masqAll not a bool",
            with(r#","masqAll":1"#),
            Invalid(c, &["masqAll"]),
        ),
        (
            "fastPath not a bool",
            with(r#","fastPath":"on""#),
            Invalid(c, &["fastPath"]),
        ),
        (
            "fastPath a string that reads like a bool",
            with(r#","fastPath":"yes""#),
            Invalid(c, &["fastPath: \"yes\" is not true or false"]),
        ),
        (
            "fastPath unset: the confirmed-flow default",
            with(""),
            Valid(|conf| assert_eq!(conf.fast_path, FastPathSetting::Confirmed)),
        ),
        (
            "fastPath null: as unset",
            with(r#","fastPath":null"#),
            Valid(|conf| assert_eq!(conf.fast_path, FastPathSetting::Confirmed)),
        ),
        (
            "fastPath true: always",
            with(r#","fastPath":true"#),
            Valid(|conf| assert_eq!(conf.fast_path, FastPathSetting::Always)),
        ),
        (
            "fastPath false: never",
            with(r#","fastPath":false"#),
            Valid(|conf| assert_eq!(conf.fast_path, FastPathSetting::Never)),
        ),
        (
            "containerSockets not a bool",
            with(r#","containerSockets":"yes""#),
            Invalid(c, &["containerSockets: \"yes\" is not true or false"]),
        ),
        (
            "containerSockets on",
            with(r#","containerSockets":true"#),
            Valid(|conf| assert!(conf.container_sockets, "containerSockets: true")),
        ),
        (
            "containerSockets off by default",
            with(""),
            Valid(|conf| {
                assert!(
                    !conf.container_sockets,
                    "containerSockets defaults to false"
                );
            }),
        ),
        (
            "cgroupPath relative",
            with(r#","cgroupPath":"sys/fs/cgroup""#),
            Invalid(c, &["cgroupPath", "absolute"]),
        ),
        (
            "hostPortListeners unknown",
            with(r#","hostPortListeners":"sometimes""#),
            Invalid(c, &["hostPortListeners", "refuse", "allow"]),
        ),
        (
            "hostPortListeners wrong type",
            with(r#","hostPortListeners":true"#),
            Invalid(c, &["hostPortListeners"]),
        ),
        (
            "conntrackSize negative",
            with(r#","conntrackSize":-1"#),
            Invalid(c, &["conntrackSize: -1 is out of range"]),
        ),
        (
            "conntrackSize float",
            with(r#","conntrackSize":2048.5"#),
            Invalid(c, &["conntrackSize: 2048.5 is not an integer"]),
        ),
        (
            "conntrackSize string",
            with(r#","conntrackSize":"64k""#),
            Invalid(c, &["conntrackSize: expected an integer, found a string"]),
        ),
        // --- invalid: prevResult and GC keep-list ---
        (
            "prevResult not an object",
            with(r#","prevResult":"10.0.0.2""#),
            Invalid(c, &["prevResult: expected an object, found a string"]),
        ),
        (
            "keep-list not an array",
            with(r#","cni.dev/valid-attachments":{}"#),
            Invalid(c, &["cni.dev/valid-attachments: expected an array"]),
        ),
        (
            "keep-list entry without ifname",
            with(r#","cni.dev/valid-attachments":[{"containerID":"a"}]"#),
            Invalid(c, &["cni.dev/valid-attachments[0].ifname is missing"]),
        ),
        (
            "keep-list containerID not a string",
            with(
                r#","cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"},{"containerID":1,"ifname":"eth0"}]"#,
            ),
            Invalid(
                c,
                &["cni.dev/valid-attachments[1].containerID: expected a string"],
            ),
        ),
        (
            "keep-list entry not an object",
            with(r#","cni.dev/valid-attachments":["a"]"#),
            Invalid(c, &["cni.dev/valid-attachments[0]: expected an object"]),
        ),
    ];
    assert!(rows.len() >= 30, "the table must keep at least 30 rows");

    for (label, input, expect) in rows {
        let result = parse_netconf(input.as_bytes());
        match (expect, result) {
            (Valid(check), Ok(conf)) => check(&conf),
            (Valid(_), Err(error)) => {
                panic!("{label}: expected a valid config, got error: {error}")
            }
            (Invalid(code, _), Ok(conf)) => {
                panic!("{label}: expected error code {code}, but it parsed: {conf:?}")
            }
            (Invalid(code, needles), Err(error)) => {
                assert_eq!(
                    error.cni_code(),
                    code,
                    "{label}: wrong CNI code for error: {error}"
                );
                let message = error.to_string();
                for needle in needles {
                    assert!(
                        message.contains(needle),
                        "{label}: message {message:?} should mention {needle:?}"
                    );
                }
            }
        }
    }
}

/// What containerd 1.6 (through go-cni) sends: Go field names, HostIP
/// always present and "" when unset.
const CONTAINERD_MAPPINGS: &str = r#"{"HostPort":18080,"ContainerPort":80,"Protocol":"tcp","HostIP":""},{"HostPort":18443,"ContainerPort":443,"Protocol":"TCP","HostIP":"192.0.2.7"}"#;

#[test]
fn every_runtime_spelling_parses_to_the_same_mapping() {
    let expected = vec![
        PortMapping {
            host_ip: HostIp::Any,
            host_port: 18080,
            container_port: 80,
            protocol: Protocol::Tcp,
        },
        PortMapping {
            host_ip: HostIp::Addr("192.0.2.7".parse().unwrap()),
            host_port: 18443,
            container_port: 443,
            protocol: Protocol::Tcp,
        },
    ];
    let cases = [
        ("containerd and Nomad (go-cni)", CONTAINERD_MAPPINGS.to_owned()),
        (
            "CRI-O (ocicni json tags)",
            r#"{"hostPort":18080,"containerPort":80,"protocol":"tcp","hostIP":""},{"hostPort":18443,"containerPort":443,"protocol":"TCP","hostIP":"192.0.2.7"}"#.to_owned(),
        ),
        (
            "podman and libcni (camelCase, hostIP omitted when unset)",
            r#"{"hostPort":18080,"containerPort":80,"protocol":"tcp"},{"hostPort":18443,"containerPort":443,"protocol":"tcp","hostIP":"192.0.2.7"}"#.to_owned(),
        ),
    ];
    for (who, entries) in cases {
        let conf = parse_netconf(mappings(&entries).as_bytes())
            .unwrap_or_else(|error| panic!("{who}: {error}"));
        assert_eq!(conf.port_mappings, expected, "{who}");
    }
}

#[test]
fn every_key_we_read_matches_case_insensitively() {
    let input = r#"{"CNIVERSION":"1.0.0","Name":"k8s","Type":"ebpf-portmap",
        "PinRoot":"/sys/fs/bpf/x","Interfaces":["eth0"],"ConntrackSize":4096,
        "LogFile":"/tmp/x.log","MaxMappings":64,"HostPortListeners":"allow",
        "SNAT":false,"MasqAll":true,"FastPath":true,"ContainerSockets":true,"CgroupPath":"/sys/fs/cgroup/x",
        "RuntimeConfig":{"PortMappings":[{"HostPort":1,"ContainerPort":2}]},
        "PrevResult":{"IPs":[{"Address":"10.0.0.2/24","Interface":0}],
                      "Interfaces":[{"Name":"eth0","Sandbox":"/proc/1/ns/net"}]},
        "CNI.DEV/VALID-ATTACHMENTS":[{"ContainerID":"a","IfName":"eth0"}]}"#;
    let conf = parse_netconf(input.as_bytes()).unwrap();
    assert_eq!(
        (conf.cni_version.as_str(), conf.name.as_str()),
        ("1.0.0", "k8s")
    );
    assert_eq!(conf.pin_root, PathBuf::from("/sys/fs/bpf/x"));
    assert_eq!(conf.interfaces, Some(vec!["eth0".to_owned()]));
    assert_eq!(
        (conf.conntrack_size, conf.max_mappings),
        (Some(4096), Some(64))
    );
    assert_eq!(conf.log_file, PathBuf::from("/tmp/x.log"));
    assert_eq!(conf.listener_policy, ListenerPolicy::Allow);
    assert_eq!(
        (
            conf.snat,
            conf.masq_all,
            conf.fast_path,
            conf.container_sockets
        ),
        (false, true, FastPathSetting::Always, true)
    );
    assert_eq!(conf.cgroup_path, Some(PathBuf::from("/sys/fs/cgroup/x")));
    assert_eq!(conf.port_mappings.len(), 1);
    assert_eq!(
        conf.valid_attachments,
        Some(vec![Attachment {
            container_id: "a".into(),
            ifname: "eth0".into()
        }])
    );
    let addrs =
        crate::cni::prev_result::PrevResult::parse(conf.prev_result.as_ref().unwrap(), "eth0")
            .unwrap()
            .container;
    assert_eq!(
        addrs.v4,
        Some("10.0.0.2".parse().unwrap()),
        "prevResult keys fold too"
    );
    assert_eq!(log_file_of(input.as_bytes()), PathBuf::from("/tmp/x.log"));
    assert_eq!(cni_version_of(input.as_bytes()).as_deref(), Some("1.0.0"));
}

#[test]
fn errors_name_the_key_as_the_user_wrote_it() {
    let cases = [
        (
            mappings(r#"{"HostPort":0,"ContainerPort":80}"#),
            "runtimeConfig.portMappings[0].HostPort: 0 is out of range",
        ),
        (
            mappings(r#"{"HostPort":80}"#),
            "runtimeConfig.portMappings[0].containerPort is missing",
        ),
        (
            mappings(r#"{"HostPort":80,"ContainerPort":80,"Protocol":"icmp"}"#),
            "runtimeConfig.portMappings[0].Protocol: \"icmp\" is not supported",
        ),
        (
            mappings(r#"{"HostPort":80,"ContainerPort":80,"HostIP":"x"}"#),
            "runtimeConfig.portMappings[0].HostIP: \"x\" is not an IP address",
        ),
        (
            with(r#","RuntimeConfig":{"PortMappings":[{"HostPort":"80","ContainerPort":80}]}"#),
            "RuntimeConfig.PortMappings[0].HostPort: expected an integer, found a string",
        ),
        (
            with(r#","RuntimeConfig":{"PortMappings":{}}"#),
            "RuntimeConfig.PortMappings: expected an array, found an object",
        ),
        (
            with(r#","PinRoot":"x""#),
            "PinRoot: \"x\" is not an absolute path",
        ),
        (with(r#","SNAT":1"#), "SNAT: 1 is not true or false"),
        (
            with(
                r#","runtimeConfig":{"portMappings":[{"HostPort":80,"ContainerPort":80},{"hostPort":80,"containerPort":81}]}"#,
            ),
            "runtimeConfig.portMappings[1] duplicates runtimeConfig.portMappings[0]",
        ),
    ];
    for (input, needle) in cases {
        let error = parse_netconf(input.as_bytes()).expect_err(&input);
        assert!(
            error.to_string().contains(needle),
            "{error} should contain {needle:?}"
        );
    }
    let conf = parse_netconf(
        mappings(r#"{"HostPort":80,"ContainerPort":80,"HostIP":"fd00::1"}"#).as_bytes(),
    )
    .unwrap();
    let v4_only = ContainerAddrs {
        v4: Some("10.0.0.2".parse().unwrap()),
        v6: None,
    };
    let error = check_mappings_reachable(&conf.port_mappings, &conf.host_ip_keys, &v4_only, "eth0")
        .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("runtimeConfig.portMappings[0].HostIP: fd00::1 is IPv6"),
        "{error}"
    );
}

#[test]
fn keys_given_twice_follow_go() {
    let port = |entries: &str| {
        parse_netconf(mappings(entries).as_bytes()).map(|c| c.port_mappings[0].host_port)
    };
    assert_eq!(
        port(r#"{"hostPort":1,"HostPort":2,"containerPort":80}"#).unwrap(),
        2,
        "the later key wins, even over an exact spelling"
    );
    assert_eq!(
        port(r#"{"HostPort":2,"hostPort":1,"containerPort":80}"#).unwrap(),
        1
    );
    assert_eq!(
        port(r#"{"HostPort":2,"hostPort":null,"containerPort":80}"#).unwrap(),
        2,
        "null leaves an int as it was"
    );
    // runtimeConfig is a struct: a second one merges into the first.
    let conf = parse_netconf(
        with(r#","runtimeConfig":{"portMappings":[{"hostPort":5,"containerPort":6}]},"RuntimeConfig":{"bandwidth":{}}"#)
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(conf.port_mappings.len(), 1, "the first one's mappings stay");
    // prevResult is a map: a second one merges, a null clears it.
    let prev = r#"{"ips":[{"address":"10.0.0.2/24"}]}"#;
    let merged = parse_netconf(
        with(&format!(
            r#","prevResult":{prev},"PrevResult":{{"dns":{{}}}}"#
        ))
        .as_bytes(),
    )
    .unwrap();
    let merged = merged.prev_result.unwrap();
    assert!(
        merged.get("ips").is_some() && merged.get("dns").is_some(),
        "{merged}"
    );
    let cleared =
        parse_netconf(with(&format!(r#","prevResult":{prev},"PrevResult":null"#)).as_bytes())
            .unwrap();
    assert!(cleared.prev_result.is_none());
    // snat is a *bool upstream: null clears it back to the default.
    let snat = parse_netconf(with(r#","snat":false,"SNAT":null"#).as_bytes()).unwrap();
    assert!(snat.snat);
}

#[test]
fn log_file_is_found_before_parsing_and_never_fails() {
    assert_eq!(
        log_file_of(br#"{"logFile":"/tmp/x.log","cniVersion":"9.9.9"}"#),
        PathBuf::from("/tmp/x.log"),
        "read even from a config that will be refused"
    );
    for stdin in [
        &b"not json"[..],
        b"[]",
        br#"{"logFile":"relative"}"#,
        br#"{"logFile":7}"#,
    ] {
        assert_eq!(
            log_file_of(stdin),
            PathBuf::from(DEFAULT_LOG_FILE),
            "{}",
            String::from_utf8_lossy(stdin)
        );
    }
}

#[test]
fn pin_root_is_found_before_parsing_and_never_fails() {
    assert_eq!(
        pin_root_of(br#"{"PINROOT":"/sys/fs/bpf/x","cniVersion":"9.9.9"}"#),
        PathBuf::from("/sys/fs/bpf/x"),
        "read even from a config that will be refused, its key matched as parsing matches it"
    );
    for stdin in [
        &b"not json"[..],
        br#"{"pinRoot":"relative"}"#,
        br#"{"pinRoot":7}"#,
    ] {
        assert_eq!(
            pin_root_of(stdin),
            PathBuf::from(DEFAULT_PIN_ROOT),
            "{}",
            String::from_utf8_lossy(stdin)
        );
    }
}

#[test]
fn invalid_json_keeps_the_parser_error_as_source() {
    let error = parse_netconf(b"{\"cniVersion\":").expect_err("truncated JSON must fail");
    let source = std::error::Error::source(&error).expect("the serde error must be the source");
    assert!(
        !error.to_string().contains(&source.to_string()),
        "Display must not repeat the source: {error}"
    );
}

#[test]
fn teardown_parse_drops_bad_request_data_but_not_identity() {
    let input = with(r#","runtimeConfig":{"portMappings":[{"hostPort":0}]},"prevResult":[1]"#);
    assert!(
        parse_netconf(input.as_bytes()).is_err(),
        "strict parsing must reject it"
    );
    let (conf, dropped) =
        parse_netconf_for_teardown(input.as_bytes()).expect("teardown parsing must tolerate it");
    assert!(
        conf.port_mappings.is_empty(),
        "bad mappings are dropped, not half-kept"
    );
    assert!(conf.prev_result.is_none(), "bad prevResult is dropped");
    assert_eq!(
        dropped.len(),
        2,
        "both problems are reported for logging: {dropped:?}"
    );

    let bad_name = r#"{"cniVersion":"1.0.0","type":"t"}"#;
    let error = parse_netconf_for_teardown(bad_name.as_bytes()).expect_err("name is still needed");
    assert_eq!(error.cni_code(), code::INVALID_NETWORK_CONFIG, "{error}");
}

#[test]
fn protocol_numbers_and_names() {
    for (protocol, number, name) in [
        (Protocol::Tcp, 6, "tcp"),
        (Protocol::Udp, 17, "udp"),
        (Protocol::Sctp, 132, "sctp"),
    ] {
        assert_eq!(protocol.number(), number, "IPPROTO number of {name}");
        assert_eq!(protocol.as_str(), name, "name of {protocol:?}");
        assert_eq!(
            Protocol::from_name(&name.to_uppercase()),
            Some(protocol),
            "upper-case {name}"
        );
    }
    assert_eq!(
        Protocol::from_name("icmp"),
        None,
        "icmp is not a port protocol"
    );
}

#[test]
fn host_ip_families() {
    let v4 = HostIp::Addr("192.0.2.1".parse().unwrap());
    let v6 = HostIp::Addr("2001:db8::1".parse().unwrap());
    let cases = [
        (HostIp::Any, true, true, None),
        (HostIp::AnyV4, true, false, None),
        (HostIp::AnyV6, false, true, None),
        (v4, true, false, v4.specific()),
        (v6, false, true, v6.specific()),
    ];
    for (host_ip, allows_v4, allows_v6, specific) in cases {
        assert_eq!(host_ip.allows_v4(), allows_v4, "{host_ip:?}.allows_v4()");
        assert_eq!(host_ip.allows_v6(), allows_v6, "{host_ip:?}.allows_v6()");
        assert_eq!(host_ip.specific(), specific, "{host_ip:?}.specific()");
    }
    assert_eq!(
        v4.specific(),
        Some("192.0.2.1".parse().unwrap()),
        "explicit address is specific"
    );
}

#[test]
fn versions_compare_numerically() {
    assert_eq!(
        version_tuple("1.1.0"),
        Some((1, 1, 0)),
        "three-part version parses"
    );
    assert_eq!(version_tuple("1.1"), None, "two parts is not a version");
    assert_eq!(
        version_tuple("1.1.0.0"),
        None,
        "four parts is not a version"
    );
    assert!(
        version_at_least("0.4.0", "0.4.0"),
        "equal counts as at least"
    );
    assert!(
        version_at_least("1.0.0", "0.4.0"),
        "1.0.0 is newer than 0.4.0"
    );
    assert!(
        !version_at_least("0.3.1", "0.4.0"),
        "0.3.1 is older than 0.4.0"
    );
    assert!(
        !version_at_least("0.10.0", "1.0.0"),
        "minor 10 is still major 0"
    );
    assert!(
        version_at_least("0.10.0", "0.4.0"),
        "compare numbers, not strings"
    );
    assert!(
        !version_at_least("garbage", "0.0.0"),
        "unparseable is never at least"
    );
}

#[test]
fn upstream_conditions_in_their_common_forms_are_parsed() {
    let input = with(
        r#","conditionsV4":["-s","10.1.2.3/8,192.168.7.7","!","-d","198.18.0.1","-p","TCP","!","-i","eth0"],"conditionsV6":["--source","fd18::/16","--protocol","17"]"#,
    );
    let conf = parse_netconf(input.as_bytes()).expect("supported conditions are accepted");
    let v4 = conf.conditions_v4.as_ref().expect("conditionsV4 parsed");
    assert_eq!(
        v4.to_string(),
        "conditionsV4: -s 10.0.0.0/8,192.168.7.7/32 ! -d 198.18.0.1/32 -p tcp ! -i eth0",
        "addresses masked to their prefix, every condition kept with its negation"
    );
    let v6 = conf
        .conditions(portmap_common::FAMILY_V6)
        .expect("conditionsV6 parsed");
    assert_eq!(v6.to_string(), "conditionsV6: -s fd18::/16 -p udp");
    // A dotted IPv4 mask, as iptables takes it.
    let dotted = with(r#","conditionsV4":["-s","10.0.0.0/255.255.0.0"]"#);
    let conf = parse_netconf(dotted.as_bytes()).expect("dotted mask");
    assert_eq!(
        conf.conditions_v4.expect("parsed").to_string(),
        "conditionsV4: -s 10.0.0.0/16"
    );
}

#[test]
fn upstream_conditions_become_the_map_entry_the_programs_check() {
    use portmap_common::conditions::{negated, protocol_bits};
    let input = with(
        r#","conditionsV4":["!","-s","10.0.0.0/8","-p","udp","-i","eth1","-d","198.18.0.0/24"]"#,
    );
    let conf = parse_netconf(input.as_bytes()).expect("accepted");
    let entry = conf
        .conditions_v4
        .expect("parsed")
        .to_map_value(|name| if name == "eth1" { 7 } else { 0 });
    assert_eq!(entry.source_len, 1);
    assert_eq!(entry.source[0].net_be[0], u32::from_ne_bytes([10, 0, 0, 0]));
    assert_eq!(
        entry.source[0].mask_be[0],
        u32::from_ne_bytes([255, 0, 0, 0])
    );
    assert_eq!(entry.destination_len, 1);
    assert_eq!(
        entry.destination[0].mask_be[0],
        u32::from_ne_bytes([255, 255, 255, 0])
    );
    assert_eq!(entry.negated, negated::SOURCE, "only -s is negated");
    assert_eq!(entry.protocols, protocol_bits::UDP);
    assert_eq!((entry.has_in_interface, entry.in_ifindex), (1, 7));
    assert_eq!(
        entry.in_interface_id,
        portmap_common::conditions::interface_id(b"eth1"),
        "the entry keeps which name its index is of"
    );
    let client = |a: [u8; 4]| [u32::from_ne_bytes(a), 0, 0, 0];
    let node = client([198, 18, 0, 1]);
    assert!(entry.admits(17, &client([198, 18, 0, 2]), &node, 7));
    assert!(!entry.admits(17, &client([10, 0, 0, 2]), &node, 7), "! -s");
    assert!(
        !entry.admits(6, &client([198, 18, 0, 2]), &node, 7),
        "-p udp"
    );
    assert!(
        !entry.admits(17, &client([198, 18, 0, 2]), &node, 8),
        "-i eth1"
    );
    // IPv6 prefixes span words.
    let v6 = with(r#","conditionsV6":["-s","fd18:0:0:1::/72"]"#);
    let entry = parse_netconf(v6.as_bytes())
        .expect("accepted")
        .conditions_v6
        .expect("parsed")
        .to_map_value(|_| 0);
    assert_eq!(
        entry.source[0].mask_be,
        [u32::MAX, u32::MAX, 0xff00_0000u32.to_be(), 0]
    );
}

#[test]
fn unsupported_upstream_conditions_are_refused_naming_the_argument() {
    for (conditions, names, says) in [
        (
            r#""conditionsV4":["-m","comment","--comment","x"]"#,
            "conditionsV4[0]",
            "\"-m\" is not supported",
        ),
        (
            r#""conditionsV4":["-s","10.0.0.0/8","-o","eth0"]"#,
            "conditionsV4[2]",
            "output interface",
        ),
        (
            r#""conditionsV4":["--out-interface","eth0"]"#,
            "conditionsV4[0]",
            "PREROUTING",
        ),
        (
            r#""conditionsV4":["-s","fd18::/16"]"#,
            "conditionsV4[1]",
            "IPv6 address, but this list is for IPv4",
        ),
        (
            r#""conditionsV6":["-d","10.0.0.1"]"#,
            "conditionsV6[1]",
            "IPv4 address, but this list is for IPv6",
        ),
        (
            r#""conditionsV4":["-s","10.0.0.0/33"]"#,
            "conditionsV4[1]",
            "out of range",
        ),
        (
            r#""conditionsV4":["-s","example.com"]"#,
            "conditionsV4[1]",
            "host names",
        ),
        (
            r#""conditionsV4":["-s","10.0.0.0/255.0.255.0"]"#,
            "conditionsV4[1]",
            "not contiguous",
        ),
        (
            r#""conditionsV4":["!","-s","10.0.0.0/8,11.0.0.0/8"]"#,
            "conditionsV4[2]",
            "negated list",
        ),
        (
            r#""conditionsV4":["-s","10.0.0.1","-s","10.0.0.2"]"#,
            "conditionsV4[2]",
            "given twice",
        ),
        (
            r#""conditionsV4":["-s"]"#,
            "conditionsV4[0]",
            "needs a value",
        ),
        (
            r#""conditionsV4":["!"]"#,
            "conditionsV4[0]",
            "\"!\" must come before an option",
        ),
        (
            r#""conditionsV4":["-s","10.0.0.0/8","!"]"#,
            "conditionsV4[2]",
            "before an option",
        ),
        (
            r#""conditionsV4":["10.0.0.0/8"]"#,
            "conditionsV4[0]",
            "is not supported",
        ),
        (
            r#""conditionsV4":["-p","icmp"]"#,
            "conditionsV4[1]",
            "not tcp, udp or sctp",
        ),
        (
            r#""conditionsV4":["-i","eth+"]"#,
            "conditionsV4[1]",
            "wildcard",
        ),
        (
            r#""conditionsV4":["-i","a/b"]"#,
            "conditionsV4[1]",
            "not allow",
        ),
        (
            r#""conditionsV4":["-s",7]"#,
            "conditionsV4[1]",
            "7 is not a string",
        ),
        (
            r#""conditionsV4":"-s 10.0.0.0/8""#,
            "conditionsV4",
            "must be an array",
        ),
        (
            r#""conditionsV4":["-s","1.0.0.1,1.0.0.2,1.0.0.3,1.0.0.4,1.0.0.5,1.0.0.6,1.0.0.7,1.0.0.8,1.0.0.9"]"#,
            "conditionsV4[1]",
            "at most 8",
        ),
    ] {
        let input = with(&format!(",{conditions}"));
        let error =
            parse_netconf(input.as_bytes()).expect_err(&format!("{conditions} must be refused"));
        assert_eq!(error.cni_code(), code::INVALID_NETWORK_CONFIG, "{error}");
        let text = error.to_string();
        assert!(
            text.starts_with(&format!("{names}: ")) && text.contains(says),
            "the message of {conditions} names {names} and says {says:?}: {text}"
        );
        assert!(
            text.contains("supported are [!] -s/--source"),
            "the message says what is supported: {text}"
        );
        // Teardown goes on: a DEL after the refused ADD must succeed.
        let (conf, dropped) =
            parse_netconf_for_teardown(input.as_bytes()).expect("DEL and GC tolerate it");
        assert_eq!(dropped.len(), 1, "{dropped:?}");
        assert!(conf.conditions_v4.is_none() && conf.conditions_v6.is_none());
    }
    // Go's encoding/json matches keys case-insensitively: so do we, and the
    // message uses the spelling given.
    let folded = with(r#","conditionsv4":["-m","set"]"#);
    let error = parse_netconf(folded.as_bytes()).expect_err("any spelling is refused");
    assert!(error.to_string().starts_with("conditionsv4[0]"), "{error}");
}

#[test]
fn upstream_conditions_that_add_nothing_are_accepted() {
    for value in ["null", "[]"] {
        let input = with(&format!(
            r#","conditionsV4":{value},"conditionsV6":{value}"#
        ));
        let conf = parse_netconf(input.as_bytes())
            .unwrap_or_else(|e| panic!("{value} adds no condition upstream: {e}"));
        assert!(conf.conditions_v4.is_none() && conf.conditions_v6.is_none());
    }
}

#[test]
fn upstream_keys_without_use_here_are_accepted_and_named() {
    let input =
        with(r#","markMasqBit":13,"externalSetMarkChain":null,"Backend":"nftables","snat":true"#);
    let conf = parse_netconf(input.as_bytes()).expect("accepted");
    let keys: Vec<&str> = conf
        .upstream_unused
        .iter()
        .map(|k| k.key.as_str())
        .collect();
    assert_eq!(
        keys,
        ["markMasqBit", "Backend"],
        "a null key is as if absent"
    );
    let warning = conf.upstream_unused[1].to_string();
    assert!(
        warning.starts_with("Backend") && warning.contains("neither iptables nor nftables"),
        "{warning}"
    );
    let plain = parse_netconf(with("").as_bytes()).expect("minimal");
    assert!(plain.upstream_unused.is_empty());
}
