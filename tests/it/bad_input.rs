//! Bad input and a bad network give clear, typed errors, never a panic or a hang: lock names,
//! settings, URLs, unreachable or silent or non-Redis or too old servers, and foreign data at a
//! lock's keys (which fairlock leaves untouched).

use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::RedisServer;
use fairlock::{Error, LockClient};

/// A bound on how long a failing connect may take: the timeouts below are 1 s each.
const NO_HANG: Duration = Duration::from_secs(10);

fn builder(url: &str) -> fairlock::LockClientBuilder {
    LockClient::builder(url)
        .connect_timeout(Duration::from_secs(1))
        .read_timeout(Duration::from_secs(1))
}

#[test]
fn errors_are_std_errors_that_can_cross_threads() {
    fn check<E: std::error::Error + Send + Sync + 'static>() {}
    check::<Error>();
}

#[test]
fn bad_lock_names_are_refused_with_the_reason() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let long = "x".repeat(fairlock::MAX_NAME_LEN + 1);
    for (name, why) in [
        ("", "empty"),
        (long.as_str(), "too long"),
        ("a{b", "hash tag"),
        ("a}b", "hash tag"),
        ("{tag}", "hash tag"),
        ("line\nbreak", "control"),
        ("nul\0", "control"),
    ] {
        match client.fair_lock(name) {
            Err(e @ Error::InvalidName { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(why), "{name:?}: {msg}");
                assert!(msg.contains("use 1 to 512 bytes"), "{name:?}: {msg}");
            }
            other => panic!("name {name:?} gave {other:?}"),
        }
        assert!(fairlock::validate_name(name).is_err());
    }
    // the longest allowed name, and names with the key separator and unicode, work end to end
    for name in [
        "x".repeat(fairlock::MAX_NAME_LEN),
        "a:b:c".into(),
        "zürich 東京".into(),
    ] {
        let lock = client.fair_lock(&name).unwrap();
        lock.lock().unwrap().unlock().unwrap();
    }
    // nothing was written for the refused names
    assert!(server
        .keys()
        .iter()
        .all(|k| !k.contains("a{b") && !k.contains("nul")));
}

#[test]
fn bad_settings_are_refused_before_connecting() {
    // the URL points nowhere: settings are checked first, so no connection is attempted
    let nowhere = format!("redis://127.0.0.1:{}/", support::free_port());
    let cases: Vec<(&str, fairlock::LockClientBuilder)> = vec![
        ("lease", builder(&nowhere).lease(Duration::ZERO)),
        ("lease", builder(&nowhere).lease(Duration::from_millis(50))),
        (
            "lease",
            builder(&nowhere).lease(Duration::from_secs(8 * 24 * 3600)),
        ),
        ("pool_size", builder(&nowhere).pool_size(0)),
        // a whole Config is checked the same way
        (
            "pool_size",
            builder(&nowhere).config(fairlock::Config {
                pool_size: 0,
                ..fairlock::Config::default()
            }),
        ),
        ("key_prefix", builder(&nowhere).key_prefix("")),
        ("key_prefix", builder(&nowhere).key_prefix("my locks")),
        ("key_prefix", builder(&nowhere).key_prefix("a{b}")),
        (
            "janitor_interval",
            builder(&nowhere).janitor_interval(Duration::ZERO),
        ),
        (
            "connect_timeout",
            builder(&nowhere).connect_timeout(Duration::ZERO),
        ),
        (
            "read_timeout",
            builder(&nowhere).read_timeout(Duration::ZERO),
        ),
    ];
    for (setting, b) in cases {
        match b.build() {
            Err(e @ Error::InvalidConfig { .. }) => {
                let Error::InvalidConfig { setting: s, .. } = &e else {
                    unreachable!()
                };
                assert_eq!(*s, setting, "{e}");
                assert!(e.to_string().contains(setting), "{e}");
            }
            Err(other) => panic!("{setting}: expected InvalidConfig, got {other:?}"),
            Ok(_) => panic!("{setting}: accepted"),
        }
    }

    // per-handle leases too
    let server = RedisServer::start();
    let client = support::client(&server);
    let lock = client.fair_lock("leases").unwrap();
    for bad in [
        Duration::ZERO,
        Duration::from_millis(1),
        Duration::from_millis(99),
    ] {
        assert!(matches!(
            lock.with_fixed_lease(bad),
            Err(Error::InvalidConfig {
                setting: "fixed lease",
                ..
            })
        ));
        assert!(matches!(
            lock.with_lease(bad),
            Err(Error::InvalidConfig {
                setting: "lease",
                ..
            })
        ));
    }
    assert!(lock.with_fixed_lease(fairlock::MIN_LEASE).is_ok());
}

