//! Upstream portmap 1.9.x with `"backend": "nftables"`: the peer of issue
//! 34, measured wherever Debian's iptables portmap 1.1.1 is.
//!
//! The plugin is Debian unstable's containernetworking-plugins, which
//! `cargo xtask setup` unpacks privately into
//! `target/tools/debian-unstable/root` (`EPM_CONTAINERD_ROOT` names another
//! unpack). Its nftables backend (knftables) execs `nft` from `PATH`; this
//! Debian has none installed, so setup unpacks Debian 12's into
//! `target/tools/nftables` (`EPM_NFT_TOOLS`), and the bench hands the
//! plugin a `PATH` that starts with its `bin/` (both found by
//! [`UpstreamNft`], as the tests find them). Either missing, or an `nft`
//! that does not run, makes every nftables row SKIP with the reason; the
//! run goes on.
//!
//! In a world's plugin directory the 1.9.x binary is linked as
//! [`PLUGIN_TYPE`], beside Debian's `portmap`, so one node can run both;
//! the plugin ignores its `type`. Its state is its own table
//! (`cni_hostport`, in families `ip` and `ip6`) in the node namespace.
//! Prefills are its own real ADDs (each one about 0.1 s, flat in the
//! size of its table), never copies.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use portmap_tests::netns::NetNs;
use portmap_tests::upstream_nft::UpstreamNft;
use serde_json::Value;

/// The `type` the 1.9.x plugin is linked under in a plugin directory.
pub const PLUGIN_TYPE: &str = "portmap-nftables";

/// The table upstream's nftables backend keeps its rules in.
const TABLE: &str = "cni_hostport";

/// Where the peer's parts are.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Upstream portmap 1.9.x.
    pub plugin: PathBuf,
    /// `PATH` for the plugin: the `nft` directory first.
    pub path_env: OsString,
    /// For the report: `containernetworking-plugins 1.9.1+ds1-1, nftables v1.0.6`.
    pub version: String,
}

static PEER: OnceLock<Result<Peer, String>> = OnceLock::new();

/// The peer, or why it cannot run here (found once per run).
pub fn peer() -> Result<&'static Peer, &'static str> {
    PEER.get_or_init(locate).as_ref().map_err(String::as_str)
}

/// The reason every nftables row is skipped, if it is.
pub fn skip_reason() -> Option<String> {
    peer()
        .err()
        .map(|e| format!("nftables portmap not measured: {e}"))
}

fn locate() -> Result<Peer, String> {
    let found = UpstreamNft::find()?;
    let nft_version = runs_nft(&found.nft_bin_dir).ok_or_else(|| {
        format!(
            "{} does not run (`cargo xtask setup` unpacks it again)",
            found.nft().display()
        )
    })?;
    let packages = found
        .plugin_dir
        .ancestors()
        .nth(3)
        .and_then(|root| std::fs::read_to_string(root.join(".packages")).ok())
        .unwrap_or_default();
    let plugins_version = packages
        .lines()
        .find(|l| l.starts_with("containernetworking-plugins "))
        .unwrap_or("containernetworking-plugins (version not recorded)")
        .to_owned();
    Ok(Peer {
        plugin: found.plugin_dir.join("portmap"),
        path_env: found.path_env(),
        version: format!("{plugins_version}, {nft_version}"),
    })
}

/// `nftables v1.0.6 ...` if `dir/nft` runs.
fn runs_nft(dir: &Path) -> Option<String> {
    let out = Command::new(dir.join("nft"))
        .arg("--version")
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Links the peer into the plugin directory `dir` as [`PLUGIN_TYPE`].
///
/// # Panics
/// If the peer is not available or the link cannot be made.
pub fn link_into(dir: &Path) {
    let peer = peer().unwrap_or_else(|e| panic!("nftables portmap: {e}"));
    let link = dir.join(PLUGIN_TYPE);
    std::os::unix::fs::symlink(&peer.plugin, &link)
        .unwrap_or_else(|e| panic!("linking {}: {e}", link.display()));
}

/// Turns Debian's `portmap` entry of a conflist (its last plugin) into the
/// 1.9.x plugin with the nftables backend.
pub fn configure(plugin: &mut Value) {
    plugin["type"] = Value::from(PLUGIN_TYPE);
    plugin["backend"] = Value::from("nftables");
}

/// The environment a run of the plugin needs on top of the `CNI_*` ones.
pub fn plugin_env() -> Vec<(OsString, OsString)> {
    peer()
        .map(|p| vec![(OsString::from("PATH"), p.path_env.clone())])
        .unwrap_or_default()
}

fn nft(node: &NetNs) -> Command {
    let mut command = node.command("nft");
    if let Ok(peer) = peer() {
        command.env("PATH", &peer.path_env);
    }
    command
}

/// Number of rules in upstream's tables (both families) of `node`.
pub fn rule_count(node: &NetNs) -> usize {
    ["ip", "ip6"]
        .iter()
        .map(|family| {
            nft(node)
                .args(["list", "table", family, TABLE])
                .output()
                .ok()
                .filter(|out| out.status.success())
                .map_or(0, |out| count_rules(&String::from_utf8_lossy(&out.stdout)))
        })
        .sum()
}

/// Rules in an `nft list table` dump: the lines inside a chain that are
/// not its `type ... hook ...` header.
pub fn count_rules(dump: &str) -> usize {
    let mut in_chain = false;
    let mut count = 0;
    for line in dump.lines().map(str::trim) {
        if line.starts_with("chain ") {
            in_chain = true;
        } else if line == "}" {
            in_chain = false;
        } else if in_chain
            && !line.is_empty()
            && !line.starts_with("type ")
            && !line.starts_with("policy ")
            && !line.starts_with("comment ")
        {
            count += 1;
        }
    }
    count
}

/// Removes upstream's tables (both families) from `node`: its whole
/// state, which nothing else in a bench node writes. Its next ADD creates
/// them again.
pub fn flush(node: &NetNs) -> Result<(), String> {
    for family in ["ip", "ip6"] {
        let out = nft(node)
            .args(["delete", "table", family, TABLE])
            .output()
            .map_err(|e| format!("nft: {e}"))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && !stderr.contains("No such file or directory") {
            return Err(format!(
                "nft delete table {family} {TABLE} failed: {}",
                stderr.trim()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_rules_not_chain_headers() {
        let dump = r#"table ip cni_hostport {
	comment "CNI portmap plugin"
	map hostip_hostport_mappings {
		type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service
	}
	chain hostports {
		tcp dport 7001 dnat to 10.244.0.2:5001 comment "abc"
		udp dport 7003 dnat to 10.244.0.2:5003 comment "abc"
	}
	chain hostip_hostports {
	}
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		fib daddr type local jump hostports
	}
}
"#;
        assert_eq!(count_rules(dump), 3);
    }

    #[test]
    fn the_conflist_entry_names_the_linked_plugin_and_its_backend() {
        let mut plugin =
            serde_json::json!({ "type": "portmap", "capabilities": { "portMappings": true } });
        configure(&mut plugin);
        assert_eq!(plugin["type"], PLUGIN_TYPE);
        assert_eq!(plugin["backend"], "nftables");
        assert_eq!(plugin["capabilities"]["portMappings"], true);
    }
}
