pub mod cascade;
pub mod config;
pub mod task;
pub mod telemetry;
