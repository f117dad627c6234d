//! Redis URLs without their secrets, for every message, `Debug` and log line that names one.

/// `url` with its password replaced by `***`: the password of the user info
/// (`scheme://user:password@host...`; a lone `scheme://secret@host` counts as a password too,
/// since some clients read it so) and the `pass` or `password` parameter of the query
/// (`unix:///run/redis.sock?pass=...`). Everything else stays when the URL is well formed, so a
/// message still says which server and which user were meant. Works on any text, URL or not,
/// and never fails.
///
/// A password typed with characters a URL reserves (`/`, `?`, `#`, `@`: base64 and generated
/// passwords have them) makes the end of the user info ambiguous; then everything from `://`
/// up to the last `@` is hidden, the user name with it. The value of a `pass` or `password`
/// parameter is hidden up to the end of the text, as it may hold a `&` or a `#`.
///
/// ```
/// assert_eq!(
///     fairlock::redact_url("redis://app:s3cret@cache.internal:6379/0"),
///     "redis://app:***@cache.internal:6379/0"
/// );
/// assert_eq!(
///     fairlock::redact_url("redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2:26379/main"),
///     "redis+sentinel://:***@10.0.0.1:26379,10.0.0.2:26379/main"
/// );
/// // a base64 password, not percent-encoded
/// assert_eq!(
///     fairlock::redact_url("redis://app:q/8t+Zw==@cache.internal:6379/0"),
///     "redis://***@cache.internal:6379/0"
/// );
/// assert_eq!(
///     fairlock::redact_url("unix:///run/redis.sock?db=1&pass=a&b#c"),
///     "unix:///run/redis.sock?db=1&pass=***"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    // the parts of `url` to hide, as byte ranges
    let mut hidden: Vec<(usize, usize)> = Vec::new();
    let start = scheme_end(url);
    let rest = &url[start..];
    if let Some(at) = rest.rfind('@') {
        let user_info = &rest[..at];
        if user_info.contains(['/', '?', '#']) {
            // the password holds a reserved character, or the '@' is the path's or the
            // query's: which one cannot be told, so hide it all
            hidden.push((start, start + at));
        } else if let Some(colon) = user_info.find(':') {
            hidden.push((start + colon + 1, start + at));
        } else if !user_info.is_empty() {
            hidden.push((start, start + at));
        }
    }
    if let Some(q) = rest.find('?') {
        let mut offset = start + q + 1;
        for param in rest[q + 1..].split('&') {
            if let Some((name, _)) = param.split_once('=') {
                if is_secret_param(name) {
                    hidden.push((offset + name.len() + 1, url.len()));
                    break;
                }
            }
            offset += param.len() + 1;
        }
    }
    hidden.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (from, to) in hidden {
        match merged.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => merged.push((from, to)),
        }
    }
    let mut out = String::with_capacity(url.len());
    let mut shown_to = 0;
    for (from, to) in merged {
        out.push_str(&url[shown_to..from]);
        out.push_str("***");
        shown_to = to;
    }
    out.push_str(&url[shown_to..]);
    out
}

/// Where the text after `scheme://` starts: 0 when `url` does not start with a scheme name
/// (a letter, then letters, digits, `+`, `-` or `.`) and `://`.
fn scheme_end(url: &str) -> usize {
    match url.find("://") {
        Some(i)
            if url[..i].starts_with(|c: char| c.is_ascii_alphabetic())
                && url[..i]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')) =>
        {
            i + 3
        }
        _ => 0,
    }
}

/// Whether a query parameter named `name` (percent-encoded or not, any case) holds a password.
fn is_secret_param(name: &str) -> bool {
    let name = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
    ["pass", "password"]
        .iter()
        .any(|secret| name.eq_ignore_ascii_case(secret))
}

