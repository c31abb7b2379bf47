//! Upstream `portmap`'s nftables backend (plugins 1.5 and later), read
//! from `nft -j list table <family> cni_hostport` and changed through one
//! `nft -f -` script per family.
//!
//! The layout upstream writes (`plugins/meta/portmap/portmap_nftables.go`):
//! a table `cni_hostport` in the `ip` and the `ip6` family; base chains
//! `prerouting` and `output` (`fib daddr type local jump hostports_all`),
//! `hostports_all` jumping to `hostip_hostports` (unused since 1.6, kept
//! for upgrades) and `hostports`, which holds one rule per mapping,
//! `[ip daddr HOSTIP] tcp dport 8080 dnat to 10.244.0.5:80 comment "ID"`,
//! and `masquerading` (postrouting) with the hairpin rules, also commented
//! with the container ID. The comment is the container ID alone: unlike
//! iptables, no network name.

use std::net::IpAddr;

use serde_json::Value;

use super::Port;
use crate::model::Protocol;

pub const TABLE: &str = "cni_hostport";
/// The chains whose rules carry a container's ID.
pub const OWNED_CHAINS: [&str; 3] = ["hostports", "hostip_hostports", "masquerading"];
const MAPPING_CHAINS: [&str; 2] = ["hostports", "hostip_hostports"];

/// One rule of the table that names a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedRule {
    pub chain: String,
    pub handle: u64,
    pub container_id: String,
    /// Set for a port mapping (`hostports`); `None` for the masquerading rules.
    pub mapping: Option<Port>,
}

/// The table as `nft -j list table` prints it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub family: String,
    pub rules: Vec<OwnedRule>,
    /// Rules of the mapping chains that name no container (hand-made).
    pub unowned_mappings: usize,
}

fn payload_match<'a>(expr: &'a Value, field: &str) -> Option<(&'a str, &'a Value)> {
    let matched = expr.get("match")?;
    let payload = matched.get("left")?.get("payload")?;
    if payload.get("field")?.as_str()? != field {
        return None;
    }
    Some((payload.get("protocol")?.as_str()?, matched.get("right")?))
}

fn mapping_of(exprs: &[Value]) -> Option<Port> {
    let mut protocol = None;
    let mut host_port = None;
    let mut host_addr = None;
    let mut destination = None;
    for expr in exprs {
        if let Some((proto, right)) = payload_match(expr, "dport") {
            protocol = Protocol::from_name(proto);
            host_port = right.as_u64().and_then(|p| u16::try_from(p).ok());
        } else if let Some((_, right)) = payload_match(expr, "daddr") {
            host_addr = right.as_str().and_then(|a| a.parse().ok());
        } else if let Some(dnat) = expr.get("dnat") {
            let addr: IpAddr = dnat.get("addr")?.as_str()?.parse().ok()?;
            let port = dnat
                .get("port")?
                .as_u64()
                .and_then(|p| u16::try_from(p).ok())?;
            destination = Some((addr, port));
        }
    }
    let (container_addr, container_port) = destination?;
    Some(Port {
        protocol: protocol?,
        host_port: host_port?,
        host_addr,
        container_addr,
        container_port,
    })
}

/// Parses `nft -j list table <family> cni_hostport`.
pub fn parse_table(json: &Value) -> Table {
    let mut table = Table::default();
    let Some(items) = json.get("nftables").and_then(Value::as_array) else {
        return table;
    };
    for item in items {
        if let Some(t) = item.get("table") {
            if let Some(family) = t.get("family").and_then(Value::as_str) {
                table.family = family.to_owned();
            }
            continue;
        }
        let Some(rule) = item.get("rule") else {
            continue;
        };
        let Some(chain) = rule.get("chain").and_then(Value::as_str) else {
            continue;
        };
        if !OWNED_CHAINS.contains(&chain) {
            continue;
        }
        let exprs = rule
            .get("expr")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let mapping = MAPPING_CHAINS
            .contains(&chain)
            .then(|| mapping_of(exprs))
            .flatten();
        match (
            rule.get("comment").and_then(Value::as_str),
            rule.get("handle").and_then(Value::as_u64),
        ) {
            (Some(id), Some(handle)) => table.rules.push(OwnedRule {
                chain: chain.to_owned(),
                handle,
                container_id: id.to_owned(),
                mapping,
            }),
            _ if MAPPING_CHAINS.contains(&chain) => table.unowned_mappings += 1,
            _ => {}
        }
    }
    table
}

