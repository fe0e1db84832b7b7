//! What one session may hold (`Config::session_limits`, docs/security.md "Limits"): one more
//! is refused naming the limit, and changes nothing.

use super::*;
use crate::config::SessionLimits;

fn limited(subscriptions: usize, instances: usize) -> Registry {
    let config = Config {
        session_limits: SessionLimits {
            subscriptions,
            instances,
        },
        ..Config::for_tests()
    };
    registry_with(Arc::new(MemoryStore::default()), config)
}

fn on(session: &str) -> SubscriberInfo {
    SubscriberInfo {
        session: Some(session.to_owned()),
        ..SubscriberInfo::new(SubscriberKind::Session, "127.0.0.1:1")
    }
}

#[tokio::test]
async fn a_session_beyond_its_subscriptions_is_refused_naming_the_limit() {
    let r = limited(2, 10);
    let s = r.open_session("127.0.0.1:1".into(), "a".into(), String::new());
    let other = r.open_session("127.0.0.1:2".into(), "b".into(), String::new());
    r.subscribe(&svc(), on(&s)).unwrap();
    r.subscribe(&ServiceKey::named("billing"), on(&s)).unwrap();
    let err = r
        .subscribe(&ServiceKey::named("third"), on(&s))
        .unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::LimitExceeded {
                limit: "subscriptions-per-session",
                max: 2
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("subscriptions-per-session"),
        "{err}"
    );
    // Nothing changed: no subscriber, not even an empty service entry.
    assert!(r.service(&ServiceKey::named("third")).is_err());
    assert_eq!(r.subscribers(&svc()).len(), 1);
    // Another session, and subscribers without a session, have their own count.
    r.subscribe(&ServiceKey::named("third"), on(&other))
        .unwrap();
    r.subscribe(
        &ServiceKey::named("third"),
        SubscriberInfo::new(SubscriberKind::Watch, "127.0.0.1:3"),
    )
    .unwrap();
    // One ended subscription makes room again.
    let first = r.subscribers(&svc())[0].id.clone();
    r.unsubscribe(&first);
    r.subscribe(&ServiceKey::named("third"), on(&s)).unwrap();
}

#[tokio::test]
async fn a_session_beyond_its_instances_is_refused_naming_the_limit() {
    let r = limited(10, 2);
    let s = r.open_session("127.0.0.1:1".into(), "a".into(), String::new());
    let session = || LivenessRequest::Session(s.clone());
    r.register(svc(), inst(1), session()).await.unwrap();
    r.register(ServiceKey::named("billing"), inst(2), session())
        .await
        .unwrap();
    let before = listing(&r);
    let revision = r.view(&svc()).revision;
    let err = r.register(svc(), inst(3), session()).await.unwrap_err();
    assert!(
        matches!(
            err,
            RegistryError::LimitExceeded {
                limit: "instances-per-session",
                max: 2
            }
        ),
        "{err:?}"
    );
    assert_eq!(listing(&r), before, "nothing changed");
    assert_eq!(r.view(&svc()).revision, revision);
    // Re-registering one it holds is not one more; a lease is not a session's.
    r.register(svc(), inst(1), session()).await.unwrap();
    r.register(svc(), inst(3), lease()).await.unwrap();
    r.deregister_on_session(&s, &svc(), &inst(1).key).unwrap();
    r.register(svc(), inst(4), session()).await.unwrap();
}
