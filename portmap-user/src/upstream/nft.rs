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
//! iptables, no network name; the rule's container address (the DNAT's,
//! the masquerade's `daddr`) is what ties it to one attachment.
//!
//! A removal is one `nft -f` batch of `delete rule ... handle N`, which
//! fails whole if any handle is gone. The table goes only when every rule
//! in it, counted from the raw listing, is either going now or one of
//! upstream's own jumps between its chains, and it holds nothing else (no
//! set, map, or chain of another name). Those jumps are deleted by handle
//! in the same batch, and upstream's ADD rewrites them (flush and add) in
//! every transaction: an ADD after the read makes the batch fail rather
//! than lose its table.

use std::net::IpAddr;

use serde_json::Value;

use super::Port;
use crate::model::Protocol;

pub const TABLE: &str = "cni_hostport";
/// The chains whose rules carry a container's ID.
pub const OWNED_CHAINS: [&str; 3] = ["hostports", "hostip_hostports", "masquerading"];
const MAPPING_CHAINS: [&str; 2] = ["hostports", "hostip_hostports"];
/// Every chain upstream makes (1.5 to 1.9): the table holds no other.
const UPSTREAM_CHAINS: [&str; 6] = [
    "hostports",
    "hostip_hostports",
    "hostports_all",
    "prerouting",
    "output",
    "masquerading",
];
/// The chains of upstream's own jumps (no container's).
const JUMP_CHAINS: [&str; 3] = ["prerouting", "output", "hostports_all"];

/// One rule of the table, whatever it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub chain: String,
    pub handle: Option<u64>,
    /// Upstream's comment: the container ID.
    pub comment: Option<String>,
    /// Set for a port mapping this parser reads.
    pub mapping: Option<Port>,
    /// The container address the rule serves (the DNAT's, the
    /// masquerade's `daddr`), when read.
    pub container_addr: Option<IpAddr>,
    /// One of upstream's own jumps between its chains.
    pub jump: bool,
}

impl Rule {
    /// The container this rule is upstream's for: a commented rule of one
    /// of the container chains.
    pub fn owner(&self) -> Option<&str> {
        OWNED_CHAINS
            .contains(&self.chain.as_str())
            .then_some(self.comment.as_deref())
            .flatten()
    }
}

/// The table as `nft -j list table` prints it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub family: String,
    /// Every rule listed, read or not.
    pub rules: Vec<Rule>,
    pub chains: Vec<String>,
    /// Listed objects other than the table, its chains and rules (sets,
    /// maps, counters, ...).
    pub others: usize,
}

/// A removal: the batch, and whether the table goes with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    pub script: String,
    pub table: bool,
}

fn payload_match<'a>(expr: &'a Value, field: &str) -> Option<(&'a str, &'a Value)> {
    let matched = expr.get("match")?;
    let payload = matched.get("left")?.get("payload")?;
    if payload.get("field")?.as_str()? != field {
        return None;
    }
    Some((payload.get("protocol")?.as_str()?, matched.get("right")?))
}

fn port_of(value: &Value) -> Option<u16> {
    value.as_u64().and_then(|p| u16::try_from(p).ok())
}

