//! Schema evolution: compatibility levels, refusals, checks and invalid schemas.

mod common;

use common::{assert_error, body, record, scratch_dir, Server};
use serde_json::json;

const ID: &str = r#"{"name":"id","type":"long"}"#;
const NOTE_WITH_DEFAULT: &str = r#"{"name":"note","type":["null","string"],"default":null}"#;
const NOTE_REQUIRED: &str = r#"{"name":"note","type":"string"}"#;

async fn server(name: &str) -> Server {
    Server::start(&scratch_dir(name).join("schemas.json")).await
}

fn with(fields: &[&str]) -> String {
    record(&fields.join(","))
}

#[tokio::test]
async fn adding_a_field_with_a_default_is_backward_compatible_and_adds_a_version() {
    let server = server("compatible").await;
    assert_eq!(server.register("s", &with(&[ID])).await, 1);
    assert_eq!(
        server.register("s", &with(&[ID, NOTE_WITH_DEFAULT])).await,
        2
    );
    assert_eq!(
        server.get("/subjects/s/versions").await,
        (200, json!([1, 2]))
    );
    server.stop().await;
}

#[tokio::test]
async fn adding_a_field_without_a_default_is_refused_with_409_and_no_new_version() {
    let server = server("incompatible").await;
    server.register("s", &with(&[ID])).await;

    let refused = server
        .post("/subjects/s/versions", &body(&with(&[ID, NOTE_REQUIRED])))
        .await;
    assert_error(&refused, 409, 409);
    let message = refused.1["message"].as_str().unwrap();
    assert!(message.contains("BACKWARD"), "{message}");
    assert!(message.contains("'note'"), "{message}");
    assert!(message.contains("default"), "{message}");

    assert_eq!(server.get("/subjects/s/versions").await, (200, json!([1])));
    assert_error(&server.get("/schemas/ids/2").await, 404, 40403);
    // The refused schema consumed no id.
    assert_eq!(
        server.register("s", &with(&[ID, NOTE_WITH_DEFAULT])).await,
        2
    );
    server.stop().await;
}

