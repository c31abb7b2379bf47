//! `migrate`: upstream `portmap`'s leftovers on a node switched to
//! ebpf-portmap (or back), and which of them belong to containers that no
//! longer exist.
//!
//! "No longer exists" is decided on evidence the node has, never on a
//! guess: the runtime's CNI result cache (libcni writes
//! `<cacheDir>/results/<network>-<containerID>-<ifname>` after a
//! successful ADD and removes it after a successful DEL; containerd,
//! CRI-O and podman with CNI all use libcni, `/var/lib/cni` by default).
//! A container upstream maps is
//! - *live* when an entry of the cache names it (for the iptables backend:
//!   when upstream's owner comment for the entry's network and container,
//!   cut as upstream cuts it, is the one on the rules; for the nftables
//!   backend, which records no network: the container ID, on any network)
//!   and either records no network namespace
//!   (libcni before 1.1 did not) or one that still exists;
//! - *gone* when no entry names it (its DEL ran, through a chain that no
//!   longer held upstream, or the runtime forgot it), or when every entry
//!   that names it records a network namespace that no longer exists (the
//!   node rebooted or the sandbox died without a DEL).
//!
//! Only gone containers' rules are removed, through the same removal as
//! a DEL ([`crate::upstream::remove`]), so a second run finds nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::upstream::{self, Mapping, Source, UpstreamError, iptables};

/// libcni's default cache directory's `results`.
pub const DEFAULT_RESULTS_DIR: &str = "/var/lib/cni/results";

/// The `kind` of a libcni cache entry this reads.
const CACHE_KIND: &str = "cniCacheV1";

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(
        "no CNI result cache at {}: without it no container can be shown to be gone; \
         pass --results-dir with the `results` directory under the runtime's CNI cacheDir",
        dir.display()
    )]
    NoCache {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One entry of the runtime's result cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEntry {
    pub file: PathBuf,
    pub network: String,
    pub container_id: String,
    /// `CNI_NETNS` of the ADD (libcni 1.1 and later record it).
    pub netns: Option<PathBuf>,
}

/// The entries of `dir` (libcni's `results`); files that are not cache
/// entries of the known kind are skipped (libcni skips them too).
pub fn read_cache(dir: &Path) -> Result<Vec<CacheEntry>, MigrateError> {
    let entries = std::fs::read_dir(dir).map_err(|source| MigrateError::NoCache {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut cache = Vec::new();
    for entry in entries.flatten() {
        let file = entry.path();
        let Ok(text) = std::fs::read(&file) else {
            continue;
        };
        let Ok(json) = serde_json::from_slice::<Value>(&text) else {
            continue;
        };
        if let Some(parsed) = cache_entry(file, &json) {
            cache.push(parsed);
        }
    }
    cache.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(cache)
}

fn cache_entry(file: PathBuf, json: &Value) -> Option<CacheEntry> {
    if json.get("kind")?.as_str()? != CACHE_KIND {
        return None;
    }
    let text = |key: &str| {
        json.get(key)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };
    Some(CacheEntry {
        network: text("networkName")?.to_owned(),
        container_id: text("containerId")?.to_owned(),
        netns: text("netns").map(PathBuf::from),
        file,
    })
}

/// Whether a container upstream maps still exists, and why it is thought so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Live(String),
    Gone(String),
    /// No jump names the rules' chain: no container to ask about. Left
    /// alone (nothing routes traffic to it).
    Unowned,
}

/// How upstream named a container on its rules.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Owner {
    /// iptables: the comment of the jumps to its chain, as written (cut
    /// by upstream past 255 bytes).
    Iptables(String),
    /// nftables: the container ID (no network).
    Nftables(String),
}

impl Owner {
    /// Whether `entry` is the attachment these rules were written for.
    fn named_by(&self, entry: &CacheEntry) -> bool {
        match self {
            Owner::Iptables(comment) => {
                *comment == iptables::owner_comment(&entry.network, &entry.container_id)
            }
            Owner::Nftables(id) => *id == entry.container_id,
        }
    }
}

