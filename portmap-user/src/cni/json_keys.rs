//! Object keys matched the way Go's `encoding/json` matches them to struct
//! fields, because the runtimes that call us (containerd and Nomad through
//! go-cni, CRI-O through ocicni, podman, libcni) and the plugin we replace
//! are Go: containerd writes `"HostPort"` where podman writes `"hostPort"`,
//! and upstream portmap accepts both.
//!
//! Go's rules (`encoding/json` decode.go, `object()`), reproduced here:
//! - Keys are met in document order. A key goes to the field whose name it
//!   equals; failing that, to the first field (in declaration order) whose
//!   name it equals under Unicode simple case folding (`strings.EqualFold`).
//! - A later key for the same field overwrites an earlier one, whatever the
//!   spelling of either. A `null` clears pointer, slice and map fields and
//!   leaves every other kind as it was.
//! - An object met again for a struct or map field is decoded into the value
//!   already there: the two merge, the later one winning key by key.
//!
//! Two documented deviations, both only reachable with a key written twice:
//! an overwritten occurrence is not type-checked (Go would fail the whole
//! decode on it), and an array written twice replaces the first one (Go
//! decodes the second into the first one's elements, golang/go#21092).
//!
//! Objects that Go decodes straight from stdin are read in document order
//! with [`Object`]; `prevResult` is different: upstream decodes it into a
//! `map[string]interface{}` and re-encodes it before decoding the result, so
//! its keys reach the struct in sorted order ([`resolve_sorted`]).

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// How a field of a given Go type treats `null` and a second occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// string, number, bool: `null` is ignored, a later key replaces.
    Scalar,
    /// pointer or slice: `null` clears, a later key replaces.
    Nullable,
    /// struct: `null` is ignored, a later object merges into it.
    Struct,
    /// map: `null` clears, a later object merges into it.
    Map,
}

/// A struct field: its JSON name (ASCII, like every name we read) and kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub kind: Kind,
}

impl Field {
    pub const fn scalar(name: &'static str) -> Field {
        Field {
            name,
            kind: Kind::Scalar,
        }
    }
    pub const fn nullable(name: &'static str) -> Field {
        Field {
            name,
            kind: Kind::Nullable,
        }
    }
    pub const fn structure(name: &'static str) -> Field {
        Field {
            name,
            kind: Kind::Struct,
        }
    }
    pub const fn map(name: &'static str) -> Field {
        Field {
            name,
            kind: Kind::Map,
        }
    }
}

/// A JSON value that can say whether it is `null`.
pub trait JsonValue {
    fn is_null(&self) -> bool;
}

impl JsonValue for Value {
    fn is_null(&self) -> bool {
        Value::is_null(self)
    }
}

impl JsonValue for RawValue {
    fn is_null(&self) -> bool {
        self.get() == "null"
    }
}

/// One key that counts for a field: its spelling in the input and its value.
#[derive(Debug)]
pub struct Found<'a, V: ?Sized> {
    pub key: &'a str,
    pub value: &'a V,
}

impl<V: ?Sized> Clone for Found<'_, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<V: ?Sized> Copy for Found<'_, V> {}

/// The keys of one object, resolved against a field list.
#[derive(Debug)]
pub struct Resolved<'a, V: ?Sized> {
    fields: &'static [Field],
    /// Per field, the keys that count. A `Vec` per field would cost an
    /// allocation per key of every mapping entry; only struct and map
    /// fields (rare) can have more than one.
    found: Vec<Slot<'a, V>>,
}

#[derive(Debug)]
struct Slot<'a, V: ?Sized> {
    /// Struct and map fields only: the occurrences before `last`.
    earlier: Vec<Found<'a, V>>,
    last: Option<Found<'a, V>>,
}

impl<'a, V: ?Sized> Slot<'a, V> {
    const EMPTY: Slot<'a, V> = Slot {
        earlier: Vec::new(),
        last: None,
    };

    fn clear(&mut self) {
        self.earlier.clear();
        self.last = None;
    }
}