#[test]
fn invalid_urls_are_refused() {
    for url in [
        "not a url",
        "http://127.0.0.1:6379/",
        "",
        "redis://127.0.0.1:notaport/",
    ] {
        match LockClient::connect(url) {
            Err(e @ Error::InvalidUrl { .. }) => {
                assert!(e.to_string().contains("redis://"), "{e}");
            }
            Err(other) => panic!("{url:?}: expected InvalidUrl, got {other:?}"),
            Ok(_) => panic!("{url:?}: accepted"),
        }
    }
}

#[test]
fn an_unreachable_server_is_a_connection_error_within_seconds() {
    let url = format!("redis://127.0.0.1:{}/", support::free_port());
    // with the default settings (2 s connect timeout)
    let start = Instant::now();
    let e = LockClient::connect(&url).expect_err("connected to nobody");
    assert!(matches!(e, Error::Connection { .. }), "{e:?}");
    assert!(e.is_connection());
    assert!(
        e.to_string().contains("check that the server is running"),
        "{e}"
    );
    // the cause is kept, not flattened to text: the redis crate's refused connection
    let cause = std::error::Error::source(&e).expect("a connection error keeps its cause");
    assert!(
        cause.downcast_ref::<redis::RedisError>().is_some(),
        "{cause:?}"
    );
    assert!(start.elapsed() < NO_HANG, "took {:?}", start.elapsed());
}

/// Accept connections on a loopback port for 15 s and hand each to `serve` on its own thread.
fn fake_server(serve: fn(TcpStream)) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}/", listener.local_addr().unwrap());
    listener.set_nonblocking(true).unwrap();
    thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(15);
        while Instant::now() < end {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false).unwrap();
                    stream
                        .set_read_timeout(Some(Duration::from_secs(15)))
                        .unwrap();
                    thread::spawn(move || serve(stream));
                }
                Err(_) => thread::sleep(Duration::from_millis(10)),
            }
        }
    });
    url
}

fn expect_not_redis_or_connection(url: &str, what: &str) {
    let start = Instant::now();
    let result = builder(url).build();
    let took = start.elapsed();
    match result {
        Err(e @ (Error::NotRedis { .. } | Error::Connection { .. })) => {
            println!("{what}: {e} after {took:?}");
            assert!(!e.to_string().is_empty());
        }
        Err(other) => panic!("{what}: expected NotRedis or Connection, got {other:?}"),
        Ok(_) => panic!("{what}: accepted as Redis"),
    }
    assert!(took < NO_HANG, "{what}: took {took:?}");
}

#[test]
fn a_server_that_accepts_and_says_nothing_is_an_error_not_a_hang() {
    let url = fake_server(|mut s| {
        // read and ignore everything, never answer
        let mut buf = [0u8; 1024];
        while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
    });
    expect_not_redis_or_connection(&url, "silent server");
}

#[test]
fn a_server_that_answers_garbage_is_an_error() {
    let http = fake_server(|mut s| {
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf);
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        thread::sleep(Duration::from_secs(2));
    });
    expect_not_redis_or_connection(&http, "HTTP server");

    let greeter = fake_server(|mut s| {
        let _ = s.write_all(b"SSH-2.0-OpenSSH_9.2p1 Debian\r\n");
        let mut buf = [0u8; 1024];
        while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
    });
    expect_not_redis_or_connection(&greeter, "SSH server");

    let binary = fake_server(|mut s| {
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf);
        let _ = s.write_all(&[0xff, 0x00, 0x13, 0x37, 0x80, b'\r', b'\n', 0xfe]);
        thread::sleep(Duration::from_secs(2));
    });
    expect_not_redis_or_connection(&binary, "binary garbage");
}

