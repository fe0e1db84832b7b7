//! TLS of the [`RestClient`](super::RestClient)'s own HTTP client (cargo feature `tls`): a CA
//! bundle instead of the system's roots and a client identity, or, without the feature, the
//! refusal of an `https://` address or a TLS file.

use super::RestError;

/// `builder` trusting the PEM CA certificates `ca_pem` instead of the system's roots and
/// presenting the client identity `identity` (PEM certificate, PEM key), when given; `server`
/// is for messages.
///
/// # Errors
/// [`RestError::Tls`] naming the CLI flag when `ca_pem` holds no PEM certificate or
/// `identity` is not a PEM certificate and key.
#[cfg(feature = "tls")]
pub(super) fn with_tls(
    mut builder: reqwest::ClientBuilder,
    server: &str,
    ca_pem: Option<&[u8]>,
    identity: Option<&(Vec<u8>, Vec<u8>)>,
) -> Result<reqwest::ClientBuilder, RestError> {
    use super::error::innermost;

    let bad = |reason: String| RestError::Tls {
        server: server.to_owned(),
        reason,
        hint: None,
    };
    if let Some(pem) = ca_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| bad(format!("--ca: {}", innermost(&e))))?;
        if certs.is_empty() {
            return Err(bad("--ca: no PEM certificate in the file".to_owned()));
        }
        builder = builder.tls_built_in_root_certs(false);
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    if let Some((cert, key)) = identity {
        let pem = [cert.as_slice(), b"\n", key.as_slice()].concat();
        let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
            bad(format!(
                "--client-cert/--client-key: not a PEM certificate and key ({})",
                innermost(&e)
            ))
        })?;
        builder = builder.identity(identity);
    }
    Ok(builder)
}

/// Without TLS support an `https://` address or any TLS file is refused.
///
/// # Errors
/// [`RestError::Tls`] with [`NO_TLS`](super::NO_TLS) when `server` is `https://` or a CA or
/// identity is given.
#[cfg(not(feature = "tls"))]
pub(super) fn with_tls(
    builder: reqwest::ClientBuilder,
    server: &str,
    ca_pem: Option<&[u8]>,
    identity: Option<&(Vec<u8>, Vec<u8>)>,
) -> Result<reqwest::ClientBuilder, RestError> {
    // `server` may list several nodes, separated by commas.
    let https = server.split(',').any(|s| {
        s.trim()
            .get(..8)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
    });
    if https || ca_pem.is_some() || identity.is_some() {
        return Err(RestError::Tls {
            server: server.to_owned(),
            reason: super::NO_TLS.to_owned(),
            hint: None,
        });
    }
    Ok(builder)
}

#[cfg(test)]
mod tests {
    use super::super::{RestClient, RestError};

    fn tls_reason(e: RestError) -> String {
        match e {
            RestError::Tls { reason, hint, .. } => {
                assert_eq!(hint, None);
                reason
            }
            other => panic!("expected RestError::Tls, got {other:?}"),
        }
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_files_without_pem_are_refused_naming_the_flag() {
        let e = RestClient::builder("https://127.0.0.1:1")
            .ca_pem(Some(b"not a certificate".to_vec()))
            .build()
            .unwrap_err();
        assert_eq!(tls_reason(e), "--ca: no PEM certificate in the file");
        let e = RestClient::builder("https://127.0.0.1:1")
            .identity_pem(b"no cert".to_vec(), b"no key".to_vec())
            .build()
            .unwrap_err();
        assert!(
            tls_reason(e).starts_with("--client-cert/--client-key: not a PEM certificate and key")
        );
        assert!(RestClient::new("https://127.0.0.1:1").is_ok());
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn without_tls_https_and_tls_files_are_refused_in_one_line() {
        let e = RestClient::new("HTTPS://127.0.0.1:1").unwrap_err();
        assert_eq!(
            e.to_string(),
            "TLS with the registry at HTTPS://127.0.0.1:1 failed: this gangway was built \
             without TLS (cargo feature tls)"
        );
        let e = RestClient::builder("127.0.0.1:1")
            .ca_pem(Some(b"x".to_vec()))
            .build()
            .unwrap_err();
        assert_eq!(tls_reason(e), super::super::NO_TLS);
        assert!(RestClient::new("127.0.0.1:1").is_ok());
    }
}
