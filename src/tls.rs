//! TLS material named in the configuration: a private CA to trust and a
//! client certificate to present, read from PEM files and checked when the
//! file is loaded, so a wrong path or a key that does not belong to its
//! certificate is a configuration error rather than a failed handshake later.

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The `tls_ca_file`, `tls_cert_file` and `tls_key_file` settings of a section.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// PEM certificates of the CA(s) that sign the server's certificate;
    /// when set, only these are trusted.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain), presented to servers that ask for one.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file` (PKCS#8, PKCS#1 or SEC1), unencrypted.
    pub key_file: Option<PathBuf>,
}

/// What [`TlsFiles`] hold, parsed.
pub struct TlsMaterial {
    /// The CA certificates to trust instead of the public roots, if any.
    pub roots: Option<Vec<CertificateDer<'static>>>,
    /// The client certificate chain and its key, if any.
    pub identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
}

impl TlsFiles {
    /// True when none of the three is set.
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.cert_file.is_none() && self.key_file.is_none()
    }

    /// The name of the first field that is set, for messages.
    pub fn first_field(&self) -> &'static str {
        if self.ca_file.is_some() {
            "tls_ca_file"
        } else if self.cert_file.is_some() {
            "tls_cert_file"
        } else {
            "tls_key_file"
        }
    }

    /// Reads and parses the files; each problem names `[section]` and the field.
    pub fn load(&self, section: &str) -> Result<TlsMaterial, Vec<String>> {
        let mut problems = Vec::new();
        let roots = self
            .ca_file
            .as_deref()
            .and_then(|p| certificates(section, "tls_ca_file", p, &mut problems));
        let identity = match (&self.cert_file, &self.key_file) {
            (None, None) => None,
            (Some(_), None) => {
                problems.push(format!("[{section}] field \"tls_cert_file\" is set without \"tls_key_file\": a client certificate needs its private key"));
                None
            }
            (None, Some(_)) => {
                problems.push(format!("[{section}] field \"tls_key_file\" is set without \"tls_cert_file\": a private key needs its client certificate"));
                None
            }
            (Some(c), Some(k)) => {
                let certs = certificates(section, "tls_cert_file", c, &mut problems);
                let key = private_key(section, k, &mut problems);
                certs.zip(key)
            }
        };
        if let (Some((certs, key)), None) = (&identity, problems.first()) {
            if let Err(e) = lapin::tcp::RustlsConnectorConfig::new_with_webpki_root_certs()
                .connector_with_single_cert(certs.clone(), key.clone_key())
            {
                problems.push(format!(
                    "[{section}] fields \"tls_cert_file\" and \"tls_key_file\" do not make a usable client certificate ({e}): is the key the one the certificate was issued for?"
                ));
            }
        }
        if problems.is_empty() {
            Ok(TlsMaterial { roots, identity })
        } else {
            Err(problems)
        }
    }

    /// Like [`TlsFiles::load`], for validation: adds its problems to `problems`.
    pub fn check(&self, section: &str, problems: &mut Vec<String>) {
        if let Err(mut p) = self.load(section) {
            problems.append(&mut p);
        }
    }
}

fn read(section: &str, field: &str, path: &Path, problems: &mut Vec<String>) -> Option<Vec<u8>> {
    match std::fs::read(path) {
        Ok(b) => Some(b),
        Err(e) => {
            problems.push(format!(
                "[{section}] field \"{field}\": cannot read {} ({e})",
                path.display()
            ));
            None
        }
    }
}

fn certificates(
    section: &str,
    field: &str,
    path: &Path,
    problems: &mut Vec<String>,
) -> Option<Vec<CertificateDer<'static>>> {
    let bytes = read(section, field, path, problems)?;
    match CertificateDer::pem_slice_iter(&bytes).collect::<Result<Vec<_>, _>>() {
        Ok(certs) if !certs.is_empty() => Some(certs),
        Ok(_) => {
            problems.push(format!(
                "[{section}] field \"{field}\": {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                path.display()
            ));
            None
        }
        Err(e) => {
            problems.push(format!(
                "[{section}] field \"{field}\": {} is not valid PEM ({e})",
                path.display()
            ));
            None
        }
    }
}

fn private_key(
    section: &str,
    path: &Path,
    problems: &mut Vec<String>,
) -> Option<PrivateKeyDer<'static>> {
    let bytes = read(section, "tls_key_file", path, problems)?;
    match PrivateKeyDer::from_pem_slice(&bytes) {
        Ok(k) => Some(k),
        Err(e) => {
            problems.push(format!(
                "[{section}] field \"tls_key_file\": {} holds no usable unencrypted private key ({e})",
                path.display()
            ));
            None
        }
    }
}
