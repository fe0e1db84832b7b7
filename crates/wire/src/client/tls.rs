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
    let https = server
        .get(..8)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"));
    if https || ca_pem.is_some() || identity.is_some() {
        return Err(RestError::Tls {
            server: server.to_owned(),
            reason: super::NO_TLS.to_owned(),
            hint: None,
        });
    }
    Ok(builder)
}
