//! Shared test helpers: a private redis-server per test, and a store on it.
#![allow(dead_code)]

use groupcast::keys::Keyspace;
use groupcast::redis_server::RedisServer;
use groupcast::store::Store;

/// Starts a private redis-server, or fails the test saying how to install one.
pub fn redis() -> RedisServer {
    match RedisServer::start() {
        Ok(s) => s,
        Err(e) => panic!("tests need a real redis-server: {e}"),
    }
}

/// A store on a fresh server (keep the server alive as long as the store).
pub async fn store(shards: u32) -> (RedisServer, Store) {
    let server = redis();
    let store = Store::connect(&server.url(), Keyspace::new("gct", shards))
        .await
        .expect("connect to the private redis-server");
    (server, store)
}
