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
//! Upstream cuts the jump's comment past 255 bytes (`trimComment`: the
//! first 253 and `...`, of which iptables stores 255), which a network name
//! of more than 171 bytes reaches with a 64-character container ID: such a
//! comment names a prefix of the ID, or of the network. Owners are therefore matched on the comment upstream
//! would write ([`owner_comment`]), never on what a cut comment seems to say.
//!
//! A removal is one `iptables-restore --noflush` transaction of exact `-D`
//! lines (never `-F`) and `-X`: `-X` of a chain that gained a rule since
//! the read fails, and with it the whole transaction.
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
    /// The owner comment of the jumps to the chain, as written; `None` when
    /// no jump names the chain with one (a leftover nobody owns).
    pub comment: Option<String>,
    pub port: Port,
}

/// A removal of container chains, as `iptables-restore --noflush` input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// One transaction: the exact rules, then the chains; upstream's
    /// shared chains too when `shared`.
    pub batch: String,
    pub shared: bool,
    /// For an iptables that refuses `-X` in the transaction that deletes
    /// the last jump to the chain: the container chains alone, their rules
    /// in one transaction and the chains in a second. `None` when no
    /// container chain is removed.
    pub split: Option<String>,
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

/// iptables' longest comment (`XT_MAX_COMMENT_LEN` less the NUL): it
/// stores the first 255 bytes of a longer one.
const MAX_COMMENT_LEN: usize = 255;
/// How much of a longer comment upstream keeps before its `...`.
const CUT_COMMENT_KEEP: usize = 253;
const OWNER_PREFIX: &str = "dnat name: \"";
const OWNER_MIDDLE: &str = "\" id: \"";

/// The comment on the jumps to the container chain of `container_id` on
/// `network`, as upstream writes it and iptables stores it: `dnat name:
/// "NET" id: "ID"`; over 255 bytes, upstream's `trimComment` keeps the
/// first 253 and adds `...` (256 bytes), of which iptables stores the
/// first 255, so the stored comment ends in `..` (CNI names are ASCII, so
/// bytes and characters agree).
pub fn owner_comment(network: &str, container_id: &str) -> String {
    let full = format!("{OWNER_PREFIX}{network}{OWNER_MIDDLE}{container_id}\"");
    if full.len() <= MAX_COMMENT_LEN {
        return full;
    }
    let mut keep = CUT_COMMENT_KEEP;
    while !full.is_char_boundary(keep) {
        keep -= 1;
    }
    let mut cut = format!("{}...", &full[..keep]);
    cut.truncate(MAX_COMMENT_LEN);
    cut
}

/// Whether `comment` is one upstream cut (as iptables stores it).
pub fn is_cut(comment: &str) -> bool {
    comment.len() == MAX_COMMENT_LEN && comment.get(CUT_COMMENT_KEEP..) == Some("..")
}

/// What an owner comment says, as far as upstream's cut left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerComment {
    /// The network, or its first bytes when `network_cut`.
    pub network: String,
    pub network_cut: bool,
    /// The container ID, or its first bytes (maybe none) when `id_cut`.
    pub container_id: String,
    pub id_cut: bool,
}

impl OwnerComment {
    /// The network as shown: a cut one ends in `...`.
    pub fn network_shown(&self) -> String {
        if self.network_cut {
            format!("{}...", self.network)
        } else {
            self.network.clone()
        }
    }

    /// The container ID as shown: a cut one ends in `...`.
    pub fn id_shown(&self) -> String {
        if self.id_cut {
            format!("{}...", self.container_id)
        } else {
            self.container_id.clone()
        }
    }
}

