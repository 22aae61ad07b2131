//! A mock of the provider (`docs/provider-api.md`) on axum, with
//! a ledger of everything it saw and fault injection, for tests and
//! benchmarks on loopback.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use groupcast_rigs::mock::{start, MockConfig};
//! let mock = start(MockConfig::default(), "127.0.0.1:0".parse().unwrap()).await?;
//! println!("provider at {}", mock.base_url());
//! let summary = mock.ledger_summary();
//! # Ok(()) }
//! ```
//!
//! Besides the group routes it serves the message list
//! (`GET /messages/v4/list`), with delivery results decided per message by
//! the delivery hooks of [`Faults`] (registration failure share, delivery
//! delay, failure share and codes, never-final share).
//!
//! Test hooks over HTTP (no authentication, no faults):
//! - `GET /_mock/ledger`: every group with its messages and send calls
//!   ([`LedgerSnapshot`]);
//! - `GET /_mock/ledger/summary`: the same without messages, with counts by
//!   status code, recipients registered twice, and totals ([`LedgerSummary`]);
//! - `GET`/`POST /_mock/faults`: read or replace the [`Faults`];
//! - `POST /_mock/reset`: forget every group and counter.

mod config;
mod delivery;
mod faults;
pub mod invariants;
mod ledger;
mod replay;
mod routes;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::{Faults, MockConfig, MAX_FAULT_CODES};
pub use ledger::{
    DuplicateRegistration, FaultTotals, GroupSummary, LedgerGroup, LedgerMessage, LedgerSnapshot,
    LedgerSummary, SendCall, Totals,
};

use faults::FaultController;
use ledger::Ledger;
use replay::ReplayGuard;

/// Locks, ignoring poisoning: every critical section leaves the state
/// consistent at each step, and a mock that stops answering after one
/// panicking handler would hide the real failure.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Shared by every request.
pub(crate) struct MockState {
    api_key: String,
    api_secret: String,
    cap: u64,
    complete_after: Duration,
    error_count_as_string: bool,
    initial_faults: Faults,
    nonce: String,
    ledger: Mutex<Ledger>,
    faults: FaultController,
    replay: Mutex<ReplayGuard>,
    requests: [AtomicU64; routes::ENDPOINTS.len()],
    /// A test hook: adds holding a message to this number are refused
    /// (`400`), before they take effect.
    refused_number: Mutex<Option<String>>,
    /// A test hook: every request to an endpoint (by its index in
    /// `routes::ENDPOINTS`) fails this way.
    endpoint_faults: Mutex<[Option<EndpointFault>; routes::ENDPOINTS.len()]>,
}

/// How every request to one endpoint fails (a test hook, see
/// [`MockHandle::fail_endpoint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointFault {
    /// The status answered: 403 (`Forbidden`), 404 (`ResourceNotFound`),
    /// 400 (`ValidationError`) or any other (`InternalError`).
    pub status: u16,
    /// Whether the request takes effect first (its answer is then the
    /// error: an answer lost), or is refused before it has any effect.
    pub after_effect: bool,
}

impl MockState {
    fn new(config: MockConfig) -> Self {
        // Distinguishes ids of mocks started in the same second.
        let nonce: String = (0..4)
            .map(|_| char::from(b'A' + rand::random_range(0..26u8)))
            .collect();
        MockState {
            api_key: config.api_key,
            api_secret: config.api_secret,
            cap: config.cap,
            complete_after: config.complete_after,
            error_count_as_string: config.error_count_as_string,
            refused_number: Mutex::new(None),
            endpoint_faults: Mutex::new(Default::default()),
            initial_faults: config.faults.clone(),
            ledger: Mutex::new(Ledger::new(nonce.clone())),
            nonce,
            faults: FaultController::new(config.faults),
            replay: Mutex::new(ReplayGuard::default()),
            requests: Default::default(),
        }
    }

    fn ledger_snapshot(&self) -> LedgerSnapshot {
        let raw = lock(&self.ledger).raw_snapshot(self.complete_after);
        ledger::snapshot(raw)
    }

    fn ledger_summary(&self) -> LedgerSummary {
        let raw = lock(&self.ledger).raw_snapshot(self.complete_after);
        let f = &self.faults;
        let totals = Totals {
            requests: routes::ENDPOINTS
                .iter()
                .zip(&self.requests)
                .map(|(name, n)| ((*name).to_owned(), n.load(Ordering::Relaxed)))
                .collect(),
            faults: FaultTotals {
                errors: f.errors.load(Ordering::Relaxed),
                drops: f.drops.load(Ordering::Relaxed),
                rate_limited: f.rate_limited.load(Ordering::Relaxed),
                stalled: f.stalled.load(Ordering::Relaxed),
            },
            messages: 0,
            registered: 0,
        };
        ledger::summary(raw, totals)
    }

