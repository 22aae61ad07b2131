//! Liveness: every batch ends in exactly one truthful report, whatever its
//! input and the provider do. One end-to-end test per situation, on real
//! redis-server processes, asserting from the mock provider's ledger and the
//! webhook's receipts.

// Shared with the product's own integration tests, in the root package.
#[path = "../../tests/common/mod.rs"]
mod common;

#[path = "liveness/retry.rs"]
mod retry;

#[path = "liveness/input.rs"]
mod input;

#[path = "liveness/cancel.rs"]
mod cancel;

#[path = "liveness/last.rs"]
mod last;

#[path = "liveness/claim.rs"]
mod claim;

#[path = "liveness/give_up.rs"]
mod give_up;

#[path = "liveness/send_give_up.rs"]
mod send_give_up;
