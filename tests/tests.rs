//! The integration test binary: every feature's tests as a module, so the suite links
//! once. Run through `scripts/test.sh`, which starts the S3 server the tests need.

mod capture;
mod ecosystem;
mod mount;
mod newcomer;
mod review;
mod security;
mod store;
mod util;