    /// Forgets groups and counters, ends any stall and restores the faults
    /// given at start. Seen signatures are kept: a reset must not make a
    /// captured request replayable.
    fn reset(&self) {
        lock(&self.ledger).clear();
        self.faults.set(self.initial_faults.clone());
        self.faults.reset_counters();
        for r in &self.requests {
            r.store(0, Ordering::Relaxed);
        }
    }
}

/// Serves the mock on `listener` until the process ends (for the CLI).
pub async fn serve(listener: TcpListener, config: MockConfig) -> std::io::Result<()> {
    serve_with_shutdown(listener, config, std::future::pending()).await
}

/// Serves the mock on `listener` until `shutdown` completes, then stops
/// accepting and finishes the requests in flight.
pub async fn serve_with_shutdown(
    listener: TcpListener,
    config: MockConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let state = Arc::new(MockState::new(config));
    serve_state(listener, state, shutdown).await
}

async fn serve_state(
    listener: TcpListener,
    state: Arc<MockState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    tracing::info!(addr = ?listener.local_addr().ok(), "mock provider listening");
    axum::serve(listener, routes::router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Binds `addr` (port 0 picks a free port) and serves the mock in a tokio
/// task until the returned handle is shut down or dropped.
pub async fn start(config: MockConfig, addr: SocketAddr) -> std::io::Result<MockHandle> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let state = Arc::new(MockState::new(config));
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_state(listener, state.clone(), async {
        // Fires on `shutdown()` and when the handle (the sender) is dropped.
        let _ = rx.await;
    }));
    Ok(MockHandle {
        addr,
        state,
        stop: Some(tx),
        task: Some(task),
    })
}

/// A running in-process mock. Dropping it stops the server (without waiting).
pub struct MockHandle {
    addr: SocketAddr,
    state: Arc<MockState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl std::fmt::Debug for MockHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockHandle")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl MockHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, ready for [`groupcast::provider::ProviderConfig::base_url`]
    /// (an unspecified bind address such as `0.0.0.0` is given as loopback).
    pub fn base_url(&self) -> String {
        let mut a = self.addr;
        if a.ip().is_unspecified() {
            a.set_ip(if a.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        format!("http://{a}")
    }

    /// Everything the mock saw, with every message (as `GET /_mock/ledger`).
    pub fn ledger(&self) -> LedgerSnapshot {
        self.state.ledger_snapshot()
    }

    /// The summary (as `GET /_mock/ledger/summary`).
    pub fn ledger_summary(&self) -> LedgerSummary {
        self.state.ledger_summary()
    }

    /// The active faults.
    pub fn faults(&self) -> Faults {
        self.state.faults.get()
    }

    /// Replaces the faults (a non-zero `stall_ms` opens a stall window now).
    pub fn set_faults(&self, faults: Faults) {
        self.state.faults.set(faults);
    }

    /// From now on, refuses every add request holding a message to `to`
    /// with `400 ValidationError`, before it takes effect (None: stop). A
    /// permanent refusal of one chunk's adds, for tests.
    pub fn refuse_adds_with(&self, to: Option<&str>) {
        *lock(&self.state.refused_number) = to.map(str::to_string);
    }

    /// From now on, every request to `endpoint` (`create`, `add`, `send`,
    /// `get`, `delete` or `messages`) fails as `fault` says (None: stop). For tests: a
    /// provider that refuses one operation for good, or loses its answers.
    /// An unknown endpoint name is ignored.
    pub fn fail_endpoint(&self, endpoint: &str, fault: Option<EndpointFault>) {
        if let Some(i) = routes::ENDPOINTS.iter().position(|e| *e == endpoint) {
            lock(&self.state.endpoint_faults)[i] = fault;
        }
    }

    /// As `POST /_mock/reset`: forgets groups and counters, restores the
    /// faults given at start.
    pub fn reset(&self) {
        self.state.reset();
    }

    /// Stops accepting, lets requests in flight finish, and waits for the
    /// server task.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.task.take() {
            Some(task) => task.await.map_err(std::io::Error::other)?,
            None => Ok(()),
        }
    }
}

impl Drop for MockHandle {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}
