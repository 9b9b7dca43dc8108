"""ops/bench rules-latency helper: reads the lake the daemon wrote (independently of it).

  rows LAKE SCHEMA TABLE
      Rows of the Silver table (0 while it does not exist).
  watermark LAKE SCHEMA TABLE
      The Silver table's watermark (the LSN, as an integer, below which every transaction
      is applied; the rules of a round commit before its Silver commit), 0 if none yet.
  latency LAKE TABLE SINCE_MS UNTIL_MS
      Commit -> transition visible for the stream transitions of TABLE (schema.table) whose
      source commit is in [SINCE_MS, UNTIL_MS): the source commit timestamp every
      transition carries (`commit_ts`, PostgreSQL's) against the timestamp of the
      rules/transitions Delta commit that added it (commitInfo.timestamp, this machine's
      clock). Prints JSON.
  bronze-latency LAKE TABLE SINCE_MS UNTIL_MS
      The same for TABLE's Bronze rows (`commit_ts`): commit -> landed in Bronze, the
      part of the above spent before Silver and the rules.
"""

import json
import os
import statistics
import sys

import pyarrow.parquet as pq


def rows(lake, schema, table):
    path = os.path.join(lake, "silver", schema, table)
    if not os.path.isdir(os.path.join(path, "_delta_log")):
        return 0
    from deltalake import DeltaTable

    return DeltaTable(path).to_pyarrow_dataset().count_rows()


def log_entries(path):
    """(version, commit timestamp in ms, commitInfo, added paths, whether it changed data)
    of every JSON commit in the Delta log, in version order."""
    log = os.path.join(path, "_delta_log")
    out = []
    if not os.path.isdir(log):
        return out
    for name in os.listdir(log):
        stem = name[: -len(".json")]
        if not name.endswith(".json") or not stem.isdigit():
            continue
        info, adds, changed = {}, [], False
        with open(os.path.join(log, name)) as f:
            for line in f:
                action = json.loads(line)
                if "commitInfo" in action:
                    info = action["commitInfo"]
                elif "add" in action:
                    adds.append(action["add"]["path"])
                    changed = True
                elif "remove" in action:
                    changed = True
        out.append((int(stem), info.get("timestamp"), info, adds, changed))
    out.sort(key=lambda e: e[0])
    return out


def commits(path):
    """(commit timestamp in ms, added file paths) of every commit in the log."""
    return [(ts, adds) for _, ts, _, adds, _ in log_entries(path) if ts is not None]


def watermark(lake, schema, table):
    path = os.path.join(lake, "silver", schema, table)
    marks = [info.get("wal2delta.watermark") for _, _, info, _, _ in log_entries(path)]
    return max([w for w in marks if isinstance(w, int)], default=0)


def lags_of(path, column, keep, since_ms, until_ms, extra=()):
    """Seconds from each kept row's `column` (a source commit timestamp) to the commit
    that added its file, for source commits in [since_ms, until_ms)."""
    lags = []
    if not os.path.isdir(os.path.join(path, "_delta_log")):
        return lags
    for ts, adds in commits(path):
        for add in adds:
            t = pq.read_table(os.path.join(path, add), columns=[column, *extra])
            commits_us = t.column(column).cast("int64").to_pylist()
            for i, commit in enumerate(commits_us):
                if commit is None or not keep(t, i):
                    continue
                commit_ms = commit / 1000
                if since_ms <= commit_ms < until_ms:
                    lags.append((ts - commit_ms) / 1000)
    return lags


def latency(lake, table, since_ms, until_ms):
    path = os.path.join(lake, "rules", "transitions")

    def keep(t, i):
        return t.column("table")[i].as_py() == table and t.column("origin")[i].as_py() == "stream"

    return summary(lags_of(path, "commit_ts", keep, since_ms, until_ms, ("table", "origin")))


def bronze_latency(lake, table, since_ms, until_ms):
    schema, name = table.split(".", 1)
    path = os.path.join(lake, "bronze", schema, name)
    return summary(lags_of(path, "commit_ts", lambda t, i: True, since_ms, until_ms))


def summary(lags):
    if not lags:
        return {"n": 0}
    lags.sort()

    def q(p):
        return lags[min(len(lags) - 1, int(p * len(lags)))]

    return {
        "n": len(lags),
        "p50_s": statistics.median(lags),
        "p99_s": q(0.99),
        "max_s": lags[-1],
    }


def main():
    cmd = sys.argv[1]
    if cmd == "rows":
        print(rows(*sys.argv[2:5]))
    elif cmd == "watermark":
        print(watermark(*sys.argv[2:5]))
    elif cmd in ("latency", "bronze-latency"):
        lake, table, since, until = sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
        f = latency if cmd == "latency" else bronze_latency
        print(json.dumps(f(lake, table, since, until)))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
