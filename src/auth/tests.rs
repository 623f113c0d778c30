use std::time::Duration;

use super::*;
use crate::auth::TokenHashes;

fn client(name: &str, token: &str, destinations: &[&str], permissions: &[&str]) -> ClientSettings {
    ClientSettings {
        name: name.to_owned(),
        token_sha256: TokenHashes::One(token::hash_hex(token)),
        destinations: destinations.iter().map(|d| d.to_string()).collect(),
        permissions: permissions.iter().map(|p| p.to_string()).collect(),
        ..ClientSettings::default()
    }
}

fn settings(clients: Vec<ClientSettings>) -> AuthSettings {
    AuthSettings {
        clients,
        ..AuthSettings::default()
    }
}

#[test]
fn tokens_name_their_client_and_nothing_else() {
    let auth = Authenticator::from_settings(
        &settings(vec![
            client("billing", "tok-b", &["billing.#"], &["submit", "read"]),
            client("ops", "tok-o", &[], &["admin"]),
        ]),
        "0.0.0.0:8080",
        true,
    )
    .unwrap();
    assert!(auth.tokens_required());
    let Ok(Caller::Client(billing)) = auth.authenticate(Some("tok-b")) else {
        panic!("billing's token")
    };
    assert_eq!(billing.name, "billing");
    assert!(billing.has(Permission::Submit) && billing.has(Permission::Read));
    assert!(!billing.has(Permission::Cancel) && !billing.has(Permission::Admin));
    assert!(billing.may_publish_to("billing.invoice") && !billing.may_publish_to("orders"));
    assert_eq!(
        auth.authenticate(Some("tok-x")).unwrap_err(),
        Unauthenticated::Unknown
    );
    assert_eq!(
        auth.authenticate(None).unwrap_err(),
        Unauthenticated::Missing
    );
    // A hash is not a token.
    assert_eq!(
        auth.authenticate(Some(&token::hash_hex("tok-b")))
            .unwrap_err(),
        Unauthenticated::Unknown
    );
    let ops = Caller::Client(match auth.authenticate(Some("tok-o")).unwrap() {
        Caller::Client(c) => c,
        Caller::Anyone => panic!(),
    });
    assert!(ops.may(Permission::Cancel) && ops.owner_scope().is_none());
    assert!(
        !ops.may_publish_to("billing"),
        "admin publishes only to its patterns"
    );
    assert_eq!(Caller::Client(billing).owner_scope(), Some("billing"));
}

#[test]
fn an_open_api_is_only_allowed_on_loopback_or_when_said() {
    let none = settings(vec![]);
    for bind in [
        "127.0.0.1:8080",
        "[::1]:80",
        "localhost:8080",
        "127.0.0.2:1",
    ] {
        let auth = Authenticator::from_settings(&none, bind, true).unwrap();
        assert!(!auth.tokens_required(), "{bind}");
        assert!(matches!(auth.authenticate(None), Ok(Caller::Anyone)));
    }
    for bind in ["0.0.0.0:8080", "[::]:8080", "10.1.2.3:80", "api.example:80"] {
        let err = Authenticator::from_settings(&none, bind, true).unwrap_err();
        assert!(
            matches!(err, AuthError::OpenOnNetwork { .. }),
            "{bind}: {err}"
        );
        assert!(err.to_string().contains("auth.mode = \"open\""));
    }
    let open = AuthSettings {
        mode: AuthMode::Open,
        ..none.clone()
    };
    assert!(
        !Authenticator::from_settings(&open, "0.0.0.0:8080", true)
            .unwrap()
            .tokens_required()
    );
    let tokens = AuthSettings {
        mode: AuthMode::Tokens,
        ..none
    };
    let auth = Authenticator::from_settings(&tokens, "127.0.0.1:8080", true).unwrap();
    assert_eq!(
        auth.authenticate(Some("x")).unwrap_err(),
        Unauthenticated::Unknown
    );
    let contradictory = AuthSettings {
        mode: AuthMode::Open,
        ..settings(vec![client("a", "t", &["#"], &["submit"])])
    };
    assert!(Authenticator::from_settings(&contradictory, "127.0.0.1:1", true).is_err());
}

#[test]
fn bad_client_entries_are_refused_with_the_reason() {
    let cases: Vec<(ClientSettings, &str)> = vec![
        (client("bad name", "t", &["#"], &["submit"]), "a name is"),
        (client("a", "t", &["a..b"], &["submit"]), "a..b"),
        (
            client("a", "t", &["#"], &["publish"]),
            "unknown permission \"publish\"",
        ),
        (client("a", "t", &["#"], &[]), "no permissions"),
        (client("a", "t", &[], &["submit"]), "no destinations"),
        (
            ClientSettings {
                token_sha256: TokenHashes::One("dlt_plaintext-token".into()),
                ..client("a", "t", &["#"], &["submit"])
            },
            "never the token itself",
        ),
        (
            ClientSettings {
                burst: Some(5),
                ..client("a", "t", &["#"], &["submit"])
            },
            "burst needs rate_per_second",
        ),
    ];
    for (entry, expected) in cases {
        let err = ClientSet::build(&[entry], None).unwrap_err().to_string();
        assert!(err.contains(expected), "{err}");
    }
    let twice = ClientSet::build(
        &[
            client("a", "t1", &["#"], &["read"]),
            client("a", "t2", &["#"], &["read"]),
        ],
        None,
    )
    .unwrap_err();
    assert!(twice.to_string().contains("used twice"));
    let shared = ClientSet::build(
        &[
            client("a", "t", &["#"], &["read"]),
            client("b", "t", &["#"], &["read"]),
        ],
        None,
    )
    .unwrap_err();
    assert!(shared.to_string().contains("another client's"));
    let max = ClientSettings {
        max_scheduled: Some(5),
        ..client("a", "t", &["#"], &["submit"])
    };
    let err = Authenticator::from_settings(&settings(vec![max]), "127.0.0.1:1", false).unwrap_err();
    assert!(err.to_string().contains("needs a ledger"), "{err}");
}

