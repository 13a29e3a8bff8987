//! Black-box tests of the `troupe` binary: real processes, real output.

mod demo;
