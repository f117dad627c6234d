//! No password reaches an error message, a `Debug`, or a log line: every error path that
//! carries a URL, a server that refuses the password, and a whole lock and unlock with a
//! password, with every log record of the library captured at trace level.

use crate::support;

use std::sync::{Mutex, Once};
use std::time::Duration;

use crate::support::{passwords, RedisServer};
use fairlock::{LockClient, LockClientBuilder};

const SECRET: &str = "supersecret-7f3a";

/// Every log record of the process, formatted.
static LOGGED: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        let line = format!("{} {}: {}", record.level(), record.target(), record.args());
        LOGGED.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }
    fn flush(&self) {}
}

fn capture_logs() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        static CAPTURE: Capture = Capture;
        log::set_logger(&CAPTURE).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Trace);
    });
}

/// `text` and every source below it, as printed.
fn printed(e: &fairlock::Error) -> String {
    let mut out = format!("{e}\n{e:?}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(&format!("\n{s}\n{s:?}"));
        source = s.source();
    }
    out
}

fn assert_secret_free(what: &str, text: &str) {
    assert!(!text.contains(SECRET), "{what} shows the password: {text}");
}

fn quick(url: &str) -> LockClientBuilder {
    LockClient::builder(url)
        .connect_timeout(Duration::from_millis(500))
        .failover_timeout(Duration::from_millis(500))
}

#[test]
fn no_error_debug_or_log_line_shows_the_password() {
    support::in_own_process!(
        Duration::from_secs(600),
        no_error_debug_or_log_line_shows_the_password_alone
    );
}

/// The body of [`no_error_debug_or_log_line_shows_the_password`], alone in a child process (see `support::in_own_process!`).
fn no_error_debug_or_log_line_shows_the_password_alone() {
    capture_logs();
    let dead = support::free_port();
    let urls = [
        // unparsable
        format!("redis://u:{SECRET}@127.0.0.1:notaport/"),
        format!("redis://:{SECRET}@127.0.0.1:{dead}/notadb"),
        format!("http://u:{SECRET}@127.0.0.1:{dead}/"),
        format!("redis+sentinel://u:{SECRET}@127.0.0.1:{dead}/"),
        format!("redis+sentinel://u:{SECRET}@/main"),
        format!("redis+cluster://u:{SECRET}@127.0.0.1:{dead}/db"),
        format!("redis+cluster://u:{SECRET}@/"),
        format!("unix:///nonexistent/redis.sock?pass={SECRET}"),
        // well formed, nobody listens
        format!("redis://u:{SECRET}@127.0.0.1:{dead}/"),
        format!("redis+sentinel://u:{SECRET}@127.0.0.1:{dead}/main"),
        format!("redis+cluster://u:{SECRET}@127.0.0.1:{dead}/"),
        // over TLS
        format!("rediss://u:{SECRET}@127.0.0.1:{dead}/"),
        format!("rediss+sentinel://u:{SECRET}@127.0.0.1:{dead}/main"),
        format!("rediss+cluster://u:{SECRET}@127.0.0.1:{dead}/"),
    ];
    for url in &urls {
        let builder = quick(url);
        assert_secret_free("the builder's Debug", &format!("{builder:?}"));
        let e = builder.build().expect_err(url);
        assert_secret_free(url, &printed(&e));
    }

    // a user whose password is the secret: refused with another one, then connected
    let server = RedisServer::start();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "app",
            "on",
            &format!(">{SECRET}"),
            "~*",
            "&*",
            "+@all",
        ])
        .query(&mut server.conn())
        .unwrap();
    let wrong = format!("redis://app:{SECRET}-not@127.0.0.1:{}/", server.port);
    let e = quick(&wrong).build().expect_err("the wrong password");
    assert_secret_free("a refused password", &printed(&e));
    let url = format!("redis://app:{SECRET}@127.0.0.1:{}/", server.port);
    let client = quick(&url).build().expect("the right password");
    assert_secret_free("the client's Debug", &format!("{client:?}"));
    let lock = client.fair_lock("secrets").unwrap();
    assert_secret_free("the lock's Debug", &format!("{lock:?}"));
    let guard = lock.lock().unwrap();
    assert_secret_free("the guard's Debug", &format!("{guard:?}"));
    // a second thread waits, so the wake-up path (and its connections) logs too
    std::thread::scope(|s| {
        let waiter = s.spawn(|| lock.lock().map(|g| g.fencing_token()));
        std::thread::sleep(Duration::from_millis(100));
        drop(guard);
        waiter.join().unwrap().unwrap();
    });
    drop(client);

    // the secret from a credentials provider, and a private key given as PEM: neither in the
    // builder's Debug, nor anywhere when the provider's password is refused or accepted
    let key = format!("-----BEGIN PRIVATE KEY-----\n{SECRET}\n-----END PRIVATE KEY-----\n");
    let with_key = quick(&format!("rediss://127.0.0.1:{dead}/"))
        .tls_client_cert_pem("-----BEGIN CERTIFICATE-----\n", key.clone());
    assert_secret_free("a builder with a client key", &format!("{with_key:?}"));
    let e = with_key.build().expect_err("an unusable key");
    assert_secret_free("an unusable key's error", &printed(&e));
    let plain = format!("redis://127.0.0.1:{}/", server.port);
    for password in [format!("{SECRET}-not"), SECRET.to_string()] {
        let builder = quick(&plain)
            .credentials_provider(move || Ok(fairlock::Credentials::new(Some("app"), &password)));
        assert_secret_free("a builder with a provider", &format!("{builder:?}"));
        match builder.build() {
            Err(e) => assert_secret_free("the provider's refused password", &printed(&e)),
            Ok(client) => {
                let lock = client.fair_lock("secrets-provider").unwrap();
                lock.lock().unwrap().unlock().unwrap();
                assert_secret_free("a provider's client", &format!("{client:?}"));
            }
        }
    }

    let logged = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
    for line in logged.iter() {
        assert_secret_free("a log line", line);
    }
}

