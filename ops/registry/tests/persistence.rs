//! The data file: durable across restarts, untouched until a change, loud when corrupt.

mod common;

use common::{assert_error, body, record, scratch_dir, Server};
use serde_json::json;

const ID: &str = r#"{"name":"id","type":"long"}"#;
const NOTE: &str = r#"{"name":"note","type":["null","string"],"default":null}"#;

#[tokio::test]
async fn everything_survives_a_restart_with_the_same_data_file() {
    let dir = scratch_dir("restart");
    let data_file = dir.join("registry").join("schemas.json");
    let v1 = record(ID);
    let v2 = record(&format!("{ID},{NOTE}"));

    let server = Server::start(&data_file).await;
    assert!(
        !data_file.exists(),
        "nothing is written before the first change"
    );
    server.register("a", &v1).await;
    server.register("a", &v2).await;
    server
        .register("gone", &record(r#"{"name":"g","type":"int"}"#))
        .await;
    server.delete("/subjects/gone").await;
    server
        .put("/config", &json!({"compatibility": "FULL"}))
        .await;
    server
        .put("/config/a", &json!({"compatibility": "NONE"}))
        .await;
    server.stop().await;

    let on_disk: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&data_file).unwrap()).unwrap();
    assert_eq!(on_disk["next_id"], json!(4), "{on_disk}");
    let leftovers: Vec<_> = std::fs::read_dir(data_file.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, vec![std::ffi::OsString::from("schemas.json")]);

    let server = Server::start(&data_file).await;
    assert_eq!(server.get("/subjects").await, (200, json!(["a"])));
    assert_eq!(
        server.get("/subjects?deleted=true").await,
        (200, json!(["a", "gone"]))
    );
    assert_eq!(
        server.get("/subjects/a/versions").await,
        (200, json!([1, 2]))
    );
    assert_eq!(
        server.get("/subjects/a/versions/latest").await,
        (
            200,
            json!({"subject": "a", "version": 2, "id": 2, "schema": v2})
        )
    );
    assert_eq!(
        server.get("/schemas/ids/1").await,
        (200, json!({"schema": v1}))
    );
    assert_eq!(
        server.get("/config").await.1["compatibilityLevel"],
        json!("FULL")
    );
    assert_eq!(
        server.get("/config/a").await.1["compatibilityLevel"],
        json!("NONE")
    );
    // Re-registering is still idempotent, and new schemas get fresh ids.
    assert_eq!(server.register("a", &v1).await, 1);
    assert_eq!(
        server.get("/subjects/a/versions").await,
        (200, json!([1, 2]))
    );
    assert_eq!(
        server
            .register("b", &record(r#"{"name":"b","type":"int"}"#))
            .await,
        4
    );
    server.stop().await;
}

#[tokio::test]
async fn a_failed_save_is_a_50001_and_changes_nothing() {
    let dir = scratch_dir("unwritable");
    let parent = dir.join("not-a-dir");
    let server = Server::start(&parent.join("schemas.json")).await;
    // Once running, the data file's directory turns out to be a regular file: no save works.
    std::fs::write(&parent, b"x").unwrap();

    let reply = server
        .post("/subjects/s/versions", &body(&record(ID)))
        .await;
    assert_error(&reply, 500, 50001);
    assert!(
        reply.1["message"]
            .as_str()
            .unwrap()
            .contains("schemas.json"),
        "{}",
        reply.1
    );
    assert_eq!(server.get("/subjects").await, (200, json!([])));
    assert_error(&server.get("/schemas/ids/1").await, 404, 40403);
    server.stop().await;
}

#[test]
fn a_corrupt_data_file_is_an_error_naming_the_file() {
    let dir = scratch_dir("corrupt");
    let cases = [
        (
            "truncated.json",
            r#"{"format":1,"compatibility":"BACKWARD""#.to_owned(),
        ),
        ("empty.json", String::new()),
        (
            "dangling.json",
            json!({
                "format": 1, "compatibility": "BACKWARD", "next_id": 2,
                "schemas": [{"id": 1, "schema": record(ID)}],
                "subjects": {"s": [{"version": 1, "id": 7}]}
            })
            .to_string(),
        ),
        (
            "bad-schema.json",
            json!({
                "format": 1, "compatibility": "BACKWARD", "next_id": 2,
                "schemas": [{"id": 1, "schema": "{\"type\":\"nope\"}"}],
                "subjects": {}
            })
            .to_string(),
        ),
    ];
    for (name, content) in cases {
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        let err = match wal2delta_dev_registry::open(&path) {
            Ok(_) => panic!("{name} was accepted"),
            Err(err) => err.to_string(),
        };
        assert!(err.contains(&path.display().to_string()), "{name}: {err}");
        assert!(err.contains("corrupt"), "{name}: {err}");
    }
}
