//! What an owner asks of the `mappings` map: the entries a request plans
//! ([`Translation`], [`plan`]), and the addresses, ports and protocols of
//! map keys as people read them ([`KeyDisplay`]).

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use portmap_common::{
    FAMILY_V4, FAMILY_V6, MappingKey, MappingValue, PROTO_SCTP, PROTO_TCP, PROTO_UDP,
};

use crate::model::{ContainerAddrs, HostIp, PortMapping};

/// One entry of the `mappings` map as an owner wants it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Translation {
    pub key: MappingKey,
    pub container_addr_be: [u32; 4],
    pub container_port_be: u16,
    /// `portmap_common::conditions::HAS_CONDITIONS` when the owner's
    /// configuration has conditions for this family (see
    /// [`with_conditions`]); 0 for none.
    pub conditions: u16,
}

impl Translation {
    pub(super) fn value(&self, owner_id: u64) -> MappingValue {
        MappingValue {
            container_addr_be: self.container_addr_be,
            container_port_be: self.container_port_be,
            conditions: self.conditions,
            owner_id,
            ..MappingValue::default()
        }
    }
}

/// The mapping key shown to people: `198.18.0.1:8080/tcp`, `0.0.0.0:8080/udp`, `[::]:80/sctp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDisplay(pub MappingKey);

impl fmt::Display for KeyDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = &self.0;
        let port = u16::from_be(key.host_port_be);
        match addr_from_words(key.family, &key.host_addr_be) {
            IpAddr::V4(a) => write!(f, "{a}:{port}/{}", protocol_name(key.proto)),
            IpAddr::V6(a) => write!(f, "[{a}]:{port}/{}", protocol_name(key.proto)),
        }
    }
}

pub fn protocol_name(proto: u8) -> &'static str {
    match proto {
        PROTO_TCP => "tcp",
        PROTO_UDP => "udp",
        PROTO_SCTP => "sctp",
        _ => "?",
    }
}

pub fn words_from_addr(addr: IpAddr) -> [u32; 4] {
    match addr {
        IpAddr::V4(a) => [u32::from_ne_bytes(a.octets()), 0, 0, 0],
        IpAddr::V6(a) => {
            let o = a.octets();
            let word = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            [word(0), word(4), word(8), word(12)]
        }
    }
}

pub fn addr_from_words(family: u8, words: &[u32; 4]) -> IpAddr {
    if family == FAMILY_V4 {
        IpAddr::V4(Ipv4Addr::from(words[0].to_ne_bytes()))
    } else {
        let mut octets = [0u8; 16];
        for (i, word) in words.iter().enumerate() {
            octets[i * 4..i * 4 + 4].copy_from_slice(&word.to_ne_bytes());
        }
        IpAddr::V6(Ipv6Addr::from(octets))
    }
}

/// The map entries a request asks for: one per mapping and per address
/// family that both the container has and `hostIP` allows.
pub fn plan(mappings: &[PortMapping], container: &ContainerAddrs) -> Vec<Translation> {
    let mut plan = Vec::new();
    for mapping in mappings {
        let families: [(u8, Option<IpAddr>, bool); 2] = [
            (
                FAMILY_V4,
                container.v4.map(IpAddr::V4),
                mapping.host_ip.allows_v4(),
            ),
            (
                FAMILY_V6,
                container.v6.map(IpAddr::V6),
                mapping.host_ip.allows_v6(),
            ),
        ];
        for (family, container_addr, allowed) in families {
            let Some(container_addr) = container_addr else {
                continue;
            };
            if !allowed {
                continue;
            }
            let host_addr_be = match mapping.host_ip {
                HostIp::Addr(addr) => words_from_addr(addr),
                HostIp::Any | HostIp::AnyV4 | HostIp::AnyV6 => [0; 4],
            };
            plan.push(Translation {
                key: MappingKey {
                    host_addr_be,
                    host_port_be: mapping.host_port.to_be(),
                    proto: mapping.protocol.number(),
                    family,
                },
                container_addr_be: words_from_addr(container_addr),
                container_port_be: mapping.container_port.to_be(),
                conditions: 0,
            });
        }
    }
    plan
}

