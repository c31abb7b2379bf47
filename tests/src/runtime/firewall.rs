//! Reading the node's firewall state: the translations each port-mapping
//! plugin holds (ours through `ebpf-portmap list --json`, upstream's
//! `CNI-DN-*` chains in `iptables-save`/`ip6tables-save`), the node's nat
//! tables as a whole, and the machine outside the test's namespaces
//! ([`RootState`]), compared before and after a test.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::netns::NetNs;
use crate::topology::PortMapping;

/// One DNAT the node holds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Translation {
    pub protocol: String,
    /// `None`: every local address of the family.
    pub host_ip: Option<IpAddr>,
    pub host_port: u16,
    pub container: SocketAddr,
}

/// Each port to the workload's IPv4 and IPv6 address (to the one family of
/// its `hostIP`, if it has one), sorted.
pub fn expected_translations(
    ipv4: Ipv4Addr,
    ipv6: Ipv6Addr,
    ports: &[PortMapping],
) -> Vec<Translation> {
    let mut expected: Vec<Translation> = ports
        .iter()
        .flat_map(|port| {
            [IpAddr::V4(ipv4), IpAddr::V6(ipv6)]
                .into_iter()
                .filter(|ip| {
                    port.host_ip
                        .is_none_or(|host| host.is_ipv4() == ip.is_ipv4())
                })
                .map(|ip| Translation {
                    protocol: port.protocol.clone(),
                    host_ip: port.host_ip,
                    host_port: port.host_port,
                    container: SocketAddr::new(ip, port.container_port),
                })
        })
        .collect();
    expected.sort();
    expected
}

/// Upstream's translations in both families of `node`'s nat tables.
pub fn upstream_translations_in(node: &NetNs) -> Vec<(String, Translation)> {
    ["iptables-save", "ip6tables-save"]
        .iter()
        .flat_map(|tool| upstream_translations(&node.exec(tool, &["-t", "nat"])))
        .collect()
}

