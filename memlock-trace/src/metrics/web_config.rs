//! `--web-config FILE`: the web configuration file every Prometheus exporter reads
//! (exporter-toolkit's format: `tls_server_config` and `basic_auth_users`), so one file and
//! one scrape configuration serve node_exporter and memlock-trace alike.
//!
//! TLS is rustls (ring); relative paths are read from the file's own directory, as the
//! toolkit does. What the toolkit offers and memlock-trace does not (`cipher_suites`,
//! `http_server_config`, ...) is refused by name rather than ignored.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context as _, Result};
use rustls::{
    RootCertStore, ServerConfig, SupportedProtocolVersion,
    server::{WebPkiClientVerifier, danger::ClientCertVerifier},
    version::{TLS12, TLS13},
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
use serde::Deserialize;

use super::auth::BasicAuth;
use crate::UsageError;

/// What the server needs from the file: TLS, the users, or neither (plain HTTP, as without
/// the option).
#[derive(Default)]
pub struct WebConfig {
    pub tls: Option<Arc<ServerConfig>>,
    pub users: Option<BasicAuth>,
}

/// The file as written; unknown keys are errors that name them.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    basic_auth_users: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    client_ca_file: Option<PathBuf>,
    client_auth_type: Option<String>,
    min_version: Option<String>,
    max_version: Option<String>,
}

impl WebConfig {
    /// Reads and checks `path`; every error names the file and the key at fault.
    pub fn load(path: &Path) -> Result<Self> {
        let bad = |what: String| UsageError(format!("--web-config {}: {what}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read: {e}")))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, dir).map_err(|e| bad(format!("{e:#}")).into())
    }

    /// Parses the text of a file whose relative paths are under `dir`.
    pub fn parse(text: &str, dir: &Path) -> Result<Self> {
        // An empty file is an empty configuration, as for the toolkit.
        let file: File = if text.trim().is_empty() {
            File::default()
        } else {
            // The parser's first line names the key and where it is; the rest is a drawing.
            serde_saphyr::from_str(text).map_err(|e| {
                let message = e.to_string();
                let first = message.lines().next().unwrap_or_default();
                anyhow::anyhow!("{}", first.trim_start_matches("error: "))
            })?
        };
        let tls = file
            .tls_server_config
            .map(|t| tls_config(&t, dir).context("tls_server_config"))
            .transpose()?
            .map(Arc::new);
        let users = file
            .basic_auth_users
            .map(BasicAuth::new)
            .transpose()
            .context("basic_auth_users")?;
        Ok(Self { tls, users })
    }
}

