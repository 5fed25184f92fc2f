//! Pushes: a folder uploaded in one commit (inline files and LFS objects, in one piece or in
//! parts), the refusals that leave nothing committed, and the same push succeeding on a retry.

use std::path::{Path, PathBuf};

use ssl_net::hub::{self, HubOptions};

use crate::fake::{
    assert_mentions, error_text, sha256_hex, FakeHub, Fault, Seen, READ_TOKEN, WRITE_TOKEN,
};
use crate::{files_under, model_folder, FILES};

#[test]
fn push_then_pull_round_trips_the_bytes() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let folder = model_folder(tmp.path());
    let opts = HubOptions {
        private: true,
        ..hub.options(&tmp.path().join("cache"))
    };

    let url = hub::push_folder("alice/vicreg-digits", &folder, "Upload VICReg", &opts).unwrap();

    let (commit, requests) = {
        let state = hub.state();
        assert_eq!(state.commits.len(), 1, "exactly one commit");
        assert!(state.repos["alice/vicreg-digits"].private);
        // The Hub sees the token on every request; storage, on none.
        let bearer = format!("Bearer {WRITE_TOKEN}");
        let authorised = |r: &Seen| match r.storage {
            false => r.authorization.as_deref() == Some(&bearer as &str),
            true => r.authorization.is_none(),
        };
        assert!(
            state.requests.iter().all(authorised),
            "{:?}",
            state.requests
        );
        (state.commits[0].clone(), state.calls())
    };
    assert_eq!(commit.repo, "alice/vicreg-digits");
    assert_eq!(commit.summary, "Upload VICReg");
    assert_eq!(commit.files, FILES);
    assert_eq!(
        url,
        format!("{}/alice/vicreg-digits/commit/{}", hub.endpoint, commit.oid)
    );
    let post = |path: &str| ("POST".to_string(), path.to_string());
    let weights = std::fs::read(folder.join("model.safetensors")).unwrap();
    let oid = sha256_hex(&weights);
    assert_eq!(
        requests,
        [
            post("/api/repos/create"),
            post("/api/models/alice/vicreg-digits/preupload/main"),
            post("/alice/vicreg-digits.git/info/lfs/objects/batch"),
            ("PUT".to_string(), format!("/storage/{oid}")),
            post("/alice/vicreg-digits.git/info/lfs/objects/verify"),
            post("/api/models/alice/vicreg-digits/commit/main"),
        ]
    );

    let cache = tmp.path().join("fresh-cache");
    let snapshot = hub::pull("alice/vicreg-digits", &FILES, &hub.options(&cache)).unwrap();
    let repo_cache = cache.join("models--alice--vicreg-digits");
    assert_eq!(snapshot, repo_cache.join("snapshots").join(&commit.oid));
    let main_ref = std::fs::read_to_string(repo_cache.join("refs").join("main")).unwrap();
    assert_eq!(main_ref, commit.oid);
    for file in FILES {
        let pulled = std::fs::read(snapshot.join(file)).unwrap();
        assert_eq!(
            pulled,
            std::fs::read(folder.join(file)).unwrap(),
            "{file} differs"
        );
    }
    assert!(!snapshot.join("nested").exists());
}

#[test]
fn weights_travel_by_lfs_and_come_back_through_the_cache() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let folder = model_folder(tmp.path());
    hub::push_folder("alice/m", &folder, "v1", &hub.options(tmp.path())).unwrap();
    let weights = std::fs::read(folder.join("model.safetensors")).unwrap();
    let oid = sha256_hex(&weights);
    {
        let state = hub.state();
        let commit = &state.commits[0];
        assert_eq!(commit.lfs, [("model.safetensors".to_string(), oid.clone())]);
        assert_eq!(commit.files, FILES, "README.md and config.yaml inline");
        assert_eq!(state.lfs_objects[&oid], weights);
        assert_eq!(state.verified, std::slice::from_ref(&oid));
        let puts: Vec<&Seen> = state
            .requests
            .iter()
            .filter(|r| r.method == "PUT")
            .collect();
        assert_eq!(puts.len(), 1, "{:?}", state.requests);
        assert!(puts[0].storage, "{:?}", puts[0]);
        assert!(puts[0].authorization.is_none(), "no Hub token to storage");
    }

    hub.state().requests.clear();
    let cache = tmp.path().join("fresh-cache");
    let snapshot = hub::pull("alice/m", &FILES, &hub.options(&cache)).unwrap();
    for file in FILES {
        let pulled = std::fs::read(snapshot.join(file)).unwrap();
        assert_eq!(pulled, std::fs::read(folder.join(file)).unwrap(), "{file}");
    }
    // huggingface_hub's layout: the snapshot entry links to the blob named by the object id.
    let blob = cache.join("models--alice--m").join("blobs").join(&oid);
    assert_eq!(std::fs::read(&blob).unwrap(), weights);
    #[cfg(unix)]
    assert_eq!(
        std::fs::read_link(snapshot.join("model.safetensors")).unwrap(),
        Path::new("../../blobs").join(&oid)
    );
    let leftovers: Vec<PathBuf> = files_under(&cache)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".incomplete"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // The metadata comes from the Hub, with the token; the bytes from the CDN, without it.
    let state = hub.state();
    let cdn = state.storage_requests();
    assert_eq!(cdn.len(), 1, "{:?}", state.requests);
    assert_eq!(
        (cdn[0].method.as_str(), cdn[0].path.clone()),
        ("GET", format!("/cdn/{oid}"))
    );
    assert!(cdn[0].authorization.is_none(), "{:?}", cdn[0]);
    let bearer = format!("Bearer {WRITE_TOKEN}");
    let hub_requests = state.requests.iter().filter(|r| !r.storage);
    assert!(hub_requests
        .clone()
        .all(|r| r.authorization.as_deref() == Some(&bearer as &str)));
    let heads = hub_requests.filter(|r| r.method == "HEAD").count();
    assert_eq!(heads, FILES.len(), "{:?}", state.requests);
}

