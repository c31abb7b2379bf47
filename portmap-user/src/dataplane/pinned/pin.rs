//! Where things live on bpffs. Pure functions, so the layout is testable and
//! written down in one place:
//!
//! ```text
//! {root}/v{LAYOUT_VERSION}/maps/{map name}              pinned maps
//! {root}/v{LAYOUT_VERSION}/progs/{build}_{program}      programs of one build
//! {root}/v{LAYOUT_VERSION}/links/if{ifindex}_{ingress|egress}   tcx links
//! {root}/v{LAYOUT_VERSION}/links/if{ifindex}_{...}_clsact       program attached by clsact
//! ```
//! bpffs names may not contain dots, so builds are hex and interfaces go by index.
//!
//! `{root}` belongs to one network namespace (see `scope.rs`); under the
//! default root, namespaces other than its owner use
//! `{root}/netns/{cookie as 16 hex digits}` as theirs ([`netns_root`]), with
//! the same layout inside.

use std::path::{Path, PathBuf};

use portmap_common::LAYOUT_VERSION;

/// Direction of a tc attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    pub const BOTH: [Direction; 2] = [Direction::Ingress, Direction::Egress];

    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinLayout {
    root: PathBuf,
}

impl PinLayout {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The configured root (`pinRoot`), shared by every layout version.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Everything of this layout version.
    pub fn versioned(&self) -> PathBuf {
        self.root.join(format!("v{LAYOUT_VERSION}"))
    }

    pub fn maps_dir(&self) -> PathBuf {
        self.versioned().join("maps")
    }

    pub fn map(&self, name: &str) -> PathBuf {
        self.maps_dir().join(name)
    }

    pub fn progs_dir(&self) -> PathBuf {
        self.versioned().join("progs")
    }

    pub fn program(&self, build: u64, program: &str) -> PathBuf {
        self.progs_dir().join(format!("{build:016x}_{program}"))
    }

    pub fn links_dir(&self) -> PathBuf {
        self.versioned().join("links")
    }

    pub fn tcx_link(&self, ifindex: u32, direction: Direction) -> PathBuf {
        self.links_dir()
            .join(format!("if{ifindex}_{}", direction.as_str()))
    }

    pub fn clsact_marker(&self, ifindex: u32, direction: Direction) -> PathBuf {
        self.links_dir()
            .join(format!("if{ifindex}_{}_clsact", direction.as_str()))
    }

    /// The ingress link on bridge port `ifindex` (a pod's veth, see
    /// `verbs::interfaces::bridge_ports`): named apart from the uplinks'
    /// and the bridge's, so that a run's read of the links directory does
    /// not take the node's pods for interfaces to ask the kernel about.
    pub fn port_link(&self, ifindex: u32) -> PathBuf {
        self.links_dir().join(format!("port{ifindex}_ingress"))
    }

    /// The clsact marker of bridge port `ifindex` (see [`Self::port_link`]).
    pub fn port_clsact_marker(&self, ifindex: u32) -> PathBuf {
        self.links_dir()
            .join(format!("port{ifindex}_ingress_clsact"))
    }

    /// Lock serialising program loads and attachments for this root (map
    /// updates never take it). Lives outside bpffs, which holds no files.
    pub fn lock_file(&self) -> PathBuf {
        let id = crate::dataplane::pinned::hash::fnv1a64(self.root.as_os_str().as_encoded_bytes());
        PathBuf::from(format!("/run/ebpf-portmap/{id:016x}.lock"))
    }
}

/// The root of the state of the network namespace with `cookie` under the
/// shared default root (when another namespace owns the root itself).
pub fn netns_root(root: &Path, cookie: u64) -> PathBuf {
    root.join("netns").join(format!("{cookie:016x}"))
}

/// Parses a bridge port's link pin file name (see [`PinLayout::port_link`])
/// back into (ifindex, clsact).
pub fn parse_port_link_name(name: &str) -> Option<(u32, bool)> {
    let (index, rest) = name.strip_prefix("port")?.split_once('_')?;
    let clsact = match rest {
        "ingress" => false,
        "ingress_clsact" => true,
        _ => return None,
    };
    Some((index.parse().ok()?, clsact))
}

