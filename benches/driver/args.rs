//! The command line. `scripts/bench.sh` passes `[--quick] --out PATH --criterion DIR`; `--only`,
//! `--libs`, `--layouts`, `--holds` and `--secs` narrow a run down while investigating.
//! Multi-process scenarios start this binary again as `--child key=value ...` (see
//! `workers::Spec`). Given twice, an option keeps its last value.

use std::path::PathBuf;

use clap::{ArgAction, Parser};

use crate::locks::Lib;
use crate::sizes::Sizes;

/// The benchmark driver; scripts/bench.sh runs it against a throwaway redis-server whose URL it
/// passes in FAIRLOCK_BENCH_REDIS.
#[derive(Parser, Debug)]
#[command(name = "driver", args_override_self = true)]
pub struct Args {
    /// Tiny samples: checks that everything still works, the figures mean nothing.
    #[arg(long)]
    pub quick: bool,

    /// Where to write the JSON results.
    #[arg(long, value_name = "PATH", default_value = "target/bench/results.json")]
    pub out: PathBuf,

    /// Criterion's output directory, for the medians of the micro benchmarks.
    #[arg(long, value_name = "DIR")]
    pub criterion: Option<PathBuf>,

    /// The scenarios to run, comma-separated: micro, handoff, throughput, fifo, scaling, scripts,
    /// waiting, cluster, tls, semaphore, peer (default: all).
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set)]
    pub only: Option<Vec<String>>,

    /// The locks of the hand-off and throughput runs, comma-separated: fairlock, redlock, naive.
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          value_parser = lib)]
    pub libs: Option<Vec<Lib>>,

    /// The layouts of the throughput runs, comma-separated PxT: P processes of T threads, P = 0
    /// for T threads of this process (e.g. 8x4,0x32).
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          value_parser = layout)]
    pub layouts: Option<Vec<(u32, u32)>>,

    /// The holds of the throughput runs in µs, comma-separated (e.g. 0,1000).
    #[arg(long, value_name = "LIST", value_delimiter = ',', action = ArgAction::Set,
          value_parser = hold_us)]
    pub holds: Option<Vec<u64>>,

    /// The length of each throughput run, seconds.
    #[arg(long, value_name = "SECONDS")]
    pub secs: Option<f64>,

    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    pub bench: bool,

    /// Run workers as a child process of a multi-process scenario and print their records.
    #[arg(long, value_name = "KEY=VALUE", num_args = 1.., exclusive = true, hide = true)]
    pub child: Option<Vec<String>>,
}

impl Args {
    /// Whether scenario `name` is to run.
    pub fn wants(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|x| x == name))
    }

    /// The sizes of `--quick` or of the full run, narrowed by the options that do.
    pub fn sizes(&self) -> Sizes {
        let mut sizes = Sizes::new(self.quick);
        if let Some(libs) = &self.libs {
            sizes.libs = libs.clone();
        }
        if let Some(layouts) = &self.layouts {
            sizes.layouts = layouts.clone();
        }
        if let Some(holds) = &self.holds {
            sizes.holds_us = holds.clone();
        }
        if let Some(secs) = self.secs {
            sizes.throughput_secs = secs;
        }
        sizes
    }
}

fn lib(s: &str) -> Result<Lib, String> {
    Lib::parse(s.trim()).ok_or_else(|| {
        format!("unknown lock {s:?} (fairlock, fairlock-sem, fairlock-rw, redlock, naive)")
    })
}

/// `PxT`: processes x threads per process.
fn layout(s: &str) -> Result<(u32, u32), String> {
    let (p, t) = s
        .trim()
        .split_once('x')
        .ok_or("a layout is PxT, e.g. 8x4")?;
    let num = |v: &str, what: &str| v.parse().map_err(|e| format!("{what} {v:?}: {e}"));
    Ok((num(p, "processes")?, num(t, "threads")?))
}

fn hold_us(s: &str) -> Result<u64, String> {
    s.trim().parse().map_err(|e| format!("µs {s:?}: {e}"))
}
