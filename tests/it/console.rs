//! The web console over HTTP, as a browser uses it (forms, a cookie,
//! redirects), against the default configuration: sign in with a token,
//! find and filter tasks, cancel and reschedule with the API's answers and
//! permissions, forms refused without their token or from another site,
//! schedules paused, the level chart's data; then the same in Debian's
//! Chromium, driven by Playwright (`tests/browser/console.cjs`), which also
//! takes the README's screenshots.

use std::time::Duration;

use delayline::auth::token::hash_hex;
use delayline::auth::{ClientSettings, TokenHashes};
use delayline::cascade::QueueType;
use serde_json::{Value, json};

use crate::common::node::node;
use crate::common::{Backend, TestApp, TestConsumer, test_settings, with_ledger};

pub(crate) struct Browser {
    http: reqwest::Client,
    base: String,
    cookie: String,
}

impl Browser {
    pub(crate) async fn sign_in(app: &TestApp, token: &str) -> Browser {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let response = http
            .post(format!("{}/console/login", app.base))
            .form(&[("token", token)])
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 303);
        let set = response.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            set.contains("HttpOnly") && set.contains("SameSite=Strict"),
            "{set}"
        );
        Browser {
            http,
            base: app.base.clone(),
            cookie: set.split(';').next().unwrap().to_owned(),
        }
    }

    pub(crate) async fn get(&self, path: &str) -> (u16, String) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    pub(crate) async fn post(
        &self,
        path: &str,
        form: &[(&str, &str)],
        site: &str,
    ) -> (u16, String) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .header("sec-fetch-site", site)
            .form(form)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let location = response
            .headers()
            .get("location")
            .map(|l| l.to_str().unwrap().to_owned());
        (status, location.unwrap_or(response.text().await.unwrap()))
    }
}

/// The form token a page carries.
pub(crate) fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("a form with its token: {page}"))
        + 19;
    page[at..at + 64].to_owned()
}

