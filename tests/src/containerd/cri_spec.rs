//! The CRI requests the kubelet would send: a pod's sandbox with its port
//! mappings, its app container, and the addresses the CRI reports.

use std::net::IpAddr;
use std::path::Path;

use super::config::{IMAGE, POD_NAMESPACE};
use crate::cri::{
    ContainerConfig, ContainerMetadata, ImageSpec, LinuxPodSandboxConfig, PodSandboxConfig,
    PodSandboxMetadata, Protocol,
};
use crate::runtime::rootfs::IMAGE_PROBE;
use crate::topology::PortMapping;

/// The sandbox of pod `name` as the kubelet would describe it.
pub fn sandbox_config(
    name: &str,
    uid: &str,
    log_directory: &Path,
    cgroup_parent: &str,
    ports: &[PortMapping],
) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.to_owned(),
            uid: uid.to_owned(),
            namespace: POD_NAMESPACE.to_owned(),
            attempt: 0,
        }),
        hostname: name.to_owned(),
        log_directory: log_directory.to_string_lossy().into_owned(),
        port_mappings: ports.iter().map(cri_port_mapping).collect(),
        labels: [("app".to_owned(), name.to_owned())].into(),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.to_owned(),
        }),
    }
}

/// A port mapping as the kubelet puts it in a sandbox config.
pub fn cri_port_mapping(port: &PortMapping) -> crate::cri::PortMapping {
    let protocol = match port.protocol.as_str() {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        "sctp" => Protocol::Sctp,
        other => panic!("no CRI protocol {other:?}"),
    };
    crate::cri::PortMapping {
        protocol: protocol as i32,
        container_port: i32::from(port.container_port),
        host_port: i32::from(port.host_port),
        host_ip: port.host_ip.map(|ip| ip.to_string()).unwrap_or_default(),
    }
}

/// The app container of pod `name`: httpd on 80 and on TCP 53 (`/` and
/// `/hostname` answer `name`, in the background), the UDP echo on 53 as the
/// main process (so one port can be published for both protocols, as a DNS
/// server's is).
pub fn app_config(name: &str) -> ContainerConfig {
    assert!(
        !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
        "pod name {name:?}: letters, digits and dashes only (it goes into a shell line)"
    );
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: "app".to_owned(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: IMAGE.to_owned(),
        }),
        command: vec!["/bin/sh".to_owned(), "-c".to_owned()],
        args: vec![format!(
            "mkdir -p /www && echo {name} > /www/index.html && echo {name} > /www/hostname && httpd -p 80 -h /www && httpd -p 53 -h /www && exec {IMAGE_PROBE} udp-echo-server 53 {name}"
        )],
        log_path: "app.log".to_owned(),
    }
}

/// Every address the CRI reports for a sandbox.
pub fn pod_ips(status: &crate::cri::PodSandboxStatus) -> Vec<IpAddr> {
    let Some(network) = &status.network else {
        return Vec::new();
    };
    std::iter::once(network.ip.as_str())
        .chain(network.additional_ips.iter().map(|ip| ip.ip.as_str()))
        .filter_map(|ip| ip.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::Protocol;

    #[test]
    fn sandbox_configs_carry_the_ports_as_the_kubelet_sends_them() {
        let config = sandbox_config(
            "web",
            "web-uid-0",
            Path::new("/tmp/c/logs/web-uid-0"),
            "/ct-ctrd-1-2",
            &[
                PortMapping::tcp(8080, 80),
                PortMapping::udp(8053, 53).on("198.18.0.11".parse().unwrap()),
            ],
        );
        let metadata = config.metadata.as_ref().unwrap();
        assert_eq!(
            (metadata.name.as_str(), metadata.namespace.as_str()),
            ("web", POD_NAMESPACE)
        );
        assert_eq!(config.linux.unwrap().cgroup_parent, "/ct-ctrd-1-2");
        assert_eq!(
            config.port_mappings,
            [
                crate::cri::PortMapping {
                    protocol: Protocol::Tcp as i32,
                    container_port: 80,
                    host_port: 8080,
                    host_ip: String::new(),
                },
                crate::cri::PortMapping {
                    protocol: Protocol::Udp as i32,
                    container_port: 53,
                    host_port: 8053,
                    host_ip: "198.18.0.11".into(),
                },
            ]
        );
    }

    #[test]
    #[should_panic(expected = "letters, digits and dashes")]
    fn pod_names_never_reach_the_shell_unchecked() {
        app_config("a;b");
    }
}
