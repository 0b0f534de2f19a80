//! The serving certificate of `inject serve`: read from PEM files, and read
//! again whenever they change (cert-manager rotates the Secret behind
//! them), each new handshake getting the current pair. A pair that does not
//! load (files replaced one after the other) is not taken: the loaded one
//! stays until the files agree.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

/// The certificate now served, replaced when its files change.
#[derive(Debug)]
pub struct Reloading {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// Certificate chain and key from PEM bytes.
fn load(cert: &[u8], key: &[u8]) -> Result<Arc<CertifiedKey>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("certificate: {e}"))?;
    if chain.is_empty() {
        return Err("certificate: no PEM certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("key: {e}"))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| format!("key: {e}"))?;
    let pair = CertifiedKey::new(chain, signer);
    // Files replaced one after the other can hold a new key and the old
    // certificate for a moment: such a pair is not served.
    match pair.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(Arc::new(pair))
        }
        Err(e) => Err(format!("certificate and key do not match: {e}")),
    }
}

fn read_pair(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), String> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    Ok((read(cert)?, read(key)?))
}

/// The pair from `cert` and `key`, and the task that reads them again
/// every `every` (to be spawned).
pub fn watched(
    cert: PathBuf,
    key: PathBuf,
    every: Duration,
) -> Result<(Arc<Reloading>, impl std::future::Future<Output = ()>), String> {
    let (c, k) = read_pair(&cert, &key)?;
    let resolver = Arc::new(Reloading { current: RwLock::new(load(&c, &k)?) });
    let served = resolver.clone();
    let reload = async move {
        let mut loaded = (c, k);
        loop {
            tokio::time::sleep(every).await;
            match read_pair(&cert, &key) {
                Ok(now) if now != loaded => match load(&now.0, &now.1) {
                    Ok(ck) => {
                        *served.current.write().unwrap_or_else(|e| e.into_inner()) = ck;
                        tracing::info!(cert = %cert.display(), "certificate reloaded");
                        loaded = now;
                    }
                    // Half-written files (cert and key updated one after the
                    // other): keep serving the old pair, try again next tick.
                    Err(e) => tracing::warn!(error = %e, "certificate files changed but do not load yet"),
                },
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "certificate files unreadable; serving the loaded one"),
            }
        }
    };
    Ok((resolver, reload))
}
