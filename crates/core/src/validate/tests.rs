use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

#[test]
fn names_follow_the_rule() {
    for ok in ["a", "orders", "my.svc_v2-x:1", &"x".repeat(128)] {
        assert_eq!(name("service", ok), Ok(()), "{ok}");
    }
    let cases = [
        ("", "must not be empty"),
        ("a b", "found ' '"),
        ("DEFAULT_GROUP@@svc", "found '@'"),
        ("tab\t", "found '\\t'"),
        ("é", "found 'é'"),
    ];
    for (bad, hint) in cases {
        let err = name("group", bad).unwrap_err();
        assert_eq!(err.field, "group");
        assert!(err.message.contains(hint), "{bad:?}: {}", err.message);
    }
    let long = name("service", &"x".repeat(129)).unwrap_err();
    assert_eq!(long.message, "must be at most 128 characters, got 129");
}

#[test]
fn ports_are_1_to_65535() {
    assert_eq!(port(1), Ok(1));
    assert_eq!(port(65535), Ok(65535));
    assert_eq!(port(0).unwrap_err().message, "must be 1-65535, got 0");
    assert_eq!(port(65536).unwrap_err().field, "port");
}

#[test]
fn ips_are_literals_or_host_names() {
    for ok in [
        "127.0.0.1",
        "::1",
        "fe80::1",
        "db-1.example.com",
        "localhost",
        "a.b.",
    ] {
        assert_eq!(ip(ok), Ok(()), "{ok}");
    }
    for bad in [
        "",
        "999.1.1.1",
        "1.2.3",
        "-x.com",
        "a..b",
        "a b",
        "x_y.com",
        &"a".repeat(254),
    ] {
        assert_eq!(ip(bad).unwrap_err().field, "ip", "{bad:?}");
    }
    let long_label = format!("{}.com", "a".repeat(64));
    assert!(ip(&long_label).is_err());
}

#[test]
fn addresses_parse_with_their_rules() {
    assert_eq!(addr("10.0.0.1:80"), Ok(("10.0.0.1".into(), 80)));
    assert_eq!(addr("[::1]:8080"), Ok(("::1".into(), 8080)));
    assert_eq!(addr("db.local:5432"), Ok(("db.local".into(), 5432)));
    assert_eq!(addr("10.0.0.1").unwrap_err().field, "addr");
    assert_eq!(addr("::1:80").unwrap_err().field, "addr");
    assert_eq!(
        addr("10.0.0.1:0").unwrap_err().message,
        "must be 1-65535, got 0"
    );
    assert_eq!(addr("10.0.0.1:x").unwrap_err().field, "port");
    assert_eq!(addr("bad host:80").unwrap_err().field, "ip");
}

#[test]
fn weights_are_finite_0_to_10000() {
    assert_eq!(weight(0.0), Ok(()));
    assert_eq!(weight(10_000.0), Ok(()));
    for bad in [-0.5, 10_000.5, f64::NAN, f64::INFINITY] {
        assert_eq!(weight(bad).unwrap_err().field, "weight");
    }
}

#[test]
fn metadata_is_bounded() {
    let mut m: BTreeMap<String, String> = (0..64).map(|i| (format!("k{i}"), "v".into())).collect();
    assert_eq!(metadata(&m), Ok(()));
    m.insert("one-too-many".into(), "v".into());
    assert_eq!(
        metadata(&m).unwrap_err().message,
        "must have at most 64 keys, got 65"
    );

    let big: BTreeMap<String, String> = [("k".to_string(), "v".repeat(16 * 1024))].into();
    assert!(metadata(&big).unwrap_err().message.contains("16384 bytes"));
    let empty_key: BTreeMap<String, String> = [(String::new(), "v".to_string())].into();
    assert_eq!(
        metadata(&empty_key).unwrap_err().message,
        "keys must not be empty"
    );
}

#[test]
fn protect_threshold_is_a_ratio() {
    assert_eq!(protect_threshold(0.0), Ok(()));
    assert_eq!(protect_threshold(1.0), Ok(()));
    assert!(protect_threshold(1.01).is_err());
    assert!(protect_threshold(-0.1).is_err());
}

proptest! {
    #[test]
    fn name_accepts_exactly_the_alphabet(s in "\\PC{0,140}") {
        let allowed = !s.is_empty()
            && s.chars().count() <= 128
            && s.chars().all(|c| c.is_ascii_alphanumeric() || ".-_:".contains(c));
        prop_assert_eq!(name("service", &s).is_ok(), allowed);
    }

    #[test]
    fn weight_accepts_exactly_the_range(w in proptest::num::f64::ANY) {
        prop_assert_eq!(weight(w).is_ok(), w.is_finite() && (0.0..=10_000.0).contains(&w));
    }
}
