//! What falls due together (issue 67): a burst's tasks given leads through
//! the levels, staged in the ledger until their instant and released from
//! there, never early; a staged task cancelled, moved, listed; a SIGKILL
//! while a burst is staged and while it is released; and the strand watch
//! telling a level that passes a burst from one that stopped. 100 ms units,
//! quorum levels, the SQLite ledger: the default configuration but for the
//! unit (and, where a test says so, a lower level rate, so that a few
//! hundred tasks make a burst).

use delayline::testkit::now_ms;
use std::collections::HashSet;
use std::time::Duration;

use delayline::cascade::QueueType;
use delayline::clock::{format_epoch_ms, parse_epoch_ms};
use delayline::config::Settings;
use serde_json::{Value, json};

use crate::common::{
    Backend, Cleanup, TestApp, TestConsumer, eventually, free_port, sample, serve_declared,
    spawn_binary, test_settings, wait_ready_at, with_ledger,
};

/// 8 levels of 100 ms, SQLite; a level planned to pass 10 tasks a unit
/// (100 a second), leads of up to 3 s.
fn burst_settings() -> Settings {
    let mut settings = with_ledger(test_settings(8, 100, QueueType::Quorum), Backend::Sqlite);
    settings.cascade.burst_level_rate = 100;
    settings.cascade.burst_window_ms = 3_000;
    settings
}

