use std::sync::Arc;

use super::file::grant;
use super::*;

fn principal(grants: Vec<Grant>) -> Caller {
    Caller::Principal(Arc::new(Principal::given("alice", grants)))
}

#[test]
fn roles_include_the_lower_ones_and_star_counts_everywhere() {
    let p = Principal::given(
        "p",
        vec![grant("public", Role::Read), grant("*", Role::Write)],
    );
    assert_eq!(p.role_on("public"), Some(Role::Write));
    assert_eq!(p.role_on("other"), Some(Role::Write));
    assert!(!p.global_admin());
    let q = Principal::given("q", vec![grant("prod", Role::Admin)]);
    assert_eq!(q.role_on("dev"), None);
}

#[test]
fn each_rule_needs_its_role() {
    let reader = principal(vec![grant("public", Role::Read)]);
    let writer = principal(vec![grant("public", Role::Write)]);
    let admin = principal(vec![grant("public", Role::Admin)]);
    assert!(reader.allow(Rule::Read, "public", None).is_ok());
    assert!(reader.allow(Rule::Read, "prod", None).is_err());
    assert!(reader.allow(Rule::Register, "public", None).is_err());
    assert!(writer.allow(Rule::Register, "public", None).is_ok());
    // Somebody else's instance: a takeover needs admin.
    assert!(writer.allow(Rule::Register, "public", Some("bob")).is_err());
    assert!(
        writer
            .allow(Rule::Register, "public", Some("alice"))
            .is_ok()
    );
    assert!(writer.allow(Rule::Instance, "public", Some("bob")).is_err());
    assert!(writer.allow(Rule::Instance, "public", None).is_err());
    assert!(admin.allow(Rule::Instance, "public", Some("bob")).is_ok());
    assert!(writer.allow(Rule::Service, "public", None).is_err());
    assert!(admin.allow(Rule::Service, "public", None).is_ok());
    // Its own instance, whatever its role now.
    assert!(
        reader
            .allow(Rule::Instance, "public", Some("alice"))
            .is_ok()
    );
}

