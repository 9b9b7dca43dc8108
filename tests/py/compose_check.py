"""Static checks of docker-compose.yml, the Dockerfile and the systemd unit (no Docker
engine here): the YAML parses, every mounted file exists, service names, ports and the
addresses in wal2delta's environment agree, Prometheus and Grafana find what they need.

Usage: compose_check.py REPO_ROOT. Prints JSON: {"problems": [...], "wal2delta_env": {...}}
where wal2delta_env is the daemon's environment with container paths mapped to the
repository files mounted there (tests/ops_compose.rs loads the config with it).
"""

import json
import pathlib
import re
import sys
from urllib.parse import urlsplit

import yaml

root = pathlib.Path(sys.argv[1])
problems = []


def problem(msg):
    problems.append(msg)


compose = yaml.safe_load((root / "docker-compose.yml").read_text())
services = compose.get("services") or {}
volumes = compose.get("volumes") or {}

for name in ["postgres", "kafka", "schema-registry", "minio", "lake-bucket", "wal2delta-setup", "wal2delta", "prometheus", "alertmanager", "grafana"]:
    if name not in services:
        problem(f"service {name} is missing")


def env_of(svc):
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: str(v) for k, v in env.items()}


def container_ports(svc):
    out = set()
    for p in svc.get("ports") or []:
        out.add(int(str(p).split(":")[-1].split("/")[0]))
    return out


mounts = {}  # (service, container path) -> host path
for name, svc in services.items():
    if "restart" not in svc:
        problem(f"{name}: no restart policy")
    # lake-bucket and wal2delta-setup run once and exit: nothing to check the health of.
    if name not in ("wal2delta", "wal2delta-setup", "lake-bucket") and "healthcheck" not in svc:
        problem(f"{name}: no healthcheck")
    deps = svc.get("depends_on") or []
    for d in deps if isinstance(deps, list) else deps.keys():
        if d not in services:
            problem(f"{name}: depends on unknown service {d}")
    for m in svc.get("volumes") or []:
        src, dst = str(m).split(":")[:2]
        if src.startswith("./") or src.startswith("/"):
            host = (root / src).resolve()
            if not host.exists():
                problem(f"{name}: mounted file {src} does not exist")
            mounts[(name, dst)] = host
        elif src not in volumes:
            problem(f"{name}: volume {src} is not declared")

# wal2delta's addresses name the services and ports they run on.
w = services.get("wal2delta", {})
wenv = env_of(w)
dsn = urlsplit(wenv.get("WAL2DELTA__SOURCE__DSN", ""))
pg = services.get("postgres", {})
pgenv = env_of(pg)
if dsn.hostname != "postgres" or dsn.port != 5432:
    problem(f"wal2delta's DSN points at {dsn.hostname}:{dsn.port}, not postgres:5432")
if dsn.username != pgenv.get("POSTGRES_USER") or dsn.path.lstrip("/") != pgenv.get("POSTGRES_DB"):
    problem("wal2delta's DSN user/database differ from the postgres service's")
if "wal_level=logical" not in " ".join(map(str, pg.get("command") or [])):
    problem("postgres does not run with wal_level=logical")
brokers = wenv.get("WAL2DELTA__KAFKA__BROKERS", "")
advertised = env_of(services.get("kafka", {})).get("KAFKA_ADVERTISED_LISTENERS", "")
for b in brokers.split(","):
    if b not in advertised:
        problem(f"broker {b} is not among kafka's advertised listeners ({advertised})")
reg = urlsplit(wenv.get("WAL2DELTA__SCHEMA_REGISTRY__URL", ""))
sr_listen = env_of(services.get("schema-registry", {})).get("SCHEMA_REGISTRY_LISTENERS", "")
if reg.hostname != "schema-registry" or f":{reg.port}" not in sr_listen:
    problem(f"registry URL {reg.geturl()} does not match the schema-registry service ({sr_listen})")
metrics_port = int(wenv.get("WAL2DELTA__METRICS__LISTEN", ":0").rsplit(":", 1)[1])
if metrics_port not in container_ports(w):
    problem(f"metrics port {metrics_port} is not published by wal2delta")
config_path = wenv.get("WAL2DELTA_CONFIG")
if ("wal2delta", config_path) not in mounts:
    problem(f"WAL2DELTA_CONFIG={config_path} is not a mounted file")
lake = urlsplit(wenv.get("WAL2DELTA__LAKE__URI", ""))
if lake.scheme == "file":
    if not any(str(m).split(":")[1] == lake.path for m in w.get("volumes") or []):
        problem(f"the lake {lake.geturl()} is not a volume")
