//! The Rust client wal2delta uses, `schema_registry_converter` (async), against the real server.

mod common;

use apache_avro::types::Value;
use common::{record, scratch_dir, Server};
use schema_registry_converter::async_impl::avro::{AvroDecoder, AvroEncoder};
use schema_registry_converter::async_impl::schema_registry::{
    get_all_subjects, get_all_versions, get_schema_by_id, get_schema_by_subject,
    is_compatible_schema, post_schema, SrSettings,
};
use schema_registry_converter::schema_registry_common::{
    SchemaType, SubjectNameStrategy, SuppliedSchema,
};

const ID: &str = r#"{"name":"id","type":"long"}"#;

fn supplied(schema: &str) -> SuppliedSchema {
    SuppliedSchema::new(
        Some("test.R".to_owned()),
        SchemaType::Avro,
        schema.to_owned(),
    )
}

#[tokio::test]
async fn the_converter_registers_fetches_and_checks() {
    let server = Server::start(&scratch_dir("converter").join("schemas.json")).await;
    let settings = SrSettings::new(server.base.clone());
    let v1 = record(ID);
    let v2 = record(&format!(r#"{ID},{{"name":"n","type":"int","default":0}}"#));
    let bad = record(&format!(r#"{ID},{{"name":"m","type":"int"}}"#));

    let first = post_schema(&settings, "orders-value".to_owned(), supplied(&v1))
        .await
        .unwrap();
    assert_eq!(first.id, 1);
    let again = post_schema(&settings, "orders-value".to_owned(), supplied(&v1))
        .await
        .unwrap();
    assert_eq!(again.id, 1);

    let by_id = get_schema_by_id(1, &settings).await.unwrap();
    assert_eq!(by_id.schema, v1);
    assert_eq!(by_id.schema_type, SchemaType::Avro);

    assert!(
        is_compatible_schema(&settings, "orders-value".to_owned(), supplied(&v2))
            .await
            .unwrap()
    );
    assert!(
        !is_compatible_schema(&settings, "orders-value".to_owned(), supplied(&bad))
            .await
            .unwrap()
    );
    assert!(
        post_schema(&settings, "orders-value".to_owned(), supplied(&bad))
            .await
            .is_err()
    );
    assert_eq!(
        post_schema(&settings, "orders-value".to_owned(), supplied(&v2))
            .await
            .unwrap()
            .id,
        2
    );

    let latest = get_schema_by_subject(
        &settings,
        &SubjectNameStrategy::TopicNameStrategy("orders".to_owned(), false),
    )
    .await
    .unwrap();
    assert_eq!(
        (latest.id, latest.version, latest.schema.as_str()),
        (2, Some(2), v2.as_str())
    );
    assert_eq!(
        get_all_subjects(&settings).await.unwrap(),
        vec!["orders-value"]
    );
    assert_eq!(
        get_all_versions(&settings, "orders-value".to_owned())
            .await
            .unwrap(),
        vec![1, 2]
    );
    server.stop().await;
}

#[tokio::test]
async fn encoded_messages_decode_through_the_registry() {
    let server = Server::start(&scratch_dir("converter-codec").join("schemas.json")).await;
    let settings = SrSettings::new(server.base.clone());
    let encoder = AvroEncoder::new(settings.clone());
    let strategy = SubjectNameStrategy::TopicNameStrategyWithSchema(
        "payments".to_owned(),
        false,
        supplied(&record(ID)),
    );

    let bytes = encoder
        .encode(vec![("id", Value::Long(42))], strategy)
        .await
        .unwrap();
    assert_eq!(bytes[0], 0, "Confluent wire format magic byte");
    assert_eq!(&bytes[1..5], &1u32.to_be_bytes(), "schema id 1");

    let decoded = AvroDecoder::new(settings)
        .decode(Some(&bytes))
        .await
        .unwrap();
    assert_eq!(
        decoded.value,
        Value::Record(vec![("id".to_owned(), Value::Long(42))])
    );
    assert_eq!(
        server.get("/subjects").await.1,
        serde_json::json!(["payments-value"])
    );
    server.stop().await;
}
