//! Passwords that need percent-encoding in a URL, typed without it: base64 passwords have `/`,
//! generated ones `?`, `#`, `@`, `%`... Each holds two markers, at both ends of its middle, so that
//! a test can tell that neither a prefix nor a suffix of it was printed.
use proptest::prelude::*;

pub const MARK_A: &str = "Xq7SECRET";
pub const MARK_B: &str = "Zk4TOKEN";

/// Every printable ASCII character that is not a letter or a digit, some runs of them that
/// mean something in a URL, letters and digits.
pub fn pieces() -> impl Strategy<Value = String> {
    let punct: Vec<String> = (0x20u8..0x7f)
        .filter(|b| !b.is_ascii_alphanumeric())
        .map(|b| (b as char).to_string())
        .collect();
    let runs: Vec<String> = [
        "@@",
        "://",
        "%2F",
        "%zz",
        "%",
        "pass=",
        "?pass=",
        "&password=",
        "#insecure",
        "a",
        "Z",
        "0",
        "9",
        "10",
        ":6379",
        "127.0.0.1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    prop_oneof![
        proptest::sample::select(punct),
        proptest::sample::select(runs)
    ]
}

/// A password: pieces around the two markers.
pub fn passwords() -> impl Strategy<Value = String> {
    let part = || proptest::collection::vec(pieces(), 0..5).prop_map(|v| v.concat());
    (part(), part(), part()).prop_map(|(a, b, c)| format!("{a}{MARK_A}{b}{MARK_B}{c}"))
}

/// Passwords every run tries: short ones with each reserved character, and one with every printable
/// ASCII character.
pub fn fixed() -> Vec<String> {
    let every: String = (0x20u8..0x7f).map(char::from).collect();
    ["pa/ss", "pa?ss", "pa#ss", "p@ss", "a/b?c#d@e", "/", "@", ""]
        .iter()
        .map(|p| format!("{p}{MARK_A}{p}{MARK_B}{p}"))
        .chain([format!("{every}{MARK_A}{every}{MARK_B}{every}")])
        .collect()
}

/// The URL forms a user can type, with `pw` as it is (not percent-encoded); nothing listens
/// on `port`.
pub fn urls(pw: &str, port: u16) -> Vec<String> {
    let h = format!("127.0.0.1:{port}");
    vec![
        format!("redis://app:{pw}@{h}/"),
        format!("redis://:{pw}@{h}/0"),
        // a lone secret: with a ':' it reads as user:password to every parser, and the part
        // before the ':' is shown as the user name
        format!("redis://{}@{h}/", pw.replace(':', "")),
        format!("redis://app:{pw}@{h}/0?protocol=resp3"),
        format!("rediss://app:{pw}@{h}/"),
        format!("redis+sentinel://app:{pw}@{h}/main"),
        format!("rediss+sentinel://:{pw}@{h},{h}/main"),
        format!("redis+sentinel://:{pw}@{h}"),
        format!("redis+cluster://app:{pw}@{h}/"),
        format!("rediss+cluster://:{pw}@{h},{h}/"),
        format!("unix:///nonexistent/redis.sock?db=0&pass={pw}"),
        format!("redis://{h}/?password={pw}"),
    ]
}

/// Neither marker in `text`.
pub fn check(what: &str, url: &str, text: &str) -> Result<(), TestCaseError> {
    prop_assert!(
        !text.contains(MARK_A) && !text.contains(MARK_B),
        "{} shows (part of) the password of {:?}: {}",
        what,
        url,
        text
    );
    Ok(())
}
