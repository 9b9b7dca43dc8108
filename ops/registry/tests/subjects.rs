//! Registering, looking up and listing schemas over HTTP.

mod common;

use common::{assert_error, body, record, scratch_dir, Server, CONTENT_TYPE};
use serde_json::json;

const V1_FIELDS: &str = r#"{"name":"id","type":"long"}"#;
const V2_FIELDS: &str =
    r#"{"name":"id","type":"long"},{"name":"note","type":["null","string"],"default":null}"#;

async fn server(name: &str) -> Server {
    Server::start(&scratch_dir(name).join("schemas.json")).await
}

#[tokio::test]
async fn root_is_an_empty_object_and_unknown_routes_are_json_404s() {
    let server = server("root").await;
    let response = server.client.get(server.url("/")).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        CONTENT_TYPE
    );
    assert_eq!(
        response.json::<serde_json::Value>().await.unwrap(),
        json!({})
    );
    assert_error(&server.get("/nowhere").await, 404, 404);
    assert_error(&server.put("/subjects", &json!({})).await, 405, 405);
    server.stop().await;
}

#[tokio::test]
async fn register_then_reregister_returns_the_same_id_without_a_new_version() {
    let server = server("register").await;
    let schema = record(V1_FIELDS);
    let (status, reply) = server
        .post("/subjects/orders-value/versions", &body(&schema))
        .await;
    assert_eq!((status, reply.clone()), (200, json!({"id": 1})));

    // Same schema, different formatting and attribute order: still the same schema.
    let reformatted = r#"{ "namespace": "test", "name": "R", "type": "record",
        "fields": [ { "type": "long", "name": "id" } ] }"#;
    let again = server
        .post(
            "/subjects/orders-value/versions",
            &json!({"schema": reformatted, "schemaType": "AVRO", "references": []}),
        )
        .await;
    assert_eq!(again, (200, json!({"id": 1})));
    assert_eq!(
        server.get("/subjects/orders-value/versions").await,
        (200, json!([1]))
    );
    server.stop().await;
}