/// The verdict on the container upstream named `owner` from `cache`, with
/// `netns_exists` telling which recorded namespaces are still there.
pub fn judge(
    owner: &Owner,
    cache: &[CacheEntry],
    results_dir: &Path,
    netns_exists: &dyn Fn(&Path) -> bool,
) -> Verdict {
    let named: Vec<&CacheEntry> = cache.iter().filter(|e| owner.named_by(e)).collect();
    if named.is_empty() {
        return Verdict::Gone(format!("no entry of {} names it", results_dir.display()));
    }
    for entry in &named {
        match &entry.netns {
            None => {
                return Verdict::Live(format!("cached by the runtime in {}", entry.file.display()));
            }
            Some(netns) if netns_exists(netns) => {
                return Verdict::Live(format!("its network namespace {} exists", netns.display()));
            }
            Some(_) => {}
        }
    }
    let gone: Vec<String> = named
        .iter()
        .filter_map(|e| e.netns.as_ref().map(|n| n.display().to_string()))
        .collect();
    Verdict::Gone(format!(
        "its network namespace {} no longer exists",
        gone.join(", ")
    ))
}

/// The mappings of one container upstream set up, and the verdict on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    /// As the rules name them (a cut name ends in `...`).
    pub network: Option<String>,
    pub container_id: Option<String>,
    pub mappings: Vec<Mapping>,
    pub verdict: Verdict,
}

/// What upstream still maps on this node, by container, judged.
#[derive(Debug, Default)]
pub struct Survey {
    pub sources: Vec<Source>,
    pub leftovers: Vec<Leftover>,
    /// The owners judged gone.
    pub gone: BTreeSet<Owner>,
    /// Sources that could not be read (the others were).
    pub errors: Vec<UpstreamError>,
}

fn owner_of(mapping: &Mapping) -> Option<Owner> {
    let comment = mapping.comment.clone()?;
    Some(match mapping.source.backend {
        upstream::Backend::Nftables => Owner::Nftables(comment),
        _ => Owner::Iptables(comment),
    })
}

/// Reads upstream's state (no process run when there is none) and judges
/// each container against the cache in `results_dir`. The cache is read
/// only when upstream maps a container: a node without any needs none.
pub fn survey(results_dir: &Path) -> Result<Survey, MigrateError> {
    let sources = upstream::sources();
    if sources.is_empty() {
        return Ok(Survey::default());
    }
    let (mappings, errors) = upstream::mappings(&sources);
    // Only a container needs the evidence: an emptied table needs none.
    let cache = if mappings.iter().any(|m| m.comment.is_some()) {
        read_cache(results_dir)?
    } else {
        Vec::new()
    };
    let mut by_owner: BTreeMap<Option<Owner>, Vec<Mapping>> = BTreeMap::new();
    for mapping in mappings {
        by_owner
            .entry(owner_of(&mapping))
            .or_default()
            .push(mapping);
    }
    let mut gone = BTreeSet::new();
    let leftovers = by_owner
        .into_iter()
        .map(|(owner, mappings)| {
            let verdict = match &owner {
                Some(owner) => judge(owner, &cache, results_dir, &|netns| netns.exists()),
                None => Verdict::Unowned,
            };
            if let (Some(owner), Verdict::Gone(_)) = (&owner, &verdict) {
                gone.insert(owner.clone());
            }
            Leftover {
                network: mappings[0].network.clone(),
                container_id: mappings[0].container_id.clone(),
                mappings,
                verdict,
            }
        })
        .collect();
    Ok(Survey {
        sources,
        leftovers,
        gone,
        errors,
    })
}

