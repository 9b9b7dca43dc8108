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
                table exists);
        gold    the first commit of every Gold model (under LAKE/gold) that reflects the
                Silver version first holding the row version: the Silver version a Gold
                commit records in its commit info (`wal2delta.gold` inputs), followed
                through models that read models. `gold_models` gives the same per model.
      Prints JSON: per layer n, p50_s, p99_s, max_s (gold: and `missing`, row versions
      no model commit reflects).

  gold-behind LAKE SCHEMA TABLE MODEL[,MODEL...]
      Prints how many of the Gold models do not yet reflect the last Silver version of
      SCHEMA.TABLE that changed data (0 when Gold has caught up).
"""

import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rules_latency import commits, latency, lags_of, log_entries, summary  # noqa: E402


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


def silver_first(path, key, since_ms, until_ms):
    """For each row version (KEY, `_commit_lsn`) committed in the window: (source commit
    in ms, timestamp of the first Silver commit holding it, that commit's version)."""
    first = {}
    for version, ts, _, adds, _ in log_entries(path):
        for add in adds:
            t = pq.read_table(os.path.join(path, add), columns=[key, "_commit_lsn", "_commit_ts"])
            for k, lsn, commit in zip(
                t.column(key).to_pylist(), t.column("_commit_lsn").to_pylist(), micros(t.column("_commit_ts"))
            ):
                if commit is None or not since_ms <= commit / 1000 < until_ms:
                    continue
                first.setdefault((k, lsn), (commit / 1000, ts, version))
    return first


def gold_reflects(lake, silver_label):
    """Per Gold model: its commits as (version, timestamp in ms, the version of the
    Silver table `silver_label` it reflects), following models that read models. A
    model that does not read the table (even through other models) is left out."""
    root = os.path.join(lake, "gold")
    if not os.path.isdir(root):
        return {}
    logs = {m: log_entries(os.path.join(root, m)) for m in sorted(os.listdir(root))}
    memo = {}

    def reflected(model, version):
        """The Silver version model's `version` reflects (None: does not read it)."""
        if (model, version) in memo:
            return memo[(model, version)]
        memo[(model, version)] = None
        # The last commit at or before `version` that records its inputs.
        recorded = None
        for v, _, info, _, _ in logs.get(model, []):
            if v > version:
                break
            gold = info.get("wal2delta.gold")
            if isinstance(gold, str):
                gold = json.loads(gold)
            if isinstance(gold, dict) and "inputs" in gold:
                recorded = gold["inputs"]
        best = None
        for label, v in (recorded or {}).items():
            if label == silver_label:
                got = v
            elif label.startswith("gold/"):
                got = reflected(label[len("gold/"):], v)
            else:
                continue
            if got is not None:
                # A model over two paths to the table reflects the older of them.
                best = got if best is None else min(best, got)
        memo[(model, version)] = best
        return best

    out = {}
    for model, entries in logs.items():
        rows = [(v, ts, reflected(model, v)) for v, ts, _, _, _ in entries]
        if any(r is not None for _, _, r in rows):
            out[model] = [(v, ts, r) for v, ts, r in rows if r is not None]
    return out


def gold_lags(first, models):
    """Seconds from each row version's source commit to the first commit of a model
    (every model: to the last of them) that reflects the Silver version first holding
    it; and how many row versions some model never reflected."""
    per_model = {m: [] for m in models}
    every, missing = [], 0
    firsts = {}  # (model, Silver version) -> timestamp of the model's first commit reflecting it

    def first_reflecting(model, version):
        if (model, version) not in firsts:
            firsts[(model, version)] = next((ts for _, ts, r in models[model] if r >= version), None)
        return firsts[(model, version)]

    for commit_ms, _, version in first.values():
        seen = []
        for model in models:
            at = first_reflecting(model, version)
            if at is None:
                seen = None
                break
            per_model[model].append((at - commit_ms) / 1000)
            seen.append(at)
        if seen is None:
            missing += 1
        elif seen:
            every.append((max(seen) - commit_ms) / 1000)
    return every, missing, per_model


def gold_behind(lake, schema, table, names):
    data = [v for v, _, _, _, changed in log_entries(os.path.join(lake, "silver", schema, table)) if changed]
    models = gold_reflects(lake, f"{schema}.{table}")
    last = data[-1] if data else 0
    return sum(1 for m in names if not models.get(m) or models[m][-1][2] < last)


def freshness(lake, schema, table, key, since_ms, until_ms):
    bronze = os.path.join(lake, "bronze", schema, table)
    out = {
        "kafka": summary(kafka_lags(bronze, since_ms, until_ms)),
        "bronze": summary(lags_of(bronze, "commit_ts", lambda t, i: True, since_ms, until_ms)),
    }
    first = silver_first(os.path.join(lake, "silver", schema, table), key, since_ms, until_ms)
    out["silver"] = summary([(ts - commit_ms) / 1000 for commit_ms, ts, _ in first.values()])
    if os.path.isdir(os.path.join(lake, "rules", "transitions", "_delta_log")):
        out["rules"] = latency(lake, f"{schema}.{table}", since_ms, until_ms)
    models = gold_reflects(lake, f"{schema}.{table}")
    if models:
        every, missing, per_model = gold_lags(first, models)
        out["gold"] = {**summary(every), "missing": missing}
        out["gold_models"] = {m: summary(lags) for m, lags in per_model.items()}
    return out


def main():
    if len(sys.argv) == 8 and sys.argv[1] == "freshness":
        _, _, lake, schema, table, key, since, until = sys.argv
        print(json.dumps(freshness(lake, schema, table, key, int(since), int(until))))
    elif len(sys.argv) == 6 and sys.argv[1] == "gold-behind":
        print(gold_behind(*sys.argv[2:5], sys.argv[5].split(",")))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
