//! The upstream plugin's state, read and (for the 10 000-mapping prefill)
//! replicated inside the node namespace only.
//!
//! Prefilling 10 000 mappings through upstream ADDs would take many minutes
//! (every ADD runs a dozen `iptables` commands, each slower as the tables
//! grow), so the large size is built from the rules the plugin itself wrote
//! for one real 10-mapping container: its `CNI-DN-<hash>` chain and its
//! jump rules in `CNI-HOSTPORT-DNAT` are copied with a new chain name,
//! container ID and host ports, and loaded with one `iptables-restore
//! --noflush` per family. The result is the ruleset the same ADDs would have
//! produced; the ADDs and DELs measured on top of it are real plugin runs.

use std::io::Write;
use std::process::Stdio;

use portmap_tests::netns::NetNs;

pub const FAMILIES: [(&str, &str); 2] = [
    ("iptables-save", "iptables-restore"),
    ("ip6tables-save", "ip6tables-restore"),
];

/// Number of rules (`-A` lines) in the nat tables of both families.
pub fn nat_rule_count(node: &NetNs) -> usize {
    FAMILIES
        .iter()
        .map(|(save, _)| {
            node.command(save)
                .args(["-t", "nat"])
                .output()
                .map_or(0, |out| {
                    String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .filter(|line| line.starts_with("-A "))
                        .count()
                })
        })
        .sum()
}

/// The rules of one container in an `iptables-save -t nat` dump: its jump
/// rules in `CNI-HOSTPORT-DNAT` and the rules of its own chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRules {
    pub chain: String,
    pub jumps: Vec<String>,
    pub chain_rules: Vec<String>,
}

/// Finds the rules upstream portmap wrote for `container_id` in `dump`.
pub fn container_rules(dump: &str, container_id: &str) -> Option<ContainerRules> {
    let id_marker = format!("id: \\\"{container_id}\\\"");
    let jumps: Vec<String> = dump
        .lines()
        .filter(|line| line.starts_with("-A CNI-HOSTPORT-DNAT ") && line.contains(&id_marker))
        .map(str::to_owned)
        .collect();
    let chain = jumps.first()?.split_whitespace().last()?.to_owned();
    let prefix = format!("-A {chain} ");
    let chain_rules = dump
        .lines()
        .filter(|line| line.starts_with(&prefix))
        .map(str::to_owned)
        .collect();
    Some(ContainerRules {
        chain,
        jumps,
        chain_rules,
    })
}

/// `line` with every host port of `--dport P` / `--dports P1,P2` mapped by
/// `port`, chain name `from` replaced by `to`, and the container ID replaced.
pub fn rewrite_rule(
    line: &str,
    chain: (&str, &str),
    id: (&str, &str),
    port: &impl Fn(u16) -> u16,
) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut previous = "";
    for token in line.split(' ') {
        let replaced = match previous {
            "--dport" => token
                .parse::<u16>()
                .map_or_else(|_| token.to_owned(), |p| port(p).to_string()),
            "--dports" => token
                .split(',')
                .map(|p| {
                    p.parse::<u16>()
                        .map_or_else(|_| p.to_owned(), |p| port(p).to_string())
                })
                .collect::<Vec<_>>()
                .join(","),
            _ if token == chain.0 => chain.1.to_owned(),
            _ => token.to_owned(),
        };
        out.push(replaced);
        previous = token;
    }
    out.join(" ")
        .replace(&format!("\\\"{}\\\"", id.0), &format!("\\\"{}\\\"", id.1))
}

/// A chain name of the plugin's shape (`CNI-DN-` + 21 hex digits) that the
/// plugin itself never produces for `index` (its names are hashes).
pub fn synthetic_chain(index: usize) -> String {
    format!("CNI-DN-5e{index:019x}")
}

/// `iptables-restore` input adding a copy of `template` (container
/// `template_id`) for each `k` of `copies`, as container `{id_prefix}{k}`
/// in chain [`synthetic_chain`]`(k)` whose host ports are
/// `port(k, template_port)`. Copies made by several calls must have
/// distinct `k`s (their chains are named by it).
pub fn replicate(
    template: &ContainerRules,
    template_id: &str,
    id_prefix: &str,
    copies: std::ops::Range<usize>,
    port: impl Fn(usize, u16) -> u16,
) -> String {
    let mut text = String::from("*nat\n");
    for k in copies.clone() {
        text.push_str(&format!(":{} - [0:0]\n", synthetic_chain(k)));
    }
    for k in copies {
        let chain = synthetic_chain(k);
        let id = format!("{id_prefix}{k}");
        let map_port = |p: u16| port(k, p);
        for line in template.chain_rules.iter().chain(&template.jumps) {
            text.push_str(&rewrite_rule(
                line,
                (&template.chain, &chain),
                (template_id, &id),
                &map_port,
            ));
            text.push('\n');
        }
    }
    text.push_str("COMMIT\n");
    text
}

