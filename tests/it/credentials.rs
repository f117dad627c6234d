//! Credentials that rotate: the password is changed on the server while threads hold and wait, and
//! every connection is cut; a client whose credentials come from a provider goes on with the new
//! password (nothing lost, one holder at a time, tokens rising), while a client that has only its
//! URL's password cannot connect again.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::RedisServer;
use fairlock::{Credentials, ErrorKind, LockClient};

const THREADS: usize = 4;
const ROUNDS: u32 = 60;

fn acl(server: &RedisServer, args: &[&str]) {
    let mut cmd = redis::cmd("ACL");
    for a in args {
        cmd.arg(*a);
    }
    let _: () = cmd.query(&mut server.conn()).unwrap();
}

fn cut_the_users_connections(server: &RedisServer) -> i64 {
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("USER")
        .arg("app")
        .query(&mut server.conn())
        .unwrap()
}

#[test]
fn a_password_rotated_while_threads_hold_and_wait_is_taken_up_by_new_connections() {
    let server = RedisServer::start();
    acl(
        &server,
        &["SETUSER", "app", "on", ">first", "~*", "&*", "+@all"],
    );
    let password = Arc::new(Mutex::new("first".to_string()));
    let provided = Arc::clone(&password);
    let url = format!("redis://127.0.0.1:{}/", server.port);
    let client = LockClient::builder(&url)
        .pool_size(2)
        .credentials_provider(move || Ok(Credentials::new(Some("app"), &provided.lock().unwrap())))
        .build()
        .expect("the provider's first password");
    // a client with the first password in its URL, for contrast
    let fixed = LockClient::connect(&format!("redis://app:first@127.0.0.1:{}/", server.port))
        .expect("the URL's password");

    let inside = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU32::new(0));
    let last_token = Arc::new(Mutex::new(0u64));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let lock = client.fair_lock("rotating").unwrap();
            let (inside, done, last_token) = (
                Arc::clone(&inside),
                Arc::clone(&done),
                Arc::clone(&last_token),
            );
            thread::spawn(move || -> Result<(), String> {
                for _ in 0..ROUNDS {
                    let g = lock.lock().map_err(|e| e.to_string())?;
                    if inside.swap(true, Ordering::SeqCst) {
                        return Err("two holders".into());
                    }
                    {
                        let mut last = last_token.lock().unwrap();
                        if g.fencing_token() <= *last {
                            return Err(format!("token {} after {}", g.fencing_token(), *last));
                        }
                        *last = g.fencing_token();
                    }
                    thread::sleep(Duration::from_millis(2));
                    inside.store(false, Ordering::SeqCst);
                    g.unlock().map_err(|e| e.to_string())?;
                    done.fetch_add(1, Ordering::SeqCst);
                }
                Ok(())
            })
        })
        .collect();

    // midway: a second password, the provider switches, the first is removed, and every
    // connection of the user is cut (as a managed service does when a token expires)
    let deadline = Instant::now() + Duration::from_secs(30);
    while done.load(Ordering::SeqCst) < ROUNDS && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    acl(&server, &["SETUSER", "app", ">second"]);
    *password.lock().unwrap() = "second".to_string();
    acl(&server, &["SETUSER", "app", "<first"]);
    let cut = cut_the_users_connections(&server);
    assert!(cut > 0, "the user's connections were cut");

    for w in workers {
        w.join().unwrap().expect("every round of every thread");
    }
    assert_eq!(done.load(Ordering::SeqCst), ROUNDS * THREADS as u32);
    // new connections of the provider's client logged in with the new password
    let lock = client.fair_lock("rotating").unwrap();
    let g = lock.lock().unwrap();
    assert!(g.is_held_in_redis().unwrap());
    g.unlock().unwrap();
    // the URL's client has no way to: its next new connection is refused
    cut_the_users_connections(&server);
    let e = fixed
        .fair_lock("rotating")
        .unwrap()
        .lock()
        .map(drop)
        .expect_err("the first password is gone");
    assert_eq!(e.kind(), ErrorKind::Permission, "{e:?}");
}

#[test]
fn a_failing_provider_is_a_permission_error_with_its_message() {
    let server = RedisServer::start();
    let e = LockClient::builder(&server.url())
        .credentials_provider(|| Err("the token service is down".into()))
        .build()
        .expect_err("no credentials");
    assert_eq!(e.kind(), ErrorKind::Permission, "{e:?}");
    assert!(e.to_string().contains("the token service is down"), "{e}");
}
