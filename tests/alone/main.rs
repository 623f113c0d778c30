//! Integration tests that need the machine to themselves: a binary of its
//! own: `cargo test` runs one test binary after another, so nothing of the
//! `it` binary runs beside it.
//!
//! A node-loss test measures how fast delayline heals (a new node within
//! seconds, a stranded level drained before an operator would be alerted).
//! Beside the `it` binary's tests, two cores also boot its three nodes,
//! run the machine's broker and a dozen services: its cluster took 90 s to
//! form instead of 30, and its bounds then said nothing of delayline.
//! The helpers are the `it` binary's ([`common`]), not all used here.

#[allow(dead_code)]
#[path = "../it/common/mod.rs"]
mod common;

mod cluster;
