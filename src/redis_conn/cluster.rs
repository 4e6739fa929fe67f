//! Redis Cluster topology as `CLUSTER NODES` describes it.

/// One host and port of a Redis server.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr {
    /// Host name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// A cluster master and the slot ranges it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Master {
    /// Where it listens.
    pub addr: Addr,
    /// Inclusive slot ranges.
    pub slots: Vec<(u16, u16)>,
}

impl Master {
    /// Whether this master serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(lo, hi)| slot >= lo && slot <= hi)
    }
}

/// The masters in a `CLUSTER NODES` reply that serve slots, sorted by address.
pub fn parse_cluster_nodes(text: &str) -> Vec<Master> {
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        let flags: Vec<&str> = f[2].split(',').collect();
        if !flags.contains(&"master")
            || flags
                .iter()
                .any(|x| matches!(*x, "fail" | "handshake" | "noaddr"))
        {
            continue;
        }
        let hostport = f[1].split(['@', ',']).next().unwrap_or("");
        let Some((host, port)) = hostport.rsplit_once(':') else {
            continue;
        };
        let Ok(port) = port.parse() else { continue };
        let slots: Vec<(u16, u16)> = f[8..]
            .iter()
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => s.parse().ok().map(|x| (x, x)),
            })
            .collect();
        if slots.is_empty() {
            continue;
        }
        out.push(Master {
            addr: Addr {
                host: host.trim_matches(['[', ']']).to_string(),
                port,
            },
            slots,
        });
    }
    out.sort_by(|a, b| a.addr.cmp(&b.addr));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lists_masters_with_slots() {
        let text = "\
07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@40002,host.example master - 0 1426238316232 2 connected 5461-10922
292f 127.0.0.1:30003@40003 master - 0 1426238318243 3 connected 10923-16383 [10923->-e7d1]
6ec2 127.0.0.1:30005@40005 master,fail - 1426238316232 0 5 disconnected
e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 16383
";
        let m = parse_cluster_nodes(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].addr.to_string(), "127.0.0.1:30001");
        assert_eq!(m[0].slots, vec![(0, 5460), (16383, 16383)]);
        assert_eq!(m[1].addr.port, 30002);
        assert_eq!(m[2].slots, vec![(10923, 16383)]);
        assert!(m[1].serves(5461) && !m[1].serves(5460));
    }
}
