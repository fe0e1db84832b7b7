use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;

use crate::model::ProbeSpec;

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
fn names_are_never_url_dot_segments() {
    for dots in [".", ".."] {
        let err = name("service", dots).unwrap_err();
        assert_eq!(err.field, "service");
        assert_eq!(
            err.message,
            format!(r#"must not be "{dots}": URLs drop the dot segments "." and "..""#)
        );
    }
    for ok in ["...", ".a", "a.", "..a", "a..b"] {
        assert_eq!(name("service", ok), Ok(()), "{ok}");
    }
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
fn weights_are_zero_or_0_001_to_10000() {
    for ok in [0.0, 0.001, 1.0, 10_000.0] {
        assert_eq!(weight(ok), Ok(()), "{ok:?}");
    }
    for bad in [
        -0.0,
        5e-324,
        f64::MIN_POSITIVE,
        0.000_999,
        -0.5,
        10_000.5,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ] {
        assert_eq!(weight(bad).unwrap_err().field, "weight", "{bad:?}");
    }
    assert_eq!(
        weight(-0.0).unwrap_err().message,
        "must be 0 or a number 0.001-10000, got -0.0"
    );
    assert_eq!(
        weight(5e-324).unwrap_err().message,
        "must be 0 or a number 0.001-10000, got 5e-324"
    );
}

#[test]
fn leases_are_100ms_to_24h_and_delete_after_the_ttl() {
    let ms = Duration::from_millis;
    assert_eq!(lease(ms(100), ms(100)), Ok(()));
    assert_eq!(lease(ms(86_400_000), ms(86_400_000)), Ok(()));
    assert_eq!(lease(ms(15_000), ms(30_000)), Ok(()));
    let ttl = |t| lease(ms(t), ms(86_400_000)).unwrap_err();
    assert_eq!(ttl(99).field, "ttl_ms");
    assert_eq!(ttl(99).message, "must be 100-86400000 (24 h), got 99");
    assert_eq!(ttl(86_400_001).field, "ttl_ms");
    assert_eq!(
        ttl(u64::MAX).message,
        format!("must be 100-86400000 (24 h), got {}", u64::MAX)
    );
    let delete = |d| lease(ms(1_000), ms(d)).unwrap_err();
    assert_eq!(delete(999).field, "delete_timeout_ms");
    assert_eq!(
        delete(999).message,
        "must be at least the TTL (1000 ms) and at most 86400000 (24 h), got 999"
    );
    assert_eq!(delete(86_400_001).field, "delete_timeout_ms");
    assert_eq!(delete(u64::MAX).field, "delete_timeout_ms");
    // The TTL is checked first: a TTL of u64::MAX ms is reported as such, not as a delete
    // timeout below it.
    assert_eq!(lease(ms(u64::MAX), ms(30_000)).unwrap_err().field, "ttl_ms");
}

#[test]
fn probes_have_bounded_intervals_counts_and_paths() {
    assert_eq!(probe(&ProbeSpec::default()), Ok(()));
    assert_eq!(probe_interval_ms(100), Ok(()));
    assert_eq!(probe_interval_ms(3_600_000), Ok(()));
    assert_eq!(
        probe_interval_ms(99).unwrap_err(),
        ValidationError::new("probe.interval_ms", "must be 100-3600000, got 99")
    );
    assert_eq!(
        probe_interval_ms(3_600_001).unwrap_err().field,
        "probe.interval_ms"
    );
    assert_eq!(probe_count("probe.fall", 1), Ok(()));
    assert_eq!(probe_count("probe.rise", 100), Ok(()));
    assert_eq!(
        probe_count("probe.fall", 0).unwrap_err(),
        ValidationError::new("probe.fall", "must be 1-100, got 0")
    );
    assert_eq!(
        probe_count("probe.rise", 101).unwrap_err().field,
        "probe.rise"
    );

    let at_limit = format!("/{}", "a".repeat(1023));
    assert_eq!(probe_path(&at_limit), Ok(()));
    assert_eq!(probe_path("/"), Ok(()));
    let over = format!("{at_limit}a");
    assert_eq!(
        probe_path(&over).unwrap_err().message,
        "must be at most 1024 bytes, got 1025"
    );
    let huge = format!("/{}", "a".repeat(100 * 1024));
    assert!(
        probe_path(&huge).unwrap_err().message.len() < 100,
        "no echo of the path"
    );
    for bad in ["", "ready", "/a b", "/a\tb", "/a\nb"] {
        assert_eq!(probe_path(bad).unwrap_err().field, "probe.path", "{bad:?}");
    }

    // `probe` names the first field at fault.
    let spec = |f: fn(&mut ProbeSpec)| {
        let mut s = ProbeSpec::default();
        f(&mut s);
        probe(&s).map_err(|e| e.field)
    };
    assert_eq!(spec(|s| s.interval_ms = 0), Err("probe.interval_ms".into()));
    assert_eq!(spec(|s| s.fall = 0), Err("probe.fall".into()));
    assert_eq!(spec(|s| s.rise = 0), Err("probe.rise".into()));
    assert_eq!(spec(|s| s.path = "x".into()), Err("probe.path".into()));
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
    assert!(protect_threshold(-0.0).is_err());
    assert!(protect_threshold(f64::MIN_POSITIVE / 2.0).is_err());
    assert!(protect_threshold(f64::NAN).is_err());
    assert_eq!(protect_threshold(f64::MIN_POSITIVE), Ok(()));
}

proptest! {
    #[test]
    fn name_accepts_exactly_the_alphabet(s in "\\PC{0,140}") {
        let allowed = !s.is_empty()
            && s.chars().count() <= 128
            && s.chars().all(|c| c.is_ascii_alphanumeric() || ".-_:".contains(c))
            && s != "."
            && s != "..";
        prop_assert_eq!(name("service", &s).is_ok(), allowed);
    }

    #[test]
    fn weight_accepts_exactly_positive_zero_and_the_range(w in proptest::num::f64::ANY) {
        let positive_zero = w == 0.0 && w.is_sign_positive();
        prop_assert_eq!(weight(w).is_ok(), positive_zero || (0.001..=10_000.0).contains(&w));
    }

    #[test]
    fn lease_accepts_exactly_the_bounds(ttl in 0u64..100_000_000, delete in 0u64..100_000_000) {
        let ok = (100..=86_400_000).contains(&ttl) && (ttl..=86_400_000).contains(&delete);
        let got = lease(Duration::from_millis(ttl), Duration::from_millis(delete));
        prop_assert_eq!(got.is_ok(), ok);
    }
}
