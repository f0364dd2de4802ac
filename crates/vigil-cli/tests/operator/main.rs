//! What an operator meets first, tried as one would: the config files and their
//! errors, the demo, the docs' commands, heartbeats, the packaging.

#[path = "../demo_support/mod.rs"]
mod demo_support;

#[path = "../controller_support/mod.rs"]
mod controller_support;

// The other files of this binary (one binary per component: a 2-core machine
// links a handful of test binaries, not one per file).
mod config;
mod demo;
mod docs;
mod heartbeat;
mod packaging;