impl<'a, V: ?Sized> Resolved<'a, V> {
    /// The key that sets field `name`, if any (`null` never counts).
    /// For struct and map fields, the last of [`Self::all`].
    pub fn get(&self, name: &str) -> Option<Found<'a, V>> {
        self.slot(name).last
    }

    /// Every key that makes up field `name`, in decode order: one at most for
    /// scalars and nullables, the objects to merge for structs and maps.
    pub fn all(&self, name: &str) -> Vec<Found<'a, V>> {
        let slot = self.slot(name);
        slot.earlier.iter().copied().chain(slot.last).collect()
    }

    fn slot(&self, name: &str) -> &Slot<'a, V> {
        let index = self
            .fields
            .iter()
            .position(|field| field.name == name)
            .unwrap_or_else(|| panic!("{name:?} is not in the field list"));
        &self.found[index]
    }
}

/// Go's `strings.EqualFold(key, name)` for an ASCII `name`. Outside ASCII,
/// only U+212A KELVIN SIGN (k) and U+017F LATIN SMALL LETTER LONG S (s)
/// fold onto an ASCII letter.
pub fn fold_eq(key: &str, name: &str) -> bool {
    debug_assert!(name.is_ascii(), "field names are ASCII");
    let mut key_chars = key.chars();
    for name_byte in name.bytes() {
        let Some(ch) = key_chars.next() else {
            return false;
        };
        let same = match ch {
            '\u{212A}' => name_byte.eq_ignore_ascii_case(&b'k'),
            '\u{017F}' => name_byte.eq_ignore_ascii_case(&b's'),
            ch => u8::try_from(ch).is_ok_and(|byte| byte.eq_ignore_ascii_case(&name_byte)),
        };
        if !same {
            return false;
        }
    }
    key_chars.next().is_none()
}

/// The field a key decodes into: exact name first, then the first field
/// whose name folds to it.
fn field_for(fields: &[Field], key: &str) -> Option<usize> {
    fields
        .iter()
        .position(|field| field.name == key)
        .or_else(|| fields.iter().position(|field| fold_eq(key, field.name)))
}

/// Resolves `entries` (in the order Go decodes them) against `fields`.
pub fn resolve<'a, V: JsonValue + ?Sized + 'a>(
    fields: &'static [Field],
    entries: impl IntoIterator<Item = (&'a str, &'a V)>,
) -> Resolved<'a, V> {
    let mut found: Vec<Slot<'a, V>> = Vec::with_capacity(fields.len());
    found.extend(fields.iter().map(|_| Slot::EMPTY));
    for (key, value) in entries {
        let Some(index) = field_for(fields, key) else {
            continue;
        };
        let slot = &mut found[index];
        let this = Some(Found { key, value });
        match (fields[index].kind, value.is_null()) {
            (Kind::Scalar | Kind::Struct, true) => {}
            (Kind::Nullable | Kind::Map, true) => slot.clear(),
            (Kind::Scalar | Kind::Nullable, false) => slot.last = this,
            (Kind::Struct | Kind::Map, false) => {
                if let Some(previous) = slot.last.replace(Found { key, value }) {
                    slot.earlier.push(previous);
                }
            }
        }
    }
    Resolved { fields, found }
}

/// Resolves the keys of a map in sorted order: how upstream meets the keys of
/// `prevResult` (see the module docs).
pub fn resolve_sorted<'a>(
    fields: &'static [Field],
    object: &'a Map<String, Value>,
) -> Resolved<'a, Value> {
    let mut entries: Vec<(&'a str, &'a Value)> = object
        .iter()
        .map(|(key, value)| (key.as_str(), value))
        .collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    resolve(fields, entries)
}

/// A JSON object with every key in document order, duplicates included, and
/// its values left unparsed until a field asks for them.
#[derive(Debug, Default)]
pub struct Object<'a> {
    entries: Vec<(Cow<'a, str>, &'a RawValue)>,
}

impl<'a> Object<'a> {
    /// Parses `text` as an object; `Err` when it is not valid JSON or not an
    /// object (see [`kind_of`] to tell which).
    pub fn parse(text: &'a str) -> Result<Object<'a>, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The keys (unescaped) and raw values, in document order.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &'a RawValue)> + '_ {
        self.entries
            .iter()
            .map(|(key, value)| (key.as_ref(), *value))
    }

    /// Resolves the object's keys against `fields`.
    pub fn resolve(&'a self, fields: &'static [Field]) -> Resolved<'a, RawValue> {
        resolve(fields, self.entries())
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Object<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = Object<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some((key, value)) = map.next_entry::<Cow<'de, str>, &'de RawValue>()? {
                    entries.push((key, value));
                }
                Ok(Object { entries })
            }
        }
        deserializer.deserialize_map(ObjectVisitor)
    }
}

