//! Keys of the configuration that are none of ours but so close to one that
//! they are a typo (`"interfcaes"`, `"hostPortListener"`): ignoring them
//! without a word is how a node ends up attached to the wrong interfaces.
//! Keys match case-insensitively already (as Go's decoder does), so what is
//! left is a letter missing, extra, changed or two swapped. A key far from
//! every key of ours is someone else's (a runtime's, a tool's) and is
//! left alone.

use crate::cni::json_keys::{Field, fold_eq};

/// A key of the configuration taken for a misspelling of one of ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MisspeltKey {
    /// The key as the configuration spells it.
    pub key: String,
    /// The nearest key of ours.
    pub meant: &'static str,
}

impl std::fmt::Display for MisspeltKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "key {:?} is not one ebpf-portmap knows and is ignored; did you mean {:?}?",
            self.key, self.meant
        )
    }
}

/// Keys the CNI protocol or a runtime puts in a plugin's configuration
/// that ebpf-portmap does not read: never taken for a typo of ours.
const OTHERS: &[&str] = &["capabilities", "args", "ipam", "dns"];

/// The keys among `keys` that are no field of `fields` (nor one of
/// [`OTHERS`]) but within a typo of one, each with the nearest field.
pub fn misspelt<'a>(keys: impl IntoIterator<Item = &'a str>, fields: &[Field]) -> Vec<MisspeltKey> {
    keys.into_iter()
        .filter(|key| {
            !fields.iter().any(|field| fold_eq(key, field.name))
                && !OTHERS.iter().any(|other| fold_eq(key, other))
        })
        .filter_map(|key| {
            let lower = key.to_ascii_lowercase();
            fields
                .iter()
                .map(|field| {
                    let name = field.name.to_ascii_lowercase();
                    (distance(&lower, &name), field.name)
                })
                .filter(|(distance, name)| *distance <= allowed(name))
                .min_by_key(|(distance, _)| *distance)
                .map(|(_, meant)| MisspeltKey {
                    key: key.to_owned(),
                    meant,
                })
        })
        .collect()
}

/// How many edits still read as a typo of `name`: one for a short name,
/// one more per four letters.
fn allowed(name: &str) -> usize {
    (name.len() / 4).max(1)
}

/// Edits (insert, delete, change a letter, or swap two neighbours) from `a`
/// to `b`: the optimal string alignment distance, over bytes.
fn distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    // Three rows: two back (for the swap), the last one, this one.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut last: Vec<usize> = (0..=b.len()).collect();
    let mut row: Vec<usize> = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        row[0] = i;
        for j in 1..=b.len() {
            let change = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (last[j] + 1).min(row[j - 1] + 1).min(last[j - 1] + change);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(before[j - 2] + 1);
            }
            row[j] = best;
        }
        std::mem::swap(&mut before, &mut last);
        std::mem::swap(&mut last, &mut row);
    }
    last[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIELDS: &[Field] = &[
        Field::scalar("name"),
        Field::scalar("type"),
        Field::nullable("snat"),
        Field::nullable("interfaces"),
        Field::scalar("hostPortListeners"),
        Field::scalar("pinRoot"),
        Field::structure("runtimeConfig"),
    ];

    fn meant(keys: &[&str]) -> Vec<(String, &'static str)> {
        misspelt(keys.iter().copied(), FIELDS)
            .into_iter()
            .map(|m| (m.key, m.meant))
            .collect()
    }

    #[test]
    fn distance_counts_each_kind_of_edit_once() {
        assert_eq!(distance("interfaces", "interfaces"), 0);
        assert_eq!(distance("interfcaes", "interfaces"), 1, "a swap");
        assert_eq!(distance("hostportlistener", "hostportlisteners"), 1);
        assert_eq!(distance("pin_root", "pinroot"), 1);
        assert_eq!(distance("snta", "snat"), 1);
        assert_eq!(distance("", "snat"), 4);
        assert_eq!(distance("ipam", "name"), 3);
    }

    #[test]
    fn typos_of_our_keys_are_named_with_the_key_meant() {
        assert_eq!(
            meant(&["interfcaes", "hostPortListener", "PIN_ROOT", "snta"]),
            [
                ("interfcaes".to_owned(), "interfaces"),
                ("hostPortListener".to_owned(), "hostPortListeners"),
                ("PIN_ROOT".to_owned(), "pinRoot"),
                ("snta".to_owned(), "snat"),
            ]
        );
    }

    #[test]
    fn our_keys_in_any_case_and_other_keys_are_left_alone() {
        assert_eq!(
            meant(&[
                "interfaces",
                "INTERFACES",
                "capabilities",
                "ipam",
                "dns",
                "args",
                "mtu",
                "cni.dev/valid-attachments",
                "something-else",
            ]),
            []
        );
    }
}
