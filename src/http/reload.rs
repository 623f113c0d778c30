//! The API's credentials read again without a restart: the clients (the
//! inline ones and the clients file) and the certificate with its key, on
//! SIGHUP and whenever their files' contents change.
//!
//! Watching the files is what reaches every replica: a Kubernetes Secret
//! or a config management run replaces the files on every host or pod, but
//! a signal reaches only the process it is sent to. The contents are
//! compared (a SHA-256 a file), not the modification times: a Secret is
//! swapped in by renaming a symbolic link, which keeps the old times.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum_server::tls_rustls::RustlsConfig;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::HttpTlsSettings;
use super::serve::https_config;
use crate::auth::Authenticator;

/// What a reload reads, and how often its files are compared.
pub struct Reloader {
    pub auth: Arc<Authenticator>,
    pub tls: Option<(RustlsConfig, HttpTlsSettings)>,
    /// `http.reload_check_ms`; `None`: only on SIGHUP.
    pub check_every: Option<Duration>,
}

impl Reloader {
    /// Reads the credentials again on SIGHUP and when a file changes, until
    /// `shutdown`. What fails to read is logged and the old one kept: a
    /// reload never stops the service.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut hangups = hangups();
        let mut seen = self.fingerprints();
        let mut checks = self.check_every.map(tokio::time::interval);
        loop {
            let why = tokio::select! {
                () = shutdown.cancelled() => return,
                Some(()) = next_hangup(&mut hangups) => {
                    // What is read now is what the next check compares with.
                    seen = self.fingerprints();
                    "SIGHUP"
                }
                Some(()) = next_tick(&mut checks) => {
                    let now = self.fingerprints();
                    if now == seen {
                        continue;
                    }
                    seen = now;
                    "a file changed"
                }
            };
            self.reload(why);
        }
    }

    /// The files a reload reads.
    fn files(&self) -> Vec<PathBuf> {
        let clients = self.auth.clients_file().map(Path::to_path_buf);
        let tls = self
            .tls
            .iter()
            .flat_map(|(_, files)| [&files.cert_file, &files.key_file].map(PathBuf::from));
        clients.into_iter().chain(tls).collect()
    }

    /// Each file's contents, hashed; `None` for one that cannot be read now
    /// (a reload then says why).
    fn fingerprints(&self) -> Vec<Option<[u8; 32]>> {
        let hash = |path: &PathBuf| std::fs::read(path).ok().map(|b| Sha256::digest(b).into());
        self.files().iter().map(hash).collect()
    }

    fn reload(&self, why: &str) {
        match self.auth.reload() {
            Ok(clients) => info!(clients, "{why}: clients reloaded"),
            Err(error) => error!(%error, "{why}: clients NOT reloaded; the previous ones stay"),
        }
        if let Some((config, files)) = &self.tls {
            match https_config(&files.cert_file, &files.key_file) {
                Ok(reloaded) => {
                    config.reload_from_config(reloaded);
                    info!(cert_file = %files.cert_file, "{why}: certificate reloaded")
                }
                Err(error) => error!(
                    %error,
                    "{why}: certificate NOT reloaded; the previous one stays"
                ),
            }
        }
    }
}

#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = Option<()>;

fn hangups() -> Hangups {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let listening = signal(SignalKind::hangup());
        if listening.is_err() {
            warn!(
                "cannot listen for SIGHUP: clients and certificates reload when their files change"
            );
        }
        listening.ok()
    }
    #[cfg(not(unix))]
    None
}

/// The next SIGHUP; never, without a listener.
async fn next_hangup(hangups: &mut Hangups) -> Option<()> {
    #[cfg(unix)]
    if let Some(hangups) = hangups {
        return hangups.recv().await;
    }
    let _ = hangups;
    std::future::pending().await
}

/// The next check of the files; never, when they are not watched.
async fn next_tick(checks: &mut Option<tokio::time::Interval>) -> Option<()> {
    match checks {
        Some(checks) => {
            checks.tick().await;
            Some(())
        }
        None => std::future::pending().await,
    }
}
