"""ops/bench e2e helper: freshness per layer, read from the lake the daemon wrote
(independently of it), from timestamps the product itself records.

  freshness LAKE SCHEMA TABLE KEY SINCE_MS UNTIL_MS
      For the changes of SCHEMA.TABLE whose source commit is in [SINCE_MS, UNTIL_MS),
      seconds from the source commit (`commit_ts` in Bronze, `_commit_ts` in Silver,
      PostgreSQL's clock) to:
        kafka   the Kafka record's timestamp (the producer's send time, in Bronze's
                `kafka_timestamp`): published to the broker;
        bronze  the Delta commit that added the row's Bronze file (commitInfo.timestamp);
        silver  the first Delta commit whose files hold the row version (KEY and
                `_commit_lsn`; a MERGE copies unchanged rows into later files too, the
                first one is when it became visible);
        rules   the rules/transitions commit of each stream transition (when a rules
                table exists).
      Prints JSON: per layer n, p50_s, p99_s, max_s.
"""

import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rules_latency import commits, latency, lags_of, summary  # noqa: E402


def micros(column):
    return column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()


def kafka_lags(path, since_ms, until_ms):
    lags = []
    if not os.path.isdir(os.path.join(path, "_delta_log")):
        return lags
    for _, adds in commits(path):
        for add in adds:
            t = pq.read_table(os.path.join(path, add), columns=["commit_ts", "kafka_timestamp"])
            for commit, sent in zip(micros(t.column("commit_ts")), micros(t.column("kafka_timestamp"))):
                if commit is None or sent is None:
                    continue
                if since_ms <= commit / 1000 < until_ms:
                    lags.append((sent - commit) / 1e6)
    return lags


def silver_lags(path, key, since_ms, until_ms):
    first = {}
    if not os.path.isdir(os.path.join(path, "_delta_log")):
        return []
    for ts, adds in commits(path):
        for add in adds:
            t = pq.read_table(os.path.join(path, add), columns=[key, "_commit_lsn", "_commit_ts"])
            for k, lsn, commit in zip(
                t.column(key).to_pylist(), t.column("_commit_lsn").to_pylist(), micros(t.column("_commit_ts"))
            ):
                if commit is None or not since_ms <= commit / 1000 < until_ms:
                    continue
                first.setdefault((k, lsn), (ts - commit / 1000) / 1000)
    return list(first.values())


def freshness(lake, schema, table, key, since_ms, until_ms):
    bronze = os.path.join(lake, "bronze", schema, table)
    out = {
        "kafka": summary(kafka_lags(bronze, since_ms, until_ms)),
        "bronze": summary(lags_of(bronze, "commit_ts", lambda t, i: True, since_ms, until_ms)),
        "silver": summary(silver_lags(os.path.join(lake, "silver", schema, table), key, since_ms, until_ms)),
    }
    if os.path.isdir(os.path.join(lake, "rules", "transitions", "_delta_log")):
        out["rules"] = latency(lake, f"{schema}.{table}", since_ms, until_ms)
    return out


def main():
    if len(sys.argv) == 8 and sys.argv[1] == "freshness":
        _, _, lake, schema, table, key, since, until = sys.argv
        print(json.dumps(freshness(lake, schema, table, key, int(since), int(until))))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