#[test]
fn refusals_are_401_anonymous_and_403_naming_the_rule() {
    assert!(matches!(
        Caller::Anonymous.allow(Rule::Read, "public", None),
        Err(AuthError::Unauthenticated(_))
    ));
    let err = principal(vec![])
        .allow(Rule::Service, "public", None)
        .unwrap_err();
    match err {
        AuthError::Forbidden { rule, message } => {
            assert_eq!(rule, "service");
            assert!(message.contains("needs admin"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(Caller::Open.allow(Rule::Service, "x", Some("bob")).is_ok());
}

#[test]
fn the_file_round_trips_atomically_and_keeps_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    let mut f = AuthFile::load_or_default(&path).unwrap();
    f.add_user("alice", "s3cret-pw", vec![grant("public", Role::Write)])
        .unwrap();
    assert!(f.add_user("alice", "x", vec![]).is_err());
    let token = f.create_token("ci", vec![grant("*", Role::Read)]);
    assert!(token.starts_with("gwt_"));
    f.save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        !text.contains("s3cret-pw") && !text.contains(&token),
        "{text}"
    );
    assert!(text.contains("$argon2id$"));
    assert_eq!(AuthFile::load(&path).unwrap(), f);
    // No temporary file is left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    f.remove_user("alice").unwrap();
    assert!(f.remove_user("alice").is_err());
    assert!(AuthFile::load(&dir.path().join("missing")).is_err());
    std::fs::write(&path, "users = 3").unwrap();
    assert!(matches!(
        AuthFile::load(&path),
        Err(AuthFileError::Parse { .. })
    ));
}

fn creds_token(t: &str) -> Option<Credentials> {
    Some(Credentials::Token(t.into()))
}

#[tokio::test]
async fn tokens_passwords_and_logins_authenticate() {
    let mut f = AuthFile::default();
    f.add_user("alice", "pw-alice", vec![grant("public", Role::Write)])
        .unwrap();
    let token = f.create_token("", vec![grant("*", Role::Read)]);
    let auth = Authority::from_file(f);
    let Caller::Principal(p) = auth.authenticate(creds_token(&token)).await.unwrap() else {
        panic!()
    };
    assert!(p.name.starts_with("token:"));
    // One character off, another id, no prefix: all 401.
    let mut wrong = token.clone();
    // Another last character (a fixed 'A' was the same one time in 64).
    let last = wrong.pop().unwrap();
    wrong.push(if last == 'A' { 'B' } else { 'A' });
    for bad in [wrong.as_str(), "gwt_00000000_x", "nonsense", ""] {
        assert!(matches!(
            auth.authenticate(creds_token(bad)).await,
            Err(AuthError::Unauthenticated(_))
        ));
    }
    let pw = |user: &str, password: &str| {
        Some(Credentials::Password {
            user: user.into(),
            password: password.into(),
        })
    };
    assert!(auth.authenticate(pw("alice", "pw-alice")).await.is_ok());
    // Cached success, still checked against the password.
    assert!(auth.authenticate(pw("alice", "pw-alice")).await.is_ok());
    assert!(auth.authenticate(pw("alice", "wrong")).await.is_err());
    assert!(auth.authenticate(pw("nobody", "pw-alice")).await.is_err());
    let (session, principal) = auth.login("alice", "pw-alice").await.unwrap();
    assert_eq!(principal.name, "alice");
    let Caller::Principal(p) = auth.authenticate(creds_token(&session)).await.unwrap() else {
        panic!()
    };
    assert_eq!(p.name, "alice");
    assert!(auth.login("alice", "nope").await.is_err());
    assert_eq!(auth.authenticate(None).await.unwrap(), Caller::Anonymous);
    assert_eq!(
        Authority::off().authenticate(None).await.unwrap(),
        Caller::Open
    );
    assert_eq!(
        format!("{:?}", pw("alice", "pw-alice").unwrap()),
        "Password(alice, <redacted>)"
    );
}

#[tokio::test(start_paused = true)]
async fn logins_expire_and_end_when_the_user_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    let mut f = AuthFile::default();
    f.add_user("alice", "pw", vec![grant("public", Role::Read)])
        .unwrap();
    f.add_user("bob", "pw", vec![grant("public", Role::Read)])
        .unwrap();
    f.save(&path).unwrap();
    let auth = Authority::load(&path).unwrap();
    let (a, _) = auth.login("alice", "pw").await.unwrap();
    let (b, _) = auth.login("bob", "pw").await.unwrap();
    f.remove_user("bob").unwrap();
    f.save(&path).unwrap();
    assert_eq!(auth.reload().unwrap(), (1, 0));
    assert!(auth.authenticate(creds_token(&b)).await.is_err());
    assert!(auth.authenticate(creds_token(&a)).await.is_ok());
    tokio::time::advance(LOGIN_TTL + std::time::Duration::from_secs(1)).await;
    assert!(auth.authenticate(creds_token(&a)).await.is_err());
    // A broken file keeps the old contents in force.
    std::fs::write(&path, "[[users]]\nname = 1").unwrap();
    assert!(auth.reload().is_err());
    assert!(auth.login("alice", "pw").await.is_ok());
}

#[test]
fn a_malformed_file_is_one_line_naming_line_and_column_without_its_contents() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    std::fs::write(&path, "users = []\nsecret_looking_value [[\n").unwrap();
    let e = AuthFile::load(&path).unwrap_err().to_string();
    assert!(!e.contains('\n'), "{e}");
    assert!(e.contains("line 2, column 22"), "{e}");
    assert!(!e.contains("secret_looking_value"), "{e}");
}

