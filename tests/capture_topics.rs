//! How capture creates its topics: `[kafka] topic_replication_factor` (default -1, the
//! broker's own default) and `[kafka] topic_config`, set on every topic it creates.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;
use wal2delta_tests::{Scenario, Stack};

/// The configs the broker reports for `topic`.
async fn topic_configs(brokers: &str, topic: &str) -> Result<Vec<(String, Option<String>)>> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let results = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &opts)
        .await?;
    let resource = results
        .into_iter()
        .next()
        .context("no result")?
        .map_err(|e| anyhow::anyhow!("describe configs of {topic}: {e}"))?;
    Ok(resource
        .entries
        .into_iter()
        .map(|e| (e.name, e.value))
        .collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn topics_are_created_with_the_configured_settings() -> Result<()> {
    let stack = Stack::from_env();
    let world = Scenario::new(&stack, "topics", "CREATE TABLE {s}.t (id int PRIMARY KEY);")
        .env(
            "WAL2DELTA__KAFKA__TOPIC_CONFIG",
            r#"{ "retention.ms" = "86400000" }"#,
        )
        .build()
        .await?;
    let (name, pg, mut d) = (world.name, world.pg, world.d);
    d.start()?;
    pg.batch_execute(&format!("INSERT INTO {name}.t VALUES (1)"))
        .await?;
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;
    let log = d.last_log();
    ensure!(d.stop()?.success(), "clean stop: {log}");

    for topic in [format!("{name}.{name}.t"), format!("{name}.transactions")] {
        let configs = topic_configs(&stack.brokers, &topic).await?;
        ensure!(
            configs
                .iter()
                .any(|(k, v)| k == "retention.ms" && v.as_deref() == Some("86400000")),
            "{topic} has retention.ms from [kafka] topic_config: {configs:?}"
        );
    }
    let positions = topic_configs(&stack.brokers, &format!("{name}.positions")).await?;
    ensure!(
        positions
            .iter()
            .any(|(k, v)| k == "cleanup.policy" && v.as_deref() == Some("compact")),
        "the position log stays compacted: {positions:?}"
    );
    Ok(())
}
