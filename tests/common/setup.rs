//! The usual start of an end-to-end test.

use super::*;

/// The usual start of an end-to-end test: on the given broker, a consumed
/// queue bound to each business's exchange; a config for the businesses in
/// a temporary directory; a Redis connection. The daemon is the test's to
/// start. Keep the whole value alive: the directory and the consumers go
/// with it.
pub struct Setup {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub redis: redis::aio::MultiplexedConnection,
    pub amqp: Connection,
    pub ch: Channel,
    /// One queue and inbox per business, in order.
    pub queues: Vec<String>,
    pub inboxes: Vec<Inbox>,
}

impl Setup {
    /// Against the shared Redis and RabbitMQ.
    pub async fn new(businesses: &[&BusinessSpec]) -> Self {
        Self::on(&redis_url(), &amqp_url(), businesses).await
    }

    /// Against the servers at `redis_url` and `amqp_url`.
    pub async fn on(redis_url: &str, amqp_url: &str, businesses: &[&BusinessSpec]) -> Self {
        let c = Consumers::on(amqp_url, businesses).await;
        let config = write_config(c.dir.path(), redis_url, amqp_url, businesses);
        Self::with(c, config, redis_url).await
    }

    /// Like [`Setup::new`], but delayd reaches the broker through `relay`
    /// (the consumers do not).
    pub async fn through(relay: &Relay, businesses: &[&BusinessSpec]) -> Self {
        let c = Consumers::on(&amqp_url(), businesses).await;
        let config = write_config(c.dir.path(), &redis_url(), relay.url(), businesses);
        Self::with(c, config, &redis_url()).await
    }

    /// Like [`Setup::new`], but only the exchanges are declared: nothing is
    /// bound to them, so every publish comes back unroutable.
    pub async fn unbound(businesses: &[&BusinessSpec]) -> Self {
        let c = Consumers::exchanges_only(&amqp_url(), businesses).await;
        let config = write_config(c.dir.path(), &redis_url(), &amqp_url(), businesses);
        Self::with(c, config, &redis_url()).await
    }

    async fn with(c: Consumers, config: PathBuf, redis_url: &str) -> Self {
        Setup {
            dir: c.dir,
            config,
            redis: redis_at(redis_url).await,
            amqp: c.amqp,
            ch: c.ch,
            queues: c.queues,
            inboxes: c.inboxes,
        }
    }

    /// The first business's inbox.
    pub fn inbox(&self) -> &Inbox {
        &self.inboxes[0]
    }
}

/// The broker side of [`Setup`], for tests whose config is not the plain one
/// (a cluster or sentinel `[redis]` section): a consumed queue bound to each
/// business's exchange, and a temporary directory for the config.
pub struct Consumers {
    pub dir: tempfile::TempDir,
    pub amqp: Connection,
    pub ch: Channel,
    /// One queue and inbox per business, in order.
    pub queues: Vec<String>,
    pub inboxes: Vec<Inbox>,
}

impl Consumers {
    /// On the broker at `amqp_url`.
    pub async fn on(amqp_url: &str, businesses: &[&BusinessSpec]) -> Self {
        let mut c = Self::connect(amqp_url).await;
        for b in businesses {
            let queue = unique("q");
            c.inboxes
                .push(bind_and_consume(&c.amqp, &c.ch, b, &queue).await);
            c.queues.push(queue);
        }
        c
    }

    /// Each business's exchange, with no queue bound to it.
    pub async fn exchanges_only(amqp_url: &str, businesses: &[&BusinessSpec]) -> Self {
        let c = Self::connect(amqp_url).await;
        for b in businesses {
            declare_exchange(&c.ch, &b.exchange).await;
        }
        c
    }

    async fn connect(amqp_url: &str) -> Self {
        let amqp = amqp_at(amqp_url).await;
        let ch = amqp.create_channel().await.unwrap();
        Consumers {
            dir: tempfile::tempdir().unwrap(),
            amqp,
            ch,
            queues: Vec::new(),
            inboxes: Vec::new(),
        }
    }

    /// The first business's inbox.
    pub fn inbox(&self) -> Inbox {
        self.inboxes[0].clone()
    }
}