/// Removes the rules of the containers `survey` judged gone (and
/// upstream's shared chains or table where nothing else is left), as their
/// DEL would. Keeps going after a failure and reports each.
pub fn remove_gone(survey: &Survey) -> upstream::Removal {
    if survey.sources.is_empty() {
        return upstream::Removal::default();
    }
    let mut comments = BTreeSet::new();
    let mut ids = BTreeSet::new();
    for owner in &survey.gone {
        match owner {
            Owner::Iptables(comment) => comments.insert(comment.clone()),
            Owner::Nftables(id) => ids.insert(id.clone()),
        };
    }
    let select = upstream::Gone {
        iptables_comments: &comments,
        nftables_ids: &ids,
    };
    upstream::remove(&survey.sources, &select)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(network: &str, id: &str, netns: Option<&str>) -> CacheEntry {
        CacheEntry {
            file: PathBuf::from(format!("/r/{network}-{id}-eth0")),
            network: network.into(),
            container_id: id.into(),
            netns: netns.map(PathBuf::from),
        }
    }

    #[test]
    fn libcnis_cache_entries_are_read_and_others_skipped() {
        let file = PathBuf::from("/r/cbr0-c1-eth0");
        let written = json!({
            "kind": "cniCacheV1", "containerId": "c1", "config": "e30=", "ifName": "eth0",
            "networkName": "cbr0", "netns": "/var/run/netns/cni-1", "result": {}
        });
        assert_eq!(
            cache_entry(file.clone(), &written),
            Some(CacheEntry {
                file: file.clone(),
                network: "cbr0".into(),
                container_id: "c1".into(),
                netns: Some("/var/run/netns/cni-1".into()),
            })
        );
        let mut old = written.clone();
        old.as_object_mut().unwrap().remove("netns");
        assert_eq!(cache_entry(file.clone(), &old).unwrap().netns, None);
        assert_eq!(
            cache_entry(file.clone(), &json!({"cniVersion": "0.4.0"})),
            None
        );
        assert_eq!(
            cache_entry(
                file,
                &json!({"kind": "cniCacheV2", "containerId": "c1", "networkName": "n"})
            ),
            None
        );
    }

    #[test]
    fn a_container_is_gone_only_on_evidence() {
        let dir = Path::new("/r");
        let cache = [
            entry("cbr0", "live", Some("/run/netns/a")),
            entry("cbr0", "dead", Some("/run/netns/b")),
            entry("cbr0", "old", None),
            entry("other", "elsewhere", Some("/run/netns/a")),
        ];
        let exists = |netns: &Path| netns == Path::new("/run/netns/a");
        let live = |v: &Verdict| matches!(v, Verdict::Live(_));
        let ipt = |net: &str, id: &str| Owner::Iptables(iptables::owner_comment(net, id));
        let nft = |id: &str| Owner::Nftables(id.into());
        assert!(live(&judge(&ipt("cbr0", "live"), &cache, dir, &exists)));
        assert!(live(&judge(&nft("live"), &cache, dir, &exists)));
        // No netns recorded (libcni before 1.1): the entry alone keeps it.
        assert!(live(&judge(&ipt("cbr0", "old"), &cache, dir, &exists)));
        assert_eq!(
            judge(&ipt("cbr0", "dead"), &cache, dir, &exists),
            Verdict::Gone("its network namespace /run/netns/b no longer exists".into())
        );
        assert_eq!(
            judge(&ipt("cbr0", "never"), &cache, dir, &exists),
            Verdict::Gone("no entry of /r names it".into())
        );
        // The iptables backend records the network: another network's entry is not this one.
        assert!(!live(&judge(
            &ipt("cbr0", "elsewhere"),
            &cache,
            dir,
            &exists
        )));
        assert!(live(&judge(&nft("elsewhere"), &cache, dir, &exists)));
    }

    #[test]
    fn a_cut_comment_is_matched_as_upstream_writes_it() {
        // 180 characters of network: upstream keeps 54 of a 64-character ID.
        let network = "n".repeat(180);
        let id = format!("{}{}", "a".repeat(54), "0123456789");
        let twin = format!("{}{}", "a".repeat(54), "9876543210");
        let comment = iptables::owner_comment(&network, &id);
        assert!(iptables::is_cut(&comment), "{comment}");
        let dir = Path::new("/r");
        let exists = |_: &Path| true;
        let owner = Owner::Iptables(comment);
        assert!(matches!(
            judge(&owner, &[entry(&network, &id, Some("/n"))], dir, &exists),
            Verdict::Live(_)
        ));
        // Another network's entry of the same container is not it.
        assert!(matches!(
            judge(&owner, &[entry("short", &id, Some("/n"))], dir, &exists),
            Verdict::Gone(_)
        ));
        // A container whose ID agrees in what upstream kept is named alike:
        // live too (never removed on a guess).
        assert!(matches!(
            judge(&owner, &[entry(&network, &twin, Some("/n"))], dir, &exists),
            Verdict::Live(_)
        ));
    }

    #[test]
    fn a_missing_cache_is_an_error_naming_the_option() {
        let error = read_cache(Path::new("/nonexistent/results")).unwrap_err();
        assert!(error.to_string().contains("--results-dir"), "{error}");
    }
}
