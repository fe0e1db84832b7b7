//! Loading and reloading the PEM files: each bad file is named with its problem, and a bad
//! reload keeps the set in force.

use std::path::Path;

use gangway_testkit::tls::{LeafFiles, Pki};

use super::*;

fn files(leaf: &LeafFiles, client_ca: Option<&Path>) -> TlsFiles {
    TlsFiles {
        cert: leaf.cert.clone(),
        key: leaf.key.clone(),
        client_ca: client_ca.map(Path::to_owned),
    }
}

/// The DER of the certificate the ports present now.
fn served_der(tls: &Tls) -> Vec<u8> {
    tls.inner.current.read().unwrap().served.clone()
}

#[test]
fn a_good_set_loads_with_alpn_per_port_and_mode() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let leaf = pki.server("server", 1).write(dir.path(), "server");
    let tls = Tls::load(files(&leaf, None)).unwrap();
    assert_eq!(tls.mode(), "on");
    assert!(!tls.mutual());
    let current = tls.inner.current.read().unwrap().clone();
    assert_eq!(current.http.alpn_protocols, [&b"h2"[..], b"http/1.1"]);
    assert_eq!(current.grpc.alpn_protocols, [&b"h2"[..]]);
    let ca = pki.write_ca(dir.path(), "ca.pem");
    let tls = Tls::load(files(&leaf, Some(&ca))).unwrap();
    assert_eq!(tls.mode(), "mutual");
}

#[test]
fn each_bad_file_is_named_with_its_problem() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let leaf = pki.server("server", 1).write(dir.path(), "server");
    let other = pki.server("other", 2).write(dir.path(), "other");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not PEM at all\n").unwrap();
    let missing = dir.path().join("missing.pem");
    let huge = dir.path().join("huge.pem");
    std::fs::write(&huge, vec![b'a'; MAX_PEM_FILE as usize + 1]).unwrap();

    let cases = [
        (
            TlsFiles {
                cert: missing.clone(),
                ..files(&leaf, None)
            },
            TlsFileKind::Cert,
            "cannot open it",
        ),
        (
            TlsFiles {
                cert: junk.clone(),
                ..files(&leaf, None)
            },
            TlsFileKind::Cert,
            "no PEM certificate",
        ),
        (
            TlsFiles {
                cert: huge.clone(),
                ..files(&leaf, None)
            },
            TlsFileKind::Cert,
            "larger than 1048576 bytes",
        ),
        (
            TlsFiles {
                key: leaf.cert.clone(),
                ..files(&leaf, None)
            },
            TlsFileKind::Key,
            "no PEM private key",
        ),
        (
            TlsFiles {
                key: other.key.clone(),
                ..files(&leaf, None)
            },
            TlsFileKind::Key,
            "does not match the first certificate",
        ),
        (
            files(&leaf, Some(&junk)),
            TlsFileKind::ClientCa,
            "no PEM certificate",
        ),
        (
            files(&leaf, Some(&missing)),
            TlsFileKind::ClientCa,
            "cannot open it",
        ),
    ];
    for (files, kind, reason) in cases {
        let e = Tls::load(files.clone()).expect_err(reason);
        assert_eq!(e.kind, kind, "{e}");
        assert!(e.reason.contains(reason), "{reason}: {e}");
        let line = e.to_string();
        assert!(!line.contains('\n'), "one line: {line:?}");
        assert!(line.contains(&e.path.display().to_string()), "{line}");
    }
}

#[test]
fn a_reload_applies_a_good_set_and_keeps_the_old_one_on_a_bad_set() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let first = pki.server("first", 1);
    let leaf = first.write(dir.path(), "server");
    let tls = Tls::load(files(&leaf, None)).unwrap();
    assert_eq!(served_der(&tls), first.der);
    assert!(tls.reload_if_changed().is_none(), "nothing changed");

    let second = pki.server("second", 2);
    second.write(dir.path(), "server");
    tls.reload_if_changed()
        .expect("the files changed")
        .expect("a good set");
    assert_eq!(served_der(&tls), second.der);

    // A key of another certificate: refused, the second set stays, and is reported once.
    let third = pki.server("third", 3);
    std::fs::write(&leaf.key, &third.key_pem).unwrap();
    let e = tls
        .reload_if_changed()
        .expect("the key changed")
        .expect_err("mismatched key");
    assert_eq!(e.kind, TlsFileKind::Key);
    assert_eq!(served_der(&tls), second.der);
    assert!(tls.reload_if_changed().is_none(), "reported once");
    assert!(tls.reload().is_err(), "an explicit reload tries again");
    assert_eq!(served_der(&tls), second.der);
}
