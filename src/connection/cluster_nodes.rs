//! The masters a Cluster node knows, from its `CLUSTER NODES` reply: the slot map the redis
//! crate keeps lists only masters that own slots, and only as of its last refresh.

/// The address (`host`, `port`) of every master `CLUSTER NODES` lists as reachable: flagged
/// `master`, and not `fail`, `fail?`, `handshake` or `noaddr`. A master without slots (a shard
/// being added) is included. Lines that do not parse are skipped: this feeds a best-effort load.
pub(super) fn masters(cluster_nodes: &str) -> Vec<(String, u16)> {
    cluster_nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_id, address, flags) = (fields.next()?, fields.next()?, fields.next()?);
            let flags: Vec<&str> = flags.split(',').collect();
            let unusable = ["fail", "fail?", "handshake", "noaddr"];
            if !flags.contains(&"master") || flags.iter().any(|f| unusable.contains(f)) {
                return None;
            }
            // ip:port@cport[,hostname]; an IPv6 ip has colons of its own
            let (host, port) = address.split('@').next()?.rsplit_once(':')?;
            let port = port.parse().ok()?;
            (!host.is_empty() && port != 0).then(|| (host.to_string(), port))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masters_with_and_without_slots_are_listed_and_replicas_and_failing_nodes_are_not() {
        let reply = "\
07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@40002 master - 0 1426238316232 2 connected 5461-10922
292f 127.0.0.1:30003@40003,node-3.example master - 0 1426238318243 3 connected 10923-16383
6ec2 127.0.0.1:30005@40005 master,fail - 1426238316232 1426238315000 5 disconnected
824f 127.0.0.1:30006@40006 master,fail? - 0 1426238317741 6 connected
aa11 127.0.0.1:30008@40008 handshake - 0 0 0 connected
e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460
bb22 ::1:30007@40007 master - 0 1426238317741 7 connected
cc33 :0@0 master,noaddr - 0 0 8 disconnected
not a line
";
        assert_eq!(
            masters(reply),
            [
                ("127.0.0.1".to_string(), 30002),
                ("127.0.0.1".to_string(), 30003),
                ("127.0.0.1".to_string(), 30001),
                ("::1".to_string(), 30007),
            ]
        );
    }
}