/// Before, a password typed into the URL without percent-encoding its reserved characters made the
/// URL unparsable, and the error that said so (and the builder's `Debug`) printed it whole.
#[test]
fn a_password_with_reserved_characters_is_never_printed_by_the_library() {
    support::in_own_process!(
        Duration::from_secs(600),
        a_password_with_reserved_characters_is_never_printed_by_the_library_alone
    );
}

/// The body of [`a_password_with_reserved_characters_is_never_printed_by_the_library`], alone in a child process (see `support::in_own_process!`).
fn a_password_with_reserved_characters_is_never_printed_by_the_library_alone() {
    use proptest::test_runner::{Config, TestRunner};
    capture_logs();
    let dead = support::free_port();
    let try_one = |pw: String| -> Result<(), proptest::test_runner::TestCaseError> {
        for url in passwords::urls(&pw, dead) {
            let builder = quick(&url);
            passwords::check("the builder's Debug", &url, &format!("{builder:?}"))?;
            passwords::check("redact_url", &url, &fairlock::redact_url(&url))?;
            match builder.build() {
                Err(e) => passwords::check("the error", &url, &printed(&e))?,
                Ok(client) => panic!("{url} connected: {client:?}"),
            }
        }
        Ok(())
    };
    for pw in passwords::fixed() {
        try_one(pw).unwrap();
    }
    let mut runner = TestRunner::new(Config {
        cases: 128,
        failure_persistence: None,
        ..Config::default()
    });
    runner.run(&passwords::passwords(), try_one).unwrap();
    let logged = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
    for line in logged.iter() {
        assert!(
            !line.contains(passwords::MARK_A) && !line.contains(passwords::MARK_B),
            "a log line shows a password: {line}"
        );
    }
}