#[test]
fn an_lfs_object_the_hub_holds_is_not_uploaded_again() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let folder = model_folder(tmp.path());
    let opts = HubOptions {
        update: true,
        ..hub.options(tmp.path())
    };
    hub::push_folder("alice/m", &folder, "v1", &opts).unwrap();
    hub.state().requests.clear();

    // Same weights, new config.
    std::fs::write(folder.join("config.yaml"), "objective:\n  name: barlow\n").unwrap();
    hub::push_folder("alice/m", &folder, "v2", &opts).unwrap();
    let weights = std::fs::read(folder.join("model.safetensors")).unwrap();
    let state = hub.state();
    let calls = state.calls();
    assert!(
        calls.contains(&("POST".into(), "/alice/m.git/info/lfs/objects/batch".into())),
        "{calls:?}"
    );
    assert!(state.storage_requests().is_empty(), "{calls:?}");
    assert!(
        !calls.iter().any(|(_, path)| path.ends_with("/verify")),
        "{calls:?}"
    );
    assert_eq!(state.verified.len(), 1, "verified once, by the first push");
    let oid = sha256_hex(&weights);
    assert_eq!(
        state.commits[1].lfs,
        [("model.safetensors".to_string(), oid)]
    );
    drop(state);
    let files = hub.head_files("alice/m");
    assert_eq!(files["model.safetensors"], weights);
    assert_eq!(files["config.yaml"], b"objective:\n  name: barlow\n");
}

#[test]
fn failed_upload_to_storage_commits_nothing() {
    for fault in [Fault::Status(500), Fault::Drop] {
        let hub = FakeHub::start();
        let tmp = tempfile::tempdir().unwrap();
        let folder = model_folder(tmp.path());
        let opts = hub.options(tmp.path());
        hub.state().storage_fault = Some(fault);

        let err = error_text(hub::push_folder("alice/m", &folder, "m", &opts));
        assert_mentions(
            &err,
            &[
                "upload of model.safetensors (204800 bytes) for alice/m to the Hub's storage \
                 failed (",
                "nothing was committed",
                "run the same command again to retry",
            ],
        );
        if let Fault::Status(_) = fault {
            assert_mentions(
                &err,
                &["HTTP 500 Internal Server Error: storage unavailable"],
            );
        }
        {
            let state = hub.state();
            assert_eq!(state.failed_puts, opts.retries, "the upload is retried");
            assert!(state.commits.is_empty());
            assert!(state.lfs_objects.is_empty());
            let calls = state.calls();
            assert!(
                !calls.iter().any(|(_, p)| p.contains("/commit/")),
                "{calls:?}"
            );
        }

        // Storage is back: the same command uploads the weights and commits.
        hub.state().storage_fault = None;
        hub::push_folder("alice/m", &folder, "m", &opts).unwrap();
        let state = hub.state();
        assert_eq!(state.commits.len(), 1);
        let weights = std::fs::read(folder.join("model.safetensors")).unwrap();
        assert_eq!(state.lfs_objects[&sha256_hex(&weights)], weights);
    }
}

#[test]
fn large_weights_go_up_in_parts() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let folder = model_folder(tmp.path());
    let opts = hub.options(&tmp.path().join("cache"));
    hub.state().chunk_size = Some(64 * 1024);
    hub::push_folder("alice/m", &folder, "m", &opts).unwrap();

    let weights = std::fs::read(folder.join("model.safetensors")).unwrap();
    let oid = sha256_hex(&weights);
    {
        let state = hub.state();
        let storage: Vec<(String, String)> = state
            .storage_requests()
            .into_iter()
            .map(|r| (r.method, r.path))
            .collect();
        // 200 KiB in parts of 64 KiB: four parts, then their ETags.
        let part = |n: usize| ("PUT".to_string(), format!("/storage/{oid}/part/{n}"));
        let complete = ("POST".to_string(), format!("/storage/{oid}/complete"));
        assert_eq!(storage, [part(1), part(2), part(3), part(4), complete]);
        assert_eq!(
            state.parts[&(oid.clone(), 4)].len(),
            200 * 1024 - 3 * 64 * 1024
        );
        assert_eq!(state.lfs_objects[&oid], weights);
        assert_eq!(state.verified, std::slice::from_ref(&oid));
        assert_eq!(
            state.commits[0].lfs,
            [("model.safetensors".to_string(), oid)]
        );
    }
    let snapshot = hub::pull("alice/m", &FILES, &opts).unwrap();
    assert_eq!(
        std::fs::read(snapshot.join("model.safetensors")).unwrap(),
        weights
    );
}

