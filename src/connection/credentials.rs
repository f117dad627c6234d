//! Credentials that change while a client runs (ElastiCache IAM tokens live 15 minutes, Azure
//! Entra ID tokens about an hour): a provider asked for every new connection, so the pool, the
//! waiting threads' connections and the Sentinel and Cluster connections all log in with what
//! is valid now. Connections already open stay logged in (Redis checks credentials at `AUTH`
//! only; a provider whose service drops connections at expiry is followed by the pool, which
//! reconnects).

use std::fmt;
use std::sync::Arc;

/// A user name and a password (or token) for one new connection. `Debug` never shows the
/// password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The ACL user; `None` for the `default` user (a `requirepass` password).
    pub username: Option<String>,
    /// The password or token.
    pub password: String,
}

impl Credentials {
    /// Credentials for `username` (or the default user with `None`) and `password`.
    pub fn new(username: Option<&str>, password: &str) -> Credentials {
        Credentials {
            username: username.map(str::to_string),
            password: password.to_string(),
        }
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"***")
            .finish()
    }
}

/// What a provider returns when it cannot give credentials: its message is shown (it must not
/// hold a secret).
pub type CredentialsError = Box<dyn std::error::Error + Send + Sync>;

/// A shared provider (see [`LockClientBuilder::credentials_provider`]).
///
/// [`LockClientBuilder::credentials_provider`]: crate::LockClientBuilder::credentials_provider
#[derive(Clone)]
pub(crate) struct Provider(
    pub Arc<dyn Fn() -> Result<Credentials, CredentialsError> + Send + Sync>,
);

impl fmt::Debug for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<credentials provider>")
    }
}

impl Provider {
    /// `info` with the provider's credentials now, or the redis crate's authentication error
    /// saying the provider failed.
    pub fn apply(&self, info: redis::ConnectionInfo) -> redis::RedisResult<redis::ConnectionInfo> {
        let credentials = (self.0)().map_err(|e| {
            redis::RedisError::from((
                redis::ErrorKind::AuthenticationFailed,
                "the credentials provider failed",
                e.to_string(),
            ))
        })?;
        let mut settings = info.redis_settings().clone();
        settings = settings.set_password(&credentials.password);
        if let Some(user) = &credentials.username {
            settings = settings.set_username(user);
        }
        Ok(info.set_redis_settings(settings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::IntoConnectionInfo;

    #[test]
    fn debug_hides_the_password() {
        let c = Credentials::new(Some("app"), "t0ken-s3cret");
        let shown = format!("{c:?}");
        assert!(
            shown.contains("app") && !shown.contains("s3cret"),
            "{shown}"
        );
    }

    #[test]
    fn the_provider_replaces_what_the_url_said() {
        let provider = Provider(Arc::new(|| Ok(Credentials::new(Some("new"), "fresh"))));
        let info = "redis://old:stale@127.0.0.1:6379/"
            .into_connection_info()
            .unwrap();
        let info = provider.apply(info).unwrap();
        assert_eq!(info.redis_settings().username(), Some("new"));
        assert_eq!(info.redis_settings().password(), Some("fresh"));
        let failing = Provider(Arc::new(|| Err("token service down".into())));
        let e = failing
            .apply("redis://127.0.0.1/".into_connection_info().unwrap())
            .unwrap_err();
        assert_eq!(e.kind(), redis::ErrorKind::AuthenticationFailed);
        assert!(e.to_string().contains("token service down"), "{e}");
    }
}
