//! Model clients of the `troupe` binary.

pub mod offline;