/// `count` tasks to `destination`, all due at `deliver_at_ms`, in batches
/// of 25 a fifth of a second apart (tasks entering the chain at one moment
/// share their first level: what they can be spread over is the levels
/// below their delay): the answers.
async fn post_burst(
    http: &reqwest::Client,
    base: &str,
    destination: &str,
    count: usize,
    deliver_at_ms: u64,
) -> Vec<Value> {
    let at = format_epoch_ms(deliver_at_ms);
    let mut accepted = Vec::with_capacity(count);
    while accepted.len() < count {
        let tasks: Vec<Value> = (0..25.min(count - accepted.len()))
            .map(|_| json!({"destination": destination, "deliver_at": at}))
            .collect();
        let response = http
            .post(format!("{base}/v1/tasks/batch"))
            .json(&json!({"tasks": tasks}))
            .send()
            .await
            .unwrap();
        let batch: Value = response.json().await.unwrap();
        let results = batch["results"].as_array().unwrap();
        accepted.extend(results.iter().map(|item| item["task"].clone()));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    accepted
}

fn ids(tasks: &[Value]) -> HashSet<String> {
    tasks
        .iter()
        .map(|task| task["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_staged_ahead_and_released_at_its_instant_cancel_and_move_still_apply() {
    let mut app = TestApp::spawn(burst_settings()).await;
    let mut consumer = TestConsumer::bind(&mut app, "#.burst").await;
    let deliver_at_ms = now_ms() + 5_000;
    let tasks = post_burst(&app.http, &app.base, "burst", 150, deliver_at_ms).await;
    assert_eq!(tasks.len(), 150);
    let keys: HashSet<&str> = tasks
        .iter()
        .map(|task| task["routing_key"].as_str().unwrap())
        .collect();
    assert!(keys.len() > 5, "leads spread the burst: {keys:?}");
    // What the levels had no room for went into the ledger as it was
    // admitted, answered `staged`; the rest into the chain.
    let answered = |state: &str| tasks.iter().filter(|task| task["state"] == state).count();
    assert!(
        answered("staged") > 0 && answered("scheduled") > 0,
        "staged {}, scheduled {}",
        answered("staged"),
        answered("scheduled")
    );

    // Staged: in the ledger alone, listed, counted in the forecast.
    eventually("tasks of the burst are staged", async || {
        let (_, page) = app.get("/v1/tasks?state=staged&limit=100").await;
        page["tasks"].as_array().unwrap().len() >= 2
    })
    .await;
    let (_, page) = app.get("/v1/tasks?state=staged&limit=100").await;
    let listed = page["tasks"].as_array().unwrap();
    let cancelled = listed[0]["id"].as_str().unwrap().to_owned();
    let moved = listed[1]["id"].as_str().unwrap().to_owned();
    let (_, one) = app.get(&format!("/v1/tasks/{cancelled}")).await;
    assert_eq!(one["state"], "staged", "{one}");
    assert!(now_ms() < deliver_at_ms, "staged before the instant");

    let (status, answer) = app.delete(&format!("/v1/tasks/{cancelled}")).await;
    assert_eq!(
        (status, &answer["state"]),
        (200, &json!("cancelled")),
        "{answer}"
    );
    let (status, answer) = app
        .patch(&format!("/v1/tasks/{moved}"), &json!({"delay_ms": 5_000}))
        .await;
    assert_eq!(status, 200, "{answer}");
    let moved_to = parse_epoch_ms(answer["deliver_at"].as_str().unwrap()).unwrap();

    let mut expected = ids(&tasks);
    expected.remove(&cancelled);
    let duplicates = consumer
        .expect_each_never_early(expected, Duration::from_secs(20))
        .await;
    assert_eq!(duplicates, 0);
    assert!(
        consumer.next(Duration::from_millis(1_500)).await.is_none(),
        "the cancelled staged task never comes"
    );
    let (_, seen) = app.get(&format!("/v1/tasks/{moved}")).await;
    assert_eq!(
        (&seen["state"], &seen["revision"]),
        (&json!("delivered"), &json!(2))
    );
    let delivered_at = parse_epoch_ms(seen["delivered_at"].as_str().unwrap()).unwrap();
    assert!(delivered_at >= moved_to, "{seen}");

    let scrape = app.scrape().await;
    let staged = sample(&scrape, "delayline_tasks_staged_total").unwrap_or(0.0);
    let released = sample(&scrape, "delayline_staged_released_total").unwrap_or(0.0);
    assert!(
        staged >= 2.0 && released >= 1.0,
        "staged {staged}, released {released}"
    );
    assert_eq!(sample(&scrape, "delayline_tasks_resent_total"), Some(0.0));
    println!(
        "burst of 150: {} routes, {staged} staged, {released} released from the ledger",
        keys.len()
    );
}

/// The number of tasks in state `state`, as the API lists them (up to 1,000).
async fn count_in_state(http: &reqwest::Client, base: &str, state: &str) -> usize {
    let page: Value = http
        .get(format!("{base}/v1/tasks?state={state}&limit=1000"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    page["tasks"].as_array().map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_while_a_burst_is_staged_and_while_it_is_released_loses_nothing() {
    let settings = burst_settings();
    let cascade = settings.cascade().unwrap();
    let mut cleanup = Cleanup::for_settings(&settings);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let mut child = serve_declared(&settings, port, &http, &base).await;
    let mut consumer = TestConsumer::bind_to(
        &mut cleanup,
        &cascade,
        cascade.business_exchange(),
        &cascade.binding_key("killed"),
    )
    .await;
    let deliver_at_ms = now_ms() + 7_000;
    let tasks = post_burst(&http, &base, "killed", 400, deliver_at_ms).await;
    let expected = ids(&tasks);
    assert_eq!(expected.len(), 400);

    // Killed while tasks are staged, well before their instant.
    eventually("tasks of the burst are staged", async || {
        count_in_state(&http, &base, "staged").await >= 20
    })
    .await;
    assert!(
        now_ms() + 1_000 < deliver_at_ms,
        "staged ahead of the instant"
    );
    child.kill().await.unwrap();
    let mut child = spawn_binary(&settings, port);
    wait_ready_at(&http, &base).await;
    assert!(count_in_state(&http, &base, "staged").await > 0);

    // Killed again while the staged release publishes them.
    let until_instant = deliver_at_ms.saturating_sub(now_ms()) + 15;
    tokio::time::sleep(Duration::from_millis(until_instant)).await;
    child.kill().await.unwrap();
    let mut child = spawn_binary(&settings, port);
    wait_ready_at(&http, &base).await;

    // A take the killed replica leased is staged again when its lease runs
    // out (10 s), and released then.
    let duplicates = consumer
        .expect_each_never_early(expected, Duration::from_secs(30))
        .await;
    println!("a burst of 400 through two SIGKILLs: {duplicates} duplicates");
    assert!(duplicates <= 400, "{duplicates}");
    // Every task may have arrived (the killed replica published it) while
    // its row still waits out the dead lease: it leaves `staged` then.
    eventually("no task of the burst stays staged", async || {
        count_in_state(&http, &base, "staged").await == 0
    })
    .await;
    child.kill().await.unwrap();
}

/// A level passing a burst holds its probe behind the burst, and probes of
/// quiet levels overtake it: that alone once took the level for stranded
/// and published its tasks again. Without leads (today's routing), 8,000
/// tasks due at one instant pass the levels one worker at a time, more
/// than the margin (2 s) behind: no level is taken over and nothing is
/// published again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_level_passing_a_burst_is_not_taken_for_stranded() {
    let mut settings = burst_settings();
    settings.cascade.burst_level_rate = 0;
    // Twice the default margin: on a loaded machine (CI runs several tests
    // on two cores) the first level can truly fall more than 2 s behind
    // before any task of the burst reaches the stage to show it moves, which
    // no watch can tell from a stop (the runbook's "A level far behind").
    settings.cascade.stranded_margin_ms = 4_000;
    let mut app = TestApp::spawn(settings).await;
    let mut consumer = TestConsumer::bind(&mut app, "#.together").await;
    let deliver_at_ms = now_ms() + 6_000;
    let at = format_epoch_ms(deliver_at_ms);
    let mut expected = HashSet::new();
    for _ in 0..8 {
        let tasks: Vec<Value> = (0..1_000)
            .map(|_| json!({"destination": "together", "deliver_at": at}))
            .collect();
        let (status, batch) = app.post("/v1/tasks/batch", &json!({"tasks": tasks})).await;
        assert_eq!(status, 200, "{batch}");
        let accepted: Vec<Value> = batch["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| item["task"].clone())
            .collect();
        expected.extend(ids(&accepted));
    }
    let duplicates = consumer
        .expect_each_never_early(expected, Duration::from_secs(60))
        .await;
    let scrape = app.scrape().await;
    let stranded = crate::strand::sum_of(&scrape, "delayline_level_stranded");
    let drained = crate::strand::sum_of(&scrape, "delayline_level_drained_total");
    let resent = sample(&scrape, "delayline_tasks_resent_total").unwrap_or(0.0);
    println!(
        "8,000 due at once: stranded {stranded}, drained {drained}, resent {resent}, duplicates {duplicates}"
    );
    assert_eq!((stranded, drained, resent), (0.0, 0.0, 0.0));
    assert_eq!(duplicates, 0);
}

/// A staged task whose destination a release limit holds at its moment
/// waits for the limit, as a due task the release stage claims does, and
/// arrives once resumed, never early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_task_of_a_held_destination_waits_for_its_limit() {
    let mut app = TestApp::spawn(burst_settings()).await;
    let mut consumer = TestConsumer::bind(&mut app, "#.limited").await;
    let (status, body) = app
        .put(
            "/v1/limits/limited",
            &json!({"destinations": "limited", "paused": true}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let deliver_at_ms = now_ms() + 5_000;
    let tasks = post_burst(&app.http, &app.base, "limited", 100, deliver_at_ms).await;
    eventually("tasks of the burst are staged", async || {
        count_in_state(&app.http, &app.base, "staged").await >= 2
    })
    .await;
    // Taken a little ahead of their moment (the claim's lead), they wait
    // from then on; past the moment, still nothing is published.
    eventually("every task waits for the limit", async || {
        count_in_state(&app.http, &app.base, "waiting").await == 100
    })
    .await;
    let past_the_moment = Duration::from_millis((deliver_at_ms + 300).saturating_sub(now_ms()));
    tokio::time::sleep(past_the_moment).await;
    assert!(consumer.next(Duration::from_millis(200)).await.is_none());
    assert_eq!(count_in_state(&app.http, &app.base, "waiting").await, 100);
    let (status, resumed) = app.post("/v1/limits/limited/resume", &json!({})).await;
    assert_eq!(status, 200, "{resumed}");
    let duplicates = consumer
        .expect_each_never_early(ids(&tasks), Duration::from_secs(20))
        .await;
    assert_eq!(duplicates, 0);
    let scrape = app.scrape().await;
    assert!(sample(&scrape, "delayline_tasks_staged_total").unwrap_or(0.0) >= 2.0);
}
