//! The topology test support works: a Sentinel group and a Redis Cluster start, replicate, fail
//! over and stop (tests/it/support/topology.rs).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::topology::{RedisCluster, Role, SentinelGroup};

#[test]
fn sentinel_group_replicates_and_fails_over() {
    let t0 = Instant::now();
    let mut group = SentinelGroup::start();
    let started = t0.elapsed();
    assert_eq!(group.sentinel_urls().len(), 3);
    let master = group.master_port();
    let replicas = group.replica_ports();
    assert_eq!(
        replicas.len(),
        2,
        "replicas {replicas:?} of master {master}"
    );
    assert_eq!(group.role(master), Some(Role::Master));

    let mut m = group.conn_to(master);
    let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut m).unwrap();
    let acked: i64 = redis::cmd("WAIT").arg(2).arg(1000).query(&mut m).unwrap();
    assert_eq!(acked, 2, "WAIT 2 1000 on the master");
    for &r in &replicas {
        let v: Option<String> = redis::cmd("GET")
            .arg("k")
            .query(&mut group.conn_to(r))
            .unwrap();
        assert_eq!(v.as_deref(), Some("v"), "GET k on replica {r}");
    }
    drop(m);

    let t1 = Instant::now();
    let old = group.kill_master();
    assert_eq!(old, master);
    let new = group.wait_for_new_master(old, Duration::from_secs(20));
    let failed_over = t1.elapsed();
    assert!(
        replicas.contains(&new),
        "new master {new} among {replicas:?}"
    );
    assert_eq!(group.role(new), Some(Role::Master));
    // the write WAIT saw on both replicas survived the failover
    let v: Option<String> = redis::cmd("GET")
        .arg("k")
        .query(&mut group.conn_to(new))
        .unwrap();
    assert_eq!(v.as_deref(), Some("v"), "GET k on the new master {new}");
    // the other replica follows the new master
    let other = replicas.iter().copied().find(|&r| r != new).unwrap();
    group.wait_for_replicas(Duration::from_secs(20));
    assert_eq!(
        group.role(other),
        Some(Role::Replica {
            master_port: new,
            connected: true
        }),
        "ROLE of {other}\n{}",
        group.log_tails()
    );
    let replicas_linked = t1.elapsed();

    // the killed master comes back as a replica of the new one
    let t2 = Instant::now();
    group.restart_node(old);
    assert_eq!(
        group.role(old),
        Some(Role::Replica {
            master_port: new,
            connected: true
        }),
        "ROLE of {old} after its restart\n{}",
        group.log_tails()
    );
    let rejoined = t2.elapsed();
    println!(
        "sentinel group: started in {started:?}, new master in {failed_over:?} after the kill \
         (replicas linked at {replicas_linked:?}), old master rejoined in {rejoined:?}, \
         total {:?}",
        t0.elapsed()
    );
}

#[test]
fn cluster_spreads_keys_and_fails_over() {
    let t0 = Instant::now();
    let mut cluster = RedisCluster::start();
    let started = t0.elapsed();
    assert_eq!(cluster.urls().len(), 6);
    let masters = cluster.master_ports();
    assert_eq!(masters.len(), 3, "masters {masters:?}");

    // one key per master, by hash tag
    let mut keys: BTreeMap<u16, String> = BTreeMap::new();
    for i in 0.. {
        let key = format!("{{tag{i}}}:k");
        keys.entry(cluster.master_for_slot(cluster.slot_of(&key)))
            .or_insert(key);
        if keys.len() == 3 {
            break;
        }
        assert!(i < 1000, "1000 hash tags all on {:?}", keys.keys());
    }
    for (&port, key) in &keys {
        let mut c = cluster.conn_to(port);
        let _: () = redis::cmd("SET").arg(key).arg(port).query(&mut c).unwrap();
        let acked: i64 = redis::cmd("WAIT").arg(1).arg(1000).query(&mut c).unwrap();
        assert_eq!(acked, 1, "WAIT 1 1000 on master {port}");
        // another master redirects
        let other = masters.iter().find(|&&m| m != port).unwrap();
        let err = redis::cmd("GET")
            .arg(key)
            .query::<Option<String>>(&mut cluster.conn_to(*other))
            .unwrap_err();
        assert!(err.to_string().to_lowercase().contains("moved"), "{err}");
    }

    // a slot and its key move to another master
    let (&from, key) = keys.iter().next().unwrap();
    let to = masters.iter().copied().find(|&m| m != from).unwrap();
    let slot = cluster.slot_of(key);
    cluster.migrate_slot(slot, to);
    assert_eq!(cluster.master_for_slot(slot), to);
    let v: Option<String> = redis::cmd("GET")
        .arg(key)
        .query(&mut cluster.conn_to(to))
        .unwrap();
    assert_eq!(
        v,
        Some(from.to_string()),
        "{key} after the migration to {to}"
    );

    // a killed master's replica takes over its slots
    let victim = masters
        .iter()
        .copied()
        .find(|&m| m != from && m != to)
        .unwrap();
    let victim_key = keys[&victim].clone();
    let replicas = cluster.replicas_of(victim);
    let t1 = Instant::now();
    cluster.kill(victim);
    let new = cluster.wait_for_failover(victim, Duration::from_secs(20));
    let failed_over = t1.elapsed();
    assert!(replicas.contains(&new), "{new} among {replicas:?}");
    assert_eq!(cluster.role(new), Some(Role::Master));
    assert_eq!(cluster.master_for_slot(cluster.slot_of(&victim_key)), new);
    let v: Option<String> = redis::cmd("GET")
        .arg(&victim_key)
        .query(&mut cluster.conn_to(new))
        .unwrap();
    assert_eq!(v, Some(victim.to_string()), "{victim_key} on {new}");
    println!(
        "cluster: started in {started:?}, failed over in {failed_over:?}, total {:?}",
        t0.elapsed()
    );
}
