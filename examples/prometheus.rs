//! fairlock's metrics exported for Prometheus (feature `metrics`): a small workload of a few
//! threads taking one lock in turn, then the scrape a Prometheus server would get, printed; with
//! `--serve ADDR` the scrape is also served over HTTP at `ADDR/metrics` until interrupted.
//!
//! ```sh
//! cargo run --example prometheus --features metrics -- redis://127.0.0.1:6379/
//! cargo run --example prometheus --features metrics -- redis://127.0.0.1:6379/ --serve 127.0.0.1:9186
//! ```
//!
//! The exporter (`metrics-exporter-prometheus`) is the application's choice: fairlock records
//! through the `metrics` facade and depends on no exporter.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::thread;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".into());
    let serve = match (args.next().as_deref(), args.next()) {
        (Some("--serve"), Some(addr)) => Some(addr),
        _ => None,
    };
    // the recorder, installed before the client records anything
    let handle = PrometheusBuilder::new().install_recorder()?;

    let client = fairlock::LockClient::builder(&url)
        .metrics_lock_label(true) // one lock name here: a bounded set
        .build()?;
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let lock = client.fair_lock("metrics-example")?;
            Ok(thread::spawn(move || -> fairlock::Result<()> {
                for _ in 0..25 {
                    let guard = lock.lock()?;
                    let again = lock.lock()?; // a re-entry
                    thread::sleep(Duration::from_millis(2));
                    drop(again);
                    guard.unlock()?;
                }
                Ok(())
            }))
        })
        .collect::<fairlock::Result<_>>()?;
    for w in workers {
        w.join().expect("a worker panicked")?;
    }
    let busy = client.fair_lock("metrics-example")?;
    let held = busy.lock()?;
    let other = client.fair_lock("metrics-example")?;
    thread::spawn(move || other.try_lock().map(|g| g.is_none()))
        .join()
        .expect("the try panicked")?;
    drop(held);

    print!("{}", handle.render());
    if let Some(addr) = serve {
        let listener = TcpListener::bind(&addr)?;
        eprintln!("serving http://{addr}/metrics (Ctrl-C to stop)");
        for stream in listener.incoming() {
            let mut stream = stream?;
            // the request line and headers, up to the blank line
            let mut reader = BufReader::new(stream.try_clone()?);
            let mut line = String::new();
            while reader.read_line(&mut line)? > 2 {
                line.clear();
            }
            let body = handle.render();
            write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )?;
        }
    }
    Ok(())
}
