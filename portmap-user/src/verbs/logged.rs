//! The plugin with each decision logged: one line per ADD, DEL, CHECK and
//! GC (and a failed STATUS) saying which container it was for and what
//! came of it. The lines go wherever [`crate::logging`] sends records.

use log::Level;

use crate::cni::{CniError, GcRequest, Plugin, Request, netconf::NetConf};

/// `host:port->container/proto` of every mapping requested, e.g.
/// `*:8080->80/tcp, 198.18.0.11:53->53/udp`.
pub fn describe_mappings(conf: &NetConf) -> String {
    if conf.port_mappings.is_empty() {
        return "none".into();
    }
    conf.port_mappings
        .iter()
        .map(|m| {
            let host = match m.host_ip.specific() {
                Some(std::net::IpAddr::V6(addr)) => format!("[{addr}]"),
                Some(addr) => addr.to_string(),
                None => match m.host_ip {
                    crate::model::HostIp::AnyV4 => "0.0.0.0".into(),
                    crate::model::HostIp::AnyV6 => "[::]".into(),
                    _ => "*".into(),
                },
            };
            format!(
                "{host}:{}->{}/{}",
                m.host_port, m.container_port, m.protocol
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn outcome(result: &Result<(), CniError>) -> String {
    match result {
        Ok(()) => "ok".into(),
        Err(error) => format!("failed (code {}): {}", error.code, error.msg),
    }
}

fn log_outcome(verb: &str, subject: &str, result: &Result<(), CniError>) {
    // Failures are logged again, with their details, by the CNI front end
    // (at error level, so also on stderr); this line ties them to the container.
    let level = if result.is_ok() {
        Level::Info
    } else {
        Level::Warn
    };
    log::log!(level, "{verb} {subject}: {}", outcome(result));
}

/// `container=… ifname=… network=…`, and `pod=namespace/name` when
/// CNI_ARGS named one (Nomad: `pod=nomad:namespace/job/group`).
fn attachment(req: &Request) -> String {
    let mut line = format!(
        "container={} ifname={} network={}",
        req.owner.container_id, req.owner.ifname, req.owner.network
    );
    if let Some(pod) = req.identity.label() {
        line.push_str(&format!(" pod={pod}"));
    }
    if let Some(alloc) = &req.identity.nomad_alloc_id {
        line.push_str(&format!(" alloc={alloc}"));
    }
    line
}

/// The attachment and the mappings it asked for: ADD's and CHECK's subject.
fn with_mappings(req: &Request) -> String {
    format!(
        "{} mappings=[{}]",
        attachment(req),
        describe_mappings(&req.conf)
    )
}

/// A plugin whose every decision is logged with the container it concerns.
#[derive(Debug, Default)]
pub struct Logged<P>(pub P);

impl<P: Plugin> Plugin for Logged<P> {
    fn add(&mut self, req: &Request) -> Result<(), CniError> {
        let result = self.0.add(req);
        log_outcome("ADD", &with_mappings(req), &result);
        result
    }

    fn del(&mut self, req: &Request) -> Result<(), CniError> {
        let result = self.0.del(req);
        log_outcome("DEL", &attachment(req), &result);
        result
    }

    fn check(&mut self, req: &Request) -> Result<(), CniError> {
        let result = self.0.check(req);
        log_outcome("CHECK", &with_mappings(req), &result);
        result
    }

    fn gc(&mut self, req: &GcRequest) -> Result<(), CniError> {
        let result = self.0.gc(req);
        let keep: Vec<String> = req
            .valid
            .iter()
            .map(|a| format!("{}/{}", a.container_id, a.ifname))
            .collect();
        log_outcome(
            "GC",
            &format!("network={} keep=[{}]", req.conf.name, keep.join(", ")),
            &result,
        );
        result
    }

    fn status(&mut self, conf: &NetConf) -> Result<(), CniError> {
        let result = self.0.status(conf);
        // Runtimes ask for STATUS often: only a failure is worth a line.
        if result.is_err() {
            log_outcome("STATUS", &format!("network={}", conf.name), &result);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_are_described_compactly() {
        let conf = crate::cni::netconf::parse_netconf(
            br#"{"cniVersion":"1.0.0","name":"net","type":"ebpf-portmap","runtimeConfig":{"portMappings":[
                {"hostPort":8080,"containerPort":80},
                {"hostPort":53,"containerPort":53,"protocol":"udp","hostIP":"198.18.0.11"},
                {"hostPort":443,"containerPort":8443,"hostIP":"::"}]}}"#,
        )
        .expect("valid config");
        assert_eq!(
            describe_mappings(&conf),
            "*:8080->80/tcp, 198.18.0.11:53->53/udp, [::]:443->8443/tcp"
        );
    }

    #[test]
    fn attachments_name_the_pod_when_cni_args_did() {
        let conf = crate::cni::netconf::parse_netconf(
            br#"{"cniVersion":"1.0.0","name":"k8s","type":"ebpf-portmap"}"#,
        )
        .expect("valid config");
        let mut req = Request {
            conf,
            owner: crate::model::Owner {
                network: "k8s".into(),
                container_id: "3a1b".into(),
                ifname: "eth0".into(),
            },
            netns: None,
            container: Default::default(),
            interfaces: Vec::new(),
            identity: Default::default(),
        };
        assert_eq!(attachment(&req), "container=3a1b ifname=eth0 network=k8s");
        req.identity =
            crate::cni::env::parse_cni_args("K8S_POD_NAME=web;K8S_POD_NAMESPACE=default").0;
        assert_eq!(
            attachment(&req),
            "container=3a1b ifname=eth0 network=k8s pod=default/web"
        );
        req.identity = crate::cni::env::parse_cni_args("NOMAD_ALLOC_ID=5e0c;NOMAD_JOB_ID=web").0;
        assert_eq!(
            attachment(&req),
            "container=3a1b ifname=eth0 network=k8s pod=nomad:-/web/- alloc=5e0c"
        );
    }

    #[test]
    fn outcomes_name_the_code() {
        assert_eq!(outcome(&Ok(())), "ok");
        assert_eq!(
            outcome(&Err(CniError::new(100, "port taken", ""))),
            "failed (code 100): port taken"
        );
    }
}
