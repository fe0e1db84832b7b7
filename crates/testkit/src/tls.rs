//! Certificates for TLS tests (feature `tls`): a private CA made afresh by each test, and leaf
//! certificates it signs, as PEM text and files. Nothing here is fit for production: the keys
//! live in temporary directories and the CA is trusted by nothing but the test.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SerialNumber,
};

/// A private certificate authority.
pub struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its private key, as PEM, and the certificate's DER (what a peer sees).
#[derive(Debug, Clone)]
pub struct Leaf {
    /// The certificate, PEM (`-----BEGIN CERTIFICATE-----`).
    pub cert_pem: String,
    /// Its private key, PEM (PKCS#8).
    pub key_pem: String,
    /// The certificate, DER: compare it with the certificate a TLS peer presents.
    pub der: Vec<u8>,
}

/// Where [`Leaf::write`] put a leaf.
#[derive(Debug, Clone)]
pub struct LeafFiles {
    /// The certificate file (`NAME.crt`).
    pub cert: PathBuf,
    /// The key file (`NAME.key`).
    pub key: PathBuf,
}

impl Pki {
    /// A new CA whose subject common name is `name`. Panics if rcgen cannot make one.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        Self {
            ca: CertifiedIssuer::self_signed(params, key).expect("self-signed CA"),
        }
    }

    /// The CA certificate, PEM: what a client passes as its CA file.
    pub fn ca_pem(&self) -> String {
        self.ca.as_ref().pem()
    }

    /// Writes the CA certificate to `dir/NAME` and returns the path.
    pub fn write_ca(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.ca_pem()).expect("write CA file");
        path
    }

    /// A server certificate for `localhost` and `127.0.0.1` with common name `cn` and serial
    /// number `serial`.
    pub fn server(&self, cn: &str, serial: u64) -> Leaf {
        self.leaf(
            vec!["localhost".to_owned(), "127.0.0.1".to_owned()],
            cn,
            serial,
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate with common name `cn` and serial number `serial`.
    pub fn client(&self, cn: &str, serial: u64) -> Leaf {
        self.leaf(Vec::new(), cn, serial, ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn leaf(
        &self,
        names: Vec<String>,
        cn: &str,
        serial: u64,
        usage: ExtendedKeyUsagePurpose,
    ) -> Leaf {
        let mut params = CertificateParams::new(names).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.serial_number = Some(SerialNumber::from_slice(&serial.to_be_bytes()));
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.ca).expect("signed leaf");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}

impl Leaf {
    /// Writes `dir/NAME.crt` and `dir/NAME.key` (overwriting them).
    pub fn write(&self, dir: &Path, name: &str) -> LeafFiles {
        let files = LeafFiles {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        };
        std::fs::write(&files.cert, &self.cert_pem).expect("write certificate");
        std::fs::write(&files.key, &self.key_pem).expect("write key");
        files
    }
}
