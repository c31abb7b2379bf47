//! What is loaded for this kernel: the embedded eBPF [`object`], its kfunc
//! calls linked by [`kfunc`] (the programs calling a module's kfuncs loaded
//! by [`program`]), and the kernel's [`features`].

pub mod features;
pub mod kfunc;
pub mod object;
pub mod program;