#[test]
fn a_rotation_accepts_both_tokens() {
    let entry = ClientSettings {
        token_sha256: TokenHashes::Many(vec![token::hash_hex("new"), token::hash_hex("old")]),
        ..client("a", "unused", &["#"], &["read"])
    };
    let set = ClientSet::build(&[entry], None).unwrap();
    assert_eq!(set.authenticate("new").unwrap().name, "a");
    assert_eq!(set.authenticate("old").unwrap().name, "a");
    assert!(set.authenticate("unused").is_none());
}

#[test]
fn the_rate_limit_is_a_token_bucket_kept_across_reloads() {
    let limited = ClientSettings {
        rate_per_second: Some(1),
        burst: Some(3),
        ..client("a", "t", &["#"], &["submit"])
    };
    let set = ClientSet::build(std::slice::from_ref(&limited), None).unwrap();
    let a = set.authenticate("t").unwrap();
    assert_eq!(a.take(2), Ok(()));
    assert_eq!(a.take(1), Ok(()));
    let Err(Throttled::Rate { retry_after }) = a.take(1) else {
        panic!("the bucket is empty")
    };
    assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_secs(1));
    assert_eq!(
        a.take(4),
        Err(Throttled::LargerThanBurst { tasks: 4, burst: 3 })
    );
    // A reload that keeps rate and burst keeps the (empty) bucket.
    let reloaded = ClientSet::build(std::slice::from_ref(&limited), Some(&set)).unwrap();
    assert!(matches!(
        reloaded.authenticate("t").unwrap().take(1),
        Err(Throttled::Rate { .. })
    ));
    // A new rate is a new bucket.
    let faster = ClientSettings {
        rate_per_second: Some(100),
        ..limited
    };
    let changed = ClientSet::build(&[faster], Some(&set)).unwrap();
    assert_eq!(changed.authenticate("t").unwrap().take(3), Ok(()));
}

#[test]
fn quotas_count_reservations_until_refreshed() {
    let entry = ClientSettings {
        max_scheduled: Some(3),
        ..client("a", "t", &["#"], &["submit"])
    };
    let set = ClientSet::build(&[entry], None).unwrap();
    let a = set.authenticate("t").unwrap();
    let usage = Usage::default();
    assert_eq!(usage.reserve(&a, 2), Ok(()));
    assert_eq!(
        usage.reserve(&a, 2),
        Err(Throttled::Quota {
            max_scheduled: 3,
            scheduled: 2
        })
    );
    usage.give_back("a", 1);
    assert_eq!(usage.reserve(&a, 2), Ok(()));
    assert_eq!(usage.get("a"), 3);
    usage.set("a", 0);
    assert_eq!(usage.reserve(&a, 3), Ok(()));
}

#[test]
fn the_clients_file_is_read_again_on_reload() {
    let path =
        std::env::temp_dir().join(format!("delayline-clients-{}.toml", uuid::Uuid::new_v4()));
    let entry = |name: &str, token: &str| {
        format!(
            "[[clients]]\nname = \"{name}\"\ntoken_sha256 = \"{}\"\ndestinations = [\"#\"]\npermissions = [\"submit\"]\n",
            token::hash_hex(token)
        )
    };
    std::fs::write(&path, entry("first", "t1")).unwrap();
    let auth = Authenticator::from_settings(
        &AuthSettings {
            clients_file: path.display().to_string(),
            ..AuthSettings::default()
        },
        "0.0.0.0:1",
        true,
    )
    .unwrap();
    assert!(auth.authenticate(Some("t1")).is_ok());
    std::fs::write(&path, entry("second", "t2")).unwrap();
    assert_eq!(auth.reload().unwrap(), 1);
    assert!(auth.authenticate(Some("t1")).is_err());
    assert!(auth.authenticate(Some("t2")).is_ok());
    // A broken file leaves the clients in use as they were.
    std::fs::write(&path, "[[clients]]\nname = \"x\"\ntoken = \"plain\"\n").unwrap();
    let err = auth.reload().unwrap_err().to_string();
    assert!(err.contains("token"), "{err}");
    assert!(auth.authenticate(Some("t2")).is_ok());
    std::fs::remove_file(&path).unwrap();
    assert!(auth.reload().is_err());
    assert!(auth.authenticate(Some("t2")).is_ok());
}

/// The security page's table of permissions names every permission the
/// code knows, in the code's order, and no other: `token create --help`
/// lists them from the same `Permission::ALL`.
#[test]
fn the_security_page_lists_every_permission() {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/security.md")).unwrap();
    let documented: Vec<&str> = page
        .lines()
        .skip_while(|line| !line.starts_with("| permission |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .filter_map(|line| line.split('`').nth(1))
        .collect();
    let known: Vec<&str> = Permission::ALL.iter().map(|p| p.as_str()).collect();
    assert_eq!(documented, known);
}