/// Flags the translations of every family in `families` (those whose
/// configuration has conditions): their mappings send each new flow to the
/// owner's entry in the conditions map first.
pub fn with_conditions(mut translations: Vec<Translation>, families: &[u8]) -> Vec<Translation> {
    for translation in &mut translations {
        if families.contains(&translation.key.family) {
            translation.conditions = portmap_common::conditions::HAS_CONDITIONS;
        }
    }
    translations
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    fn mapping(
        host_ip: HostIp,
        host_port: u16,
        container_port: u16,
        protocol: Protocol,
    ) -> PortMapping {
        PortMapping {
            host_ip,
            host_port,
            container_port,
            protocol,
        }
    }

    #[test]
    fn plan_maps_each_family_the_container_has_and_host_ip_allows() {
        let dual = ContainerAddrs {
            v4: Some("10.244.0.5".parse().unwrap()),
            v6: Some("fd44::5".parse().unwrap()),
        };
        let both = plan(&[mapping(HostIp::Any, 8080, 80, Protocol::Tcp)], &dual);
        assert_eq!(
            both.len(),
            2,
            "wildcard on a dual-stack container maps both families"
        );
        assert_eq!(both[0].key.family, FAMILY_V4);
        assert_eq!(
            both[0].key.host_addr_be, [0; 4],
            "wildcard key has a zero address"
        );
        assert_eq!(both[0].key.host_port_be, 8080u16.to_be());
        assert_eq!(both[0].key.proto, 6);
        assert_eq!(
            both[0].container_addr_be,
            words_from_addr("10.244.0.5".parse().unwrap())
        );
        assert_eq!(both[0].container_port_be, 80u16.to_be());
        assert_eq!(both[1].key.family, FAMILY_V6);

        let v4_only = plan_for(&dual, HostIp::AnyV4);
        assert_eq!(v4_only.len(), 1);
        assert_eq!(v4_only[0].key.family, FAMILY_V4, "0.0.0.0 maps IPv4 only");
        let v6_only = plan_for(&dual, HostIp::AnyV6);
        assert_eq!(v6_only.len(), 1);
        assert_eq!(v6_only[0].key.family, FAMILY_V6, ":: maps IPv6 only");

        let specific = plan_for(&dual, HostIp::Addr("198.18.0.11".parse().unwrap()));
        assert_eq!(specific.len(), 1);
        assert_eq!(
            addr_from_words(FAMILY_V4, &specific[0].key.host_addr_be),
            "198.18.0.11".parse::<IpAddr>().unwrap()
        );

        let v6_container = ContainerAddrs {
            v4: None,
            v6: dual.v6,
        };
        assert!(
            plan(
                &[mapping(HostIp::AnyV4, 1, 1, Protocol::Udp)],
                &v6_container
            )
            .is_empty(),
            "no IPv4 address, nothing to map for 0.0.0.0"
        );
    }

    fn plan_for(container: &ContainerAddrs, host_ip: HostIp) -> Vec<Translation> {
        plan(&[mapping(host_ip, 8080, 80, Protocol::Tcp)], container)
    }

    #[test]
    fn addresses_round_trip_through_map_words() {
        for text in ["10.1.2.3", "255.0.0.1", "fd18::1", "2001:db8::dead:beef"] {
            let addr: IpAddr = text.parse().unwrap();
            let family = if addr.is_ipv4() { FAMILY_V4 } else { FAMILY_V6 };
            assert_eq!(
                addr_from_words(family, &words_from_addr(addr)),
                addr,
                "{text}"
            );
        }
        // Network order in memory: the first octet is the first byte.
        let words = words_from_addr("10.1.2.3".parse().unwrap());
        assert_eq!(words[0].to_ne_bytes(), [10, 1, 2, 3]);
    }

    #[test]
    fn key_display_is_readable() {
        let key = plan_for(
            &ContainerAddrs {
                v4: Some("10.0.0.2".parse().unwrap()),
                v6: Some("fd00::2".parse().unwrap()),
            },
            HostIp::Any,
        );
        assert_eq!(KeyDisplay(key[0].key).to_string(), "0.0.0.0:8080/tcp");
        assert_eq!(KeyDisplay(key[1].key).to_string(), "[::]:8080/tcp");
    }
}