elif lake.scheme == "s3":
    # The endpoint is the minio service; the bucket is the one lake-bucket makes; the
    # credentials are MinIO's; wal2delta starts after the bucket exists.
    endpoint = urlsplit(wenv.get("WAL2DELTA__LAKE__STORAGE_OPTIONS__AWS_ENDPOINT_URL", ""))
    minio = services.get("minio", {})
    if endpoint.hostname != "minio" or endpoint.port not in container_ports(minio):
        problem(f"the lake's endpoint {endpoint.geturl()} is not the minio service's published port")
    if endpoint.scheme == "http" and wenv.get("WAL2DELTA__LAKE__STORAGE_OPTIONS__AWS_ALLOW_HTTP") != "true":
        problem("an http:// endpoint needs WAL2DELTA__LAKE__STORAGE_OPTIONS__AWS_ALLOW_HTTP=true")
    menv = env_of(minio)
    if (wenv.get("AWS_ACCESS_KEY_ID"), wenv.get("AWS_SECRET_ACCESS_KEY")) != (menv.get("MINIO_ROOT_USER"), menv.get("MINIO_ROOT_PASSWORD")):
        problem("wal2delta's AWS credentials are not the minio service's")
    mb = " ".join(map(str, services.get("lake-bucket", {}).get("entrypoint") or []))
    if f"local/{lake.hostname}" not in mb:
        problem(f"lake-bucket does not create the bucket {lake.hostname}")
    setup_deps = services.get("wal2delta-setup", {}).get("depends_on") or {}
    if (setup_deps.get("lake-bucket") or {}).get("condition") != "service_completed_successfully":
        problem("wal2delta-setup does not wait for lake-bucket to complete")
else:
    problem(f"the lake {lake.geturl()} is neither file:// nor s3://")

# The daemon starts after a one-shot `wal2delta setup` succeeded (a plain `up` would
# otherwise run capture without its publication), with the same config and environment.
setup = services.get("wal2delta-setup", {})
if setup.get("command") != ["setup"]:
    problem(f"wal2delta-setup runs {setup.get('command')}, not [\"setup\"]")
if ((w.get("depends_on") or {}).get("wal2delta-setup") or {}).get("condition") != "service_completed_successfully":
    problem("wal2delta does not wait for wal2delta-setup to complete")
senv = env_of(setup)
for k, v in wenv.items():
    if k != "WAL2DELTA__METRICS__LISTEN" and senv.get(k) != v:
        problem(f"wal2delta-setup's {k} differs from the daemon's")
if setup.get("volumes") != w.get("volumes"):
    problem("wal2delta-setup does not mount what the daemon mounts")

# SIGTERM drains for up to two minutes; Docker's default grace is 10 s.
grace = str(w.get("stop_grace_period", "10s"))
m = re.fullmatch(r"(\d+)(s|m)", grace)
if not m or int(m.group(1)) * (60 if m.group(2) == "m" else 1) < 120:
    problem(f"wal2delta's stop_grace_period is {grace}, below 120s")

# Clients on the host reach Kafka through a listener advertised as localhost on a
# published port (kafka:9092 resolves only inside the compose network).
kafka_ports = container_ports(services.get("kafka", {}))
host_listeners = [int(p) for p in re.findall(r"//localhost:(\d+)", advertised)]
if not any(p in kafka_ports for p in host_listeners):
    problem(f"kafka advertises no localhost listener on a published port ({advertised}, ports {sorted(kafka_ports)})")

# `status` asks the running daemon: `exec` into its container, never `run` a new one.
for doc in [root / "README.md", root / "docker-compose.yml", *sorted((root / "docs").glob("*.md"))]:
    if doc.exists() and re.search(r"compose run[^\n`]*wal2delta status", doc.read_text()):
        problem(f"{doc.relative_to(root)} runs status in a new container (use docker compose exec)")

# Prometheus scrapes wal2delta under the job the alerts expect, and loads the alerts.
prom_cfg_path = mounts.get(("prometheus", "/etc/prometheus/prometheus.yml"))
if prom_cfg_path is None or not prom_cfg_path.exists():
    problem("prometheus.yml is not mounted at /etc/prometheus/prometheus.yml")
