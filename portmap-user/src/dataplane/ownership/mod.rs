//! Ownership of port mappings in the pinned maps: claim, release, verify,
//! collect garbage.
//!
//! Every step is one atomic map operation; nothing is read, modified and
//! written back. The protocol, which stays correct when any process is
//! killed at any point and when any number of plugins run at once:
//! - ADD creates the owner record (`BPF_NOEXIST`). A re-ADD first releases
//!   what the new set drops and compacts the index to what it keeps (slot
//!   `i` rewritten with a key from a slot `>= i`, the tail deleted from the
//!   end: every held mapping stays findable at every step), so the new set
//!   only has to fit on its own. Then for each mapping it first writes the
//!   owner's next index slot, then claims the mapping with `BPF_NOEXIST`.
//!   Exactly one claimant of a host port wins; a loser rolls back what it
//!   claimed in this call.
//! - A wildcard and a specific address of one port, protocol and family
//!   exclude each other. Each claim writes its mapping first and looks for
//!   the other kind second (a handshake: of two racing claims at least one
//!   sees the other and rolls back). A specific claim records its port in
//!   `specific_ports` before it writes, so a wildcard claim walks the
//!   mappings map only for ports where a specific one may exist. Those
//!   records are never removed: a remover cannot know that no specific
//!   claim is between its record and its mapping (no count survives
//!   without a lock), and a missing record would let a wildcard skip its
//!   look.
//! - ADD's last step checks that the owner record is still the one it
//!   started with. DEL and GC mark the record dying (one update) before
//!   they read the index, so either they read the ADD's complete index, or
//!   the ADD sees the mark (or no record) and removes everything it wrote,
//!   found by what it wrote, and fails with "try again". Without this a GC
//!   that did not list a container whose ADD was running removed the owner
//!   midway, and the ADD's later mappings belonged to nobody for ever.
//! - DEL walks the owner's slots from the last to the first, deleting each
//!   mapping that still names the owner and then the slot, and finally the
//!   owner record. Interrupted, it leaves a contiguous prefix of slots that
//!   the next DEL or GC finishes. Its cost depends on the owner's mappings
//!   only, never on how many mappings the node has. An ADD of an owner
//!   whose record a killed DEL left dying finishes that DEL first.
//! - Mappings whose owner record is gone all the same (older builds, hand
//!   edits) are found by one walk of the mappings map; GC reclaims them
//!   after a grace period counted from its first sighting (`orphans_seen`),
//!   `status` reports them.
//! - Pod identity (CNI_ARGS) lives in its own map, `owner_pods`, keyed by
//!   owner ID like `owners`. ADD writes it once the owner record is known
//!   to be this owner's (so an ID collision never overwrites another
//!   owner's identity); DEL removes it just before the owner record. It
//!   only labels an owner: a missing record means "no pod known", never an
//!   error.
//!
//! - What proves an owner's container alive lives in `owner_sandboxes`,
//!   keyed the same way and written like the pod record: the `CNI_NETNS`
//!   path, the namespace's (device, inode) and the mount namespace the
//!   path was resolved in, plus `K8S_POD_UID`. A GC that finds the
//!   namespace gone records when (`gone_since`, first sighting) and
//!   removes the owner after a grace period ([`Store::reclaim_gone`]);
//!   DEL leaves the record to GC's prune (it opens only the maps it needs).
//!
//! Why a separate map rather than a longer `OwnerRecord`: the pinned maps
//! of a node outlive the binary that made them. A new `owners` layout would
//! need a new layout version (new pins: the running mappings would lose
//! their owners until migrated) or an in-place migration racing with
//! plugins of the old build still running during the upgrade. The eBPF
//! programs never read either map, so a new map costs nothing on the data
//! path, leaves every existing pin byte for byte as the old build wrote it
//! (upgrade and downgrade both keep working), and is created by the first
//! ADD that has an identity to record (`maps::create_pods`).
//!
//! Every step above is a method of [`Store`], the maps the protocol works
//! on. Where each part lives: `store` (the `Store` itself, opened under the
//! mappings' writers lock), `claim` (ADD's claim, DEL's release, CHECK's
//! verify), `gc` (CNI GC, gone namespaces, orphans), `index` (owner
//! records, their slots and the update flags), `owner_maps` (pod,
//! sandbox and conditions entries), `records` (pinned forms, pure),
//! `translation` (planned map entries, pure) and `error`.

mod claim;
mod error;
mod gc;
mod index;
mod owner_maps;
mod records;
mod store;
mod translation;

pub use error::{HolderDisplay, StoreError};
pub use gc::{
    GONE_GRACE_SECS, GoneOwner, GoneReclaim, ORPHAN_GRACE_SECS, OrphanReclaim, orphan_due,
};
pub use records::{
    now_unix, owner_id, owner_record, pod_identity, pod_record, record_is, record_network_is,
    record_strings, sandbox_of_record, sandbox_record,
};
pub use store::Store;
pub use translation::{
    KeyDisplay, Translation, addr_from_words, plan, protocol_name, with_conditions, words_from_addr,
};