/// Whether the user info of `url` (from `scheme://` to the last `@`) holds a character a URL
/// reserves (`/`, `?`, `#`), which a user name or password must have percent-encoded.
pub(crate) fn has_unencoded_user_info(url: &str) -> bool {
    let rest = &url[scheme_end(url)..];
    rest.rfind('@')
        .is_some_and(|at| rest[..at].contains(['/', '?', '#']))
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn the_password_of_every_url_form_is_replaced() {
        for (url, redacted) in [
            ("redis://u:pw@h:1/", "redis://u:***@h:1/"),
            ("redis://:pw@h:1/2", "redis://:***@h:1/2"),
            ("rediss://u:pw@h:1", "rediss://u:***@h:1"),
            ("redis://pw@h:1/", "redis://***@h:1/"),
            ("redis://u:p@w:d@h:1/", "redis://u:***@h:1/"),
            (
                "redis+sentinel://u:pw@a:1,b:2/m",
                "redis+sentinel://u:***@a:1,b:2/m",
            ),
            (
                "redis+cluster://:pw@a:1,b:2/",
                "redis+cluster://:***@a:1,b:2/",
            ),
            (
                "unix:///s.sock?db=1&pass=pw",
                "unix:///s.sock?db=1&pass=***",
            ),
            ("redis://h/?password=pw#x", "redis://h/?password=***"),
            ("redis://u:pw@h:notaport/", "redis://u:***@h:notaport/"),
            ("u:pw@h:1", "u:***@h:1"),
            ("redis://u:@h:1/", "redis://u:***@h:1/"),
            // percent-encoded, as it should be
            ("redis://u:a%2Fb%40c@h:1/", "redis://u:***@h:1/"),
            ("redis://ops%40team:pw@h:1/", "redis://ops%40team:***@h:1/"),
            ("unix:///s.sock?P%61SS=pw&db=1", "unix:///s.sock?P%61SS=***"),
        ] {
            assert_eq!(redact_url(url), redacted, "{url}");
        }
    }

    #[test]
    fn urls_without_a_secret_are_left_as_they_are() {
        for url in [
            "redis://127.0.0.1:6379/",
            "redis://@h:1/",
            "redis+cluster://a:1,b:2/",
            "not a url at all",
            "",
            "redis://h:1/0?protocol=resp3",
            "127.0.0.1:6379",
        ] {
            assert_eq!(redact_url(url), url);
        }
    }

    /// The user info ends at the last `@` before the host. Before, it was taken to end at the first
    /// `/`, `?` or `#`, so a password with one of them had no `@` before it and was shown whole.
    #[test]
    fn a_password_with_reserved_characters_is_hidden_to_the_last_at() {
        for (url, redacted) in [
            ("redis://app:pa/ss@h:1/", "redis://***@h:1/"),
            ("redis://app:pa?ss@h:1/", "redis://***@h:1/"),
            ("redis://app:pa#ss@h:1/", "redis://***@h:1/"),
            ("rediss://app:p@s/s@h:1/0", "rediss://***@h:1/0"),
            ("redis://app:p@ss@h:1/", "redis://app:***@h:1/"),
            (
                "redis+sentinel://:pa/ss@a:1,b:2/m",
                "redis+sentinel://***@a:1,b:2/m",
            ),
            ("redis+cluster://:pa/ss@a:1/", "redis+cluster://***@a:1/"),
            ("redis://app:a://b@h:1/", "redis://***@h:1/"),
            ("redis:/app:pa/ss@h:1/", "***@h:1/"),
            ("redis://pa/ss@h:1/", "redis://***@h:1/"),
            // an '@' of the path or the query cannot be told from one of the password
            ("redis://h/path@with-at", "redis://***@with-at"),
            // the value of `pass` runs to the end, '@', '&' and '#' included
            ("unix:///s.sock?pass=a@b", "unix://***"),
            (
                "unix:///s.sock?db=1&pass=a&db=2#x",
                "unix:///s.sock?db=1&pass=***",
            ),
            ("redis://u:p?pass=x@h/", "redis://***"),
        ] {
            assert_eq!(redact_url(url), redacted, "{url}");
        }
    }
}