else:
    prom = yaml.safe_load(prom_cfg_path.read_text())
    for rf in prom.get("rule_files") or []:
        if ("prometheus", rf) not in mounts:
            problem(f"prometheus rule file {rf} is not mounted")
    jobs = {j["job_name"]: j for j in prom.get("scrape_configs") or []}
    alerts = (root / "ops/prometheus/alerts.yml").read_text()
    for job in re.findall(r'up\{job="([^"]+)"\}', alerts):
        if job not in jobs:
            problem(f"the alerts expect scrape job {job}, prometheus.yml has {sorted(jobs)}")
    targets = [t for j in jobs.values() for sc in j.get("static_configs") or [] for t in sc.get("targets") or []]
    # ... and sends them to Alertmanager, whose config is mounted.
    am_targets = [t for a in (prom.get("alerting") or {}).get("alertmanagers") or [] for sc in a.get("static_configs") or [] for t in sc.get("targets") or []]
    am = services.get("alertmanager", {})
    if not any(t.split(":")[0] == "alertmanager" and int(t.split(":")[1]) in container_ports(am) for t in am_targets):
        problem(f"prometheus sends its alerts to {am_targets}, not the alertmanager service")
    am_cfg = next((h for (s, d), h in mounts.items() if s == "alertmanager" and d.endswith(".yml")), None)
    if am_cfg is None or not am_cfg.exists():
        problem("alertmanager's config is not mounted")
    else:
        amc = yaml.safe_load(am_cfg.read_text())
        names = {r["name"] for r in amc.get("receivers") or []}
        if (amc.get("route") or {}).get("receiver") not in names:
            problem("alertmanager's route names a receiver it does not define")
    if f"wal2delta:{metrics_port}" not in targets:
        problem(f"prometheus does not scrape wal2delta:{metrics_port} ({targets})")

# Grafana: the datasource is the prometheus service, the dashboard is where the provider looks.
ds_path = next((h for (s, d), h in mounts.items() if s == "grafana" and "datasources" in d), None)
prov_path = next((h for (s, d), h in mounts.items() if s == "grafana" and "provisioning/dashboards" in d), None)
if ds_path is None or prov_path is None or not ds_path.exists() or not prov_path.exists():
    problem("grafana's datasource or dashboard provisioning is not mounted")
else:
    ds = yaml.safe_load(ds_path.read_text())["datasources"][0]
    u = urlsplit(ds["url"])
    if u.hostname not in services or u.port not in container_ports(services[u.hostname]):
        problem(f"grafana's datasource {ds['url']} is not a service's published port")
    dash_dir = yaml.safe_load(prov_path.read_text())["providers"][0]["options"]["path"]
    if not any(s == "grafana" and d.startswith(dash_dir + "/") and d.endswith(".json") for (s, d) in mounts):
        problem(f"no dashboard is mounted under {dash_dir}")

# The Dockerfile: dependencies in their own layer, non-root, metrics port, healthcheck.
docker = (root / "Dockerfile").read_text()
if not re.search(r"^USER (?!root)\S+", docker, re.M):
    problem("the image does not run as a non-root user")
if not re.search(rf"^EXPOSE {metrics_port}\b", docker, re.M):
    problem(f"the image does not expose {metrics_port}")
if not re.search(r"^HEALTHCHECK .*\n?.*healthz", docker, re.M):
    problem("the image has no healthcheck on /healthz")
cook, copy_all = docker.find("cargo chef cook"), docker.rfind("COPY . .")
if cook < 0 or copy_all < cook:
    problem("dependencies are not built in a layer before the sources are copied")
if not re.search(r"^FROM rust:\d+\.\d+\.\d+-", docker, re.M):
    problem("the image's Rust toolchain is not pinned (FROM rust:X.Y.Z-...)")
if "cargo chef cook" in docker and not re.search(r"cargo chef cook[^\n]*--bin wal2delta", docker):
    problem("the dependency layer builds every workspace member, not --bin wal2delta")
if not re.search(r"cargo build[^\n]*--bin wal2delta", docker):
    problem("the image does not build --bin wal2delta alone")
if "WAL2DELTA_CONFIG" not in docker:
    problem("the image does not set WAL2DELTA_CONFIG")

# The systemd unit.
unit = (root / "ops/wal2delta.service").read_text()
for needle in ["[Service]", "ExecStart=/usr/local/bin/wal2delta run", "User=wal2delta", "Restart=on-failure", "WAL2DELTA_CONFIG="]:
    if needle not in unit:
        problem(f"ops/wal2delta.service lacks {needle}")

# The daemon's environment, container paths mapped to the repository's files.
mapped = {}
for k, v in wenv.items():
    for (s, dst), host in mounts.items():
        if s == "wal2delta" and (v == dst or v.startswith(dst + "/")):
            v = str(host) + v[len(dst):]
    mapped[k] = v
print(json.dumps({"problems": problems, "wal2delta_env": mapped}))