async fn api_task(app: &TestApp, token: &str, id: &str) -> Value {
    app.http
        .get(format!("{}/v1/tasks/{id}", app.base))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_finds_cancels_and_reschedules_with_the_apis_permissions() {
    let mut settings = with_ledger(test_settings(16, 100, QueueType::Quorum), Backend::Sqlite);
    let client = |name: &str, permissions: &[&str]| ClientSettings {
        name: name.to_owned(),
        token_sha256: TokenHashes::One(hash_hex(&format!("tok-{name}"))),
        destinations: vec!["#".to_owned()],
        permissions: permissions.iter().map(|p| (*p).to_owned()).collect(),
        ..ClientSettings::default()
    };
    settings.auth.clients = vec![
        client(
            "ops",
            &["submit", "read", "cancel", "reschedule", "schedule"],
        ),
        client("viewer", &["submit", "read"]),
    ];
    let mut app = TestApp::spawn(settings).await;
    let mut consumer = TestConsumer::bind(&mut app, "console.a").await;
    for id in ["c-1", "c-2"] {
        let answer = app
            .http
            .post(format!("{}/v1/tasks", app.base))
            .bearer_auth("tok-ops")
            .json(
                &json!({"id": id, "destination": "console.a", "delay": "1h", "payload": {"n": 1}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 202);
    }

    // Without a session, the sign-in page; a wrong token is refused.
    let anonymous = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let bare = anonymous
        .get(format!("{}/console", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (
            bare.status().as_u16(),
            bare.headers()["location"].to_str().unwrap()
        ),
        (303, "/console/login")
    );
    let wrong = anonymous
        .post(format!("{}/console/login", app.base))
        .form(&[("token", "nope")])
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);

    let ops = Browser::sign_in(&app, "tok-ops").await;
    let (status, overview) = ops.get("/console").await;
    assert_eq!(status, 200);
    assert!(
        overview.contains("Messages held per level") && overview.contains("Ready"),
        "{overview}"
    );
    let (status, levels) = ops.get("/console/levels").await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&levels)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        16
    );

    // Find by id, filter by destination and state.
    let (status, location) = ops.get("/console/tasks?id=c-1").await;
    assert_eq!(status, 303, "{location}");
    let (_, listed) = ops
        .get("/console/tasks?destination=console.a&state=scheduled")
        .await;
    assert!(listed.contains("c-1") && listed.contains("c-2"), "{listed}");
    let (status, page) = ops.get("/console/tasks/c-1").await;
    assert_eq!(status, 200);
    assert!(
        page.contains("Cancel task") && page.contains("Reschedule"),
        "{page}"
    );
    assert!(
        page.contains("&quot;n&quot;: 1") || page.contains("\"n\": 1"),
        "the payload, pretty: {page}"
    );
    let csrf = csrf_of(&page);

    // A form without its token, or from another site, changes nothing.
    let (status, _) = ops
        .post("/console/tasks/c-1/cancel", &[("csrf", "x")], "same-origin")
        .await;
    assert_eq!(status, 403);
    let (status, _) = ops
        .post(
            "/console/tasks/c-1/cancel",
            &[("csrf", &csrf)],
            "cross-site",
        )
        .await;
    assert_eq!(status, 403);
    assert_eq!(api_task(&app, "tok-ops", "c-1").await["state"], "scheduled");

    let (status, location) = ops
        .post(
            "/console/tasks/c-1/cancel",
            &[("csrf", &csrf)],
            "same-origin",
        )
        .await;
    assert_eq!(status, 303);
    assert!(location.contains("done=cancelled"), "{location}");
    assert_eq!(api_task(&app, "tok-ops", "c-1").await["state"], "cancelled");
    let (_, page) = ops.get(&location).await;
    assert!(
        page.contains("cancelled") && !page.contains("Cancel task"),
        "{page}"
    );
    // Cancelling again answers what the API answers.
    let (_, again) = ops
        .post(
            "/console/tasks/c-2/reschedule",
            &[("csrf", &csrf), ("delay", "soon")],
            "same-origin",
        )
        .await;
    assert!(again.contains("error=invalid_delay"), "{again}");

    let (status, location) = ops
        .post(
            "/console/tasks/c-2/reschedule",
            &[("csrf", &csrf), ("delay", "2s")],
            "same-origin",
        )
        .await;
    assert_eq!(status, 303);
    assert!(location.contains("done=moved"), "{location}");
    assert_eq!(api_task(&app, "tok-ops", "c-2").await["revision"], 2);
    let arrived = consumer
        .next(Duration::from_secs(15))
        .await
        .expect("c-2 arrives");
    assert_eq!(arrived.message_id(), "c-2");
    assert!(
        consumer.next(Duration::from_secs(2)).await.is_none(),
        "c-1 was cancelled"
    );

    // A token without `cancel` sees no button, and the server refuses anyway.
    let viewer = Browser::sign_in(&app, "tok-viewer").await;
    let (status, _) = viewer.get("/console/tasks/c-1").await;
    assert_eq!(status, 404, "another client's task");
    let mut posted = app
        .http
        .post(format!("{}/v1/tasks", app.base))
        .bearer_auth("tok-viewer")
        .json(&json!({"id": "c-3", "destination": "console.a", "delay": "1h"}))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 202);
    let (_, page) = viewer.get("/console/tasks/c-3").await;
    assert!(
        !page.contains("Cancel task") && !page.contains("Reschedule"),
        "{page}"
    );
    let (status, _) = viewer
        .post(
            "/console/tasks/c-3/cancel",
            &[("csrf", &csrf)],
            "same-origin",
        )
        .await;
    assert_eq!(status, 403, "another session's form token");
    // Its own form token (in its sign-out form), and still no permission.
    let viewer_csrf = csrf_of(&page);
    assert_ne!(viewer_csrf, csrf);
    let (status, refused) = viewer
        .post(
            "/console/tasks/c-3/cancel",
            &[("csrf", &viewer_csrf)],
            "same-origin",
        )
        .await;
    assert_eq!(status, 403);
    assert!(refused.contains("forbidden"), "{refused}");
    assert_eq!(
        api_task(&app, "tok-viewer", "c-3").await["state"],
        "scheduled"
    );

    // Schedules: listed and paused from the console.
    posted = app
        .http
        .post(format!("{}/v1/schedules", app.base))
        .bearer_auth("tok-ops")
        .json(&json!({"id": "nightly", "destination": "console.a", "cron": "0 3 * * *"}))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 201);
    let (_, page) = ops.get("/console/schedules").await;
    assert!(
        page.contains("nightly") && page.contains("0 3 * * *"),
        "{page}"
    );
    let (status, _) = ops
        .post(
            "/console/schedules/nightly/pause",
            &[("csrf", &csrf)],
            "same-origin",
        )
        .await;
    assert_eq!(status, 303);
    let (_, page) = ops.get("/console/schedules").await;
    assert!(
        page.contains("paused") && page.contains(">resume<"),
        "{page}"
    );
    let (status, _) = ops.get("/console/problems").await;
    assert_eq!(status, 200);
}

