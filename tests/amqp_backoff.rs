//! A broker that accepts delayd and then drops it is retried with backoff,
//! never in a busy loop.

use delayd_test_support as common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A TCP relay to the shared broker that closes each connection as soon as
/// the broker has answered `connection.open` (method frame class 10,
/// method 41): the handshake succeeds, then the connection is gone. Counts
/// the connections it accepted.
async fn dropping_relay(upstream_port: u16) -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let Ok(mut broker) =
                    tokio::net::TcpStream::connect(("127.0.0.1", upstream_port)).await
                else {
                    return;
                };
                let (mut cr, mut cw) = client.split();
                let (mut br, mut bw) = broker.split();
                let up = tokio::io::copy(&mut cr, &mut bw);
                let down = async {
                    let mut buf = vec![0u8; 65536];
                    loop {
                        let n = match br.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if cw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                        if buf[..n].windows(4).any(|w| w == [0, 10, 0, 41]) {
                            return;
                        }
                    }
                };
                tokio::select! {
                    _ = up => {}
                    _ = down => {}
                }
            });
        }
    });
    (port, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_drops_every_connection_after_the_handshake_is_retried_with_backoff() {
    let upstream: u16 = amqp_url()
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next()?.parse().ok())
        .expect("port in DELAYD_TEST_AMQP_URL");
    let (port, accepted) = dropping_relay(upstream).await;
    let b = BusinessSpec::random("dropped");
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &redis_url(),
        &format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
        &[&b],
    );
    let d = Daemon::start(&config);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let n = accepted.load(Ordering::Relaxed);
    // Backoff from 200 ms doubling to 5 s: about 6 attempts in 6 s. A
    // reconnect at once after each drop makes hundreds.
    assert!(n >= 2, "delayd stopped trying: {n}; log:\n{}", d.tail());
    assert!(
        n <= 15,
        "{n} connections in 6 s: a busy loop; log:\n{}",
        d.tail()
    );
}
