//! What is refused or retried: server errors after retries, an unreachable Hub, bad arguments
//! (before any request), `hf://` paths, and the token looked up from the environment (in child
//! processes, so that no test changes this one's environment).

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

use ssl_net::hub::{self, HubOptions};

use crate::fake::{assert_mentions, error_text, FakeHub, Fault, Seen, WRITE_TOKEN};
use crate::{model_folder, CHILD_MARKER, FILES};

#[test]
fn server_errors_after_retries_say_to_retry() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let opts = HubOptions {
        retries: 3,
        ..hub.options(tmp.path())
    };
    hub.state().commit_fault = Some(Fault::Status(503));
    let err = error_text(hub::push_folder(
        "alice/m",
        &model_folder(tmp.path()),
        "m",
        &opts,
    ));
    assert_mentions(
        &err,
        &[
            &format!("upload of alice/m to {} failed", hub.endpoint),
            "503 Service Unavailable",
            "nothing was committed",
            "run the same command again to retry",
        ],
    );
    assert_eq!(hub.state().failed_commits, 3);
    assert!(hub.state().commits.is_empty());
}

#[test]
fn unreachable_hub_says_to_retry() {
    let tmp = tempfile::tempdir().unwrap();
    // A port nothing listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let opts = HubOptions {
        endpoint: Some(endpoint.clone()),
        token: Some(WRITE_TOKEN.to_string()),
        cache_dir: Some(tmp.path().join("cache")),
        retries: 1,
        ..Default::default()
    };
    let err = error_text(hub::push_folder(
        "alice/m",
        &model_folder(tmp.path()),
        "m",
        &opts,
    ));
    assert_mentions(
        &err,
        &[
            &format!("upload of alice/m to {endpoint} failed"),
            "nothing was committed",
            "run the same command again to retry",
        ],
    );
    let err = error_text(hub::pull("alice/m", &FILES, &opts));
    assert_mentions(
        &err,
        &[
            &format!("download of README.md from alice/m on {endpoint} failed"),
            "run the same command again to retry",
        ],
    );
}

#[test]
fn bad_arguments_fail_before_any_request() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let opts = hub.options(tmp.path());
    let folder = model_folder(tmp.path());

    for repo in [
        "noslash",
        "a/b/c",
        "alice/",
        "/m",
        "alice/has space",
        "alice/-m",
        "alice/m..x",
    ] {
        let err = error_text(hub::push_folder(repo, &folder, "m", &opts));
        assert_mentions(&err, &[&format!("invalid repository id `{repo}`")]);
        let err = error_text(hub::pull(repo, &FILES, &opts));
        assert_mentions(&err, &["invalid repository id"]);
    }
    let missing = tmp.path().join("no-such-run");
    let err = error_text(hub::push_folder("alice/m", &missing, "m", &opts));
    assert_mentions(&err, &["cannot read the folder to push", "no-such-run"]);
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let err = error_text(hub::push_folder("alice/m", &empty, "m", &opts));
    assert_mentions(&err, &["holds no files to push"]);
    let err = error_text(hub::push_folder("alice/m", &folder, "  ", &opts));
    assert_mentions(&err, &["commit message must not be empty"]);

    assert!(hub.state().requests.is_empty());
}

#[test]
fn parse_hf_path_cases() {
    let some = |repo: &str, rev: Option<&str>| Some((repo.to_string(), rev.map(str::to_string)));
    assert_eq!(
        hub::parse_hf_path("hf://alice/vicreg"),
        some("alice/vicreg", None)
    );
    assert_eq!(
        hub::parse_hf_path("hf://alice/vicreg@v2"),
        some("alice/vicreg", Some("v2"))
    );
    assert_eq!(
        hub::parse_hf_path("hf://alice/vicreg@refs/pr/1"),
        some("alice/vicreg", Some("refs/pr/1"))
    );
    assert_eq!(
        hub::parse_hf_path("hf://org-1/model_v1.5@0123abc"),
        some("org-1/model_v1.5", Some("0123abc"))
    );
    for bad in [
        "alice/vicreg",
        "hf://",
        "hf://alice",
        "hf://alice/",
        "hf:///vicreg",
        "hf://alice/vicreg@",
        "hf://a/b/c",
        "hf://alice/vic reg",
        "https://huggingface.co/alice/vicreg",
        "HF://alice/vicreg",
    ] {
        assert_eq!(hub::parse_hf_path(bad), None, "{bad}");
    }
}

