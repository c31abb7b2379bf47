//! The names CNI hands us and the rules they must follow: identifiers
//! (network names, container IDs) by the CNI spec, interface names by the
//! kernel. Below both the configuration (`netconf`, its `conditions`) and
//! the environment (`env`), which all check names the same way.

/// Longest interface name the kernel accepts: `IFNAMSIZ` (16) minus the NUL.
pub const MAX_IFNAME_LEN: usize = 15;

/// Longest network name and container ID an ADD accepts: what an owner
/// record holds verbatim (`portmap_common::OWNER_NAME_LEN`). The CNI spec
/// sets no limit, but every runtime stays far below it (containerd, CRI-O
/// and Podman IDs are 64 hex digits, Nomad's are 36-byte UUIDs); a longer
/// name would be recorded cut, and a GC comparing names could then not
/// tell it from another sharing its first 128 bytes. So ADD refuses it,
/// naming the field; DEL and GC accept any length (they only remove what
/// an ADD recorded, found by the full name).
pub const MAX_RECORDED_NAME_LEN: usize = portmap_common::OWNER_NAME_LEN;

/// A name ADD would have to record cut (see [`MAX_RECORDED_NAME_LEN`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "it is {len} bytes long; ebpf-portmap records at most {MAX_RECORDED_NAME_LEN} bytes, and a cut name could be confused with another sharing its first {MAX_RECORDED_NAME_LEN}"
)]
pub struct NameTooLong {
    pub len: usize,
}

/// Checks that `value` fits an owner record whole.
pub fn validate_recorded_length(value: &str) -> Result<(), NameTooLong> {
    if value.len() > MAX_RECORDED_NAME_LEN {
        return Err(NameTooLong { len: value.len() });
    }
    Ok(())
}

/// Why a name (network name, container ID) breaks the CNI spec's
/// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentifierError {
    #[error("it is empty")]
    Empty,
    #[error("it starts with {ch:?}; the first character must be an ASCII letter or digit")]
    BadFirstChar { ch: char },
    #[error(
        "it contains {ch:?} at byte {position}; only ASCII letters, digits, '_', '.' and '-' are allowed"
    )]
    BadChar { ch: char, position: usize },
}

/// Checks the CNI spec's identifier rule, shared by network names and container IDs.
pub fn validate_identifier(value: &str) -> Result<(), IdentifierError> {
    let mut chars = value.char_indices();
    match chars.next() {
        None => return Err(IdentifierError::Empty),
        Some((_, ch)) if !ch.is_ascii_alphanumeric() => {
            return Err(IdentifierError::BadFirstChar { ch });
        }
        Some(_) => {}
    }
    match chars.find(|(_, ch)| !(ch.is_ascii_alphanumeric() || matches!(ch, '_' | '.' | '-'))) {
        Some((position, ch)) => Err(IdentifierError::BadChar { ch, position }),
        None => Ok(()),
    }
}

/// Why the kernel would refuse an interface name (mirrors `dev_valid_name()`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IfnameError {
    #[error("it is empty")]
    Empty,
    #[error("it is {len} bytes long; the kernel allows at most {MAX_IFNAME_LEN}")]
    TooLong { len: usize },
    #[error("\".\" and \"..\" are reserved and cannot name an interface")]
    Reserved,
    #[error("it contains {ch:?}, which the kernel does not allow in interface names")]
    ForbiddenChar { ch: char },
}

