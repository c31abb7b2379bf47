//! Reading what the manifest, the Dockerfile and `install.sh` say, for the
//! test that they agree.

use std::fs;

use portmap_tests::plugins::workspace_root;
use serde::Deserialize;
use serde_json::Value;

pub(crate) fn read(relative: &str) -> String {
    fs::read_to_string(workspace_root().join(relative))
        .unwrap_or_else(|e| panic!("reading {relative}: {e}"))
}

/// `NAME=${NAME:-default}` from install.sh.
pub(crate) fn script_default(name: &str) -> String {
    let prefix = format!("{name}=${{{name}:-");
    read("deploy/install.sh")
        .lines()
        .find_map(|line| {
            line.strip_prefix(&prefix)?
                .strip_suffix('}')
                .map(str::to_owned)
        })
        .unwrap_or_else(|| panic!("install.sh has no default for {name}"))
}

/// `COPY src dest` lines of the Dockerfile, as (src, dest), with each
/// `${NAME}` replaced by the default of its `ARG NAME=default` line.
pub(crate) fn dockerfile_copies() -> Vec<(String, String)> {
    let dockerfile = read("deploy/Dockerfile");
    let defaults: Vec<(String, String)> = dockerfile
        .lines()
        .filter_map(|line| {
            let (name, default) = line.strip_prefix("ARG ")?.split_once('=')?;
            Some((format!("${{{name}}}"), default.to_owned()))
        })
        .collect();
    dockerfile
        .lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("COPY ")?.split_whitespace();
            let mut source = words.next()?.to_owned();
            for (reference, default) in &defaults {
                source = source.replace(reference, default);
            }
            Some((source, words.next()?.to_owned()))
        })
        .collect()
}

pub(crate) fn manifest() -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(&read("deploy/daemonset.yaml"))
        .map(|document| Value::deserialize(document).expect("a YAML document"))
        .collect()
}

pub(crate) fn at<'a>(value: &'a Value, pointer: &str) -> &'a Value {
    value
        .pointer(pointer)
        .unwrap_or_else(|| panic!("the manifest has no {pointer}"))
}
