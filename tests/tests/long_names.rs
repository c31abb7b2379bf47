//! Names longer than an owner record holds (128 bytes): ADD refuses a
//! container ID or a network name past the limit with a CNI error naming
//! the field, its length and the limit, and changes nothing; DEL and GC
//! accept any length and never touch another container's entries. Real
//! plugin runs on a private node and pin root. Needs root.

#![allow(
    clippy::result_large_err,
    reason = "CniFailure carries the whole plugin exchange on purpose (see cni.rs)"
)]

use portmap_tests::cni::{CniCommand, GcAttachment};
use portmap_tests::world::{FakeContainer, World};
use portmap_tests::{Conflist, PortMapping};

/// The longest name an owner record holds whole.
const LIMIT: usize = 128;

/// An ID of `len` bytes, all valid CNI identifier characters, starting
/// with `prefix`.
fn id_of(prefix: &str, len: usize) -> String {
    let mut id = prefix.to_owned();
    while id.len() < len {
        id.push(char::from(b'a' + (id.len() % 26) as u8));
    }
    id
}

/// `world`'s conflist renamed to `name`.
fn renamed(world: &World, name: &str) -> Conflist {
    let mut json = world.list.json().clone();
    json["name"] = name.into();
    Conflist::from_json(json).expect("a well-formed conflist")
}

/// Asserts `add` failed as ADD must for a name past the limit.
fn assert_refused(
    add: Result<portmap_tests::cni::PluginOutput, portmap_tests::cni::CniFailure>,
    field: &str,
    len: usize,
    code: u64,
) {
    let failure = match add {
        Ok(out) => panic!("ADD with a {len}-byte {field} succeeded: {out:?}"),
        Err(failure) => failure,
    };
    let msg = failure.error_msg().unwrap_or_default().to_owned();
    assert_eq!(failure.error_code(), Some(code), "error code: {failure}");
    for part in [field, &format!("{len} bytes"), &format!("at most {LIMIT}")] {
        assert!(msg.contains(part), "the error names {part:?}: {msg}");
    }
}

#[test]
fn a_container_id_past_the_limit_is_refused_at_add_and_del_and_gc_harm_nobody() {
    let world = World::plugin_only();
    let kept = FakeContainer::new(&world, "kept", 0, vec![PortMapping::tcp(7100, 80)]);
    kept.add(&world).expect("ADD of a short ID");
    // A container ID of the limit's length is recorded whole.
    let at_limit = FakeContainer::new(
        &world,
        &id_of("c", LIMIT),
        1,
        vec![PortMapping::tcp(7101, 80)],
    );
    at_limit.add(&world).expect("ADD of a 128-byte ID");
    let before = world.listed_hosts();
    let mut expected = kept.expected_hosts();
    expected.extend(at_limit.expected_hosts());
    assert_eq!(before, expected, "both containers listed, IDs whole");

    // 200 bytes sharing the first 128 with `at_limit`.
    let long_id = id_of(&at_limit.rt.container_id, 200);
    assert_eq!(&long_id[..LIMIT], at_limit.rt.container_id);
    let long = FakeContainer::new(&world, &long_id, 2, vec![PortMapping::tcp(7102, 80)]);
    assert_refused(
        world.exec_ours(CniCommand::Add, &long.rt, Some(&long.prev)),
        "CNI_CONTAINERID",
        200,
        4,
    );
    assert_eq!(
        world.listed_hosts(),
        before,
        "a refused ADD changed the mappings"
    );

    // GC listing the long ID (and the others): nothing goes.
    let all: Vec<GcAttachment> = [&kept, &at_limit, &long]
        .iter()
        .map(|c| GcAttachment::from(&c.rt))
        .collect();
    world
        .runner
        .gc(&world.list, &all)
        .unwrap_or_else(|e| panic!("GC listing a 200-byte ID: {e}"));
    assert_eq!(
        world.listed_hosts(),
        before,
        "GC listing everyone removed someone"
    );
    // GC listing the long ID instead of its 128-byte prefix: the prefix's
    // owner is not listed, so it goes, and the kept one stays.
    let without_at_limit: Vec<GcAttachment> = [&kept, &long]
        .iter()
        .map(|c| GcAttachment::from(&c.rt))
        .collect();
    // First DEL of the long ID: nothing of the prefix's owner goes.
    long.del(&world)
        .unwrap_or_else(|e| panic!("DEL of a 200-byte ID: {e}"));
    assert_eq!(
        world.listed_hosts(),
        before,
        "DEL of the long ID removed another's"
    );
    world
        .runner
        .gc(&world.list, &without_at_limit)
        .unwrap_or_else(|e| panic!("GC: {e}"));
    assert_eq!(
        world.listed_hosts(),
        kept.expected_hosts(),
        "the unlisted 128-byte owner goes, the listed one stays"
    );
    // GC without the long ID in the list: the listed one still stays.
    world
        .runner
        .gc(&world.list, &[GcAttachment::from(&kept.rt)])
        .unwrap_or_else(|e| panic!("GC: {e}"));
    assert_eq!(world.listed_hosts(), kept.expected_hosts());
    kept.del(&world).expect("DEL");
    world.assert_clean("after every DEL");
}

#[test]
fn a_network_name_past_the_limit_is_refused_and_a_shared_prefix_confuses_nothing() {
    let mut world = World::plugin_only();
    // A network named to the limit, and another sharing its 128 bytes.
    let at_limit = id_of("net-", LIMIT);
    let longer = id_of(&at_limit, 200);
    world.list = renamed(&world, &longer);
    let refused = FakeContainer::new(&world, "first", 0, vec![PortMapping::tcp(7110, 80)]);
    assert_refused(
        world.exec_ours(CniCommand::Add, &refused.rt, Some(&refused.prev)),
        "network name (`name`)",
        200,
        7,
    );
    assert!(
        world.listed_hosts().is_empty(),
        "a refused ADD added something"
    );
    refused
        .del(&world)
        .unwrap_or_else(|e| panic!("DEL on a 200-byte network: {e}"));

    world.list = renamed(&world, &at_limit);
    let held = FakeContainer::new(&world, "held", 1, vec![PortMapping::tcp(7111, 80)]);
    held.add(&world).expect("ADD on a 128-byte network");
    // GC of the longer network, keeping nothing: not this network's owner.
    let longer_list = renamed(&world, &longer);
    world
        .runner
        .gc(&longer_list, &[])
        .unwrap_or_else(|e| panic!("GC of a 200-byte network: {e}"));
    assert_eq!(
        world.listed_hosts(),
        held.expected_hosts(),
        "GC of a network sharing the first 128 bytes removed this one's owner"
    );
    world
        .runner
        .gc(&world.list, &[GcAttachment::from(&held.rt)])
        .unwrap_or_else(|e| panic!("GC: {e}"));
    assert_eq!(
        world.listed_hosts(),
        held.expected_hosts(),
        "GC keeps the listed"
    );
    world.runner.gc(&world.list, &[]).expect("GC of everything");
    world.assert_clean("after GC with no valid attachments");
}