#[test]
fn a_check_in_reused_memory_answers_as_the_plain_check() {
    let hash = super::file::hash_password("right").unwrap();
    let mut memory = Vec::new();
    for (password, want) in [("right", true), ("wrong", false), ("right", true)] {
        assert_eq!(super::file::verify_password(password, &hash), want);
        assert_eq!(
            super::file::verify_password_in(password, &hash, &mut memory),
            want,
            "{password}"
        );
    }
    // 19 MiB of working memory (m=19456 KiB, 1 KiB blocks), kept for the next check.
    assert_eq!(memory.len(), 19_456);
    assert!(!super::file::verify_password_in(
        "right",
        "not a hash",
        &mut memory
    ));
    let other = "$argon2id$v=19$m=8,t=1,p=1$c29tZXNhbHRzb21lc2FsdA$0uG6yVbW3Xk1tHq4w9hB9C2iH8Zr9mQ1dG3oK6pVw0s";
    assert!(!super::file::verify_password_in(
        "right",
        other,
        &mut memory
    ));
    assert_eq!(memory.len(), 8, "resized to the hash's m");
}

/// A user named `token` would poll as `token:` + `<id>:NAME`, the poller name of API token
/// `<id>`'s `NAME`, and ack its drains: the name is refused when added and when loaded.
#[test]
fn the_user_name_token_is_refused_when_added_and_when_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    let mut f = AuthFile::load_or_default(&path).unwrap();
    let e = f
        .add_user("token", "pw-of-token", vec![grant("*", Role::Read)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"token\"") && e.contains("reserved"), "{e}");
    assert!(f.users.is_empty());
    f.add_user("alice", "pw-of-alice", vec![]).unwrap();
    f.save(&path).unwrap();
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("name = \"alice\"", "name = \"token\"");
    std::fs::write(&path, text).unwrap();
    let e = AuthFile::load(&path).unwrap_err().to_string();
    assert!(e.contains("reserved") && !e.contains('\n'), "{e}");
    std::fs::write(&path, "[[users]]\nname = \"a:b\"\npassword_hash = \"x\"\n").unwrap();
    let e = AuthFile::load(&path).unwrap_err().to_string();
    assert!(e.contains("invalid user name \"a:b\""), "{e}");
    // A hand-edited file with one user twice (the last would win) is refused too.
    let twice = "[[users]]\nname = \"bob\"\npassword_hash = \"x\"\n".repeat(2);
    std::fs::write(&path, twice).unwrap();
    let e = AuthFile::load(&path).unwrap_err().to_string();
    assert!(e.contains("user bob is listed twice"), "{e}");
}

/// F4: a user's logins beyond [`MAX_LOGINS_PER_USER`] end only its own oldest; a full table
/// refuses a new login (429 `login-tokens`) and ends nobody's; a user at its own cap still
/// gets in by giving up its own oldest.
#[tokio::test(start_paused = true)]
async fn login_caps_end_only_the_users_own_oldest_and_a_full_table_refuses() {
    let mut f = AuthFile::default();
    for user in ["alice", "bob", "carol"] {
        f.add_user(user, "pw", vec![grant("public", Role::Read)])
            .unwrap();
    }
    let global = MAX_LOGINS_PER_USER + 6;
    let auth = Authority::from_file_with_max_logins(f, global);
    let login = |user: &'static str| {
        let auth = auth.clone();
        async move {
            // Distinct expiries, so "oldest" is one session.
            tokio::time::advance(std::time::Duration::from_millis(1)).await;
            auth.login(user, "pw").await.map(|(token, _)| token)
        }
    };
    let works = |token: String| {
        let auth = auth.clone();
        async move { auth.authenticate(creds_token(&token)).await.is_ok() }
    };
    let bob = login("bob").await.unwrap();
    let mut alice = Vec::new();
    for _ in 0..MAX_LOGINS_PER_USER + 3 {
        alice.push(login("alice").await.unwrap());
    }
    let mut alive = Vec::new();
    for t in &alice {
        alive.push(works(t.clone()).await);
    }
    let expected: Vec<bool> = (0..alice.len()).map(|i| i >= 3).collect();
    assert_eq!(alive, expected, "alice's 3 oldest went, her last 64 stay");
    assert!(
        works(bob.clone()).await,
        "bob's login survives alice's flood"
    );

    // 1 + 64 held; carol fills the table to `global`.
    let mut carol = Vec::new();
    for _ in 0..global - 1 - MAX_LOGINS_PER_USER {
        carol.push(login("carol").await.unwrap());
    }
    let refused = login("carol").await.unwrap_err();
    let AuthError::LimitExceeded { limit, message } = &refused else {
        panic!("{refused:?}")
    };
    assert_eq!(*limit, "login-tokens");
    assert!(
        message.starts_with(&format!(
            "limit login-tokens reached: {global} login sessions are held"
        )),
        "{message}"
    );
    assert!(works(bob.clone()).await && works(carol[0].clone()).await);
    assert!(works(alice[3].clone()).await);
    // alice is at her own cap: she gets in, and her oldest (alice[3]) goes.
    let newest = login("alice").await.unwrap();
    assert!(works(newest).await);
    assert!(!works(alice[3].clone()).await && works(alice[4].clone()).await);
    // Once they expire there is room again.
    tokio::time::advance(LOGIN_TTL).await;
    assert!(login("carol").await.is_ok());
    assert!(!works(bob).await, "expired");
}

