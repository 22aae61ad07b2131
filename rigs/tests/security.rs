//! Security: Redis AUTH (password and a least-privilege ACL user), TLS
//! (verified with a CA file, refused with a wrong one, client certificates),
//! secrets that never leave the environment, loopback-only listeners, and
//! signed report deliveries with no token of the webhook's URL in any output.
//!
//! Every test runs against a real `redis-server` it starts, and most run the
//! built `groupcast` binary as a user would. TLS tests make their own CA with
//! the `openssl` command-line tool.

// Shared with the product's own integration tests, in the root package.
#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "security/support.rs"]
mod support;

#[path = "security/auth.rs"]
mod auth;
#[path = "security/listeners.rs"]
mod listeners;
#[path = "security/secrets.rs"]
mod secrets;
#[path = "security/tls.rs"]
mod tls;
#[path = "security/webhooks.rs"]
mod webhooks;