fn tls_config(t: &TlsFile, dir: &Path) -> Result<ServerConfig> {
    let required = |key: &str, value: &Option<PathBuf>| {
        value
            .as_ref()
            .map(|p| dir.join(p))
            .ok_or_else(|| anyhow::anyhow!("{key} is missing (a PEM file)"))
    };
    let cert_file = required("cert_file", &t.cert_file)?;
    let key_file = required("key_file", &t.key_file)?;
    // The settings first, then the files: a typo is named whatever the files hold.
    let versions = versions(t.min_version.as_deref(), t.max_version.as_deref())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = client_verifier(t, dir, Arc::clone(&provider))?;
    let certs = read_certs(&cert_file).context("cert_file")?;
    let key = PrivateKeyDer::from_pem_file(&cert_or_key(&key_file)?)
        .map_err(|e| anyhow::anyhow!("{}: no private key read: {e}", key_file.display()))
        .context("key_file")?;
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&versions)
        .context("min_version/max_version")?;
    let builder = match verifier {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| anyhow::anyhow!("cert_file and key_file do not make a pair: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// `path` if it is a readable file, else an error that says which and why.
fn cert_or_key(path: &Path) -> Result<PathBuf> {
    std::fs::metadata(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(path.to_path_buf())
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(cert_or_key(path)?)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{}: no PEM certificate in it",
        path.display()
    );
    Ok(certs)
}

/// The toolkit's `min_version`/`max_version` (`TLS10` .. `TLS13`, default TLS 1.2 up).
/// rustls speaks 1.2 and 1.3 only: a lower minimum still means those two.
fn versions(
    min: Option<&str>,
    max: Option<&str>,
) -> Result<Vec<&'static SupportedProtocolVersion>> {
    let rank = |key: &str, v: &str| match v {
        "TLS10" => Ok(10),
        "TLS11" => Ok(11),
        "TLS12" => Ok(12),
        "TLS13" => Ok(13),
        other => anyhow::bail!("{key}: `{other}` is not one of TLS10, TLS11, TLS12, TLS13"),
    };
    let min = min.map_or(Ok(12), |v| rank("min_version", v))?;
    let max = max.map_or(Ok(13), |v| rank("max_version", v))?;
    anyhow::ensure!(
        max >= 12,
        "max_version: TLS 1.0 and 1.1 are not offered (rustls speaks TLS 1.2 and 1.3)"
    );
    anyhow::ensure!(min <= max, "min_version is above max_version");
    Ok([(12, &TLS12), (13, &TLS13)]
        .into_iter()
        .filter(|&(v, _)| v >= min && v <= max)
        .map(|(_, version)| version)
        .collect())
}

/// `client_auth_type` with `client_ca_file`, as the toolkit reads them.
fn client_verifier(
    t: &TlsFile,
    dir: &Path,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Option<Arc<dyn ClientCertVerifier>>> {
    let auth = t.client_auth_type.as_deref().unwrap_or("NoClientCert");
    let optional = match auth {
        "NoClientCert" | "" => {
            anyhow::ensure!(
                t.client_ca_file.is_none(),
                "client_ca_file is set but client_auth_type is NoClientCert: set \
                 client_auth_type to RequireAndVerifyClientCert or VerifyClientCertIfGiven"
            );
            return Ok(None);
        }
        "RequireAndVerifyClientCert" => false,
        "VerifyClientCertIfGiven" => true,
        "RequestClientCert" | "RequireAnyClientCert" | "RequireClientCert" => anyhow::bail!(
            "client_auth_type: {auth} (a client certificate taken without checking it) is not \
             supported: use RequireAndVerifyClientCert or VerifyClientCertIfGiven with \
             client_ca_file"
        ),
        other => anyhow::bail!(
            "client_auth_type: `{other}` is not one of NoClientCert, VerifyClientCertIfGiven, \
             RequireAndVerifyClientCert"
        ),
    };
    let ca_file = t
        .client_ca_file
        .as_ref()
        .map(|p| dir.join(p))
        .ok_or_else(|| {
            anyhow::anyhow!("client_auth_type {auth} needs client_ca_file (the CA's PEM file)")
        })?;
    let mut roots = RootCertStore::empty();
    for cert in read_certs(&ca_file).context("client_ca_file")? {
        roots
            .add(cert)
            .map_err(|e| anyhow::anyhow!("client_ca_file: {}: {e}", ca_file.display()))?;
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    let builder = if optional {
        builder.allow_unauthenticated()
    } else {
        builder
    };
    let verifier = builder
        .build()
        .map_err(|e| anyhow::anyhow!("client_ca_file: {e}"))?;
    Ok(Some(verifier))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> String {
        match WebConfig::parse(text, Path::new("/nonexistent")) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn empty_file_is_plain_http() {
        let c = WebConfig::parse("", Path::new(".")).unwrap();
        assert!(c.tls.is_none() && c.users.is_none());
    }

    #[test]
    fn errors_name_the_key() {
        let e = error("tls_server_config:\n  cert_file: a.pem\n  cipher_suites: [X]\n");
        assert!(e.contains("cipher_suites"), "{e}");
        let e = error("basic_auth_user:\n  a: b\n");
        assert!(e.contains("basic_auth_user"), "{e}");
        let e = error("tls_server_config:\n  key_file: k.pem\n");
        assert!(e.contains("cert_file is missing"), "{e}");
        let e = error("tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n");
        assert!(
            e.contains("cert_file") && e.contains("/nonexistent/c.pem"),
            "{e}"
        );
        let e = error("basic_auth_users:\n  alice: notahash\n");
        assert!(e.contains("basic_auth_users") && e.contains("alice"), "{e}");
    }

    #[test]
    fn versions_and_client_auth() {
        assert_eq!(versions(None, None).unwrap().len(), 2);
        assert_eq!(versions(Some("TLS13"), None).unwrap().len(), 1);
        assert!(format!("{:#}", versions(None, Some("TLS11")).unwrap_err()).contains("1.1"));
        assert!(format!("{:#}", versions(Some("SSL3"), None).unwrap_err()).contains("SSL3"));
        let t = TlsFile {
            client_ca_file: Some("ca.pem".into()),
            ..TlsFile::default()
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let e = client_verifier(&t, Path::new("."), Arc::clone(&provider)).unwrap_err();
        assert!(format!("{e}").contains("NoClientCert"), "{e}");
        let t = TlsFile {
            client_auth_type: Some("RequireAndVerifyClientCert".into()),
            ..TlsFile::default()
        };
        let e = client_verifier(&t, Path::new("."), provider).unwrap_err();
        assert!(format!("{e}").contains("needs client_ca_file"), "{e}");
    }
}
