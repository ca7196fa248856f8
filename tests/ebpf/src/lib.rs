//! Empty on purpose: the library target lets the tests crate name this
//! crate as a build-dependency, so cargo rebuilds the reference object when
//! it changes.
#![no_std]