/// F2: `is_current` follows the file: a removed token, a removed user, a user with a new
/// password or other grants are no longer current; `revoked` completes for them at the reload
/// and not for the others.
#[tokio::test]
async fn is_current_and_revoked_follow_the_file_at_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    let mut f = AuthFile::default();
    let gone = f.create_token("gone", vec![grant("public", Role::Read)]);
    let kept = f.create_token("kept", vec![grant("public", Role::Read)]);
    for user in ["removed", "regranted", "repassworded", "same"] {
        f.add_user(user, "pw", vec![grant("public", Role::Read)])
            .unwrap();
    }
    f.save(&path).unwrap();
    let auth = Authority::load(&path).unwrap();
    let mut callers = Vec::new();
    for t in [&gone, &kept] {
        callers.push(auth.authenticate(creds_token(t)).await.unwrap());
    }
    for user in ["removed", "regranted", "repassworded", "same"] {
        let pw = Credentials::Password {
            user: user.into(),
            password: "pw".into(),
        };
        callers.push(auth.authenticate(Some(pw)).await.unwrap());
    }
    let current = |callers: &[Caller]| -> Vec<bool> {
        callers
            .iter()
            .map(|c| match c {
                Caller::Principal(p) => auth.is_current(p),
                _ => unreachable!(),
            })
            .collect()
    };
    assert_eq!(current(&callers), [true; 6]);
    let mut revoked: Vec<_> = callers.iter().map(|c| Box::pin(auth.revoked(c))).collect();
    fn pending<F: Future + Unpin>(r: &mut F) -> bool {
        futures::FutureExt::now_or_never(r).is_none()
    }
    assert!(revoked.iter_mut().all(pending), "nothing revoked yet");

    f.remove_token(gone.split('_').nth(1).unwrap()).unwrap();
    f.remove_user("removed").unwrap();
    f.users
        .iter_mut()
        .find(|u| u.name == "regranted")
        .unwrap()
        .grants = vec![grant("public", Role::Write)];
    f.remove_user("repassworded").unwrap();
    f.add_user("repassworded", "pw", vec![grant("public", Role::Read)])
        .unwrap();
    f.save(&path).unwrap();
    assert_eq!(auth.reload().unwrap(), (3, 1));
    assert_eq!(
        current(&callers),
        [false, true, false, false, false, true],
        "gone, kept, removed, regranted, repassworded, same"
    );
    let ended: Vec<bool> = revoked.iter_mut().map(|r| !pending(r)).collect();
    assert_eq!(ended, [true, false, true, true, true, false]);
    // Open and anonymous callers, and auth off, are never revoked.
    for (authority, caller) in [
        (&auth, Caller::Anonymous),
        (&auth, Caller::Open),
        (&Authority::off(), callers[0].clone()),
    ] {
        let mut r = Box::pin(authority.revoked(&caller));
        assert!(pending(&mut r), "{caller:?}");
    }
    assert!(Authority::off().generations().is_none());
}