/// Copies container `template_id`'s rules once for each of `copies` in
/// both families (see [`replicate`]). Returns the number of rules added.
pub fn synthesize(
    node: &NetNs,
    template_id: &str,
    id_prefix: &str,
    copies: std::ops::Range<usize>,
    port: impl Fn(usize, u16) -> u16 + Copy,
) -> Result<usize, String> {
    let mut added = 0;
    for (save, restore) in FAMILIES {
        let dump = node
            .command(save)
            .args(["-t", "nat"])
            .output()
            .map_err(|e| format!("{save}: {e}"))?;
        let dump = String::from_utf8_lossy(&dump.stdout);
        let Some(template) = container_rules(&dump, template_id) else {
            // The container has no address of this family.
            continue;
        };
        let input = replicate(&template, template_id, id_prefix, copies.clone(), port);
        added += copies.len() * (template.jumps.len() + template.chain_rules.len());
        let mut child = node
            .command(restore)
            .args(["--noflush", "-w"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{restore}: {e}"))?;
        let mut stdin = child.stdin.take().expect("piped");
        let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
        let out = child
            .wait_with_output()
            .map_err(|e| format!("{restore}: {e}"))?;
        let _ = writer.join();
        if !out.status.success() {
            return Err(format!(
                "{restore} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    Ok(added)
}

/// Removes every rule and chain of the node's nat tables (both families):
/// upstream portmap's whole state, which nothing else in a bench node
/// writes. Its next ADD creates its base chains again.
pub fn flush_nat(node: &NetNs) -> Result<(), String> {
    for (save, _) in FAMILIES {
        let iptables = save.trim_end_matches("-save");
        for flag in ["-F", "-X"] {
            let out = node
                .command(iptables)
                .args(["-w", "-t", "nat", flag])
                .output()
                .map_err(|e| format!("{iptables}: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "{iptables} -t nat {flag} failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = r#"*nat
:CNI-DN-632ad37de5cce7b6db3ff - [0:0]
-A CNI-DN-632ad37de5cce7b6db3ff -s 10.244.0.0/24 -p tcp -m tcp --dport 7001 -j CNI-HOSTPORT-SETMARK
-A CNI-DN-632ad37de5cce7b6db3ff -p tcp -m tcp --dport 7001 -j DNAT --to-destination 10.244.0.2:5001
-A CNI-DN-632ad37de5cce7b6db3ff -p tcp -m tcp --dport 7002 -j DNAT --to-destination 10.244.0.2:5002
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"bench-up\" id: \"probe\"" -m multiport --dports 7001,7002 -j CNI-DN-632ad37de5cce7b6db3ff
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"bench-up\" id: \"other\"" -m multiport --dports 9 -j CNI-DN-1
-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
COMMIT
"#;

    #[test]
    fn finds_one_containers_rules() {
        let rules = container_rules(DUMP, "probe").expect("probe's rules");
        assert_eq!(rules.chain, "CNI-DN-632ad37de5cce7b6db3ff");
        assert_eq!(rules.jumps.len(), 1);
        assert_eq!(rules.chain_rules.len(), 3);
        assert!(container_rules(DUMP, "nobody").is_none());
    }

    #[test]
    fn rewrites_ports_chain_and_id_only() {
        let rules = container_rules(DUMP, "probe").unwrap();
        let chain = synthetic_chain(7);
        let port = |p: u16| p + 1000;
        let jump = rewrite_rule(
            &rules.jumps[0],
            (&rules.chain, &chain),
            ("probe", "syn-7"),
            &port,
        );
        assert_eq!(
            jump,
            format!(
                r#"-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"bench-up\" id: \"syn-7\"" -m multiport --dports 8001,8002 -j {chain}"#
            )
        );
        let dnat = rewrite_rule(
            &rules.chain_rules[1],
            (&rules.chain, &chain),
            ("probe", "syn-7"),
            &port,
        );
        assert_eq!(
            dnat,
            format!(
                "-A {chain} -p tcp -m tcp --dport 8001 -j DNAT --to-destination 10.244.0.2:5001"
            ),
            "the container port is not a host port"
        );
    }

    #[test]
    fn synthetic_chains_fit_iptables_names() {
        assert_eq!(synthetic_chain(0).len(), 28);
        assert_eq!(synthetic_chain(999_999).len(), 28);
        assert_ne!(synthetic_chain(1), synthetic_chain(2));
    }

    #[test]
    fn replication_declares_chains_first() {
        let rules = container_rules(DUMP, "probe").unwrap();
        let text = replicate(&rules, "probe", "syn-", 0..2, |k, p| p + 10 * k as u16);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "*nat");
        assert!(lines[1].starts_with(":CNI-DN-5e") && lines[2].starts_with(":CNI-DN-5e"));
        assert_eq!(lines.len(), 1 + 2 + 2 * 4 + 1);
        assert_eq!(*lines.last().unwrap(), "COMMIT");
        assert!(text.contains("--dports 7011,7012"));
        assert!(text.contains(r#"id: \"syn-1\""#));
    }
}