#[test]
fn push_with_rejected_token_reports_http_401() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let opts = HubOptions {
        token: Some("hf_expired".to_string()),
        ..hub.options(tmp.path())
    };
    let err = error_text(hub::push_folder(
        "alice/m",
        &model_folder(tmp.path()),
        "m",
        &opts,
    ));
    let expected = format!("the Hub at {} refused the token (HTTP 401)", hub.endpoint);
    assert_mentions(&err, &[&expected, "HF_TOKEN", "write access to alice/m"]);
    assert!(hub.state().repos.is_empty());
}

#[test]
fn push_with_read_only_token_reports_http_403() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let opts = HubOptions {
        token: Some(READ_TOKEN.to_string()),
        ..hub.options(tmp.path())
    };
    let err = error_text(hub::push_folder(
        "alice/m",
        &model_folder(tmp.path()),
        "m",
        &opts,
    ));
    let expected = format!("the Hub at {} refused the token (HTTP 403)", hub.endpoint);
    assert_mentions(&err, &[&expected, "HF_TOKEN", "write access to alice/m"]);
    assert!(!err.contains("HTTP 401"), "{err}");
    assert!(hub.state().repos.is_empty());
}

#[test]
fn dropped_commit_fails_cleanly_and_the_same_push_then_succeeds() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let folder = model_folder(tmp.path());
    let opts = hub.options(tmp.path());
    hub.state().commit_fault = Some(Fault::Drop);

    let err = error_text(hub::push_folder("alice/m", &folder, "first try", &opts));
    assert_mentions(
        &err,
        &[
            &format!("upload of alice/m to {} failed", hub.endpoint),
            "nothing was committed",
            "run the same command again to retry",
        ],
    );
    {
        let state = hub.state();
        let attempts = state.failed_commits;
        assert_eq!(attempts, opts.retries, "a dropped commit is retried");
        assert!(state.commits.is_empty());
        assert!(
            state.repos.contains_key("alice/m"),
            "the repository was created"
        );
    }

    // The network is back: the same command reuses the model-less repository.
    let mut state = hub.state();
    state.commit_fault = None;
    state.requests.clear();
    drop(state);
    hub::push_folder("alice/m", &folder, "first try", &opts).unwrap();
    let state = hub.state();
    assert_eq!(state.commits.len(), 1);
    assert_eq!(state.commits[0].files, FILES);
    // Create (409), look for a model at the branch (none), then upload: the weights reached
    // storage on the first try, so the batch call asks for nothing and nothing is sent again.
    let post = |path: &str| ("POST".to_string(), path.to_string());
    assert_eq!(
        state.calls(),
        [
            post("/api/repos/create"),
            ("GET".into(), "/api/models/alice/m/revision/main".into()),
            post("/api/models/alice/m/preupload/main"),
            post("/alice/m.git/info/lfs/objects/batch"),
            post("/api/models/alice/m/commit/main"),
        ]
    );
    drop(state);
    let files = hub.head_files("alice/m");
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        [
            ".gitattributes",
            "README.md",
            "config.yaml",
            "model.safetensors"
        ]
    );
    assert_eq!(
        files["model.safetensors"],
        std::fs::read(folder.join("model.safetensors")).unwrap()
    );
}

#[test]
fn existing_model_needs_update() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let folder = model_folder(tmp.path());
    let opts = hub.options(tmp.path());
    hub::push_folder("alice/m", &folder, "v1", &opts).unwrap();

    let err = error_text(hub::push_folder("alice/m", &folder, "v2", &opts));
    let expected = format!(
        "repository alice/m already exists on {} and holds a model",
        hub.endpoint
    );
    assert_mentions(&err, &[&expected, "pass --update to add a new commit"]);
    assert_eq!(hub.state().commits.len(), 1);

    std::fs::write(folder.join("config.yaml"), "objective:\n  name: barlow\n").unwrap();
    let update = HubOptions {
        update: true,
        ..opts
    };
    let url = hub::push_folder("alice/m", &folder, "v2", &update).unwrap();
    let state = hub.state();
    assert_eq!(state.commits.len(), 2);
    assert_eq!(state.commits[1].summary, "v2");
    assert!(url.ends_with(&state.commits[1].oid), "{url}");
    drop(state);
    assert_eq!(
        hub.head_files("alice/m")["config.yaml"],
        b"objective:\n  name: barlow\n"
    );
}
