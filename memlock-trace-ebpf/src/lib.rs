//! Lets the loader name this crate as a build-dependency (cargo requires a lib target);
//! the programs themselves are the `memlock-trace` binary.
#![no_std]
