//! A TCP relay between delayd and the broker that can hold the broker's
//! side: delayd's frames go through, the broker's replies (its confirms)
//! wait until released. A member published while they are held stays in
//! flight for as long as the test needs.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The relay: listening on a loopback port, forwarding to one broker.
pub struct Relay {
    url: String,
    held: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// A relay to the broker of `amqp_url`; [`Relay::url`] is the same URL
    /// through it.
    pub async fn to(amqp_url: &str) -> Self {
        let start = amqp_url.find('@').map_or_else(
            || amqp_url.find("://").expect("an AMQP URL") + 3,
            |at| at + 1,
        );
        let end = amqp_url[start..]
            .find('/')
            .map_or(amqp_url.len(), |i| start + i);
        let target = amqp_url[start..end].to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = format!("{}127.0.0.1:{port}{}", &amqp_url[..start], &amqp_url[end..]);
        let (held, rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if let Ok(server) = TcpStream::connect(&target).await {
                    tokio::spawn(relay(client, server, rx.clone()));
                }
            }
        });
        Self { url, held, task }
    }

    /// The broker's URL through the relay.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Holds everything the broker sends from now on.
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Lets what was held, and what follows, through.
    pub fn release(&self) {
        self.held.send_replace(false);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One connection: the client's bytes as they come, the server's once not
/// held.
async fn relay(client: TcpStream, server: TcpStream, mut held: watch::Receiver<bool>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = tokio::io::copy(&mut cr, &mut sw);
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if held.wait_for(|h| !*h).await.is_err() || cw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = cw.shutdown().await;
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}