/// Runs the ignored test `name` of this binary in a child process whose Hugging Face environment
/// is `HF_HOME=home` plus `env`, with no `HF_TOKEN`.
fn run_child(name: &str, home: &Path, env: &[(&str, &Path)]) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args([
        name,
        "--exact",
        "--ignored",
        "--test-threads=1",
        "--nocapture",
    ]);
    for key in [
        "HF_TOKEN",
        "HF_TOKEN_PATH",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN",
        "HF_ENDPOINT",
        "HF_HUB_CACHE",
        "XDG_CACHE_HOME",
    ] {
        command.env_remove(key);
    }
    command.env("HF_HOME", home).env(CHILD_MARKER, "1");
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child test {name} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn push_without_token_names_hf_token() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-token-here");
    run_child(
        "checks::child_push_without_token",
        tmp.path(),
        &[("HF_TOKEN_PATH", &missing)],
    );
}

#[test]
fn push_reads_the_token_file() {
    let tmp = tempfile::tempdir().unwrap();
    let token = tmp.path().join("token-file");
    std::fs::write(&token, format!("{WRITE_TOKEN}\n")).unwrap();
    run_child(
        "checks::child_push_with_token_file",
        tmp.path(),
        &[("HF_TOKEN_PATH", &token)],
    );
}

#[test]
#[ignore = "run by push_without_token_names_hf_token in a child process"]
fn child_push_without_token() {
    if std::env::var_os(CHILD_MARKER).is_none() {
        return;
    }
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let opts = HubOptions {
        token: None,
        ..hub.options(tmp.path())
    };
    let err = error_text(hub::push_folder(
        "alice/m",
        &model_folder(tmp.path()),
        "m",
        &opts,
    ));
    let token_path = std::env::var("HF_TOKEN_PATH").unwrap();
    assert_mentions(
        &err,
        &[
            "HF_TOKEN",
            "hf auth login",
            &token_path,
            &hub.endpoint,
            "alice/m",
        ],
    );
    assert!(
        hub.state().requests.is_empty(),
        "nothing may be sent without a token"
    );

    // Pulling a public repository needs no token.
    let owner = hub.options(tmp.path());
    hub::push_folder("alice/m", &model_folder(tmp.path()), "m", &owner).unwrap();
    let anonymous = HubOptions {
        cache_dir: Some(tmp.path().join("anonymous-cache")),
        ..opts
    };
    let snapshot = hub::pull("alice/m", &FILES, &anonymous).unwrap();
    assert!(snapshot.join("model.safetensors").is_file());
    let state = hub.state();
    let downloads = state
        .requests
        .iter()
        .filter(|r| r.path.contains("/resolve/"));
    assert!(downloads.clone().count() > 0);
    assert!(
        downloads.clone().all(|r| r.authorization.is_none()),
        "{:?}",
        state.requests
    );
}

#[test]
#[ignore = "run by push_reads_the_token_file in a child process"]
fn child_push_with_token_file() {
    if std::env::var_os(CHILD_MARKER).is_none() {
        return;
    }
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let opts = HubOptions {
        token: None,
        ..hub.options(tmp.path())
    };
    hub::push_folder("alice/m", &model_folder(tmp.path()), "m", &opts).unwrap();
    let state = hub.state();
    assert_eq!(state.commits.len(), 1);
    let bearer = format!("Bearer {WRITE_TOKEN}");
    let (hub_requests, storage): (Vec<&Seen>, Vec<&Seen>) =
        state.requests.iter().partition(|r| !r.storage);
    let all_authorised = hub_requests
        .iter()
        .all(|r| r.authorization.as_deref() == Some(&bearer as &str));
    assert!(all_authorised, "{:?}", state.requests);
    assert_eq!(
        storage.len(),
        1,
        "the weights' upload: {:?}",
        state.requests
    );
    assert!(storage[0].authorization.is_none(), "{:?}", storage[0]);
}
