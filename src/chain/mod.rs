//! The cascade at run time: what the binary TTL cascade needs beside its
//! pure rules ([`crate::cascade`]) to meet what a way of delaying owes the
//! control plane (the seam, in docs/development.md). Everything here is the
//! cascade's own; another way of delaying (RabbitMQ 4.4's delayed quorum
//! queues) would be a room beside this one, and the control plane
//! (`scheduler`, `release`, `ingress`, `http`, `operations`) would not
//! change (`tests/layout.rs` checks that it names none of the cascade's
//! internals).
//!
//! - [`burst`]: a burst's head starts through the levels, so that it
//!   passes them before its instant (the rules are `cascade`'s `spread`).
//! - [`strands`]: the level keepers, a probe through every level and the
//!   drain of a level that stopped dead-lettering; they hear what reaches
//!   the release stage through `release::ArrivalWatch`.
//! - [`failover`]: what a lost node's levels may have lost, published
//!   again from the ledger.

mod burst;
mod failover;
mod strands;

pub(crate) use burst::{Bursts, HeadStart};
pub(crate) use failover::FailoverResender;
pub(crate) use strands::{KeeperHandles, ShardStrands, level_keepers};
