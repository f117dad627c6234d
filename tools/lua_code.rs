//! Prints the Lua that fairlock sends Redis, for tools that measure it (`scripts/lua-cost.sh`):
//!
//! ```text
//! cargo run --quiet --example lua_code -- library     # the function library (FUNCTION LOAD)
//! cargo run --quiet --example lua_code -- acquire     # one script as EVALSHA runs it
//! ```

use std::process::ExitCode;

fn main() -> ExitCode {
    let what = std::env::args().nth(1).unwrap_or_default();
    if what == "library" {
        print!("{}", fairlock::raw::library_code());
        return ExitCode::SUCCESS;
    }
    match fairlock::raw::scripts()
        .into_iter()
        .find(|s| s.name() == what)
    {
        Some(script) => {
            print!("{}", script.code());
            ExitCode::SUCCESS
        }
        None => {
            let names: Vec<&str> = fairlock::raw::scripts().iter().map(|s| s.name()).collect();
            eprintln!("usage: lua_code library|{}", names.join("|"));
            ExitCode::from(2)
        }
    }
}
