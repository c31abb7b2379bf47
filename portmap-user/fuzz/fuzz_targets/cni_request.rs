//! Fuzzes everything the plugin parses from a runtime: the CNI environment,
//! the network configuration on stdin (with `runtimeConfig.portMappings`
//! and `prevResult`), for every verb. The dataplane is replaced by a plugin
//! that accepts everything: the target is the parsing and validation, which
//! must never panic and never allocate without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use portmap_user::cni::{self, CniError, GcRequest, Plugin, Request};
use portmap_user::cni::netconf::{self, NetConf};
use portmap_user::cni::prev_result::PrevResult;

struct AcceptAll;

impl Plugin for AcceptAll {
    fn add(&mut self, _: &Request) -> Result<(), CniError> {
        Ok(())
    }
    fn del(&mut self, _: &Request) -> Result<(), CniError> {
        Ok(())
    }
    fn check(&mut self, _: &Request) -> Result<(), CniError> {
        Ok(())
    }
    fn gc(&mut self, _: &GcRequest) -> Result<(), CniError> {
        Ok(())
    }
    fn status(&mut self, _: &NetConf) -> Result<(), CniError> {
        Ok(())
    }
}

const COMMANDS: [&str; 7] = ["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "BOGUS"];

fuzz_target!(|data: &[u8]| {
    // Layout: [command selector] [env text up to the first NUL] NUL [stdin].
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (env_text, stdin) = match rest.iter().position(|&b| b == 0) {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (&rest[..0], rest),
    };
    let env_text = String::from_utf8_lossy(env_text);
    let mut vars: Vec<(String, String)> = vec![
        ("CNI_COMMAND".into(), COMMANDS[selector as usize % COMMANDS.len()].into()),
        ("CNI_CONTAINERID".into(), "fuzz".into()),
        ("CNI_NETNS".into(), "/proc/self/ns/net".into()),
        ("CNI_IFNAME".into(), "eth0".into()),
        ("CNI_PATH".into(), "/usr/lib/cni".into()),
    ];
    // Lines of KEY=VALUE override the defaults, so the fuzzer reaches bad
    // container IDs, interface names and missing variables too.
    for line in env_text.lines() {
        if let Some((key, value)) = line.split_once('=') {
            vars.retain(|(k, _)| k != key);
            if !value.is_empty() {
                vars.push((key.to_owned(), value.to_owned()));
            }
        }
    }
    let env = |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let mut out = Vec::new();
    let code = cni::run(&env, &mut &stdin[..], &mut out, &mut AcceptAll);
    assert!(code == 0 || code == 1, "exit code {code}");
    if code == 1 {
        let doc: serde_json::Value =
            serde_json::from_slice(&out).expect("an error is one JSON document");
        assert!(doc["code"].as_u64().is_some(), "error without code: {doc}");
    }
    // The parsers on their own, with no environment in the way.
    let _ = netconf::parse_netconf(stdin);
    if let Ok(doc) = serde_json::from_slice::<serde_json::Value>(stdin)
        && let Some(prev) = doc.get("prevResult")
    {
        let _ = PrevResult::parse(prev, "eth0");
        let _ = PrevResult::parse_for_teardown(prev, "eth0");
    }
    let _ = cni::env::parse_cni_args(&env_text);
});
