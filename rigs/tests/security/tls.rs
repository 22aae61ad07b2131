//! TLS: verified with a CA file, refused with a wrong one or none, client
//! certificates when the server asks for them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use groupcast::keys::Keyspace;
use groupcast::store::{ClientTlsConfig, Store, TlsCertificates};
use groupcast_rigs::redis_server::{free_port, RedisServer};

use crate::common::*;
use crate::support::*;

/// A CA, a server certificate for 127.0.0.1/localhost, a client certificate,
/// and an unrelated CA, made with the `openssl` tool.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "the TLS tests need the `openssl` command-line tool ({e}): \
                 install it with `sudo apt-get install openssl`"
            )
        });
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    for ca in ["ca", "wrong-ca"] {
        let mut args = vec!["req", "-x509", "-nodes", "-days", "2"];
        args.extend(ec);
        let (key, crt, subj) = (
            format!("{ca}.key"),
            format!("{ca}.crt"),
            format!("/CN=groupcast test {ca}"),
        );
        args.extend([
            "-keyout",
            &key,
            "-out",
            &crt,
            "-subj",
            &subj,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(d, &args);
    }
    std::fs::write(
        d.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write");
    std::fs::write(
        d.join("client.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    .expect("write");
    for (who, cn) in [("server", "localhost"), ("client", "groupcast-worker")] {
        let mut args = vec!["req", "-nodes"];
        args.extend(ec);
        let (key, csr, subj) = (
            format!("{who}.key"),
            format!("{who}.csr"),
            format!("/CN={cn}"),
        );
        args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
        openssl(d, &args);
        let (crt, ext) = (format!("{who}.crt"), format!("{who}.ext"));
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &crt,
                "-extfile",
                &ext,
            ],
        );
    }
    Pki { dir }
}

/// A redis-server speaking TLS on `tls_port` (and plain on `plain` if given).
fn tls_server(pki: &Pki, auth_clients: &str, plain: Option<u16>) -> (RedisServer, u16) {
    let tls_port = free_port().expect("port");
    let (cert, key, ca) = (
        pki.arg("server.crt"),
        pki.arg("server.key"),
        pki.arg("ca.crt"),
    );
    let tls_port_s = tls_port.to_string();
    let mut args = vec![
        "--tls-port",
        &tls_port_s,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        auth_clients,
    ];
    let server = match plain {
        Some(p) => server(&args, p, None),
        None => {
            // TLS only: the plain port is turned off, so readiness is a TLS PING.
            args.extend(["--port", "0"]);
            server(
                &args,
                tls_port,
                Some(format!("rediss://127.0.0.1:{tls_port}/#insecure")),
            )
        }
    };
    (server, tls_port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verified_with_the_ca_file_carries_a_whole_batch() {
    let pki = pki();
    let (server, port) = tls_server(&pki, "no", None);
    let url = format!("rediss://127.0.0.1:{port}/");
    let ca = std::fs::read(pki.path("ca.crt")).expect("ca");
    let store = Store::connect_with_tls(
        &url,
        Keyspace::new("gct", 1),
        Some(TlsCertificates {
            client_tls: None,
            root_cert: Some(ca),
        }),
    )
    .await
    .expect("a server whose certificate our CA signed is trusted");

    // The whole pipeline over TLS, blocking reads included.
    let mock = groupcast_rigs::mock::start(mock_config(), "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("mock");
    let provider = provider_for(&mock);
    let mut rig = Rig {
        server,
        store,
        mock,
        provider,
        workers: Vec::new(),
        config: test_config(),
    };
    rig.add_worker().await;
    let batch = "tls-batch".to_string();
    let chunks = groupcast::producer::cut(&batch, &template(), recipients(1, 250), 100);
    groupcast::producer::append_chunks(&rig.store, &chunks)
        .await
        .expect("append over TLS");
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(60))
        .await;
    rig.verify(std::slice::from_ref(&batch)).await;

    // The CLI, with the CA from GROUPCAST_REDIS_CA_FILE.
    let env = [
        ("GROUPCAST_REDIS_URL", url.clone()),
        ("GROUPCAST_PREFIX", "gct".to_string()),
        ("GROUPCAST_REDIS_CA_FILE", pki.arg("ca.crt")),
    ];
    let out = run_ok(&["status", &batch, "--json"], &env);
    assert!(out.contains("\"report\""), "{out}");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_wrong_ca_or_none_is_refused() {
    let pki = pki();
    let (_server, port) = tls_server(&pki, "no", None);
    let url = format!("rediss://127.0.0.1:{port}/");

    // A CA that did not sign the server's certificate, and no CA at all (the
    // system's trust store does not know our test CA): both refused.
    for ca in [Some(pki.arg("wrong-ca.crt")), None] {
        let mut env = vec![("GROUPCAST_REDIS_URL", url.clone())];
        if let Some(ca) = &ca {
            env.push(("GROUPCAST_REDIS_CA_FILE", ca.clone()));
        }
        let (status, _, err) = run(&["status"], &env);
        assert_eq!(status.code(), Some(1), "CA {ca:?} was accepted: {err}");
        assert!(
            err.contains("TLS handshake failed") && err.contains("GROUPCAST_REDIS_CA_FILE"),
            "the message should say the TLS handshake failed and name GROUPCAST_REDIS_CA_FILE: {err}"
        );
        assert!(
            err.contains(&format!("rediss://127.0.0.1:{port}/")),
            "{err}"
        );
    }

    // In process too: the wrong CA is an error, not a connection.
    let wrong = std::fs::read(pki.path("wrong-ca.crt")).expect("ca");
    let r = Store::connect_with_tls(
        &url,
        Keyspace::new("gct", 1),
        Some(TlsCertificates {
            client_tls: None,
            root_cert: Some(wrong),
        }),
    )
    .await;
    assert!(r.is_err(), "a server signed by another CA was trusted");

    // A CA file with a plain URL is a mistake, said as such.
    let (status, _, err) = run(
        &["status"],
        &[
            ("GROUPCAST_REDIS_URL", format!("redis://127.0.0.1:{port}/")),
            ("GROUPCAST_REDIS_CA_FILE", pki.arg("ca.crt")),
        ],
    );
    assert!(!status.success());
    assert!(err.contains("needs a rediss://"), "{err}");

    // A CA file that cannot be read is named.
    let (status, _, err) = run(
        &["status"],
        &[
            ("GROUPCAST_REDIS_URL", url.clone()),
            ("GROUPCAST_REDIS_CA_FILE", "/nonexistent/ca.pem".into()),
        ],
    );
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("GROUPCAST_REDIS_CA_FILE=/nonexistent/ca.pem"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_client_certificates_when_the_server_asks_for_them() {
    let pki = pki();
    let plain = free_port().expect("port");
    let (_server, port) = tls_server(&pki, "yes", Some(plain));
    let base = vec![
        ("GROUPCAST_REDIS_URL", format!("rediss://127.0.0.1:{port}/")),
        ("GROUPCAST_REDIS_CA_FILE", pki.arg("ca.crt")),
    ];
    let mut with_cert = base.clone();
    with_cert.push(("GROUPCAST_REDIS_CLIENT_CERT_FILE", pki.arg("client.crt")));
    with_cert.push(("GROUPCAST_REDIS_CLIENT_KEY_FILE", pki.arg("client.key")));
    run_ok(&["status"], &with_cert);

    let (status, _, err) = run(&["status"], &base);
    assert_eq!(status.code(), Some(1), "no client certificate, yet: {err}");
    assert!(
        err.contains("GROUPCAST_REDIS_CLIENT_CERT_FILE"),
        "the message should name the client certificate variables: {err}"
    );

    // In process, the same.
    let certs = TlsCertificates {
        root_cert: Some(std::fs::read(pki.path("ca.crt")).expect("ca")),
        client_tls: Some(ClientTlsConfig {
            client_cert: std::fs::read(pki.path("client.crt")).expect("crt"),
            client_key: std::fs::read(pki.path("client.key")).expect("key"),
        }),
    };
    let store = Store::connect_with_tls(
        &format!("rediss://127.0.0.1:{port}/"),
        Keyspace::new("gct", 1),
        Some(certs),
    )
    .await
    .expect("mutual TLS");
    let pong: String = redis::cmd("PING")
        .query_async(&mut store.raw_conn())
        .await
        .expect("ping");
    assert_eq!(pong, "PONG");
}
