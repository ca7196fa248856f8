//! Empty on purpose: the library target lets policer-user name this crate
//! as a build-dependency, so cargo rebuilds the XDP object when it changes.
#![no_std]
