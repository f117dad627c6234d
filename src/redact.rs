//! Redis URLs without their secrets, for every message, `Debug` and log line that names one.

/// `url` with its password replaced by `***`: the password of the user info
/// (`scheme://user:password@host...`; a lone `scheme://secret@host` counts as a password too,
/// since some clients read it so) and the `pass` or `password` parameter of the query
/// (`unix:///run/redis.sock?pass=...`). Everything else stays, so a message still says which
/// server and which user were meant. Works on any text, URL or not, and never fails.
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
/// ```
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    // the user info ends at the last '@' before the path, the query or the fragment
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rfind('@') {
        Some(at) => {
            let (user_info, hosts) = authority.split_at(at);
            match user_info.split_once(':') {
                Some((user, _password)) => format!("{user}:***{hosts}"),
                None if user_info.is_empty() => authority.to_string(),
                None => format!("***{hosts}"),
            }
        }
        None => authority.to_string(),
    };
    format!("{scheme}{authority}{}", redact_query(tail))
}

/// The path, query and fragment `tail` with the value of every `pass` or `password` query
/// parameter replaced by `***`.
fn redact_query(tail: &str) -> String {
    let Some(q) = tail.find('?') else {
        return tail.to_string();
    };
    let (path, query) = tail.split_at(q + 1);
    let (query, fragment) = match query.find('#') {
        Some(f) => query.split_at(f),
        None => (query, ""),
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((name, _)) if is_secret_param(name) => format!("{name}=***"),
            _ => param.to_string(),
        })
        .collect();
    format!("{path}{}{fragment}", params.join("&"))
}

fn is_secret_param(name: &str) -> bool {
    ["pass", "password"]
        .iter()
        .any(|secret| name.eq_ignore_ascii_case(secret))
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
            ("redis://h/?password=pw#x", "redis://h/?password=***#x"),
            ("redis://u:pw@h:notaport/", "redis://u:***@h:notaport/"),
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
            "redis://h/path@with-at",
        ] {
            assert_eq!(redact_url(url), url);
        }
    }
}