pub(crate) fn client(name: &str, permissions: &[&str]) -> ClientSettings {
    ClientSettings {
        name: name.to_owned(),
        token_sha256: TokenHashes::One(hash_hex(&format!("tok-{name}"))),
        destinations: vec!["#".to_owned()],
        permissions: permissions.iter().map(|p| (*p).to_owned()).collect(),
        ..ClientSettings::default()
    }
}

async fn post(app: &TestApp, token: &str, route: &str, body: Value) -> reqwest::StatusCode {
    let answer = app
        .http
        .post(format!("{}{route}", app.base))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    answer.status()
}

/// Where the screenshots go: `DLTEST_SCREENSHOTS` (the README's come from
/// `DLTEST_SCREENSHOTS=docs/console`), or under `target/`.
fn screenshots() -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let folder = std::env::var("DLTEST_SCREENSHOTS")
        .map(|f| root.join(f))
        .unwrap_or_else(|_| root.join("target/console-screenshots"));
    std::fs::create_dir_all(&folder).unwrap();
    folder
}

/// In Chromium, on the default configuration (quorum queues, the SQLite
/// ledger, the release stage, the default unit and levels): sign in with
/// the keyboard, see the level chart follow tasks as they flow, find a task
/// by id, filter, cancel one (never delivered), reschedule one (its new due
/// time is the API's), pause a schedule, requeue the unroutable queue, a
/// read-only token unable to cancel, every page labelled, in contrast and
/// no wider than a phone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_works_in_chromium() {
    let chromium = std::env::var("DLTEST_CHROMIUM").unwrap_or("/usr/bin/chromium".to_owned());
    assert!(
        std::path::Path::new(&chromium).exists(),
        "{chromium} is missing: `bash tests/run` installs it (apt-get install chromium)"
    );
    let defaults = delayline::config::Settings::default().cascade;
    let mut settings = with_ledger(
        test_settings(defaults.levels, defaults.unit_ms, defaults.queue_type),
        Backend::Sqlite,
    );
    settings.metrics.queue_poll_ms = 1_000;
    settings.auth.clients = vec![
        client(
            "ops",
            &[
                "submit",
                "read",
                "cancel",
                "reschedule",
                "schedule",
                "admin",
            ],
        ),
        client("viewer", &["submit", "read"]),
    ];
    let mut app = TestApp::spawn(settings).await;
    let destination = format!("{}.browser", app.cascade.prefix());
    let nowhere = format!("{}.nowhere", app.cascade.prefix());
    let mut consumer = TestConsumer::bind(&mut app, &destination).await;
    let task = |id: &str, to: &str, delay: &str| json!({"id": id, "destination": to, "delay": delay, "payload": {"id": id}});
    for (token, body) in [
        ("tok-ops", task("b-move", &destination, "1h")),
        ("tok-ops", task("b-other", &destination, "1h")),
        ("tok-viewer", task("b-keep", &destination, "1h")),
        ("tok-ops", task("b-nowhere", &nowhere, "1s")),
    ] {
        assert_eq!(post(&app, token, "/v1/tasks", body).await, 202);
    }
    let schedule =
        json!({"id": "b-every", "destination": destination, "every": "1h", "payload": {}});
    assert_eq!(post(&app, "tok-ops", "/v1/schedules", schedule).await, 201);
    // The requeue the Problems page acts through is an administrator's.
    assert_eq!(
        post(&app, "tok-viewer", "/v1/unroutable/requeue", json!({})).await,
        403
    );

    let mut script = node();
    script
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/browser/console.cjs"
        ))
        .env("BASE", &app.base)
        .env("OPS_TOKEN", "tok-ops")
        .env("VIEWER_TOKEN", "tok-viewer")
        .env("DEST", &destination)
        .env("NOWHERE", &nowhere)
        .env("SHOTS", screenshots())
        .env("CHROMIUM", &chromium);
    let output = tokio::task::spawn_blocking(move || script.output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the browser test failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_str(stdout.trim().lines().last().unwrap()).unwrap();

    // What the browser did, as the API and the consumer see it.
    assert_eq!(
        api_task(&app, "tok-ops", "b-cancel").await["state"],
        "cancelled"
    );
    let moved = api_task(&app, "tok-ops", "b-move").await;
    assert_eq!(
        (moved["revision"].clone(), moved["deliver_at"].clone()),
        (json!(2), seen["moved_due"].clone())
    );
    assert_eq!(
        api_task(&app, "tok-viewer", "b-keep").await["state"],
        "scheduled"
    );
    assert_eq!(
        api_task(&app, "tok-ops", "b-other").await["state"],
        "scheduled"
    );
    let (_, paused) = get_json(&app, "/v1/schedules/b-every").await;
    assert_eq!(paused["state"], "paused");
    // b-control was due with b-cancel: once it came (and a little after),
    // b-cancel never did.
    let mut control_at = None;
    while control_at.is_none_or(|at: std::time::Instant| at.elapsed() < Duration::from_secs(2)) {
        let wait = Duration::from_secs(if control_at.is_some() { 2 } else { 20 });
        let Some(message) = consumer.next(wait).await else {
            assert!(control_at.is_some(), "b-control never arrived");
            continue;
        };
        assert_ne!(
            message.message_id(),
            "b-cancel",
            "a cancelled task was delivered"
        );
        if message.message_id() == "b-control" {
            control_at = Some(std::time::Instant::now());
        }
    }
}

