//! Upstream `portmap`'s iptables backend (plugins up to 1.4, and 1.5+ with
//! `"backend": "iptables"`), read from `iptables-save -t nat` and changed
//! through one `iptables-restore --noflush` batch per family.
//!
//! The layout upstream writes (`plugins/meta/portmap/portmap_iptables.go`),
//! all in the `nat` table:
//! - `PREROUTING` and `OUTPUT`: `-m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT`;
//! - `CNI-HOSTPORT-DNAT`: per container and protocol, `-p tcp -m comment
//!   --comment "dnat name: \"NET\" id: \"ID\"" -m multiport --dports 8080,9090
//!   -j CNI-DN-<hash>`;
//! - `CNI-DN-<hash>`: per mapping, `[-d HOSTIP/32] -p tcp -m tcp --dport 8080
//!   -j DNAT --to-destination 10.244.0.5:80`, behind the hairpin and
//!   localhost rules that jump to `CNI-HOSTPORT-SETMARK`;
//! - `POSTROUTING`: `-j CNI-HOSTPORT-MASQ` (marked traffic masqueraded),
//!   and `CNI-HOSTPORT-SETMARK`, which sets that mark.
//!
//! Parsing and the batches are pure and tested here; running the tools is
//! in [`super`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::Port;
use crate::model::Protocol;

pub const TOP_DNAT_CHAIN: &str = "CNI-HOSTPORT-DNAT";
pub const SET_MARK_CHAIN: &str = "CNI-HOSTPORT-SETMARK";
pub const MASQ_CHAIN: &str = "CNI-HOSTPORT-MASQ";
/// The chain of plugins before 0.7 (`CNI-HOSTPORT-SNAT`); removed with the others.
pub const OLD_SNAT_CHAIN: &str = "CNI-HOSTPORT-SNAT";
pub const CONTAINER_CHAIN_PREFIX: &str = "CNI-DN-";
const SHARED_CHAINS: [&str; 4] = [TOP_DNAT_CHAIN, SET_MARK_CHAIN, MASQ_CHAIN, OLD_SNAT_CHAIN];

/// One `-A CHAIN ...` line of the nat table: its chain, its arguments (as
/// a shell splits them) and its text after the chain name, as
/// `iptables-restore` reads it back (for `-D`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub chain: String,
    pub args: Vec<String>,
    pub text: String,
}

impl Rule {
    /// The value after `option` (`-j`, `--dport`, ...).
    fn value(&self, option: &str) -> Option<&str> {
        let at = self.args.iter().position(|a| a == option)?;
        self.args.get(at + 1).map(String::as_str)
    }
}

/// The nat table as `iptables-save -t nat` prints it: chains and rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatTable {
    /// Every chain declared (`:NAME POLICY [counters]`), built-in ones too.
    pub chains: BTreeSet<String>,
    pub rules: Vec<Rule>,
}

/// One port a container chain maps, with its owner from the jump's comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainMapping {
    pub chain: String,
    /// From `dnat name: "NET" id: "ID"`; `None` when no jump names the chain
    /// with that comment (a leftover nobody owns).
    pub network: Option<String>,
    pub container_id: Option<String>,
    pub port: Port,
}

/// Splits one line as `iptables-save` quotes it: words separated by
/// spaces, `"..."` quoting, `\"` and `\\` escaped inside quotes.
pub fn split_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quoted = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            '\\' if quoted => {
                if let Some(next) = chars.next() {
                    word.push(next);
                }
            }
            ' ' | '\t' if !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// Parses the `*nat` section of `iptables-save` output (other tables, if
/// any, are skipped).
pub fn parse_save(text: &str) -> NatTable {
    let mut table = NatTable::default();
    let mut in_nat = false;
    for line in text.lines() {
        let line = line.trim_end();
        if let Some(name) = line.strip_prefix('*') {
            in_nat = name == "nat";
            continue;
        }
        if !in_nat {
            continue;
        }
        if let Some(declaration) = line.strip_prefix(':') {
            if let Some(name) = declaration.split_whitespace().next() {
                table.chains.insert(name.to_owned());
            }
        } else if let Some(rest) = line.strip_prefix("-A ")
            && let Some((chain, text)) = rest.split_once(' ')
        {
            table.rules.push(Rule {
                chain: chain.to_owned(),
                args: split_words(text),
                text: text.to_owned(),
            });
        }
    }
    table
}

