//! What the last ADD of each network found wrong with its configuration's
//! keys (a key a typo away from one of ours, ignored), kept for `status`:
//! the plugin's log is one place to warn, but the operator asks `status`.
//!
//! The record lies beside the pin root's lock (`{lock}.keys`), one line per
//! key: `network<TAB>key<TAB>meant`. Each ADD replaces its network's lines
//! (written only when they change; removed with the last line), so a fixed
//! configuration clears its note with its next ADD. Two networks' ADDs
//! racing may lose one's lines until its next ADD: a note, not state
//! anything depends on.

use std::path::PathBuf;

use crate::dataplane::pinned::pin::PinLayout;

/// A key the last ADD of `network` ignored, and the key meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyNote {
    pub network: String,
    pub key: String,
    pub meant: String,
}

/// The record of `layout`.
pub fn record_path(layout: &PinLayout) -> PathBuf {
    layout.lock_file().with_extension("keys")
}

/// Every note recorded under `layout`.
pub fn recorded(layout: &PinLayout) -> Vec<KeyNote> {
    std::fs::read_to_string(record_path(layout))
        .map(|text| parse(&text))
        .unwrap_or_default()
}

fn parse(text: &str) -> Vec<KeyNote> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split('\t');
            let note = KeyNote {
                network: fields.next()?.to_owned(),
                key: fields.next()?.to_owned(),
                meant: fields.next()?.to_owned(),
            };
            fields.next().is_none().then_some(note)
        })
        .collect()
}

fn render(notes: &[KeyNote]) -> String {
    notes
        .iter()
        .map(|note| format!("{}\t{}\t{}\n", note.network, note.key, note.meant))
        .collect()
}

/// Replaces the notes of `network` with `keys` ((key, meant) pairs); best
/// effort, a failure is logged at debug level.
pub fn record<'a>(
    layout: &PinLayout,
    network: &str,
    keys: impl IntoIterator<Item = (&'a str, &'a str)>,
) {
    let before = recorded(layout);
    let mut after: Vec<KeyNote> = before
        .iter()
        .filter(|note| note.network != network)
        .cloned()
        .collect();
    // Tabs and newlines cannot be in a network name (validated) nor in one
    // of our keys; a key with them is dropped rather than break the format.
    after.extend(
        keys.into_iter()
            .filter(|(key, _)| !key.contains(['\t', '\n']))
            .map(|(key, meant)| KeyNote {
                network: network.to_owned(),
                key: key.to_owned(),
                meant: meant.to_owned(),
            }),
    );
    if after == before {
        return;
    }
    let path = record_path(layout);
    let written = if after.is_empty() {
        std::fs::remove_file(&path)
    } else {
        crate::dataplane::pinned::lock::write_record(&path, &render(&after))
    };
    if let Err(error) = written {
        log::debug!("{} not written: {error}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_reads_back_what_it_wrote() {
        let notes = vec![
            KeyNote {
                network: "kind".into(),
                key: "interfcaes".into(),
                meant: "interfaces".into(),
            },
            KeyNote {
                network: "podman".into(),
                key: "snta".into(),
                meant: "snat".into(),
            },
        ];
        assert_eq!(parse(&render(&notes)), notes);
        assert_eq!(parse("torn line\tno meant\n"), []);
    }

    #[test]
    fn the_record_lies_beside_the_lock() {
        let layout = PinLayout::new("/sys/fs/bpf/ebpf-portmap");
        let record = record_path(&layout);
        assert_eq!(record.parent(), layout.lock_file().parent());
        assert_eq!(record.extension().and_then(|e| e.to_str()), Some("keys"));
    }
}