async fn get_json(app: &TestApp, route: &str) -> (u16, Value) {
    let answer = app
        .http
        .get(format!("{}{route}", app.base))
        .bearer_auth("tok-ops")
        .send()
        .await
        .unwrap();
    (answer.status().as_u16(), answer.json().await.unwrap())
}

/// Every console answer carries the headers that keep it from being
/// framed, sniffed or leaking its URLs, with a policy that allows nothing
/// but the console's own files (and the pages need nothing else: no inline
/// script or style). The cookie is a session, not the token: useless
/// against the API, and dead once signed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_sends_its_security_headers_and_holds_sessions_not_tokens() {
    let mut settings = with_ledger(test_settings(8, 100, QueueType::Quorum), Backend::Sqlite);
    settings.auth.clients = vec![client("ops", &["admin"])];
    let app = TestApp::spawn(settings).await;
    let ops = Browser::sign_in(&app, "tok-ops").await;
    let session = ops.cookie.split_once('=').unwrap().1.to_owned();
    assert_ne!(session, "tok-ops");
    assert_eq!(session.len(), 43, "256 random bits");

    let anonymous = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let get = |path: &str, cookie: Option<&str>| {
        let mut request = anonymous.get(format!("{}{path}", app.base));
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        request.send()
    };
    for (path, cookie, status) in [
        ("/console", Some(ops.cookie.as_str()), 200),
        ("/console/login", None, 200),
        ("/console", None, 303),
        ("/console/levels", Some(ops.cookie.as_str()), 200),
        ("/console/tasks/none-such", Some(ops.cookie.as_str()), 404),
        ("/console/assets/console.css", None, 200),
        ("/console/assets/console.js", None, 200),
    ] {
        let answer = get(path, cookie).await.unwrap();
        assert_eq!(answer.status().as_u16(), status, "{path}");
        let headers = answer.headers();
        let policy = headers["content-security-policy"].to_str().unwrap();
        for directive in [
            "default-src 'self'",
            "frame-ancestors 'none'",
            "script-src 'self'",
        ] {
            assert!(policy.contains(directive), "{path}: {policy}");
        }
        assert_eq!(headers["x-frame-options"], "DENY", "{path}");
        assert_eq!(headers["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(headers["referrer-policy"], "no-referrer", "{path}");
        if status != 303 && !path.contains("/assets/") {
            assert!(
                headers["content-type"].to_str().unwrap().starts_with(
                    if path.ends_with("levels") {
                        "application/json"
                    } else {
                        "text/html"
                    }
                ),
                "{path}"
            );
            let body = answer.text().await.unwrap();
            // Nothing the policy would block: no inline script or style.
            assert!(
                !body.contains("style=")
                    && !body.contains("<style")
                    && !body.contains("<script>")
                    && !body.contains("onsubmit"),
                "{path}: {body}"
            );
            if path.ends_with("none-such") {
                assert!(body.contains("task_not_found"), "{body}");
            }
            if path.ends_with("levels") {
                let levels: Value = serde_json::from_str(&body).unwrap();
                assert!(
                    levels
                        .as_array()
                        .unwrap()
                        .iter()
                        .all(|l| l["messages"].is_u64()),
                    "counts, not floats: {body}"
                );
            }
        }
    }

    // The cookie's value is no API token.
    let as_token = app
        .http
        .get(format!("{}/v1/tasks", app.base))
        .bearer_auth(&session)
        .send()
        .await
        .unwrap();
    assert_eq!(as_token.status(), 401);

    // Signed out, the same cookie opens nothing.
    let (_, page) = ops.get("/console").await;
    let (status, location) = ops
        .post(
            "/console/logout",
            &[("csrf", &csrf_of(&page))],
            "same-origin",
        )
        .await;
    assert_eq!((status, location.as_str()), (303, "/console/login"));
    let (status, _) = ops.get("/console").await;
    assert_eq!(status, 303, "the old cookie after sign-out");
    app.stop().await.unwrap();
}

/// The Limits page lists the limits the client may see, says why each
/// holds and how many wait, and pauses and resumes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_limits_and_why_they_hold_and_pauses_them() {
    let mut settings = with_ledger(test_settings(6, 100, QueueType::Quorum), Backend::Sqlite);
    let client = |name: &str, permissions: &[&str]| ClientSettings {
        name: name.to_owned(),
        token_sha256: TokenHashes::One(hash_hex(&format!("tok-{name}"))),
        destinations: vec!["billing.#".to_owned()],
        permissions: permissions.iter().map(|p| (*p).to_owned()).collect(),
        ..ClientSettings::default()
    };
    settings.auth.clients = vec![
        client("operator", &["limits", "submit"]),
        client("root", &["admin"]),
    ];
    let app = TestApp::spawn(settings).await;
    let put = async |name: &str, body: Value| {
        let response = app
            .http
            .put(format!("{}/v1/limits/{name}", app.base))
            .bearer_auth("tok-root")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
    };
    put(
        "invoices",
        json!({"destinations": "billing.invoice", "paused": true}),
    )
    .await;
    put(
        "everything",
        json!({"destinations": "#", "rate_per_sec": 1000}),
    )
    .await;
    let response = app
        .http
        .post(format!("{}/v1/tasks", app.base))
        .bearer_auth("tok-operator")
        .json(&json!({"destination": "billing.invoice", "delay_ms": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let browser = Browser::sign_in(&app, "tok-operator").await;
    crate::common::eventually("the paused task waits", async || {
        browser
            .get("/console/limits")
            .await
            .1
            .contains("<td>1</td>")
    })
    .await;
    let (status, page) = browser.get("/console/limits").await;
    assert_eq!(status, 200);
    assert!(
        page.contains("invoices") && page.contains("paused until resumed"),
        "{page}"
    );
    assert!(
        !page.contains("everything"),
        "a limit beyond its destinations: {page}"
    );
    let csrf = csrf_of(&page);
    let (status, location) = browser
        .post(
            "/console/limits/everything/pause",
            &[("csrf", &csrf)],
            "same-origin",
        )
        .await;
    assert_eq!(status, 404, "{location}");
    let (status, location) = browser
        .post(
            "/console/limits/invoices/resume",
            &[("csrf", &csrf)],
            "same-origin",
        )
        .await;
    assert_eq!((status, location.as_str()), (303, "/console/limits"));
    crate::common::eventually("resumed, the task is released", async || {
        browser
            .get("/console/limits")
            .await
            .1
            .contains("nothing held")
    })
    .await;
}
