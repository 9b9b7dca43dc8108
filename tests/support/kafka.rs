//! Reading a topic back from the broker and decoding its Avro events through the registry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use apache_avro::Schema;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

static READS: AtomicUsize = AtomicUsize::new(0);

/// One message as read back.
#[derive(Debug, Clone)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    /// The value (empty for a tombstone; see `tombstone`).
    pub payload: Vec<u8>,
    /// A null value: the tombstone capture sends after a delete.
    pub tombstone: bool,
    /// The message's Kafka headers (name, value).
    pub headers: Vec<(String, Vec<u8>)>,
}

fn headers_of<M: Message>(m: &M) -> Vec<(String, Vec<u8>)> {
    use rdkafka::message::Headers;
    m.headers()
        .map(|h| {
            h.iter()
                .map(|x| {
                    (
                        x.key.to_owned(),
                        x.value.map(<[u8]>::to_vec).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A consumer that only assigns partitions, in a group of its own (a reused group id can
/// make the broker hand a second reader nothing).
fn reader(brokers: &str) -> Result<BaseConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set(
            "group.id",
            format!(
                "wal2delta-test-{}-{}",
                std::process::id(),
                READS.fetch_add(1, Ordering::Relaxed)
            ),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()?)
}

/// Reads every message of `topic` from the beginning, until `expect` messages were read
/// or nothing new arrived for `idle`.
pub fn read_topic(
    brokers: &str,
    topic: &str,
    expect: Option<usize>,
    idle: Duration,
) -> Result<Vec<Record>> {
    let consumer = reader(brokers)?;
    // A just-created topic may not be in the broker's metadata yet: ask again until it is.
    let started = Instant::now();
    let partitions: Vec<i32> = loop {
        let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let found: Vec<i32> = md
            .topics()
            .iter()
            .filter(|t| t.name() == topic && t.error().is_none())
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if !found.is_empty() {
            break found;
        }
        if started.elapsed() > idle {
            return Ok(Vec::new());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut tpl = TopicPartitionList::new();
    for p in &partitions {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    let mut last = Instant::now();
    loop {
        if let Some(n) = expect {
            if out.len() >= n {
                break;
            }
        }
        if last.elapsed() > idle {
            break;
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                out.push(Record::of(&m));
                last = Instant::now();
            }
            Some(Err(e)) => return Err(anyhow!("consuming {topic}: {e}")),
            None => {}
        }
    }
    out.sort_by_key(|r| (r.partition, r.offset));
    Ok(out)
}

/// The dead letters capture wrote under topic prefix `prefix` (read for 2 s).
pub fn dead_letters(brokers: &str, prefix: &str) -> Result<Vec<Record>> {
    read_topic(
        brokers,
        &format!("{prefix}.dlq"),
        None,
        Duration::from_secs(2),
    )
}

/// The versions the registry holds for `subject`.
pub async fn schema_versions(registry: &str, subject: &str) -> Result<Vec<i64>> {
    Ok(
        ::reqwest::get(format!("{registry}/subjects/{subject}/versions"))
            .await?
            .error_for_status()?
            .json()
            .await?,
    )
}

impl Record {
    fn of<M: Message>(m: &M) -> Record {
        Record {
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
            tombstone: m.payload().is_none(),
            headers: headers_of(m),
        }
    }
}

/// Reads every message currently in `topic` (up to each partition's high watermark at
/// the time of the call), without waiting for more.
pub fn read_topic_to_end(brokers: &str, topic: &str) -> Result<Vec<Record>> {
    let consumer = reader(brokers)?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut expected = 0usize;
    let mut tpl = TopicPartitionList::new();
    for t in md.topics().iter().filter(|t| t.name() == topic) {
        for p in t.partitions() {
            let (low, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
            if high > low {
                expected += (high - low) as usize;
                tpl.add_partition_offset(topic, p.id(), Offset::Offset(low))?;
            }
        }
    }
    if expected == 0 {
        return Ok(Vec::new());
    }
    consumer.assign(&tpl)?;
    let mut out = Vec::with_capacity(expected);
    // Gives up after 60 s without a message, however long the whole read takes (the
    // long chaos run reads millions).
    let mut deadline = Instant::now() + Duration::from_secs(60);
    while out.len() < expected {
        if Instant::now() > deadline {
            return Err(anyhow!(
                "read {} of {expected} messages of {topic}, then none for 60 s",
                out.len()
            ));
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                deadline = Instant::now() + Duration::from_secs(60);
                out.push(Record::of(&m))
            }
            Some(Err(e)) => return Err(anyhow!("consuming {topic}: {e}")),
            None => {}
        }
    }
    Ok(out)
}

/// Decodes Confluent-framed Avro with schemas fetched from the registry by id.
pub struct AvroDecoder {
    registry: String,
    schemas: HashMap<u32, Schema>,
}

impl AvroDecoder {
    pub fn new(registry: &str) -> Self {
        AvroDecoder {
            registry: registry.trim_end_matches('/').to_owned(),
            schemas: HashMap::new(),
        }
    }

    pub fn decode(&mut self, payload: &[u8]) -> Result<Value> {
        let (id, datum) = wal2delta_stream::registry::unframe(payload)
            .ok_or_else(|| anyhow!("not Confluent-framed"))?;
        if !self.schemas.contains_key(&id) {
            let url = format!("{}/schemas/ids/{id}", self.registry);
            let body: serde_json::Value = reqwest::blocking_get_json(&url)?;
            let text = body["schema"]
                .as_str()
                .ok_or_else(|| anyhow!("registry returned no schema for id {id}"))?;
            self.schemas.insert(
                id,
                Schema::parse_str(text).context("parsing registry schema")?,
            );
        }
        let schema = &self.schemas[&id];
        let mut reader = datum;
        let v = GenericDatumReader::builder(schema)
            .build()?
            .read_value(&mut reader)?;
        if !reader.is_empty() {
            bail!("{} trailing bytes after the Avro datum", reader.len());
        }
        Ok(v)
    }
}

/// Field of a record value by name (unwrapping unions).
pub fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    match unwrap_union(v) {
        Value::Record(fields) => fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| unwrap_union(v)),
        _ => None,
    }
}

/// An int or long field value.
pub fn long(v: Option<&Value>) -> Option<i64> {
    match v.map(unwrap_union) {
        Some(Value::Long(n)) => Some(*n),
        Some(Value::Int(n)) => Some(i64::from(*n)),
        _ => None,
    }
}

/// A string field value.
pub fn string(v: Option<&Value>) -> Option<String> {
    match v.map(unwrap_union) {
        Some(Value::String(s)) => Some(s.clone()),
        _ => None,
    }
}

pub fn unwrap_union(v: &Value) -> &Value {
    match v {
        Value::Union(_, inner) => unwrap_union(inner),
        other => other,
    }
}

mod reqwest {
    /// A tiny blocking GET for the registry (the tests are sync around the consumer).
    pub fn blocking_get_json(url: &str) -> anyhow::Result<serde_json::Value> {
        let url = url.to_owned();
        let handle = std::thread::spawn(move || -> anyhow::Result<serde_json::Value> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                Ok(::reqwest::get(&url)
                    .await?
                    .error_for_status()?
                    .json()
                    .await?)
            })
        });
        handle
            .join()
            .map_err(|_| anyhow::anyhow!("registry request thread panicked"))?
    }
}

/// The first `count` records of `topic` as a Python consumer reads them: confluent-kafka's
/// `DeserializingConsumer` with its `AvroDeserializer` (fastavro) for keys and values
/// (`tests/py/avro_consumer.py`, in the `ops/pyenv` virtualenv). Fails with the
/// deserializer's error when the Python client cannot read a record.
pub fn read_topic_with_python(
    brokers: &str,
    registry: &str,
    topic: &str,
    count: usize,
    timeout: Duration,
) -> Result<Vec<serde_json::Value>> {
    let script = crate::tests_dir().join("py/avro_consumer.py");
    let out = std::process::Command::new(crate::lake::python()?)
        .arg(script)
        .args([
            brokers,
            registry,
            topic,
            &count.to_string(),
            &timeout.as_secs().to_string(),
        ])
        .output()
        .context("running tests/py/avro_consumer.py")?;
    if !out.status.success() {
        bail!(
            "the Python Avro consumer failed on {topic}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).context("avro_consumer.py printed no JSON")
}