/// `iptables-save -t nat` and `ip6tables-save -t nat` of `node`, without
/// comments and packet counters (they change with traffic): what must be
/// back once every rule a plugin added is gone.
pub fn nat_rules(node: &NetNs) -> Vec<String> {
    ["iptables-save", "ip6tables-save"]
        .iter()
        .flat_map(|tool| {
            node.exec(tool, &["-t", "nat"])
                .lines()
                .filter(|line| !line.starts_with('#'))
                .map(|line| match line.rsplit_once(" [") {
                    Some((chain, _)) if line.starts_with(':') => chain.to_owned(),
                    _ => line.to_owned(),
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Whether `node`'s nat tables still hold upstream's per-container chains
/// or DNAT rules: the tool and its output if so.
pub fn upstream_leftovers(node: &NetNs) -> Option<(String, String)> {
    ["iptables-save", "ip6tables-save"].iter().find_map(|tool| {
        let save = node.exec(tool, &["-t", "nat"]);
        (save.contains(":CNI-DN-") || save.contains("DNAT --to-destination"))
            .then(|| ((*tool).to_owned(), save))
    })
}

/// `(containerID, translation)` for every entry of `ebpf-portmap list --json`
/// that is ours (`list` also shows what upstream portmap still maps, marked
/// with the `upstream` key).
pub fn ours_translations(list: &Value) -> Vec<(String, Translation)> {
    list.as_array()
        .unwrap_or_else(|| panic!("list --json is an array: {list}"))
        .iter()
        .filter(|entry| entry.get("upstream").is_none())
        .map(|entry| {
            let text = |key: &str| {
                entry[key]
                    .as_str()
                    .unwrap_or_else(|| panic!("list entry without {key}: {entry}"))
                    .to_owned()
            };
            let host_ip = entry["hostIP"].as_str().map(|ip| {
                ip.parse()
                    .unwrap_or_else(|e| panic!("list entry's hostIP: {e}: {entry}"))
            });
            let translation = Translation {
                protocol: text("protocol"),
                host_ip,
                host_port: entry["hostPort"]
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .unwrap_or_else(|| panic!("list entry without hostPort: {entry}")),
                container: text("container")
                    .parse()
                    .unwrap_or_else(|e| panic!("list entry's container address: {e}: {entry}")),
            };
            (text("containerID"), translation)
        })
        .collect()
}

/// `(containerID, translation)` for every DNAT rule of the upstream plugin in
/// `iptables-save -t nat` output: `CNI-HOSTPORT-DNAT` jumps to a `CNI-DN-*`
/// chain per container, commented with its ID; that chain's DNAT rules are
/// the translations (`-d` for a `hostIP`).
pub fn upstream_translations(save: &str) -> Vec<(String, Translation)> {
    let word_after = |line: &str, option: &str| -> Option<String> {
        let mut words = line.split_whitespace();
        words.find(|w| *w == option)?;
        words.next().map(str::to_owned)
    };
    let owners: std::collections::BTreeMap<String, String> = save
        .lines()
        .filter(|l| l.starts_with("-A CNI-HOSTPORT-DNAT "))
        .filter_map(|line| {
            let id = line.split_once("id: \\\"")?.1.split_once("\\\"")?.0;
            Some((word_after(line, "-j")?, id.to_owned()))
        })
        .collect();
    save.lines()
        .filter(|l| l.starts_with("-A CNI-DN-") && word_after(l, "-j").as_deref() == Some("DNAT"))
        .map(|line| {
            let chain = line.split_whitespace().nth(1).unwrap_or_default();
            let owner = owners
                .get(chain)
                .cloned()
                .unwrap_or_else(|| format!("(no CNI-HOSTPORT-DNAT jump to {chain})"));
            let get = |option: &str| {
                word_after(line, option)
                    .unwrap_or_else(|| panic!("DNAT rule without {option}: {line}"))
            };
            let host_ip = word_after(line, "-d").map(|cidr| {
                let ip = cidr.split_once('/').map_or(cidr.as_str(), |(ip, _)| ip);
                ip.parse().unwrap_or_else(|e| panic!("-d of {line}: {e}"))
            });
            let translation = Translation {
                protocol: get("-p"),
                host_ip,
                host_port: get("--dport")
                    .parse()
                    .unwrap_or_else(|e| panic!("--dport of {line}: {e}")),
                container: get("--to-destination")
                    .parse()
                    .unwrap_or_else(|e| panic!("--to-destination of {line}: {e}")),
            };
            (owner, translation)
        })
        .collect()
}

/// What the machine outside the test's namespaces looks like: the root
/// network namespace (links, addresses, routes, firewall rules) and the
/// places a runtime or a plugin would write to if it escaped its
/// confinement. Compared before and after a test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootState {
    pub network: BTreeMap<String, String>,
    /// Whether each path exists.
    pub paths: BTreeMap<&'static str, bool>,
    /// Mounts in the root mount namespace that name containerd, CNI or a
    /// path of this harness's kind.
    pub mounts: Vec<String>,
}

/// Paths a runtime, libcni or runc write to by default. ebpf-portmap's own
/// defaults (`/sys/fs/bpf/ebpf-portmap`, `/run/ebpf-portmap`,
/// `/var/log/ebpf-portmap.log`) are not among them: other tests of this
/// project use them on the machine (`stale.rs` runs a node under the
/// default pin root), so whether they exist says nothing about a runtime
/// test running beside them. Their confinement is checked where it holds:
/// each driver reads ebpf-portmap's mappings from its private pin root, so
/// a plugin that pinned on the machine's bpffs instead fails every
/// translation check.
const ROOT_PATHS: [&str; 7] = [
    "/run/containerd",
    "/var/lib/containerd",
    "/run/runc",
    "/var/lib/cni",
    "/run/cni",
    "/etc/cni/net.d",
    "/opt/cni/bin",
];

impl RootState {
    /// Captures the state (the test process runs in the root namespaces).
    pub fn capture() -> RootState {
        let mut network = BTreeMap::new();
        for args in [
            &["ip", "-o", "link", "show"][..],
            &["ip", "-o", "addr", "show"],
            &["ip", "route", "show", "table", "all"],
            &["ip", "-6", "route", "show", "table", "all"],
            &["iptables", "-t", "nat", "-S"],
            &["iptables", "-t", "filter", "-S"],
            &["ip6tables", "-t", "nat", "-S"],
            &["ip6tables", "-t", "filter", "-S"],
        ] {
            let out = Command::new(args[0]).args(&args[1..]).output();
            let text = match out {
                Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
                Err(e) => format!("(could not run: {e})"),
            };
            network.insert(args.join(" "), without_lifetimes(&text));
        }
        let paths = ROOT_PATHS
            .iter()
            .map(|path| (*path, Path::new(path).exists()))
            .collect();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let prefixes = [
            crate::naming::name_prefix(),
            crate::naming::DEFAULT_NAME_PREFIX.to_owned(),
        ];
        let mounts = mountinfo
            .lines()
            .filter(|l| mount_to_compare(l, &prefixes, std::process::id()))
            .map(str::to_owned)
            .collect();
        RootState {
            network,
            paths,
            mounts,
        }
    }

    /// What differs from `before`, one line per difference.
    pub fn differences(&self, before: &RootState) -> Vec<String> {
        let mut found = Vec::new();
        for (what, text) in &self.network {
            if before.network.get(what) != Some(text) {
                found.push(format!(
                    "`{what}` changed:\nbefore:\n{}\nafter:\n{text}",
                    before.network.get(what).map_or("", String::as_str)
                ));
            }
        }
        for (path, exists) in &self.paths {
            if before.paths.get(path) != Some(exists) {
                found.push(format!(
                    "{path}: existed {:?}, now {exists}",
                    before.paths.get(path)
                ));
            }
        }
        if self.mounts != before.mounts {
            found.push(format!(
                "root mounts changed:\nbefore:\n{}\nafter:\n{}",
                before.mounts.join("\n"),
                self.mounts.join("\n")
            ));
        }
        found
    }
}

/// Whether a line of `/proc/self/mountinfo` belongs in [`RootState`]: a
/// mount that names containerd, CNI or a harness name (`<prefix>-...` of
/// `prefixes`), unless the harness name is another live process's. Every
/// test binary of the harness mounts its network namespaces on
/// `/run/netns/<prefix>-<kind>-<pid>-<n>` in the root mount namespace:
/// another suite running beside this one (with the same prefix, or both
/// with the default one) adds and removes such mounts all the time, and
/// none of them is a mount this test left behind.
fn mount_to_compare(line: &str, prefixes: &[String], own_pid: u32) -> bool {
    let named = line.contains("containerd")
        || line.contains("/cni")
        || prefixes.iter().any(|p| line.contains(&format!("{p}-")));
    let anothers = line
        .split(|c: char| c == '/' || c.is_whitespace())
        .any(|word| {
            prefixes.iter().any(|prefix| {
                crate::naming::owner_pid(word, prefix).is_some_and(|pid| pid != own_pid)
            })
        });
    named && !anothers
}

/// `ip` output without the counting-down lifetimes of dynamic addresses
/// and routes (`valid_lft 86390sec`, `expires 1799sec`).
fn without_lifetimes(text: &str) -> String {
    text.lines()
        .map(|line| {
            let mut words = Vec::new();
            let mut skip_next = false;
            for word in line.split_whitespace() {
                if skip_next {
                    skip_next = false;
                    continue;
                }
                if matches!(word, "valid_lft" | "preferred_lft" | "expires") {
                    skip_next = true;
                    continue;
                }
                words.push(word);
            }
            words.join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_mounts_of_another_test_process_are_not_compared() {
        let prefixes = ["epmrt".to_owned(), "epm".to_owned()];
        let netns = |name: &str| {
            format!("48 46 0:4 net:[4026532239] /run/netns/{name} rw shared:3 - nsfs nsfs rw")
        };
        // This process's own namespace, and a leaked runtime mount: compared.
        assert!(mount_to_compare(&netns("epmrt-node-100-1"), &prefixes, 100));
        assert!(mount_to_compare(&netns("epm-ctrd-100-7"), &prefixes, 100));
        assert!(mount_to_compare(
            "60 46 0:50 / /run/containerd/io.containerd.runtime.v2.task/k8s.io/x rw - overlay overlay rw",
            &prefixes,
            100
        ));
        // Another test binary's namespaces, with this prefix or the default
        // one: never this test's leftovers.
        assert!(!mount_to_compare(
            &netns("epmrt-node-200-1"),
            &prefixes,
            100
        ));
        assert!(!mount_to_compare(&netns("epm-far-200-5"), &prefixes, 100));
        // Nothing of the harness or a runtime: not compared.
        assert!(!mount_to_compare(
            "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw",
            &prefixes,
            100
        ));
    }

    #[test]
    fn upstream_rules_parse_into_translations() {
        // As upstream portmap wrote them for a pod with 8080:80 and one with
        // a hostIP.
        let save = r#"*nat
:CNI-DN-0794e4ed92904a55f2da5 - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
-A CNI-DN-0794e4ed92904a55f2da5 -s 10.244.0.0/24 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-0794e4ed92904a55f2da5 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.244.0.7:80
-A CNI-DN-0794e4ed92904a55f2da5 -d 198.18.0.11/32 -p tcp -m tcp --dport 8081 -j DNAT --to-destination 10.244.0.7:80
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"epm-ctrd\" id: \"f1cf1a39\"" -m multiport --dports 8080,8081 -j CNI-DN-0794e4ed92904a55f2da5
COMMIT
"#;
        assert_eq!(
            upstream_translations(save),
            [
                (
                    "f1cf1a39".to_owned(),
                    Translation {
                        protocol: "tcp".into(),
                        host_ip: None,
                        host_port: 8080,
                        container: "10.244.0.7:80".parse().unwrap(),
                    }
                ),
                (
                    "f1cf1a39".to_owned(),
                    Translation {
                        protocol: "tcp".into(),
                        host_ip: Some("198.18.0.11".parse().unwrap()),
                        host_port: 8081,
                        container: "10.244.0.7:80".parse().unwrap(),
                    }
                ),
            ]
        );
    }

    #[test]
    fn upstream_rules_of_both_families_parse() {
        // As the upstream plugin wrote them for `podman run -p 8080:80 -p 8053:53/udp`,
        // and a DN chain no jump leads to.
        let save = r#"*nat
:CNI-DN-0794e4ed92904a55f2da5 - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A CNI-DN-0794e4ed92904a55f2da5 -s 10.244.0.0/24 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-0794e4ed92904a55f2da5 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.244.0.7:80
-A CNI-DN-0794e4ed92904a55f2da5 -p udp -m udp --dport 8053 -j DNAT --to-destination [fd44::7]:53
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"epm-e2e\" id: \"f1cf1a39\"" -m multiport --dports 8080 -j CNI-DN-0794e4ed92904a55f2da5
-A CNI-DN-ffff -p tcp -m tcp --dport 9 -j DNAT --to-destination 10.244.0.9:9
COMMIT
"#;
        let shown: Vec<String> = upstream_translations(save)
            .iter()
            .map(|(id, t)| {
                format!(
                    "{id} {:?} {}/{}->{}",
                    t.host_ip, t.host_port, t.protocol, t.container
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                "f1cf1a39 None 8080/tcp->10.244.0.7:80",
                "f1cf1a39 None 8053/udp->[fd44::7]:53",
                "(no CNI-HOSTPORT-DNAT jump to CNI-DN-ffff) None 9/tcp->10.244.0.9:9",
            ]
        );
    }

    #[test]
    fn list_entries_parse_into_translations() {
        let list = serde_json::json!([
            { "containerID": "abc", "protocol": "udp", "hostPort": 8053, "container": "[fd44::5]:53" },
            { "containerID": "abc", "protocol": "tcp", "hostPort": 8080, "container": "10.244.0.5:80", "hostIP": "198.18.0.1" },
            { "containerID": "up", "protocol": "tcp", "hostPort": 9, "container": "10.244.0.9:9", "upstream": {} },
        ]);
        let shown: Vec<String> = ours_translations(&list)
            .iter()
            .map(|(id, t)| {
                format!(
                    "{id} {:?} {}/{}->{}",
                    t.host_ip, t.host_port, t.protocol, t.container
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                "abc None 8053/udp->[fd44::5]:53",
                "abc Some(198.18.0.1) 8080/tcp->10.244.0.5:80",
            ]
        );
    }

    #[test]
    fn expected_translations_follow_the_host_ip_family() {
        let shown = |ports: &[PortMapping]| -> Vec<String> {
            expected_translations(
                "10.244.0.5".parse().unwrap(),
                "fd44::5".parse().unwrap(),
                ports,
            )
            .iter()
            .map(|t| {
                format!(
                    "{:?} {}/{}->{}",
                    t.host_ip, t.host_port, t.protocol, t.container
                )
            })
            .collect()
        };
        assert_eq!(
            shown(&[PortMapping::tcp(8080, 80), PortMapping::udp(8053, 53)]),
            [
                "None 8080/tcp->10.244.0.5:80",
                "None 8080/tcp->[fd44::5]:80",
                "None 8053/udp->10.244.0.5:53",
                "None 8053/udp->[fd44::5]:53",
            ]
        );
        assert_eq!(
            shown(&[PortMapping::tcp(8081, 80).on("198.18.0.11".parse().unwrap())]),
            ["Some(198.18.0.11) 8081/tcp->10.244.0.5:80"]
        );
    }

    #[test]
    fn lifetimes_do_not_count_as_changes() {
        assert_eq!(
            without_lifetimes(
                "2: eth0    inet 10.0.0.5/24 brd 10.0.0.255 scope global dynamic eth0\\       valid_lft 86390sec preferred_lft 86390sec"
            ),
            "2: eth0 inet 10.0.0.5/24 brd 10.0.0.255 scope global dynamic eth0\\"
        );
        assert_eq!(
            without_lifetimes("fe80::/64 dev eth0 proto ra metric 100 expires 1799sec pref medium"),
            "fe80::/64 dev eth0 proto ra metric 100 pref medium"
        );
    }
}
