//! Config files for the daemon under test.

use super::*;

/// A business section for a config file.
pub struct BusinessSpec {
    pub name: String,
    pub key: String,
    pub exchange: String,
    pub routing_key: String,
    pub extra: String,
}

impl BusinessSpec {
    /// A business with random key, exchange and routing key.
    pub fn random(name: &str) -> Self {
        Self {
            name: name.to_string(),
            key: unique(&format!("test:{name}")),
            exchange: unique("ex"),
            routing_key: unique("rk"),
            extra: String::new(),
        }
    }

    /// Like [`BusinessSpec::random`], with `extra` lines for its section.
    pub fn with_extra(name: &str, extra: impl Into<String>) -> Self {
        Self {
            extra: extra.into(),
            ..Self::random(name)
        }
    }
}

/// Writes a config file for the given servers and businesses.
pub fn write_config(
    dir: &Path,
    redis_url: &str,
    amqp_url: &str,
    businesses: &[&BusinessSpec],
) -> PathBuf {
    write_config_with(
        dir,
        redis_url,
        &format!("url = \"{amqp_url}\""),
        "off",
        businesses,
    )
}

/// Like [`write_config`], with the body of `[amqp]` as given (node list,
/// TLS files) and `[http] listen`.
pub fn write_config_with(
    dir: &Path,
    redis_url: &str,
    amqp_section: &str,
    http_listen: &str,
    businesses: &[&BusinessSpec],
) -> PathBuf {
    write_config_full(
        dir,
        &format!("[redis]\nurl = \"{redis_url}\"\n"),
        amqp_section,
        http_listen,
        businesses,
    )
}

/// Like [`write_config`], with a whole `[redis]` section (cluster,
/// sentinel, TLS) and `[http] listen`.
pub fn write_config_redis(
    dir: &Path,
    redis_section: &str,
    amqp_url: &str,
    http_listen: &str,
    businesses: &[&BusinessSpec],
) -> PathBuf {
    write_config_full(
        dir,
        redis_section,
        &format!("url = \"{amqp_url}\""),
        http_listen,
        businesses,
    )
}

fn write_config_full(
    dir: &Path,
    redis_section: &str,
    amqp_section: &str,
    http_listen: &str,
    businesses: &[&BusinessSpec],
) -> PathBuf {
    let mut s = format!(
        "{redis_section}[amqp]\n{amqp_section}\n[http]\nlisten = \"{http_listen}\"\n[log]\nlevel = \"info\"\n"
    );
    for b in businesses {
        s.push_str(&format!(
            "[businesses.{}]\nkey = \"{}\"\nexchange = \"{}\"\nrouting_key = \"{}\"\n{}\n",
            b.name, b.key, b.exchange, b.routing_key, b.extra
        ));
        // The tests read the due time to the millisecond and the attempt
        // from the `x-delayd-*` headers; the default message is tested on
        // its own, by businesses that name their `properties`.
        if !b.extra.contains("properties") {
            s.push_str("properties = \"full\"\n");
        }
    }
    let path = dir.join(format!("{}.toml", unique("delayd")));
    std::fs::File::create(&path)
        .unwrap()
        .write_all(s.as_bytes())
        .unwrap();
    path
}

/// Turns on `[http]` in the config at `path` on a free port of `range`
/// (it was `listen = "off"`), and returns the port.
pub fn listen_on_free_port(path: &Path, range: std::ops::Range<u16>) -> u16 {
    let port = free_port(range, &[]);
    let listen = format!("listen = \"127.0.0.1:{port}\"");
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains("listen = \"off\""), "{}", path.display());
    std::fs::write(path, text.replace("listen = \"off\"", &listen)).unwrap();
    port
}
