//! Listeners bind to loopback unless told otherwise.

use std::net::SocketAddr;

use clap::Parser;
use groupcast::cli::Command as Product;
use groupcast_rigs::cli::{Cli, Command as CliCommand};

use crate::common::redis;

fn loopback(addr: &str) -> bool {
    addr.parse::<SocketAddr>()
        .is_ok_and(|a| a.ip().is_loopback())
}

#[test]
fn listeners_bind_to_loopback_unless_told_otherwise() {
    for var in ["GROUPCAST_METRICS_LISTEN", "GROUPCAST_MOCK_LISTEN"] {
        assert!(
            std::env::var_os(var).is_none(),
            "unset {var} to run this test: it checks the built-in defaults"
        );
    }
    let cli = Cli::try_parse_from(["groupcast", "worker"]).expect("parse");
    let CliCommand::Product(Product::Worker(w)) = cli.command else {
        panic!("not a worker command")
    };
    // Without the flag a worker takes the first free of the default
    // addresses: each on loopback.
    assert_eq!(w.worker.metrics_listen, None);
    let defaults = groupcast::cli::worker::default_metrics_addrs();
    assert!(
        !defaults.is_empty() && defaults.iter().all(|a| loopback(&a.to_string())),
        "--metrics-listen defaults to {defaults:?}"
    );

    let cli = Cli::try_parse_from(["groupcast", "mock-provider"]).expect("parse");
    let CliCommand::MockProvider(m) = cli.command else {
        panic!("not mock-provider")
    };
    assert!(
        m.listen.ip().is_loopback(),
        "--listen defaults to {}",
        m.listen
    );
    // No credentials come from a default either.
    assert!(m.api_key.is_none() && m.api_secret.is_none());

    // The Redis URL's default is loopback too.
    let cli = Cli::try_parse_from(["groupcast", "status"]).expect("parse");
    let CliCommand::Product(Product::Status(s)) = cli.command else {
        panic!("not status")
    };
    assert!(
        s.redis.url.starts_with("redis://127.0.0.1:"),
        "{}",
        s.redis.url
    );

    // Binding elsewhere takes an explicit flag.
    let cli = Cli::try_parse_from(["groupcast", "worker", "--metrics-listen", "0.0.0.0:9464"])
        .expect("parse");
    let CliCommand::Product(Product::Worker(w)) = cli.command else {
        panic!("not a worker command")
    };
    assert_eq!(w.worker.metrics_listen.as_deref(), Some("0.0.0.0:9464"));
}

#[test]
fn the_private_redis_server_binds_to_loopback() {
    // The demo and the tests start their redis-server through RedisServer:
    // it must listen on 127.0.0.1 only.
    let server = redis();
    let mut c = redis::Client::open(server.url())
        .expect("url")
        .get_connection()
        .expect("connect");
    let bind: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("bind")
        .query(&mut c)
        .expect("config get");
    assert_eq!(
        bind.get(1).map(String::as_str),
        Some("127.0.0.1"),
        "{bind:?}"
    );
}