impl Table {
    /// The `nft -f -` script that removes the rules of the containers
    /// `remove` selects and, when no mapping rule is left after that, the
    /// whole table (as the state before upstream's first ADD had none).
    /// Upstream's own DEL never removes its table, so a table without any
    /// mapping goes even when `remove` selects nothing in it. `None` when
    /// there is nothing to remove.
    pub fn removal_script(&self, remove: impl Fn(&str) -> bool) -> Option<String> {
        let (gone, kept): (Vec<&OwnedRule>, Vec<&OwnedRule>) =
            self.rules.iter().partition(|r| remove(&r.container_id));
        let unused = self.unowned_mappings == 0 && !self.rules.iter().any(|r| r.mapping.is_some());
        if gone.is_empty() && !unused {
            return None;
        }
        let family = if self.family.is_empty() {
            "ip"
        } else {
            &self.family
        };
        if self.unowned_mappings == 0 && !kept.iter().any(|r| r.mapping.is_some()) {
            return Some(format!("delete table {family} {TABLE}\n"));
        }
        let mut script = String::new();
        for rule in gone {
            script.push_str(&format!(
                "delete rule {family} {TABLE} {} handle {}\n",
                rule.chain, rule.handle
            ));
        }
        Some(script)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What `nft -j list table ip cni_hostport` prints after upstream's
    /// ADD of two containers (one with a hostIP), SNAT on.
    fn listed() -> Value {
        let tcp_dport = |port: u16| json!({"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": port}});
        json!({"nftables": [
            {"metainfo": {"version": "1.0.9", "json_schema_version": 1}},
            {"table": {"family": "ip", "name": "cni_hostport", "handle": 7, "comment": "CNI portmap plugin"}},
            {"chain": {"family": "ip", "table": "cni_hostport", "name": "hostports", "handle": 1}},
            {"chain": {"family": "ip", "table": "cni_hostport", "name": "hostip_hostports", "handle": 2}},
            {"rule": {"family": "ip", "table": "cni_hostport", "chain": "hostports_all", "handle": 5,
                      "expr": [{"jump": {"target": "hostports"}}]}},
            {"rule": {"family": "ip", "table": "cni_hostport", "chain": "hostports", "handle": 9, "comment": "c1",
                      "expr": [tcp_dport(8080), {"dnat": {"addr": "10.244.0.5", "port": 80}}]}},
            {"rule": {"family": "ip", "table": "cni_hostport", "chain": "hostports", "handle": 10, "comment": "c2",
                      "expr": [
                        {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": "198.18.0.1"}},
                        {"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": 53}},
                        {"dnat": {"addr": "10.244.0.6", "port": 5353}}]}},
            {"rule": {"family": "ip", "table": "cni_hostport", "chain": "masquerading", "handle": 11, "comment": "c1",
                      "expr": [{"masquerade": null}]}},
        ]})
    }

    #[test]
    fn mapping_rules_are_read_with_their_container() {
        let table = parse_table(&listed());
        assert_eq!(table.family, "ip");
        let mappings: Vec<(&str, Port)> = table
            .rules
            .iter()
            .filter_map(|r| Some((r.container_id.as_str(), r.mapping?)))
            .collect();
        assert_eq!(
            mappings,
            [
                (
                    "c1",
                    Port {
                        protocol: Protocol::Tcp,
                        host_port: 8080,
                        host_addr: None,
                        container_addr: "10.244.0.5".parse().unwrap(),
                        container_port: 80,
                    }
                ),
                (
                    "c2",
                    Port {
                        protocol: Protocol::Udp,
                        host_port: 53,
                        host_addr: Some("198.18.0.1".parse().unwrap()),
                        container_addr: "10.244.0.6".parse().unwrap(),
                        container_port: 5353,
                    }
                ),
            ]
        );
        assert_eq!(table.rules.len(), 3, "the masquerading rule is owned too");
    }

    #[test]
    fn one_container_goes_by_handle_and_the_last_takes_the_table() {
        let table = parse_table(&listed());
        assert_eq!(
            table.removal_script(|id| id == "c1").as_deref(),
            Some(
                "delete rule ip cni_hostport hostports handle 9\n\
                 delete rule ip cni_hostport masquerading handle 11\n"
            )
        );
        assert_eq!(
            table.removal_script(|_| true).as_deref(),
            Some("delete table ip cni_hostport\n")
        );
        assert_eq!(table.removal_script(|id| id == "c3"), None);
    }

    /// `nft -j list table ip|ip6 cni_hostport` (nft 1.0.6) after upstream
    /// portmap 1.9.1's ADD of container `old` with 8080->80/tcp and
    /// 8081->81/udp, captured in tests/tests/switch.rs's node namespace.
    const REAL_IP: &str = include_str!("testdata/portmap-1.9.1-ip.json");
    const REAL_IP6: &str = include_str!("testdata/portmap-1.9.1-ip6.json");

    #[test]
    fn upstream_1_9_1s_real_tables_are_read() {
        for (text, family, addr) in [(REAL_IP, "ip", "10.244.0.2"), (REAL_IP6, "ip6", "fd44::2")] {
            let table = parse_table(&serde_json::from_str(text).unwrap());
            assert_eq!(table.family, family);
            assert_eq!(table.unowned_mappings, 0, "{family}");
            let mappings: Vec<Port> = table.rules.iter().filter_map(|r| r.mapping).collect();
            let addr: IpAddr = addr.parse().unwrap();
            assert_eq!(
                mappings,
                [(Protocol::Tcp, 8080, 80), (Protocol::Udp, 8081, 81)].map(
                    |(protocol, host_port, container_port)| Port {
                        protocol,
                        host_port,
                        host_addr: None,
                        container_addr: addr,
                        container_port,
                    }
                ),
                "{family}"
            );
            assert!(table.rules.iter().all(|r| r.container_id == "old"));
            // Hairpin (and, for IPv4, localhost) masquerading is old's too.
            assert!(table.rules.iter().any(|r| r.chain == "masquerading"));
            assert_eq!(
                table.removal_script(|id| id == "old").as_deref(),
                Some(format!("delete table {family} cni_hostport\n").as_str())
            );
        }
    }

    #[test]
    fn a_table_upstreams_own_del_emptied_goes_whoever_is_selected() {
        let mut emptied = listed();
        emptied["nftables"].as_array_mut().unwrap().retain(|item| {
            item.get("rule")
                .is_none_or(|rule| rule.get("comment").is_none())
        });
        let table = parse_table(&emptied);
        assert_eq!(
            table.removal_script(|_| false).as_deref(),
            Some("delete table ip cni_hostport\n")
        );
    }
}