/// Reads upstream's owner comment `dnat name: "NET" id: "ID"`, whole or cut.
pub fn parse_owner_comment(comment: &str) -> Option<OwnerComment> {
    if is_cut(comment) {
        let body = comment[..CUT_COMMENT_KEEP].strip_prefix(OWNER_PREFIX)?;
        return Some(match body.split_once(OWNER_MIDDLE) {
            Some((network, id)) => OwnerComment {
                network: network.to_owned(),
                network_cut: false,
                container_id: id.to_owned(),
                id_cut: true,
            },
            None => OwnerComment {
                network: body.to_owned(),
                network_cut: true,
                container_id: String::new(),
                id_cut: true,
            },
        });
    }
    let rest = comment.strip_prefix(OWNER_PREFIX)?.strip_suffix('"')?;
    let (network, id) = rest.split_once(OWNER_MIDDLE)?;
    Some(OwnerComment {
        network: network.to_owned(),
        network_cut: false,
        container_id: id.to_owned(),
        id_cut: false,
    })
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
    /// The owner comment of each container chain, from the jumps of
    /// `CNI-HOSTPORT-DNAT` (only comments of upstream's form).
    pub fn owners(&self) -> BTreeMap<String, String> {
        let mut owners = BTreeMap::new();
        for rule in self.rules.iter().filter(|r| r.chain == TOP_DNAT_CHAIN) {
            let (Some(target), Some(comment)) = (rule.value("-j"), rule.value("--comment")) else {
                continue;
            };
            if parse_owner_comment(comment).is_some() {
                owners.insert(target.to_owned(), comment.to_owned());
            }
        }
        owners
    }

    /// Where `chain`'s DNAT rules send traffic: the container's addresses.
    pub fn destinations(&self, chain: &str) -> Vec<IpAddr> {
        let mut addrs: Vec<IpAddr> = self
            .rules
            .iter()
            .filter(|r| r.chain == chain && r.value("-j") == Some("DNAT"))
            .filter_map(|r| r.value("--to-destination").and_then(parse_destination))
            .map(|(addr, _)| addr)
            .collect();
        addrs.sort();
        addrs.dedup();
        addrs
    }

    /// Every DNAT rule of every container chain, with its owner comment.
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
            mappings.push(ChainMapping {
                chain: rule.chain.clone(),
                comment: owners.get(&rule.chain).cloned(),
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

    fn jumps_to(rule: &Rule, chains: &[&str]) -> bool {
        rule.value("-j").is_some_and(|t| chains.contains(&t))
    }

    /// Whether a rule of a shared chain is one upstream writes there for
    /// itself (not a container's jump): the mark, and the masquerade of
    /// marked traffic.
    fn upstreams_own(rule: &Rule) -> bool {
        match rule.chain.as_str() {
            SET_MARK_CHAIN => rule.value("-j") == Some("MARK"),
            MASQ_CHAIN => rule.value("-j") == Some("MASQUERADE") && rule.value("--mark").is_some(),
            _ => false,
        }
    }

    /// The removal of the container chains in `chains` (those declared):
    /// each rule that jumps to one and each rule in one, exactly as read,
    /// then the chains. When no other container chain is declared and the
    /// shared chains hold nothing but upstream's own rules and the jumps
    /// going now, they go too, with every jump to them, in the same
    /// transaction: its `-X CNI-HOSTPORT-DNAT` fails if an ADD put a jump
    /// there after the read, so that ADD keeps the jump from PREROUTING.
    /// `None` when there is nothing to remove.
    pub fn removal(&self, chains: &BTreeSet<String>) -> Option<Removal> {
        let chains: Vec<&str> = chains
            .iter()
            .map(String::as_str)
            .filter(|c| self.chains.contains(*c) && c.starts_with(CONTAINER_CHAIN_PREFIX))
            .collect();
        let line = |rule: &Rule| format!("-D {} {}", rule.chain, rule.text);
        // The jumps first: no packet enters a chain being emptied.
        let in_chains = |r: &&Rule| chains.contains(&r.chain.as_str());
        let mut deletes: Vec<String> = self
            .rules
            .iter()
            .filter(|r| Self::jumps_to(r, &chains) && !in_chains(r))
            .chain(self.rules.iter().filter(in_chains))
            .map(line)
            .collect();
        let mut removals: Vec<String> = chains.iter().map(|c| format!("-X {c}")).collect();
        let split = (!chains.is_empty()).then(|| {
            format!(
                "*nat\n{}\nCOMMIT\n*nat\n{}\nCOMMIT\n",
                deletes.join("\n"),
                removals.join("\n")
            )
        });
        let shared: Vec<&str> = SHARED_CHAINS
            .into_iter()
            .filter(|c| self.chains.contains(*c))
            .collect();
        let other_container_chain = self
            .chains
            .iter()
            .any(|c| c.starts_with(CONTAINER_CHAIN_PREFIX) && !chains.contains(&c.as_str()));
        // Every rule of a shared chain is upstream's own or a jump going
        // now; anything else (another tool's, a container chain not
        // declared) keeps them all.
        let only_upstreams = self
            .rules
            .iter()
            .filter(|r| shared.contains(&r.chain.as_str()))
            .all(|r| Self::upstreams_own(r) || Self::jumps_to(r, &chains));
        let with_shared = !shared.is_empty() && !other_container_chain && only_upstreams;
        if with_shared {
            for rule in &self.rules {
                let going = chains.contains(&rule.chain.as_str()) || Self::jumps_to(rule, &chains);
                if going {
                    continue;
                }
                if shared.contains(&rule.chain.as_str()) || Self::jumps_to(rule, &shared) {
                    deletes.push(line(rule));
                }
            }
            removals.extend(shared.iter().map(|c| format!("-X {c}")));
        }
        if deletes.is_empty() && removals.is_empty() {
            return None;
        }
        let body: Vec<String> = deletes.into_iter().chain(removals).collect();
        Some(Removal {
            batch: format!("*nat\n{}\nCOMMIT\n", body.join("\n")),
            shared: with_shared,
            split,
        })
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
            Some(OwnerComment {
                network: "cbr0".into(),
                network_cut: false,
                container_id: "3a1b".into(),
                id_cut: false,
            })
        );
        assert_eq!(parse_owner_comment("CNI portfwd masquerade mark"), None);
        assert_eq!(
            owner_comment("cbr0", "3a1b"),
            r#"dnat name: "cbr0" id: "3a1b""#
        );
    }

    #[test]
    fn comments_over_255_bytes_are_cut_as_upstream_cuts_them() {
        let id = "0123456789abcdef".repeat(4);
        // 171 characters of network: 255 bytes, the longest left whole.
        let whole = owner_comment(&"n".repeat(171), &id);
        assert_eq!(whole.len(), 255);
        assert!(!is_cut(&whole));
        // 172: 256 bytes, cut by upstream to the first 253 and "...", of
        // which iptables stores 255 (as iptables-save shows them).
        let cut = owner_comment(&"n".repeat(172), &id);
        assert_eq!(cut.len(), 255);
        assert_eq!(
            cut,
            format!("dnat name: \"{}\" id: \"{}..", "n".repeat(172), &id[..62])
        );
        assert!(is_cut(&cut));
        assert_eq!(
            parse_owner_comment(&cut),
            Some(OwnerComment {
                network: "n".repeat(172),
                network_cut: false,
                container_id: id[..62].into(),
                id_cut: true,
            })
        );
        // 234 and more: no room for the ID; past 240, the network itself is cut.
        let network = "m".repeat(250);
        let no_id = owner_comment(&network, &id);
        assert_eq!(no_id, format!("dnat name: \"{}..", &network[..241]));
        let owner = parse_owner_comment(&no_id).expect("a cut owner comment");
        assert!(owner.network_cut && owner.id_cut, "{owner:?}");
        assert_eq!(owner.network_shown(), format!("{}...", &network[..241]));
    }

    #[test]
    fn every_dnat_rule_becomes_a_mapping_with_its_owner() {
        let table = parse_save(SAVED);
        assert!(table.chains.contains(FIRST) && table.chains.contains("PREROUTING"));
        assert!(!table.chains.contains("INPUT ACCEPT"), "{:?}", table.chains);
        let mappings = table.mappings();
        type Seen = (u16, Protocol, Option<IpAddr>, IpAddr, u16, Option<String>);
        let ports: Vec<Seen> = mappings
            .iter()
            .map(|m| {
                (
                    m.port.host_port,
                    m.port.protocol,
                    m.port.host_addr,
                    m.port.container_addr,
                    m.port.container_port,
                    m.comment
                        .as_deref()
                        .and_then(parse_owner_comment)
                        .map(|o| o.container_id),
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
                    Some("abcdef123".into())
                ),
                (
                    8081,
                    Protocol::Udp,
                    None,
                    v4("10.244.0.5"),
                    81,
                    Some("abcdef123".into())
                ),
                (
                    9090,
                    Protocol::Tcp,
                    Some(v4("198.18.0.1")),
                    v4("10.244.0.5"),
                    90,
                    Some("abcdef123".into())
                ),
                (
                    7070,
                    Protocol::Tcp,
                    None,
                    v4("fd44::7"),
                    70,
                    Some("c2".into())
                ),
            ]
        );
        assert_eq!(
            mappings[0].comment.as_deref(),
            Some(r#"dnat name: "netx" id: "abcdef123""#)
        );
        // Every DNAT of the chain goes to the one container address.
        assert_eq!(table.destinations(FIRST), [v4("10.244.0.5")]);
        assert_eq!(table.destinations(SECOND), [v4("fd44::7")]);
    }

    #[test]
    fn removing_one_container_keeps_the_shared_chains_while_another_is_mapped() {
        let table = parse_save(SAVED);
        let removal = table
            .removal(&BTreeSet::from([FIRST.to_owned()]))
            .expect("something to remove");
        let comment = r#""dnat name: \"netx\" id: \"abcdef123\"""#;
        let rules = format!(
            "-D CNI-HOSTPORT-DNAT -p tcp -m comment --comment {comment} -m multiport --dports 8080,9090 -j {FIRST}\n\
             -D CNI-HOSTPORT-DNAT -p udp -m comment --comment {comment} -m multiport --dports 8081 -j {FIRST}\n\
             -D {FIRST} -s 10.244.0.0/24 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK\n\
             -D {FIRST} -s 127.0.0.1/32 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK\n\
             -D {FIRST} -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.244.0.5:80\n\
             -D {FIRST} -p udp -m udp --dport 8081 -j DNAT --to-destination 10.244.0.5:81\n\
             -D {FIRST} -d 198.18.0.1/32 -p tcp -m tcp --dport 9090 -j DNAT --to-destination 10.244.0.5:90"
        );
        // Exact rules and the chain, in one transaction; nothing flushed.
        assert_eq!(
            removal.batch,
            format!("*nat\n{rules}\n-X {FIRST}\nCOMMIT\n")
        );
        assert!(!removal.shared);
        assert_eq!(
            removal.split.as_deref(),
            Some(format!("*nat\n{rules}\nCOMMIT\n*nat\n-X {FIRST}\nCOMMIT\n").as_str())
        );
    }

    #[test]
    fn removing_the_last_container_removes_the_shared_chains_and_their_jumps() {
        let table = parse_save(SAVED);
        let removal = table
            .removal(&BTreeSet::from([FIRST.to_owned(), SECOND.to_owned()]))
            .expect("something to remove");
        assert!(removal.shared);
        let batch = &removal.batch;
        let lines: Vec<&str> = batch.lines().collect();
        assert_eq!(
            batch.matches("COMMIT").count(),
            1,
            "one transaction: {batch}"
        );
        assert!(lines.contains(&"-D PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT"));
        assert!(lines.contains(&"-D OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT"));
        assert!(lines.contains(
            &"-D POSTROUTING -m comment --comment \"CNI portfwd requiring masquerade\" -j CNI-HOSTPORT-MASQ"
        ));
        assert!(lines.contains(&"-D CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE"));
        // Another tool's rule in POSTROUTING stays; nothing is flushed.
        assert!(!batch.contains("10.9.0.0/16"), "{batch}");
        assert!(!batch.contains("-F "), "{batch}");
        let removals: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| l.starts_with("-X "))
            .collect();
        assert_eq!(
            removals,
            [
                format!("-X {SECOND}"),
                format!("-X {FIRST}"),
                "-X CNI-HOSTPORT-DNAT".into(),
                "-X CNI-HOSTPORT-SETMARK".into(),
                "-X CNI-HOSTPORT-MASQ".into(),
            ]
        );
        // The chains go after every rule.
        let first_x = lines.iter().position(|l| l.starts_with("-X ")).unwrap();
        assert!(
            lines[first_x..].iter().all(|l| !l.starts_with("-D ")),
            "{batch}"
        );
    }

    #[test]
    fn a_shared_chain_with_a_rule_not_upstreams_stays() {
        let text = SAVED.replace(
            "-A CNI-HOSTPORT-MASQ -m mark",
            "-A CNI-HOSTPORT-MASQ -s 10.1.0.0/16 -j RETURN\n-A CNI-HOSTPORT-MASQ -m mark",
        );
        let removal = parse_save(&text)
            .removal(&BTreeSet::from([FIRST.to_owned(), SECOND.to_owned()]))
            .expect("the container chains go");
        assert!(!removal.shared, "{}", removal.batch);
        assert!(!removal.batch.contains("PREROUTING"), "{}", removal.batch);
        assert!(
            !removal.batch.contains("-X CNI-HOSTPORT"),
            "{}",
            removal.batch
        );
    }

    #[test]
    fn nothing_to_remove_is_no_batch() {
        let table = parse_save(SAVED);
        assert_eq!(
            table.removal(&BTreeSet::from(["CNI-DN-gone".to_owned()])),
            None
        );
        assert_eq!(parse_save("").removal(&BTreeSet::new()), None);
    }

    #[test]
    fn shared_chains_left_alone_are_removed_with_no_container_chain() {
        // A node where every container chain is gone but the shared ones stay
        // (upstream's own DEL never removes them).
        let text = "*nat\n:PREROUTING ACCEPT [0:0]\n:CNI-HOSTPORT-DNAT - [0:0]\n\
                    -A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\nCOMMIT\n";
        let table = parse_save(text);
        assert!(table.has_upstream_state());
        let removal = table
            .removal(&BTreeSet::new())
            .expect("the shared chain goes");
        assert_eq!(
            removal.batch,
            "*nat\n-D PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n\
             -X CNI-HOSTPORT-DNAT\nCOMMIT\n"
        );
        assert_eq!(removal.split, None);
    }
}