/// (network, container ID) of upstream's comment `dnat name: "NET" id: "ID"`.
pub fn parse_owner_comment(comment: &str) -> Option<(String, String)> {
    let rest = comment.strip_prefix("dnat name: \"")?;
    let (network, rest) = rest.split_once("\" id: \"")?;
    // Upstream trims comments to 256 characters; an ID cut there has no
    // closing quote.
    let id = rest.strip_suffix('"').unwrap_or(rest);
    Some((network.to_owned(), id.to_owned()))
}

fn strip_prefix_len(addr: &str) -> Option<IpAddr> {
    addr.split('/').next()?.parse().ok()
}

/// `10.244.0.5:80` or `[fd44::5]:80`.
fn parse_destination(text: &str) -> Option<(IpAddr, u16)> {
    let (addr, port) = text.rsplit_once(':')?;
    let addr = addr.trim_start_matches('[').trim_end_matches(']');
    Some((addr.parse().ok()?, port.parse().ok()?))
}

impl NatTable {
    /// (network, container ID) of each container chain, from the jumps of
    /// `CNI-HOSTPORT-DNAT`.
    pub fn owners(&self) -> BTreeMap<String, (String, String)> {
        let mut owners = BTreeMap::new();
        for rule in self.rules.iter().filter(|r| r.chain == TOP_DNAT_CHAIN) {
            let (Some(target), Some(comment)) = (rule.value("-j"), rule.value("--comment")) else {
                continue;
            };
            if let Some(owner) = parse_owner_comment(comment) {
                owners.insert(target.to_owned(), owner);
            }
        }
        owners
    }

    /// Every DNAT rule of every container chain, with its owner.
    pub fn mappings(&self) -> Vec<ChainMapping> {
        let owners = self.owners();
        let mut mappings = Vec::new();
        for rule in &self.rules {
            if !rule.chain.starts_with(CONTAINER_CHAIN_PREFIX) || rule.value("-j") != Some("DNAT") {
                continue;
            }
            let Some(protocol) = rule.value("-p").and_then(Protocol::from_name) else {
                continue;
            };
            let Some(host_port) = rule.value("--dport").and_then(|p| p.parse().ok()) else {
                continue;
            };
            let Some((container_addr, container_port)) =
                rule.value("--to-destination").and_then(parse_destination)
            else {
                continue;
            };
            let owner = owners.get(&rule.chain);
            mappings.push(ChainMapping {
                chain: rule.chain.clone(),
                network: owner.map(|o| o.0.clone()),
                container_id: owner.map(|o| o.1.clone()),
                port: Port {
                    protocol,
                    host_port,
                    host_addr: rule.value("-d").and_then(strip_prefix_len),
                    container_addr,
                    container_port,
                },
            });
        }
        mappings
    }

    /// Whether upstream has anything in this table.
    pub fn has_upstream_state(&self) -> bool {
        self.chains
            .iter()
            .any(|c| c.starts_with(CONTAINER_CHAIN_PREFIX) || SHARED_CHAINS.contains(&c.as_str()))
    }

