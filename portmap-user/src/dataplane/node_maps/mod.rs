//! What the programs are told about this node: its own addresses and
//! interfaces ([`node_state`]), where containers hand packets over
//! ([`peers`]), and the containers whose own sockets the hooks translate
//! ([`container_netns`]).

pub mod container_netns;
pub mod node_state;
pub mod peers;