#[tokio::test]
async fn plain_application_json_bodies_are_accepted() {
    let server = server("json").await;
    let response = server
        .client
        .post(server.url("/subjects/s/versions"))
        .json(&body(&record(V1_FIELDS)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(server.get("/subjects").await, (200, json!(["s"])));
    server.stop().await;
}

#[tokio::test]
async fn the_same_schema_under_another_subject_reuses_the_global_id() {
    let server = server("global-id").await;
    assert_eq!(server.register("a-value", &record(V1_FIELDS)).await, 1);
    assert_eq!(server.register("b-value", &record(V1_FIELDS)).await, 1);
    assert_eq!(server.register("b-value", &record(V2_FIELDS)).await, 2);

    assert_eq!(
        server.get("/subjects/b-value/versions/1").await.1["id"],
        json!(1)
    );
    assert_eq!(
        server.get("/schemas/ids/1/versions").await,
        (
            200,
            json!([{"subject": "a-value", "version": 1}, {"subject": "b-value", "version": 1}])
        )
    );
    assert_eq!(
        server.get("/schemas/ids/1/subjects").await,
        (200, json!(["a-value", "b-value"]))
    );
    server.stop().await;
}

#[tokio::test]
async fn lookup_returns_the_version_or_a_precise_404() {
    let server = server("lookup").await;
    let v1 = record(V1_FIELDS);
    let v2 = record(V2_FIELDS);
    server.register("s", &v1).await;
    server.register("s", &v2).await;

    let (status, reply) = server.post("/subjects/s?deleted=false", &body(&v1)).await;
    assert_eq!(status, 200);
    assert_eq!(
        reply,
        json!({"subject": "s", "version": 1, "id": 1, "schema": v1})
    );

    let other = record(r#"{"name":"other","type":"string"}"#);
    assert_error(&server.post("/subjects/s", &body(&other)).await, 404, 40403);
    assert_error(&server.post("/subjects/nope", &body(&v1)).await, 404, 40401);
    server.stop().await;
}

#[tokio::test]
async fn latest_numbered_and_raw_versions() {
    let server = server("versions").await;
    let v1 = record(V1_FIELDS);
    let v2 = record(V2_FIELDS);
    server.register("s", &v1).await;
    server.register("s", &v2).await;

    assert_eq!(
        server.get("/subjects/s/versions").await,
        (200, json!([1, 2]))
    );
    assert_eq!(
        server.get("/subjects/s/versions/latest").await,
        (
            200,
            json!({"subject": "s", "version": 2, "id": 2, "schema": v2})
        )
    );
    assert_eq!(
        server.get("/subjects/s/versions/-1").await.1["version"],
        json!(2)
    );
    assert_eq!(
        server.get("/subjects/s/versions/1").await,
        (
            200,
            json!({"subject": "s", "version": 1, "id": 1, "schema": v1})
        )
    );
    let raw: serde_json::Value = serde_json::from_str(&v1).unwrap();
    assert_eq!(
        server.get("/subjects/s/versions/1/schema").await,
        (200, raw)
    );

    assert_error(&server.get("/subjects/s/versions/3").await, 404, 40402);
    assert_error(&server.get("/subjects/s/versions/zero").await, 422, 42202);
    assert_error(&server.get("/subjects/s/versions/0").await, 422, 42202);
    assert_error(
        &server.get("/subjects/nope/versions/latest").await,
        404,
        40401,
    );
    assert_error(&server.get("/subjects/nope/versions").await, 404, 40401);
    server.stop().await;
}

#[tokio::test]
async fn schemas_by_id_including_the_converters_deleted_flag() {
    let server = server("ids").await;
    let v1 = record(V1_FIELDS);
    server.register("s", &v1).await;
    assert_eq!(
        server.get("/schemas/ids/1?deleted=true").await,
        (200, json!({"schema": v1}))
    );
    assert_error(&server.get("/schemas/ids/2").await, 404, 40403);
    assert_error(&server.get("/schemas/ids/abc").await, 404, 40403);
    server.stop().await;
}

#[tokio::test]
async fn subjects_with_slashes_travel_percent_encoded() {
    let server = server("slash").await;
    assert_eq!(
        server
            .register("team%2Forders-value", &record(V1_FIELDS))
            .await,
        1
    );
    assert_eq!(
        server.get("/subjects").await,
        (200, json!(["team/orders-value"]))
    );
    assert_eq!(
        server
            .get("/subjects/team%2Forders-value/versions/latest")
            .await
            .1["subject"],
        json!("team/orders-value")
    );
    server.stop().await;
}

#[tokio::test]
async fn soft_and_permanent_subject_deletes() {
    let server = server("delete").await;
    server.register("b", &record(V1_FIELDS)).await;
    server.register("a", &record(V1_FIELDS)).await;
    server.register("a", &record(V2_FIELDS)).await;
    assert_eq!(server.get("/subjects").await, (200, json!(["a", "b"])));

    assert_error(
        &server.delete("/subjects/a?permanent=true").await,
        404,
        40405,
    );
    assert_eq!(server.delete("/subjects/a").await, (200, json!([1, 2])));
    assert_eq!(server.get("/subjects").await, (200, json!(["b"])));
    assert_eq!(
        server.get("/subjects?deleted=true").await,
        (200, json!(["a", "b"]))
    );
    assert_error(&server.get("/subjects/a/versions").await, 404, 40401);
    assert_eq!(
        server.get("/subjects/a/versions?deleted=true").await,
        (200, json!([1, 2]))
    );
    assert_error(&server.delete("/subjects/a").await, 404, 40404);
    // Ids stay readable so that old messages still decode.
    assert_eq!(server.get("/schemas/ids/2").await.0, 200);

    assert_eq!(
        server.delete("/subjects/a?permanent=true").await,
        (200, json!([1, 2]))
    );
    assert_eq!(
        server.get("/subjects?deleted=true").await,
        (200, json!(["b"]))
    );
    assert_error(&server.delete("/subjects/a").await, 404, 40401);
    server.stop().await;
}