/// Parses the pin file name of either kind of tc attachment (an
/// interface's, [`parse_link_name`], or a bridge port's, ingress only,
/// [`parse_port_link_name`]) back into (ifindex, direction, clsact).
pub fn parse_tc_pin_name(name: &str) -> Option<(u32, Direction, bool)> {
    parse_port_link_name(name)
        .map(|(ifindex, clsact)| (ifindex, Direction::Ingress, clsact))
        .or_else(|| parse_link_name(name))
}

/// Parses a link pin file name back into (ifindex, direction, clsact).
pub fn parse_link_name(name: &str) -> Option<(u32, Direction, bool)> {
    let rest = name.strip_prefix("if")?;
    let (index, rest) = rest.split_once('_')?;
    let (direction, clsact) = match rest {
        "ingress" => (Direction::Ingress, false),
        "egress" => (Direction::Egress, false),
        "ingress_clsact" => (Direction::Ingress, true),
        "egress_clsact" => (Direction::Egress, true),
        _ => return None,
    };
    Some((index.parse().ok()?, direction, clsact))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_versioned_and_dot_free() {
        let layout = PinLayout::new("/sys/fs/bpf/ebpf-portmap");
        assert_eq!(
            layout.map("mappings"),
            PathBuf::from("/sys/fs/bpf/ebpf-portmap/v1/maps/mappings")
        );
        assert_eq!(
            layout.tcx_link(7, Direction::Egress),
            PathBuf::from("/sys/fs/bpf/ebpf-portmap/v1/links/if7_egress")
        );
        let program = layout.program(0xabc, "portmap_ingress");
        assert_eq!(
            program,
            PathBuf::from("/sys/fs/bpf/ebpf-portmap/v1/progs/0000000000000abc_portmap_ingress")
        );
        for path in [program, layout.clsact_marker(3, Direction::Ingress)] {
            let name = path.file_name().unwrap().to_str().unwrap();
            assert!(!name.contains('.'), "bpffs rejects dots: {name}");
        }
    }

    #[test]
    fn link_names_round_trip() {
        let layout = PinLayout::new("/x");
        for direction in Direction::BOTH {
            let tcx = layout.tcx_link(42, direction);
            let clsact = layout.clsact_marker(42, direction);
            assert_eq!(
                parse_link_name(tcx.file_name().unwrap().to_str().unwrap()),
                Some((42, direction, false))
            );
            assert_eq!(
                parse_link_name(clsact.file_name().unwrap().to_str().unwrap()),
                Some((42, direction, true))
            );
        }
        assert_eq!(parse_link_name("if_x_ingress"), None);
        assert_eq!(parse_link_name("ifx_ingress"), None);
        assert_eq!(parse_link_name("if1_sideways"), None);
        let port = layout.port_link(42);
        let port = port.file_name().unwrap().to_str().unwrap();
        assert_eq!(parse_port_link_name(port), Some((42, false)));
        assert_eq!(parse_link_name(port), None);
        let marker = layout.port_clsact_marker(42);
        let marker = marker.file_name().unwrap().to_str().unwrap();
        assert_eq!(parse_port_link_name(marker), Some((42, true)));
        assert_eq!(parse_link_name(marker), None);
        assert_eq!(parse_port_link_name("if42_ingress"), None);
        assert_eq!(parse_port_link_name("port42_egress"), None);
        assert_eq!(
            parse_tc_pin_name("port42_ingress_clsact"),
            Some((42, Direction::Ingress, true))
        );
        assert_eq!(
            parse_tc_pin_name("if42_egress"),
            Some((42, Direction::Egress, false))
        );
        assert_eq!(parse_tc_pin_name("beacon"), None);
    }

    #[test]
    fn every_namespace_has_its_own_root_under_the_default() {
        let root = Path::new("/sys/fs/bpf/ebpf-portmap");
        let a = PinLayout::new(netns_root(root, 0x1000_0000_0000_00ab));
        assert_eq!(
            a.map("mappings"),
            PathBuf::from("/sys/fs/bpf/ebpf-portmap/netns/10000000000000ab/v1/maps/mappings")
        );
        assert_ne!(
            a.lock_file(),
            PinLayout::new(netns_root(root, 2)).lock_file()
        );
        assert_ne!(a.lock_file(), PinLayout::new(root).lock_file());
    }

    #[test]
    fn lock_files_differ_per_root() {
        assert_ne!(
            PinLayout::new("/sys/fs/bpf/a").lock_file(),
            PinLayout::new("/sys/fs/bpf/b").lock_file()
        );
    }
}
