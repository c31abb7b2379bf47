//! The CNI error object and the one table of error codes: the spec's and the
//! plugin's own (100 and up). Every typed error of the library maps itself to
//! one of these next to its definition (`cni_code`); only the binary turns an
//! error into the JSON document and the exit code.

use std::fmt;

use serde_json::{Value, json};

/// Every error code this plugin answers with. 1-99 are the CNI spec's
/// ("Error" section); 100 and up are ours, documented in
/// docs/operating.md.
pub mod code {
    /// The configuration's `cniVersion` is not one this plugin speaks.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// A field of the configuration is not supported.
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// The container is unknown or does not exist.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// A `CNI_*` environment variable is missing or invalid.
    pub const INVALID_ENVIRONMENT_VARIABLES: u32 = 4;
    /// An I/O failure (a map, netlink, a socket).
    pub const IO_FAILURE: u32 = 5;
    /// stdin could not be decoded.
    pub const DECODING_FAILURE: u32 = 6;
    /// The network configuration is invalid.
    pub const INVALID_NETWORK_CONFIG: u32 = 7;
    /// Transient: a concurrent DEL or GC removed the owner while ADD ran.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin cannot serve ADD requests.
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    /// STATUS: the plugin can serve ADD, with limited connectivity.
    pub const PLUGIN_NOT_AVAILABLE_LIMITED_CONNECTIVITY: u32 = 51;
    /// Another owner holds the requested host port.
    pub const PORT_CONFLICT: u32 = 100;
    /// A map is full.
    pub const CAPACITY: u32 = 101;
    /// The eBPF programs could not be loaded or attached.
    pub const DATAPLANE: u32 = 102;
    /// CHECK found an entry missing or different.
    pub const CHECK_FAILED: u32 = 103;
    /// The plugin lacks the capabilities it needs.
    pub const PRIVILEGE: u32 = 104;
    /// A node process already listens on the requested host port.
    pub const HOST_PORT_IN_USE: u32 = 105;
    /// What libcni's `ErrInternal` uses for "the plugin has a bug".
    pub const INTERNAL: u32 = 999;
}

/// The error object of the CNI spec. Built only at this boundary: the rest of
/// the library uses typed errors.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// The spec's error document: `{"cniVersion", "code", "msg", "details"}`.
    pub fn to_json(&self, cni_version: &str) -> Value {
        json!({
            "cniVersion": cni_version,
            "code": self.code,
            "msg": self.msg,
            "details": self.details,
        })
    }

    /// Builds a CNI error from a typed one: `msg` is its message, `details` the
    /// messages of its sources (so nothing is printed twice).
    pub fn from_error(code: u32, error: &dyn std::error::Error) -> Self {
        CniError::new(code, error.to_string(), source_chain(error))
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CNI error {}: {}", self.code, self.msg)?;
        if !self.details.is_empty() {
            write!(f, " ({})", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

/// `error`'s message and its sources', outermost first, joined with ": ":
/// one line for a log.
pub fn with_sources(error: &dyn std::error::Error) -> String {
    let sources = source_chain(error);
    if sources.is_empty() {
        error.to_string()
    } else {
        format!("{error}: {sources}")
    }
}

/// Messages of `error`'s sources, outermost first, joined with ": ".
fn source_chain(error: &dyn std::error::Error) -> String {
    let mut chain = Vec::new();
    let mut source = error.source();
    while let Some(cause) = source {
        chain.push(cause.to_string());
        source = cause.source();
    }
    chain.join(": ")
}