#[tokio::test]
async fn invalid_schemas_are_42201_with_the_parsers_reason() {
    let server = server("invalid").await;
    let unknown_type = record(r#"{"name":"x","type":"no_such_type"}"#);
    let reply = server
        .post("/subjects/s/versions", &body(&unknown_type))
        .await;
    assert_error(&reply, 422, 42201);
    assert!(
        reply.1["message"]
            .as_str()
            .unwrap()
            .contains("no_such_type"),
        "{}",
        reply.1
    );

    assert_error(
        &server
            .post("/subjects/s/versions", &body(r#"{"type":"record""#))
            .await,
        422,
        42201,
    );
    assert_error(
        &server
            .post(
                "/subjects/s/versions",
                &json!({"schema": "{}", "schemaType": "PROTOBUF"}),
            )
            .await,
        422,
        42201,
    );
    let with_reference = json!({
        "schema": with(&[ID]),
        "references": [{"name": "x", "subject": "y", "version": 1}]
    });
    assert_error(
        &server.post("/subjects/s/versions", &with_reference).await,
        422,
        42201,
    );
    // Not even JSON, or no "schema" field: an unprocessable request.
    let response = server
        .client
        .post(server.url("/subjects/s/versions"))
        .body("schema=nope")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 422);
    assert_error(
        &server.post("/subjects/s/versions", &json!({})).await,
        422,
        422,
    );
    // Nothing was registered along the way.
    assert_eq!(server.get("/subjects").await, (200, json!([])));
    server.stop().await;
}

#[tokio::test]
async fn global_and_subject_compatibility_config() {
    let server = server("config").await;
    assert_eq!(
        server.get("/config").await,
        (
            200,
            json!({"compatibilityLevel": "BACKWARD", "compatibility": "BACKWARD"})
        )
    );
    server.register("s", &with(&[ID])).await;

    assert_eq!(
        server
            .put("/config/s", &json!({"compatibility": "NONE"}))
            .await,
        (200, json!({"compatibility": "NONE"}))
    );
    assert_eq!(
        server.get("/config/s").await.1["compatibilityLevel"],
        json!("NONE")
    );
    // NONE lets the otherwise incompatible schema in.
    assert_eq!(server.register("s", &with(&[ID, NOTE_REQUIRED])).await, 2);

    assert_error(&server.get("/config/other").await, 404, 40408);
    assert_eq!(
        server.get("/config/other?defaultToGlobal=true").await.1["compatibilityLevel"],
        json!("BACKWARD")
    );
    assert_error(
        &server
            .put("/config", &json!({"compatibility": "SIDEWAYS"}))
            .await,
        422,
        42203,
    );

    // Back to the global level (BACKWARD): adding a required field is refused again.
    assert_eq!(
        server.delete("/config/s").await.1["compatibilityLevel"],
        json!("NONE")
    );
    assert_error(&server.get("/config/s").await, 404, 40408);
    let refused = server
        .post(
            "/subjects/s/versions",
            &body(&with(&[
                ID,
                NOTE_REQUIRED,
                r#"{"name":"more","type":"int"}"#,
            ])),
        )
        .await;
    assert_error(&refused, 409, 409);

    assert_eq!(
        server
            .put("/config", &json!({"compatibility": "FULL"}))
            .await,
        (200, json!({"compatibility": "FULL"}))
    );
    assert_eq!(
        server.get("/config").await.1["compatibilityLevel"],
        json!("FULL")
    );
    server.stop().await;
}

#[tokio::test]
async fn forward_and_full_check_the_other_direction() {
    let server = server("forward").await;
    let v1 = with(&[ID, NOTE_REQUIRED]);
    server.register("fwd", &v1).await;
    server
        .put("/config/fwd", &json!({"compatibility": "FORWARD"}))
        .await;
    // Dropping a field the old reader needs (it has no default there) breaks FORWARD...
    let dropped = server
        .post("/subjects/fwd/versions", &body(&with(&[ID])))
        .await;
    assert_error(&dropped, 409, 409);
    assert!(dropped.1["message"].as_str().unwrap().contains("FORWARD"));
    // ...while adding a required field is fine: old readers ignore it.
    let added = with(&[ID, NOTE_REQUIRED, r#"{"name":"n","type":"int"}"#]);
    assert_eq!(server.register("fwd", &added).await, 2);

    server.register("full", &with(&[ID])).await;
    server
        .put("/config/full", &json!({"compatibility": "FULL"}))
        .await;
    assert_error(
        &server
            .post(
                "/subjects/full/versions",
                &body(&with(&[ID, NOTE_REQUIRED])),
            )
            .await,
        409,
        409,
    );
    // Ids so far: 1 and 2 under `fwd`, 3 for `full`'s first version.
    assert_eq!(
        server
            .register("full", &with(&[ID, NOTE_WITH_DEFAULT]))
            .await,
        4
    );
    server.stop().await;
}

#[tokio::test]
async fn transitive_levels_check_every_live_version() {
    let server = server("transitive").await;
    server
        .put("/config", &json!({"compatibility": "NONE"}))
        .await;
    server.register("s", &with(&[ID])).await;
    server.register("s", &with(&[ID, NOTE_REQUIRED])).await;
    let same_again = with(&[
        ID,
        NOTE_REQUIRED,
        r#"{"name":"n","type":"int","default":0}"#,
    ]);

    server
        .put("/config/s", &json!({"compatibility": "BACKWARD"}))
        .await;
    let check = server
        .post("/compatibility/subjects/s/versions", &body(&same_again))
        .await;
    assert_eq!(check, (200, json!({"is_compatible": true, "messages": []})));

    server
        .put(
            "/config/s",
            &json!({"compatibility": "BACKWARD_TRANSITIVE"}),
        )
        .await;
    let check = server
        .post("/compatibility/subjects/s/versions", &body(&same_again))
        .await;
    assert_eq!(check.1["is_compatible"], json!(false), "{}", check.1);
    assert!(check.1["messages"][0]
        .as_str()
        .unwrap()
        .contains("version 1"));
    assert_error(
        &server
            .post("/subjects/s/versions", &body(&same_again))
            .await,
        409,
        409,
    );
    server.stop().await;
}

#[tokio::test]
async fn compatibility_check_against_a_version() {
    let server = server("check").await;
    server.register("s", &with(&[ID])).await;

    let good = server
        .post(
            "/compatibility/subjects/s/versions/latest",
            &body(&with(&[ID, NOTE_WITH_DEFAULT])),
        )
        .await;
    assert_eq!(good, (200, json!({"is_compatible": true, "messages": []})));

    let bad = server
        .post(
            "/compatibility/subjects/s/versions/1",
            &body(&with(&[ID, NOTE_REQUIRED])),
        )
        .await;
    assert_eq!(bad.0, 200);
    assert_eq!(bad.1["is_compatible"], json!(false));
    let message = bad.1["messages"][0].as_str().unwrap();
    assert!(
        message.contains("'note'") && message.contains("BACKWARD"),
        "{message}"
    );

    assert_error(
        &server
            .post("/compatibility/subjects/s/versions/2", &body(&with(&[ID])))
            .await,
        404,
        40402,
    );
    assert_error(
        &server
            .post(
                "/compatibility/subjects/none/versions/latest",
                &body(&with(&[ID])),
            )
            .await,
        404,
        40401,
    );
    assert_error(
        &server
            .post("/compatibility/subjects/s/versions/latest", &body("nope"))
            .await,
        422,
        42201,
    );
    // A check registers nothing.
    assert_eq!(server.get("/subjects/s/versions").await, (200, json!([1])));
    server.stop().await;
}
