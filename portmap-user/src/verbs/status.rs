//! STATUS: whether the plugin can serve ADD on this node (the kernel loads
//! this build's programs; the pin root is usable).

use crate::cni::CniError;
use crate::cni::error::code;
use crate::cni::netconf::NetConf;
use crate::dataplane::attach;
use crate::dataplane::scope;

/// The STATUS verb.
pub(super) fn status(conf: &NetConf) -> Result<(), CniError> {
    let layout = scope::resolve(&conf.pin_root, scope::Access::Read)
        .map_err(|error| CniError::from_error(code::INVALID_NETWORK_CONFIG, &error))?;
    attach::probe(&layout).map_err(|error| CniError::from_error(code::PLUGIN_NOT_AVAILABLE, &error))
}