    /// The `iptables-restore --noflush` batch that removes the container
    /// chains in `chains` (their jumps, then the chains), and, when no
    /// container chain is left after that, upstream's shared chains and
    /// the built-in chains' jumps to them. `None` when there is nothing to
    /// remove.
    pub fn removal_batch(&self, chains: &BTreeSet<String>) -> Option<String> {
        let chains: BTreeSet<&String> = chains
            .iter()
            .filter(|c| self.chains.contains(*c) && c.starts_with(CONTAINER_CHAIN_PREFIX))
            .collect();
        // Two transactions: iptables-nft refuses to delete a chain (EBUSY)
        // in the transaction that deletes the last jump to it.
        let mut rules = Vec::new();
        let mut removals = Vec::new();
        for rule in &self.rules {
            if rule
                .value("-j")
                .is_some_and(|t| chains.iter().any(|c| c.as_str() == t))
            {
                rules.push(format!("-D {} {}", rule.chain, rule.text));
            }
        }
        for chain in &chains {
            rules.push(format!("-F {chain}"));
            removals.push(format!("-X {chain}"));
        }
        let left = self
            .chains
            .iter()
            .any(|c| c.starts_with(CONTAINER_CHAIN_PREFIX) && !chains.contains(c));
        let shared: Vec<&str> = SHARED_CHAINS
            .into_iter()
            .filter(|c| self.chains.contains(*c))
            .collect();
        if !left && !shared.is_empty() {
            // What jumps to a shared chain from anywhere else goes, then the
            // shared chains' own rules (one jumps to another), then the chains.
            for rule in &self.rules {
                let jumps_to_shared = rule.value("-j").is_some_and(|t| shared.contains(&t));
                if jumps_to_shared
                    && !shared.contains(&rule.chain.as_str())
                    && !chains.contains(&rule.chain)
                {
                    rules.push(format!("-D {} {}", rule.chain, rule.text));
                }
            }
            for chain in &shared {
                rules.push(format!("-F {chain}"));
                removals.push(format!("-X {chain}"));
            }
        }
        if rules.is_empty() {
            return None;
        }
        let mut batch = format!("*nat\n{}\nCOMMIT\n", rules.join("\n"));
        if !removals.is_empty() {
            batch.push_str(&format!("*nat\n{}\nCOMMIT\n", removals.join("\n")));
        }
        Some(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Debian's portmap 1.1.1 wrote for two ports and a hostIP (as
    /// `iptables-nft-save` printed it), plus a second container.
    const SAVED: &str = r#"# Generated by iptables-nft-save v1.8.9 (nf_tables)
*filter
:INPUT ACCEPT [0:0]
-A INPUT -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-DN-9d45ae2ed27a800254389 - [0:0]
:CNI-DN-1111111111111111111111 - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:CNI-HOSTPORT-MASQ - [0:0]
:CNI-HOSTPORT-SETMARK - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
-A POSTROUTING -s 10.9.0.0/16 -j MASQUERADE
-A CNI-DN-9d45ae2ed27a800254389 -s 10.244.0.0/24 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-9d45ae2ed27a800254389 -s 127.0.0.1/32 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-9d45ae2ed27a800254389 -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.244.0.5:80
-A CNI-DN-9d45ae2ed27a800254389 -p udp -m udp --dport 8081 -j DNAT --to-destination 10.244.0.5:81
-A CNI-DN-9d45ae2ed27a800254389 -d 198.18.0.1/32 -p tcp -m tcp --dport 9090 -j DNAT --to-destination 10.244.0.5:90
-A CNI-DN-1111111111111111111111 -p tcp -m tcp --dport 7070 -j DNAT --to-destination [fd44::7]:70
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"netx\" id: \"abcdef123\"" -m multiport --dports 8080,9090 -j CNI-DN-9d45ae2ed27a800254389
-A CNI-HOSTPORT-DNAT -p udp -m comment --comment "dnat name: \"netx\" id: \"abcdef123\"" -m multiport --dports 8081 -j CNI-DN-9d45ae2ed27a800254389
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"other\" id: \"c2\"" -m multiport --dports 7070 -j CNI-DN-1111111111111111111111
-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
-A CNI-HOSTPORT-SETMARK -m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000
COMMIT
"#;

    const FIRST: &str = "CNI-DN-9d45ae2ed27a800254389";
    const SECOND: &str = "CNI-DN-1111111111111111111111";

    #[test]
    fn words_are_split_as_iptables_save_quotes_them() {
        assert_eq!(
            split_words(r#"-p tcp -m comment --comment "dnat name: \"n\" id: \"i\"" -j X"#),
            [
                "-p",
                "tcp",
                "-m",
                "comment",
                "--comment",
                r#"dnat name: "n" id: "i""#,
                "-j",
                "X"
            ]
        );
        assert_eq!(split_words(r#"--comment "a\\b""#), ["--comment", r"a\b"]);
    }

    #[test]
    fn the_owner_comes_from_the_comment() {
        assert_eq!(
            parse_owner_comment(r#"dnat name: "cbr0" id: "3a1b""#),
            Some(("cbr0".into(), "3a1b".into()))
        );
        assert_eq!(parse_owner_comment("CNI portfwd masquerade mark"), None);
    }

    #[test]
    fn every_dnat_rule_becomes_a_mapping_with_its_owner() {
        let table = parse_save(SAVED);
        assert!(table.chains.contains(FIRST) && table.chains.contains("PREROUTING"));
        assert!(!table.chains.contains("INPUT ACCEPT"), "{:?}", table.chains);
        let mappings = table.mappings();
        type Seen<'a> = (u16, Protocol, Option<IpAddr>, IpAddr, u16, Option<&'a str>);
        let ports: Vec<Seen> = mappings
            .iter()
            .map(|m| {
                (
                    m.port.host_port,
                    m.port.protocol,
                    m.port.host_addr,
                    m.port.container_addr,
                    m.port.container_port,
                    m.container_id.as_deref(),
                )
            })
            .collect();
        let v4 = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            ports,
            [
                (
                    8080,
                    Protocol::Tcp,
                    None,
                    v4("10.244.0.5"),
                    80,
                    Some("abcdef123")
                ),
                (
                    8081,
                    Protocol::Udp,
                    None,
                    v4("10.244.0.5"),
                    81,
                    Some("abcdef123")
                ),
                (
                    9090,
                    Protocol::Tcp,
                    Some(v4("198.18.0.1")),
                    v4("10.244.0.5"),
                    90,
                    Some("abcdef123")
                ),
                (7070, Protocol::Tcp, None, v4("fd44::7"), 70, Some("c2")),
            ]
        );
        assert_eq!(mappings[0].network.as_deref(), Some("netx"));
    }

    #[test]
    fn removing_one_container_keeps_the_shared_chains_while_another_is_mapped() {
        let table = parse_save(SAVED);
        let batch = table
            .removal_batch(&BTreeSet::from([FIRST.to_owned()]))
            .expect("something to remove");
        assert_eq!(
            batch,
            format!(
                "*nat\n\
                 -D CNI-HOSTPORT-DNAT -p tcp -m comment --comment \"dnat name: \\\"netx\\\" id: \\\"abcdef123\\\"\" -m multiport --dports 8080,9090 -j {FIRST}\n\
                 -D CNI-HOSTPORT-DNAT -p udp -m comment --comment \"dnat name: \\\"netx\\\" id: \\\"abcdef123\\\"\" -m multiport --dports 8081 -j {FIRST}\n\
                 -F {FIRST}\nCOMMIT\n*nat\n-X {FIRST}\nCOMMIT\n"
            )
        );
    }

    #[test]
    fn removing_the_last_container_removes_the_shared_chains_and_their_jumps() {
        let table = parse_save(SAVED);
        let batch = table
            .removal_batch(&BTreeSet::from([FIRST.to_owned(), SECOND.to_owned()]))
            .expect("something to remove");
        let lines: Vec<&str> = batch.lines().collect();
        assert!(lines.contains(&"-D PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT"));
        assert!(lines.contains(&"-D OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT"));
        assert!(lines.contains(
            &"-D POSTROUTING -m comment --comment \"CNI portfwd requiring masquerade\" -j CNI-HOSTPORT-MASQ"
        ));
        // Another tool's rule in POSTROUTING stays.
        assert!(!batch.contains("10.9.0.0/16"), "{batch}");
        // The shared chains' own rules are flushed, not deleted one by one.
        assert!(!batch.contains("-D CNI-HOSTPORT-MASQ"), "{batch}");
        let second = batch
            .split("COMMIT\n")
            .nth(1)
            .expect("a second transaction");
        assert_eq!(
            second,
            format!(
                "*nat\n-X {SECOND}\n-X {FIRST}\n-X CNI-HOSTPORT-DNAT\n-X CNI-HOSTPORT-SETMARK\n\
                 -X CNI-HOSTPORT-MASQ\n"
            )
        );
        for chain in [
            "CNI-HOSTPORT-DNAT",
            "CNI-HOSTPORT-SETMARK",
            "CNI-HOSTPORT-MASQ",
        ] {
            assert!(lines.contains(&format!("-F {chain}").as_str()), "{batch}");
        }
    }

    #[test]
    fn nothing_to_remove_is_no_batch() {
        let table = parse_save(SAVED);
        assert_eq!(
            table.removal_batch(&BTreeSet::from(["CNI-DN-gone".to_owned()])),
            None
        );
        assert_eq!(parse_save("").removal_batch(&BTreeSet::new()), None);
    }

    #[test]
    fn shared_chains_left_alone_are_removed_with_no_container_chain() {
        // A node where every container chain is gone but the shared ones stay
        // (upstream's own DEL never removes them).
        let text = "*nat\n:PREROUTING ACCEPT [0:0]\n:CNI-HOSTPORT-DNAT - [0:0]\n\
                    -A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\nCOMMIT\n";
        let table = parse_save(text);
        assert!(table.has_upstream_state());
        assert_eq!(
            table.removal_batch(&BTreeSet::new()).as_deref(),
            Some(
                "*nat\n-D PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n\
                 -F CNI-HOSTPORT-DNAT\nCOMMIT\n*nat\n-X CNI-HOSTPORT-DNAT\nCOMMIT\n"
            )
        );
    }
}
