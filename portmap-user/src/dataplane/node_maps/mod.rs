//! What the programs are told about this node: its own addresses and
//! interfaces ([`node_state`]), where containers hand packets over
//! ([`peers`]), the containers whose own sockets the hooks translate
//! ([`container_netns`]), and the index of each interface `-i` conditions
//! name ([`interface_conditions`]).

pub mod container_netns;
pub mod interface_conditions;
pub mod node_state;
pub mod peers;