/// Checks a name the way the kernel's `dev_valid_name()` does, so a bad name is
/// reported here with its source rather than as an opaque netlink EINVAL later.
pub fn validate_ifname(name: &str) -> Result<(), IfnameError> {
    if name.is_empty() {
        return Err(IfnameError::Empty);
    }
    if name.len() > MAX_IFNAME_LEN {
        return Err(IfnameError::TooLong { len: name.len() });
    }
    if name == "." || name == ".." {
        return Err(IfnameError::Reserved);
    }
    // Checked byte-wise like the kernel: its isspace() also matches 0xa0, which
    // can appear inside a UTF-8 sequence; NUL would silently truncate the name.
    let forbidden = |byte: u8| {
        matches!(byte, b'/' | b':' | b'\0' | 0xa0) || byte.is_ascii_whitespace() || byte == 0x0b
    };
    match name.bytes().find(|byte| forbidden(*byte)) {
        Some(byte) => Err(IfnameError::ForbiddenChar {
            ch: char::from(byte),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_follow_the_spec_rule() {
        for good in [
            "a",
            "0",
            "abc-DEF_1.2",
            "3f6940ab5ab43bc522569d15b23f8c1bbde1d7678b080398506924fc01d72755",
        ] {
            assert_eq!(
                validate_identifier(good),
                Ok(()),
                "{good:?} must be accepted"
            );
        }
        assert_eq!(
            validate_identifier(""),
            Err(IdentifierError::Empty),
            "empty identifier"
        );
        assert_eq!(
            validate_identifier("_a"),
            Err(IdentifierError::BadFirstChar { ch: '_' }),
            "identifier starting with underscore"
        );
        assert_eq!(
            validate_identifier("a b"),
            Err(IdentifierError::BadChar {
                ch: ' ',
                position: 1
            }),
            "identifier with a space"
        );
        assert_eq!(
            validate_identifier("a/b"),
            Err(IdentifierError::BadChar {
                ch: '/',
                position: 1
            }),
            "identifier with a slash"
        );
        assert!(
            validate_identifier("é").is_err(),
            "non-ASCII letters are not allowed"
        );
    }

    #[test]
    fn recorded_names_fit_an_owner_record_whole() {
        let runtime_ids = [
            "3f6940ab5ab43bc522569d15b23f8c1bbde1d7678b080398506924fc01d72755",
            "5e0c1d2a-8f3b-4c6d-9e7f-0a1b2c3d4e5f",
        ];
        for id in runtime_ids {
            assert_eq!(validate_recorded_length(id), Ok(()), "{id}");
        }
        let longest = "a".repeat(MAX_RECORDED_NAME_LEN);
        assert_eq!(
            validate_recorded_length(&longest),
            Ok(()),
            "the limit itself fits"
        );
        let error = validate_recorded_length(&"a".repeat(200)).expect_err("200 bytes");
        assert_eq!(error, NameTooLong { len: 200 });
        let text = error.to_string();
        assert!(
            text.contains("200 bytes") && text.contains("at most 128"),
            "the length and the limit are named: {text}"
        );
    }

    #[test]
    fn ifnames_follow_the_kernel_rule() {
        for good in ["eth0", "a", "abcdefghijklmno", "bond0.100", "net-1_x", "é"] {
            assert_eq!(validate_ifname(good), Ok(()), "{good:?} must be accepted");
        }
        assert_eq!(validate_ifname(""), Err(IfnameError::Empty), "empty ifname");
        assert_eq!(
            validate_ifname("abcdefghijklmnop"),
            Err(IfnameError::TooLong { len: 16 }),
            "16-byte ifname exceeds IFNAMSIZ - 1"
        );
        assert_eq!(
            validate_ifname("."),
            Err(IfnameError::Reserved),
            "\".\" is reserved"
        );
        assert_eq!(
            validate_ifname(".."),
            Err(IfnameError::Reserved),
            "\"..\" is reserved"
        );
        for (bad, ch) in [
            ("a/b", '/'),
            ("a:b", ':'),
            ("a b", ' '),
            ("a\tb", '\t'),
            ("a\u{b}b", '\u{b}'),
            ("a\0b", '\0'),
        ] {
            assert_eq!(
                validate_ifname(bad),
                Err(IfnameError::ForbiddenChar { ch }),
                "{bad:?}"
            );
        }
        // U+00E0 is C3 A0 in UTF-8; the kernel's isspace() matches the 0xa0 byte.
        assert_eq!(
            validate_ifname("à"),
            Err(IfnameError::ForbiddenChar { ch: '\u{a0}' }),
            "0xa0 byte inside UTF-8"
        );
    }
}
