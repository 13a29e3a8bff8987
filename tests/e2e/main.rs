//! Black-box tests of the `troupe` binary: real processes, real output.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod crash;
mod demo;
mod model;
mod store;
