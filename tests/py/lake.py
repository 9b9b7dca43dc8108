"""Independent reader of the lake for the end-to-end tests (DESIGN §5).

    lake.py duckdb SQL       run SQL in DuckDB 1.4.4 with the delta extension loaded from
                             the duckdb-ext-delta package; print the rows as JSON
    lake.py deltalake PATH   open PATH with the deltalake package; print version, rows,
                             partition columns and protocol as JSON
    lake.py sums PATH        open PATH with the deltalake package; print each top-level
                             column's Arrow type and, for decimal columns, the exact sum
                             of its non-null values (Python Decimal arithmetic) as text
    lake.py versions PATH    read every version of the table at PATH with the deltalake
                             package and with DuckDB (ATTACH ... VERSION); print
                             [version, deltalake rows, duckdb rows] per version
    lake.py tamper JSON      change a table behind wal2delta's back with the deltalake
                             package (tests that must detect it): JSON is {"path": ...,
                             "update": [[predicate, {column: SQL expression}], ...],
                             "delete": [predicate, ...], "copy": [[predicate, column,
                             new value], ...]} (copy appends the matching rows with one
                             column changed); prints the new version

Paths may be s3:// URIs of the development S3 server: its address and keys come from
WAL2DELTA_STACK_S3_ENDPOINT, WAL2DELTA_STACK_S3_ACCESS_KEY and WAL2DELTA_STACK_S3_SECRET_KEY
(`ops/stack env`). DuckDB then reads through its httpfs extension and an S3 secret, the
deltalake package through storage options: what a user's reader of an S3 lake sets up.

Values that JSON cannot hold (dates, decimals, bytes) are printed as strings.
"""
import glob
import json
import os
import site
import sys


def s3_options():
    """The deltalake storage options of the development S3 server, or None."""
    endpoint = os.environ.get("WAL2DELTA_STACK_S3_ENDPOINT")
    if not endpoint:
        return None
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": os.environ["WAL2DELTA_STACK_S3_ACCESS_KEY"],
        "AWS_SECRET_ACCESS_KEY": os.environ["WAL2DELTA_STACK_S3_SECRET_KEY"],
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }


def open_table(path):
    import deltalake

    if path.startswith("s3://"):
        return deltalake.DeltaTable(path, storage_options=s3_options())
    return deltalake.DeltaTable(path)


def duckdb_s3(con, extensions):
    """Loads httpfs and registers the development S3 server as an S3 secret."""
    options = s3_options()
    if options is None:
        return
    httpfs = glob.glob(os.path.join(extensions, "httpfs.duckdb_extension"))
    if not httpfs:
        raise SystemExit("duckdb-ext-httpfs is not installed (run ops/pyenv)")
    con.execute(f"LOAD '{httpfs[0]}'")
    host = options["AWS_ENDPOINT_URL"].removeprefix("http://")
    con.execute(
        "CREATE SECRET dev_s3 (TYPE S3, KEY_ID ?, SECRET ?, ENDPOINT ?, REGION 'us-east-1', URL_STYLE 'path', USE_SSL false)".replace(
            "?", "'{}'"
        ).format(options["AWS_ACCESS_KEY_ID"], options["AWS_SECRET_ACCESS_KEY"], host)
    )


def duckdb_delta():
    """A DuckDB connection with the delta extension (and S3, when configured) loaded."""
    import duckdb

    ext = glob.glob(
        os.path.join(site.getsitepackages()[0], "duckdb_ext/extensions/*/*/delta.duckdb_extension")
    )
    if not ext:
        raise SystemExit("duckdb-ext-delta is not installed (run ops/pyenv)")
    con = duckdb.connect()
    con.execute(f"LOAD '{ext[0]}'")
    duckdb_s3(con, os.path.dirname(ext[0]))
    return con


def main():
    mode, arg = sys.argv[1], sys.argv[2]
    if mode == "duckdb":
        rows = duckdb_delta().execute(arg).fetchall()
        out = [[v if isinstance(v, (int, float, str, bool, type(None))) else str(v) for v in r] for r in rows]
    elif mode == "deltalake":
        import deltalake

        dt = open_table(arg)
        p = dt.protocol()
        out = {
            "version": dt.version(),
            "rows": dt.to_pyarrow_table().num_rows,
            "partition_columns": dt.metadata().partition_columns,
            "min_reader_version": p.min_reader_version,
        }
    elif mode == "sums":
        import decimal

        import pyarrow as pa

        table = open_table(arg).to_pyarrow_table()
        out = {"types": {}, "sums": {}}
        for field in table.schema:
            out["types"][field.name] = str(field.type)
            if pa.types.is_decimal(field.type):
                # Exact: Decimal addition with enough digits for 38-digit values.
                with decimal.localcontext() as ctx:
                    ctx.prec = 100
                    total = sum((v for v in table.column(field.name).to_pylist() if v is not None), decimal.Decimal(0))
                    total = total.quantize(decimal.Decimal(1).scaleb(-field.type.scale))
                out["sums"][field.name] = format(total, "f")
    elif mode == "versions":
        import deltalake

        con = duckdb_delta()
        latest = open_table(arg).version()
        out = []
        for v in range(latest + 1):
            dt = deltalake.DeltaTable(arg, version=v, storage_options=s3_options() if arg.startswith("s3://") else None)
            con.execute(f"ATTACH '{arg}' AS v{v} (TYPE delta, VERSION {v})")
            n = con.execute(f"SELECT count(*) FROM v{v}").fetchone()[0]
            out.append([v, dt.to_pyarrow_table().num_rows, n])
    elif mode == "tamper":
        import deltalake
        import pyarrow as pa
        import pyarrow.compute as pc

        spec = json.loads(arg)
        path = spec["path"]
        for predicate, updates in spec.get("update", []):
            open_table(path).update(updates=updates, predicate=predicate)
        for predicate in spec.get("delete", []):
            open_table(path).delete(predicate)
        for predicate, column, value in spec.get("copy", []):
            dt = open_table(path)
            rows = dt.to_pyarrow_table()
            rows = rows.filter(pc.field(predicate[0]) == predicate[1])
            i = rows.schema.get_field_index(column)
            rows = rows.set_column(i, rows.schema.field(i), pa.array([value] * rows.num_rows, rows.schema.field(i).type))
            deltalake.write_deltalake(path, rows, mode="append", storage_options=s3_options() if path.startswith("s3://") else None)
        out = {"version": open_table(path).version()}
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - report any failure as one line
        sys.stderr.write(f"{type(e).__name__}: {e}\n")
        sys.stderr.flush()
        os._exit(1)
    # DuckDB and deltalake both start native threads; skip interpreter teardown, which can
    # abort when both are loaded.
    os._exit(0)