/// What kind of JSON value `raw` holds, for messages ("an object", ...).
pub fn kind_of(raw: &RawValue) -> &'static str {
    match raw.get().as_bytes().first() {
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPPING: &[Field] = &[
        Field::scalar("hostPort"),
        Field::scalar("containerPort"),
        Field::scalar("protocol"),
        Field::scalar("hostIP"),
    ];

    /// (key as written, value) of field `name` in `json`.
    fn pick(fields: &'static [Field], json: &str, name: &str) -> Option<(String, String)> {
        let object = Object::parse(json).expect("test input is an object");
        let resolved = object.resolve(fields);
        resolved
            .get(name)
            .map(|found| (found.key.to_owned(), found.value.get().to_owned()))
    }

    #[test]
    fn every_runtime_spelling_of_a_port_mapping_matches() {
        // (who sends it, the entry as it arrives)
        let cases = [
            (
                "containerd/go-cni and Nomad (Go field names, no tags)",
                r#"{"HostPort":18080,"ContainerPort":80,"Protocol":"tcp","HostIP":""}"#,
                ["HostPort", "ContainerPort", "Protocol", "HostIP"],
            ),
            (
                "CRI-O/ocicni (json tags)",
                r#"{"hostPort":18080,"containerPort":80,"protocol":"tcp","hostIP":""}"#,
                ["hostPort", "containerPort", "protocol", "hostIP"],
            ),
            (
                "podman (camelCase, hostIP left out when unset)",
                r#"{"hostPort":18080,"containerPort":80,"protocol":"tcp"}"#,
                ["hostPort", "containerPort", "protocol", ""],
            ),
            (
                "snake_case is not a spelling Go matches",
                r#"{"host_port":18080,"container_port":80,"Protocol":"tcp","host_ip":""}"#,
                ["", "", "Protocol", ""],
            ),
            (
                "libcni's PortMapping (camelCase)",
                r#"{"hostPort":18080,"containerPort":80,"protocol":"tcp","hostIP":"10.0.0.1"}"#,
                ["hostPort", "containerPort", "protocol", "hostIP"],
            ),
            (
                "any other casing",
                r#"{"HOSTPORT":18080,"containerport":80,"pROTOCOL":"tcp","HostIp":""}"#,
                ["HOSTPORT", "containerport", "pROTOCOL", "HostIp"],
            ),
        ];
        for (who, json, keys) in cases {
            for (field, key) in MAPPING.iter().zip(keys) {
                let found = pick(MAPPING, json, field.name).map(|(key, _)| key);
                let expected = (!key.is_empty()).then(|| key.to_owned());
                assert_eq!(found, expected, "{who}: field {}", field.name);
            }
        }
    }

    #[test]
    fn folding_is_go_simple_folding_not_anything_looser() {
        assert!(fold_eq("hostport", "hostPort"));
        assert!(fold_eq("HOSTPORT", "hostPort"));
        // U+017F folds to s and U+212A to k, as in Go.
        assert!(fold_eq("ho\u{17f}tPort", "hostPort"));
        assert!(fold_eq("\u{212a}ey", "key"));
        // Nothing else outside ASCII, and no punctuation folding.
        assert!(!fold_eq("hostPört", "hostPort"));
        assert!(
            !fold_eq("\u{130}d", "id"),
            "U+0130 folds to a lower-case i, which no folded ASCII name holds"
        );
        assert!(!fold_eq("host_port", "hostPort"));
        assert!(!fold_eq("hostPor", "hostPort"));
        assert!(!fold_eq("hostPortt", "hostPort"));
        assert!(!fold_eq("@", "`"), "only letters fold");
    }

    #[test]
    fn a_later_key_wins_whatever_its_spelling() {
        let mapping = |json| pick(MAPPING, json, "hostPort");
        assert_eq!(
            mapping(r#"{"hostPort":1,"HostPort":2}"#),
            Some(("HostPort".into(), "2".into())),
            "the exact spelling does not beat a later folded one"
        );
        assert_eq!(
            mapping(r#"{"HostPort":2,"hostPort":1}"#),
            Some(("hostPort".into(), "1".into()))
        );
        assert_eq!(
            mapping(r#"{"hostPort":1,"HostPort":2,"hostPort":3}"#),
            Some(("hostPort".into(), "3".into())),
            "an exact duplicate counts where it stands"
        );
        assert_eq!(
            mapping(r#"{"HostPort":2,"hostPort":null}"#),
            Some(("HostPort".into(), "2".into())),
            "null leaves a scalar as it was"
        );
        assert_eq!(mapping(r#"{"hostPort":null}"#), None);
    }

    #[test]
    fn null_clears_pointers_slices_and_maps() {
        const FIELDS: &[Field] = &[
            Field::nullable("snat"),
            Field::map("prevResult"),
            Field::structure("runtimeConfig"),
        ];
        let json = r#"{"snat":false,"SNAT":null,"prevResult":{"a":1},"PrevResult":null,
                       "runtimeConfig":{"a":1},"RuntimeConfig":null}"#;
        let object = Object::parse(json).unwrap();
        let resolved = object.resolve(FIELDS);
        assert!(resolved.get("snat").is_none(), "null clears a *bool");
        assert!(resolved.all("prevResult").is_empty(), "null clears a map");
        assert_eq!(
            resolved.all("runtimeConfig").len(),
            1,
            "null leaves a struct as it was"
        );
    }

    #[test]
    fn objects_met_twice_for_a_struct_are_all_kept_to_merge() {
        const FIELDS: &[Field] = &[Field::structure("runtimeConfig")];
        let json = r#"{"runtimeConfig":{"a":1},"RuntimeConfig":{"b":2}}"#;
        let object = Object::parse(json).unwrap();
        let resolved = object.resolve(FIELDS);
        let keys: Vec<&str> = resolved
            .all("runtimeConfig")
            .iter()
            .map(|f| f.key)
            .collect();
        assert_eq!(
            keys,
            ["runtimeConfig", "RuntimeConfig"],
            "in document order"
        );
    }

    #[test]
    fn an_exact_name_beats_a_folded_one_and_the_first_field_wins_a_fold_tie() {
        const FIELDS: &[Field] = &[Field::scalar("title"), Field::scalar("TITLE")];
        let object = Object::parse(r#"{"TITLE":1,"Title":2}"#).unwrap();
        let resolved = object.resolve(FIELDS);
        assert_eq!(resolved.get("TITLE").map(|f| f.value.get()), Some("1"));
        assert_eq!(
            resolved.get("title").map(|f| f.value.get()),
            Some("2"),
            "Title folds to both; the first declared field takes it"
        );
    }

    #[test]
    fn prev_result_keys_are_met_in_sorted_order() {
        const FIELDS: &[Field] = &[Field::nullable("ips")];
        // Document order would pick "IPs"; Go's re-encoded map sorts "IPs"
        // before "ips", so "ips" is decoded last and wins.
        let value: Value = serde_json::from_str(r#"{"ips":[1],"IPs":[2]}"#).unwrap();
        let resolved = resolve_sorted(FIELDS, value.as_object().unwrap());
        assert_eq!(resolved.get("ips").map(|f| f.key), Some("ips"));
    }

    #[test]
    fn escaped_keys_are_compared_unescaped() {
        assert_eq!(
            pick(MAPPING, r#"{"host\u0050ort":5}"#, "hostPort"),
            Some(("hostPort".into(), "5".into()))
        );
    }

    #[test]
    fn non_objects_are_refused_and_kinds_named() {
        assert!(Object::parse("[1]").is_err());
        assert!(Object::parse("{").is_err());
        let object = Object::parse(
            r#"{"a": [1] ,"b":
                "x","c":true, "d" : null ,"e":-1,"f":{}}"#,
        )
        .unwrap();
        assert!(object.entries[3].1.is_null(), "null with whitespace around");
        let kinds: Vec<&str> = object.entries.iter().map(|(_, v)| kind_of(v)).collect();
        assert_eq!(
            kinds,
            [
                "an array",
                "a string",
                "a boolean",
                "null",
                "a number",
                "an object"
            ]
        );
    }
}