fn mapping_of(exprs: &[Value]) -> Option<Port> {
    let mut protocol = None;
    let mut host_port = None;
    let mut host_addr = None;
    let mut destination = None;
    for expr in exprs {
        if let Some((proto, right)) = payload_match(expr, "dport") {
            protocol = Protocol::from_name(proto);
            host_port = Some(port_of(right)?);
        } else if let Some((_, right)) = payload_match(expr, "daddr") {
            host_addr = Some(right.as_str()?.parse().ok()?);
        } else if let Some(dnat) = expr.get("dnat") {
            let addr: IpAddr = dnat.get("addr")?.as_str()?.parse().ok()?;
            destination = Some((addr, port_of(dnat.get("port")?)?));
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

/// The `daddr` of a masquerading rule: the container's address.
fn masquerade_addr(exprs: &[Value]) -> Option<IpAddr> {
    if !exprs.iter().any(|e| e.get("masquerade").is_some()) {
        return None;
    }
    let (_, right) = exprs.iter().find_map(|e| payload_match(e, "daddr"))?;
    right.as_str()?.parse().ok()
}

/// Upstream's jump between its own chains: `[fib daddr type local] jump
/// CHAIN`, nothing else.
fn is_upstream_jump(chain: &str, exprs: &[Value]) -> bool {
    let Some((last, before)) = exprs.split_last() else {
        return false;
    };
    let jumps_home = last
        .get("jump")
        .and_then(|j| j.get("target"))
        .and_then(Value::as_str)
        .is_some_and(|t| UPSTREAM_CHAINS.contains(&t));
    let local_only = |e: &Value| {
        e.get("match").is_some_and(|m| {
            m.get("left").and_then(|l| l.get("fib")).is_some()
                && m.get("right").and_then(Value::as_str) == Some("local")
        })
    };
    JUMP_CHAINS.contains(&chain) && jumps_home && before.iter().all(local_only)
}

/// Parses `nft -j list table <family> cni_hostport`.
pub fn parse_table(json: &Value) -> Table {
    let mut table = Table::default();
    let Some(items) = json.get("nftables").and_then(Value::as_array) else {
        return table;
    };
    for item in items {
        if item.get("metainfo").is_some() {
            continue;
        }
        if let Some(t) = item.get("table") {
            if let Some(family) = t.get("family").and_then(Value::as_str) {
                table.family = family.to_owned();
            }
            continue;
        }
        if let Some(chain) = item.get("chain") {
            let name = chain.get("name").and_then(Value::as_str).unwrap_or("");
            table.chains.push(name.to_owned());
            continue;
        }
        let Some(rule) = item.get("rule") else {
            table.others += 1;
            continue;
        };
        let chain = rule.get("chain").and_then(Value::as_str).unwrap_or("");
        let exprs = rule
            .get("expr")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let comment = rule.get("comment").and_then(Value::as_str);
        let mapping = MAPPING_CHAINS
            .contains(&chain)
            .then(|| mapping_of(exprs))
            .flatten();
        table.rules.push(Rule {
            chain: chain.to_owned(),
            handle: rule.get("handle").and_then(Value::as_u64),
            comment: comment.map(str::to_owned),
            container_addr: mapping
                .map(|m| m.container_addr)
                .or_else(|| masquerade_addr(exprs)),
            mapping,
            jump: comment.is_none() && is_upstream_jump(chain, exprs),
        });
    }
    table
}

impl Table {
    /// The `nft -f -` batch that deletes the rules `take` picks among the
    /// containers' (by handle), and the table itself when nothing but
    /// upstream's own jumps would be left in it (those by handle too, then
    /// the table). Upstream's own DEL never removes its table, so a table
    /// holding no container rule goes even when `take` picks nothing.
    /// `None` when there is nothing to remove.
    pub fn removal(&self, take: impl Fn(&Rule) -> bool) -> Option<Removal> {
        let family = if self.family.is_empty() {
            "ip"
        } else {
            &self.family
        };
        let taken = |r: &Rule| r.owner().is_some() && r.handle.is_some() && take(r);
        let gone: Vec<&Rule> = self.rules.iter().filter(|r| taken(r)).collect();
        let table = self.others == 0
            && self
                .chains
                .iter()
                .all(|c| UPSTREAM_CHAINS.contains(&c.as_str()))
            && self
                .rules
                .iter()
                .all(|r| taken(r) || (r.jump && r.handle.is_some()));
        if gone.is_empty() && !table {
            return None;
        }
        let deleted: Vec<&Rule> = if table {
            self.rules.iter().collect()
        } else {
            gone
        };
        let mut script = String::new();
        for rule in deleted {
            if let Some(handle) = rule.handle {
                script.push_str(&format!(
                    "delete rule {family} {TABLE} {} handle {handle}\n",
                    rule.chain
                ));
            }
        }
        if table {
            script.push_str(&format!("delete table {family} {TABLE}\n"));
        }
        Some(Removal { script, table })
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

    fn script(removal: Option<Removal>) -> Option<String> {
        removal.map(|r| r.script)
    }

    #[test]
    fn mapping_rules_are_read_with_their_container() {
        let table = parse_table(&listed());
        assert_eq!(table.family, "ip");
        let mappings: Vec<(&str, Port)> = table
            .rules
            .iter()
            .filter_map(|r| Some((r.owner()?, r.mapping?)))
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
        let owned = table.rules.iter().filter(|r| r.owner().is_some()).count();
        assert_eq!(owned, 3, "the masquerading rule is owned too");
        assert_eq!(table.rules.len(), 4, "and the jump is listed");
        assert!(table.rules[0].jump);
    }

    #[test]
    fn one_container_goes_by_handle_and_the_last_takes_the_table() {
        let table = parse_table(&listed());
        assert_eq!(
            script(table.removal(|r| r.owner() == Some("c1"))).as_deref(),
            Some(
                "delete rule ip cni_hostport hostports handle 9\n\
                 delete rule ip cni_hostport masquerading handle 11\n"
            )
        );
        // The last container: every rule by handle (so an ADD since the
        // read fails the batch), then the table.
        assert_eq!(
            table.removal(|_| true),
            Some(Removal {
                script: "delete rule ip cni_hostport hostports_all handle 5\n\
                         delete rule ip cni_hostport hostports handle 9\n\
                         delete rule ip cni_hostport hostports handle 10\n\
                         delete rule ip cni_hostport masquerading handle 11\n\
                         delete table ip cni_hostport\n"
                    .into(),
                table: true,
            })
        );
        assert_eq!(table.removal(|r| r.owner() == Some("c3")), None);
    }

    #[test]
    fn a_rule_the_parser_cannot_read_keeps_the_table() {
        // A mapping through a port set, commented like upstream's: no
        // mapping read, but a rule all the same.
        let mut with_set = listed();
        with_set["nftables"].as_array_mut().unwrap().push(json!(
            {"rule": {"family": "ip", "table": "cni_hostport", "chain": "hostports", "handle": 12, "comment": "future",
                      "expr": [
                        {"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}},
                                   "right": {"set": [9000, 9001]}}},
                        {"dnat": {"addr": "10.244.0.9", "port": 80}}]}}
        ));
        let table = parse_table(&with_set);
        let future = table.rules.last().unwrap();
        assert_eq!((future.owner(), future.mapping), (Some("future"), None));
        let taken = |r: &Rule| matches!(r.owner(), Some("c1" | "c2"));
        let removal = table.removal(taken).expect("c1 and c2 go");
        assert!(!removal.table, "{}", removal.script);
        assert!(!removal.script.contains("delete table"));
        // Nor does a rule without a comment, or any other object.
        for extra in [
            json!({"rule": {"family": "ip", "table": "cni_hostport", "chain": "hostports", "handle": 12,
                            "expr": [{"counter": {"packets": 0, "bytes": 0}}]}}),
            json!({"set": {"family": "ip", "table": "cni_hostport", "name": "ports", "handle": 12, "type": "inet_service"}}),
            json!({"chain": {"family": "ip", "table": "cni_hostport", "name": "mine", "handle": 12}}),
        ] {
            let mut listed = listed();
            listed["nftables"]
                .as_array_mut()
                .unwrap()
                .push(extra.clone());
            let removal = parse_table(&listed).removal(|_| true).expect("rules go");
            assert!(!removal.table, "{extra}: {}", removal.script);
        }
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
            // Every rule is old's or one of upstream's jumps, each with
            // the container's address where it serves one.
            for rule in &table.rules {
                match rule.owner() {
                    Some(id) => {
                        assert_eq!(id, "old", "{rule:?}");
                        assert_eq!(rule.container_addr, Some(addr), "{rule:?}");
                    }
                    None => assert!(rule.jump, "{rule:?}"),
                }
            }
            // Hairpin (and, for IPv4, localhost) masquerading is old's too.
            assert!(table.rules.iter().any(|r| r.chain == "masquerading"));
            let removal = table
                .removal(|r| r.owner() == Some("old"))
                .expect("old's rules go");
            assert!(removal.table, "{family}");
            let handles = removal.script.matches(" handle ").count();
            assert_eq!(handles, table.rules.len(), "{}", removal.script);
            assert!(
                removal
                    .script
                    .ends_with(&format!("delete table {family} cni_hostport\n"))
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
            script(table.removal(|_| false)).as_deref(),
            Some(
                "delete rule ip cni_hostport hostports_all handle 5\n\
                 delete table ip cni_hostport\n"
            )
        );
    }
}