/// A fake Redis 6.0.9: answers INFO with that version and everything else with +OK.
fn old_redis(stream: TcpStream) {
    let mut out = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let Some(n) = line
            .trim_end()
            .strip_prefix('*')
            .and_then(|n| n.parse::<usize>().ok())
        else {
            return;
        };
        let mut args = vec![];
        for _ in 0..n {
            line.clear();
            reader.read_line(&mut line).unwrap();
            let len: usize = line.trim_end()[1..].parse().unwrap();
            let mut arg = vec![0u8; len + 2];
            reader.read_exact(&mut arg).unwrap();
            args.push(String::from_utf8_lossy(&arg[..len]).to_uppercase());
        }
        let reply = if args.first().map(String::as_str) == Some("INFO") {
            let body = "# Server\r\nredis_version:6.0.9\r\nredis_mode:standalone\r\n";
            format!("${}\r\n{body}\r\n", body.len())
        } else {
            "+OK\r\n".to_string()
        };
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

#[test]
fn a_redis_older_than_6_2_is_refused_by_name() {
    let url = fake_server(old_redis);
    match builder(&url).build() {
        Err(e @ Error::UnsupportedServer { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("6.0.9") && msg.contains("6.2"), "{msg}");
        }
        Err(other) => panic!("expected UnsupportedServer, got {other:?}"),
        Ok(_) => panic!("a Redis 6.0.9 was accepted"),
    }
}

#[test]
fn foreign_data_at_a_locks_keys_is_reported_by_key_and_left_untouched() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let mut c = server.conn();
    // lock name, the key of that lock holding foreign data, the command that wrote it, and the
    // data (a string, or a list)
    let foreign: [(&str, &str, &str, &[&str]); 4] = [
        ("x", "fairlock:{x}", "SET", &["hello"]),
        ("q", "fairlock:{q}:queue", "SET", &["mine"]),
        ("f", "fairlock:{f}:fence", "SET", &["abc"]),
        ("h", "fairlock:{h}", "RPUSH", &["a", "b"]),
    ];
    for (_, key, write, data) in foreign {
        let _: () = redis::cmd(write).arg(key).arg(data).query(&mut c).unwrap();
    }

    for (name, key, _, _) in foreign {
        let lock = client.fair_lock(name).unwrap();
        let results: Vec<(&str, fairlock::Result<()>)> = vec![
            ("lock", lock.lock().map(|_| ())),
            ("try_lock", lock.try_lock().map(|_| ())),
            (
                "try_lock_for",
                lock.try_lock_for(Duration::from_millis(200)).map(|_| ()),
            ),
            ("force_unlock", lock.force_unlock().map(|_| ())),
        ];
        for (what, result) in results {
            match result {
                Err(e @ Error::ForeignData { .. }) => {
                    assert!(e.to_string().contains(key), "{name} {what}: {e}");
                }
                other => panic!("{name} {what}: expected ForeignData, got {other:?}"),
            }
        }
        // status reports it the same way
        match lock.status() {
            Err(e @ Error::ForeignData { .. }) => assert!(e.to_string().contains(key), "{e}"),
            other => panic!("{name} status: expected ForeignData, got {other:?}"),
        }
        // and nothing was written next to it
        let keys = server.lock_keys(name);
        assert_eq!(keys, [key], "{name}: fairlock wrote {keys:?}");
    }
    // the data is untouched
    for (_, key, write, data) in foreign {
        let now: Vec<String> = if write == "SET" {
            vec![redis::cmd("GET").arg(key).query(&mut c).unwrap()]
        } else {
            redis::cmd("LRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .query(&mut c)
                .unwrap()
        };
        assert_eq!(now, data, "{key}");
        assert_eq!(server.pttl(key), -1, "{key} got a TTL");
    }
}

/// The left marks' key (`<prefix>:{name}:left`, see `leave.lua`) with another program's data:
/// an acquire that reads it is refused, naming the key and the type fairlock expects there.
#[test]
fn foreign_data_at_the_left_marks_key_is_reported_with_the_type_expected() {
    let server = RedisServer::start();
    let client = support::client(&server);
    let mut c = server.conn();
    let key = "fairlock:{marks}:left";
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("mine")
        .query(&mut c)
        .unwrap();
    let lock = client.fair_lock("marks").unwrap();
    match lock.try_lock() {
        Err(e @ Error::ForeignData { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(key) && msg.contains("expects a hash"), "{msg}");
        }
        other => panic!("expected ForeignData, got {other:?}"),
    }
    let now: String = redis::cmd("GET").arg(key).query(&mut c).unwrap();
    assert_eq!(now, "mine");
}
