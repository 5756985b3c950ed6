"""``streameval cluster``: fetch the engines, start a local Flink cluster, Prism or a Kafka broker, stop it.

    streameval cluster fetch [flink] [prism] [kafka] [dashboard] [--retry]
    streameval cluster up flink --state-dir DIR [--taskmanagers N] [--slots S] [--taskmanager-memory M]
                               [--job-server-jar JAR]
    streameval cluster up prism --state-dir DIR
    streameval cluster up kafka --state-dir DIR [--expansion-service]
    streameval cluster status --state-dir DIR
    streameval cluster args --state-dir DIR     (the runner_args as one shell line)
    streameval cluster down --state-dir DIR

``up kafka`` starts one Kafka broker in KRaft mode (broker and controller in one process, its storage
formatted in ``DIR/kafka``) and prints ``bootstrap_servers`` instead of ``runner_args``; with
``--expansion-service`` also Beam's Java expansion service and a Java SDK worker pool, the pair that
``apache_beam.io.kafka.ReadFromKafka(..., expansion_service=...)`` needs (printed as ``expansion_service``),
and a second expansion service for jobs on Flink (``flink_expansion_service``: Kafka's read as the
primitive Read Flink runs itself; see :func:`_start_kafka_io`). The broker keeps every record
(``log.retention.ms=-1``): events of the past are not deleted before a job reads them.

``up`` starts every process on 127.0.0.1 with ports the kernel found free, each the leader of a
process group of its own (its output in ``DIR/logs/NAME.log``), waits until the cluster accepts
jobs, writes ``DIR/cluster.json`` and prints one JSON object: ``runner_args`` (the options to append
to ``streameval batch`` or ``streameval stream``), ``processes`` (name to PID), ``web_ui``, ``logs``.
A process that does not come up stops the others and exits 1 with one line naming it and its log.

The Python SDK workers run in one EXTERNAL worker pool (:mod:`streameval.commands.worker_pool`) per
cluster, shared by every TaskManager (docs/deploy.md says why: one machine has one ``localhost``, and
the pool starts each worker as a process of its own; and why not Beam's ``worker_pool_main``: it
stops workers by an id that two TaskManagers both use). ``down`` signals each process group by the PID recorded at
``up`` (SIGTERM, then SIGKILL after a grace period), and only if that PID is still the process
``up`` started (its start time in /proc matches); never by name.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE, one_line
from . import engines
from .processes import (HOST, START_TIMEOUT, ClusterError, Proc, accepts, alive, child_env, free_port, http_json,
                        listens, ours, spawn, stop, wait_ready)

__all__ = ["main", "up", "down", "status", "ClusterError"]

STATE_FILE = "cluster.json"
ENGINES = ("flink", "prism", "kafka")
#: the cached parts (streameval.commands.engines) each engine needs
PARTS = {"flink": ("flink", "job_server", "expansion_service"), "prism": ("prism",), "kafka": ("kafka", "kafka_io"),
         "dashboard": ("uplot",)}
#: what ``fetch`` takes: the engines, and the dashboard's chart library (uPlot, from npm)
FETCHABLE = (*ENGINES, "dashboard")
#: each TaskManager's process memory when ``--taskmanager-memory`` is given (docs/deploy.md says how it is
#: split); without it the TaskManager is sized per slot (:func:`slot_memory`)
TASKMANAGER_MEMORY = None
#: heap per task slot for Beam's data plane (Beam 2.62): the runner queues up to 100 data messages of a
#: bundle's output (``BeamFnDataInboundObserver``) until the SDK worker has finished the bundle, and
#: Beam's Python SDK sends messages of 10 MB (its ``_DEFAULT_SIZE_FLUSH_THRESHOLD``) plus one element:
#: about 1.1 GB per running stage. With 320 MB per slot the batch job's reading stage at 30 M impressions
#: filled a 640 MB heap with 53 such messages and the gRPC thread decoding the next one ran out of it
#: (the job then hung: docs/benchmarks.md)
SLOT_HEAP_MB = 1280
#: task off-heap (direct) memory per slot: gRPC's netty buffers of the data sent to the SDK worker,
#: which Beam sends 100 messages at a time before it asks whether the worker takes more
#: (``DirectStreamObserver``), each at least one element (a shard's group: up to about 500,000
#: impressions, ``--shards auto``). With 512 MB for two slots the scoring stage at 30 M impressions ran
#: out of it ("OutOfMemoryError: Direct buffer memory")
SLOT_DIRECT_MB = 1024
#: managed memory (the batch job's sorts of its groupings; they spill beyond it)
MANAGED_MB = 512
#: a TaskManager that runs out of memory exits (Flink restarts the job's tasks elsewhere, or fails the
#: job). Without it a gRPC thread of Beam's data plane that ran out of heap died alone and left its
#: task RUNNING, waiting for data that never came, until the launcher's stall watch (10 minutes)
TASKMANAGER_JVM_OPTS = ("-XX:+ExitOnOutOfMemoryError",)
#: the JVM options Flink 1.19's distribution gives every process it starts on Java 17 (``env.java.opts.all``
#: of its conf/config.yaml, which the cache does not keep: only bin/ and lib/). Without them a task that
#: ran out of memory took its TaskManager down: Flink's own handler could not update the error's message
#: (InaccessibleObjectException: "module java.base does not opens java.lang"), left the task in no final
#: state and exited the TaskManager (IllegalStateException in Task.notifyFinalState), so the job waited for
#: slots that never came (the batch job at 10 M impressions, 2026-12-05)
FLINK_JAVA17_OPTS = tuple(
    [f"--add-exports={m}=ALL-UNNAMED" for m in (
        "java.base/sun.net.util", "java.rmi/sun.rmi.registry", "jdk.compiler/com.sun.tools.javac.api",
        "jdk.compiler/com.sun.tools.javac.file", "jdk.compiler/com.sun.tools.javac.parser",
        "jdk.compiler/com.sun.tools.javac.tree", "jdk.compiler/com.sun.tools.javac.util",
        "java.security.jgss/sun.security.krb5")]
    + [f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in (
        "java.lang", "java.net", "java.io", "java.nio", "sun.nio.ch", "java.lang.reflect", "java.text", "java.time",
        "java.util", "java.util.concurrent", "java.util.concurrent.atomic", "java.util.concurrent.locks")])
#: the broker's heap (Kafka's own scripts give it 1 GB; a test broker needs far less)
KAFKA_HEAP = "512m"
#: each expansion service's heap (it only expands transforms)
EXPANSION_HEAP = "384m"
#: the line Kafka logs once the broker and controller serve
_KAFKA_STARTED = "Kafka Server started"
_POOL_LINE = "Started worker pool servicer at port: "


@dataclass
class Cluster:
    engine: str
    state_dir: str
    runner_args: list = field(default_factory=list)
    processes: dict = field(default_factory=dict)  # name -> Proc (as a dict in cluster.json)
    web_ui: str = ""
    logs: str = ""
    ports: dict = field(default_factory=dict)
    bootstrap_servers: str = ""  # kafka
    expansion_service: str = ""  # kafka --expansion-service
    flink_expansion_service: str = ""  # kafka --expansion-service: the one for Flink (Kafka read natively)
    #: flink: what Flink receives with each job: "none" (Beam's runner is on the Flink processes' classpath,
    #: the job server's launcher stages nothing) or why the job server's classpath is staged instead
    job_jars: str = ""


# ------------------------------------------------------------------------------------------------
# the pieces


def _start_pool(c: Cluster, logs: Path, state: Path, name: str = "worker_pool-1", extra: tuple = ()) -> str:
    """An EXTERNAL SDK worker pool on a port of its choosing; returns HOST:PORT. ``extra``: more
    flags for the pool (``--container_executable``)."""
    # our pool (streameval.commands.worker_pool), not Beam's worker_pool_main: Beam's keeps one worker
    # per id, and the TaskManagers sharing the pool number their workers alike (the module says more)
    argv = [sys.executable, "-m", "streameval.commands.worker_pool", "--service_port", "0", *extra]
    proc = spawn(name, argv, logs, child_env(), state / "workers")
    c.processes[name] = proc

    def port():
        text = Path(proc.log).read_text(errors="replace")
        i = text.rfind(_POOL_LINE)
        if i < 0:
            return 0
        p = int(text[i + len(_POOL_LINE):].split()[0].rsplit(":", 1)[1])
        return p if listens(proc, p) and accepts(f"{HOST}:{p}") else 0

    p = wait_ready(name, proc, port)
    c.ports[name] = p
    return f"{HOST}:{p}"


def _up_prism(c: Cluster, logs: Path, state: Path, args) -> None:
    binary = engines.prism_binary()
    lacking = engines.missing(["prism"])
    if lacking:
        raise ClusterError(lacking[0])
    pool = _start_pool(c, logs, state)
    web = free_port()
    # Prism listens on every address (its flags choose ports only); the job port is the kernel's choice
    argv = [binary, "--job_port", "0", "--web_port", web, "--serve_http=true", "--log_kind", "text",
            "--log_level", "info", "--idle_shutdown_timeout", "-1s"]
    proc = spawn("prism", argv, logs, child_env(), state / "prism")
    c.processes["prism"] = proc

    def port():
        text = Path(proc.log).read_text(errors="replace")
        i = text.rfind("Serving JobManagement")
        if i < 0:
            return 0
        line = text[i:].splitlines()[0]
        p = int(line.rsplit(":", 1)[1].strip().strip('"').split()[0].strip('"'))
        return p if listens(proc, p) and accepts(f"{HOST}:{p}") else 0

    job_port = wait_ready("prism", proc, port)
    c.ports.update(job=job_port, web=web)
    c.web_ui = f"http://{HOST}:{web}"
    c.runner_args = ["--runner", "PortableRunner", "--job_endpoint", f"{HOST}:{job_port}",
                     "--environment_type", "EXTERNAL", "--environment_config", pool]


def _kafka_properties(path: Path, data: Path, broker: int, controller: int) -> None:
    """A one-node KRaft broker and controller on 127.0.0.1 (replication factors of 1 for its
    internal topics; topics are created explicitly, never on first use)."""
    settings = {
        "process.roles": "broker,controller", "node.id": 1,
        "controller.quorum.voters": f"1@{HOST}:{controller}",
        "listeners": f"PLAINTEXT://{HOST}:{broker},CONTROLLER://{HOST}:{controller}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{broker}",
        "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": data, "num.partitions": 1, "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": 1, "transaction.state.log.replication.factor": 1,
        "transaction.state.log.min.isr": 1, "share.coordinator.state.topic.replication.factor": 1,
        "share.coordinator.state.topic.min.isr": 1, "group.initial.rebalance.delay.ms": 0,
        # records are kept: retention by time goes by the records' own timestamps, so a backlog of past
        # events (a day, a year ago) would be deleted within minutes of being produced, before a job read it
        "log.retention.ms": -1,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))


def _kafka_cluster_id(state: Path) -> str:
    """The KRaft cluster ID (22 characters of URL-safe base64 of a random UUID, as
    ``kafka-storage random-uuid``), made once per state folder and kept, so a second ``up`` on the
    same folder finds its formatted storage and topics. Never starting with ``-`` (as Kafka's own
    ``Uuid.randomUuid``): the storage tool took such an ID for an option and refused to format
    (one start in 64 failed so). A kept ID starting with ``-`` never formatted a storage: made again."""
    import base64
    import uuid

    path = state / "kafka" / "cluster.id"
    if not path.exists() or path.read_text().startswith("-"):
        path.parent.mkdir(parents=True, exist_ok=True)
        cid = "-"
        while cid.startswith("-"):
            cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        path.write_text(cid + "\n")
    return path.read_text().strip()


def _up_kafka(c: Cluster, logs: Path, state: Path, args) -> None:
    """One Kafka broker (KRaft, broker and controller in one JVM) on 127.0.0.1; with
    ``args.expansion_service`` also Beam's Java expansion service and a Java SDK worker pool."""
    wanted = ["kafka"] + (["kafka_io"] if getattr(args, "expansion_service", False) else [])
    lacking = engines.missing(wanted)
    if lacking:
        raise ClusterError(lacking[0])
    java = shutil.which("java")
    if not java:
        raise ClusterError("no java on PATH (the Kafka broker needs Java 17)")
    classpath = f"{engines.kafka_classpath()}/*"
    props = state / "kafka" / "server.properties"
    broker, controller = free_port(), free_port()
    while controller == broker:
        controller = free_port()
    _kafka_properties(props, state / "kafka" / "data", broker, controller)
    # the storage must be formatted before the first start (`kafka-storage format`); a second `up` on
    # the same folder keeps it (--ignore-formatted)
    fmt = subprocess.run([java, "-cp", classpath, "kafka.tools.StorageTool", "format", "--ignore-formatted",
                          "-t", _kafka_cluster_id(state), "-c", str(props)],
                         capture_output=True, text=True, timeout=START_TIMEOUT, env=child_env())
    (logs / "kafka-storage-format.log").write_text(fmt.stdout + fmt.stderr)
    if fmt.returncode != 0:
        raise ClusterError(f"formatting Kafka's storage failed (exit {fmt.returncode}): "
                           f"{one_line(fmt.stderr or fmt.stdout)[-400:]}")
    argv = [java, f"-Xms{KAFKA_HEAP}", f"-Xmx{KAFKA_HEAP}", "-cp", classpath, "kafka.Kafka", props]
    proc = spawn("kafka", argv, logs, child_env(), state / "kafka")
    c.processes["kafka"] = proc

    def ready():
        return (_KAFKA_STARTED in Path(proc.log).read_text(errors="replace") and listens(proc, broker)
                and accepts(f"{HOST}:{broker}"))

    wait_ready("kafka", proc, ready)
    c.ports.update(kafka=broker, controller=controller)
    c.bootstrap_servers = f"{HOST}:{broker}"
    if getattr(args, "expansion_service", False):
        c.expansion_service, c.flink_expansion_service = _start_kafka_io(c, logs, state, java)


#: the boot program Beam's Python worker pool runs (``--container_executable``) for each Java worker:
#: it asks the runner's provision service for the job's options and starts the Java SDK harness
#: (``FnHarness``) as a JVM of its own, with the environment variables Beam's Java container sets
_JAVA_BOOT = """#!{python}
import argparse, os
import grpc
from google.protobuf import json_format
from apache_beam.portability.api import beam_provision_api_pb2, beam_provision_api_pb2_grpc

a = argparse.ArgumentParser()
for name in ("id", "logging_endpoint", "artifact_endpoint", "provision_endpoint", "control_endpoint"):
    a.add_argument("--" + name, default="")
args = a.parse_args()
with grpc.insecure_channel(args.provision_endpoint) as channel:
    info = beam_provision_api_pb2_grpc.ProvisionServiceStub(channel).GetProvisionInfo(
        beam_provision_api_pb2.GetProvisionInfoRequest(), metadata=[("worker_id", args.id)]).info
control = info.control_endpoint.url or args.control_endpoint
logging = info.logging_endpoint.url or args.logging_endpoint
env = dict(os.environ, HARNESS_ID=args.id, PIPELINE_OPTIONS=json_format.MessageToJson(info.pipeline_options),
           CONTROL_API_SERVICE_DESCRIPTOR='url: "%s"' % control, LOGGING_API_SERVICE_DESCRIPTOR='url: "%s"' % logging,
           RUNNER_CAPABILITIES=" ".join(info.runner_capabilities))
os.execvpe({java!r}, [{java!r}, "-Xmx{heap}", "-cp", {classpath!r}, "org.apache.beam.fn.harness.FnHarness"], env)
"""


def _start_kafka_io(c: Cluster, logs: Path, state: Path, java: str) -> tuple[str, str]:
    """Beam's Java expansion service with its Kafka IO, whose transforms run in an EXTERNAL environment
    at a worker pool started beside it (no Docker), twice: ``expansion_service`` expands Kafka's read
    as a splittable DoFn (Prism, Dataflow); ``expansion_service_flink`` (``--experiments=
    use_deprecated_read``) as Beam's primitive unbounded Read, which Flink's portable runner executes
    itself in the TaskManagers (:data:`KAFKA_READ_JARS` on the job server's classpath): it never
    checkpoints an unbounded splittable DoFn running in an SDK worker, so that read's bundle never ends
    and no record leaves it (Beam issue #20979; seen here: the job RUNNING, nothing read). Returns
    both addresses (HOST:PORT).

    The pool is the cluster's (:mod:`.worker_pool`) with a boot program (:data:`_JAVA_BOOT`) that starts
    each Java worker as a JVM of its own. Beam's Java ``ExternalWorkerService`` (workers as threads of
    one JVM) serves one job only: the first worker's shutdown stops an executor the next one needs
    (``RejectedExecutionException`` from ``ExecutionStateSampler``; the second job waits for its
    worker until the runner gives up). The expansion service listens on every address (it takes a port only)."""
    classpath = f"{engines.kafka_io_classpath()}/*"
    boot = state / "java-boot"
    boot.write_text(_JAVA_BOOT.format(python=sys.executable, java=java, heap=KAFKA_HEAP, classpath=classpath))
    boot.chmod(0o755)
    pool = _start_pool(c, logs, state, "java_worker_pool", ("--container_executable", boot))
    addresses = []
    for name, extra in (("expansion_service", []), ("expansion_service_flink", ["--experiments=use_deprecated_read"])):
        port = free_port()
        service = spawn(name, [java, f"-Xmx{EXPANSION_HEAP}", "-cp", classpath,
                                "org.apache.beam.sdk.expansion.service.ExpansionService", port,
                                "--defaultEnvironmentType=EXTERNAL", f"--defaultEnvironmentConfig={pool}", *extra],
                         logs, child_env(), state / name)
        c.processes[name] = service
        wait_ready(name, service, lambda s=service, q=port: listens(s, q) and accepts(f"{HOST}:{q}"))
        c.ports[name] = port
        addresses.append(f"{HOST}:{port}")
    return addresses[0], addresses[1]


#: the jars Flink's own (native) read of Kafka needs beside the job server's (when ``kafka_io`` is in the cache):
#: Beam's KafkaIO, the Kafka client and what they load (spring-expression: KafkaUnboundedReader.start). The job
#: server stages its own classpath as the job's jars, so the TaskManagers load them from there
KAFKA_READ_JARS = ("beam-sdks-java-io-kafka-", "kafka-clients-", "beam-sdks-java-extensions-avro-", "avro-",
                   "zstd-jni-", "snappy-java-", "spring-core-", "spring-expression-", "spring-jcl-")


def _kafka_read_jars() -> list[str]:
    folder = engines.kafka_io_classpath()
    if not (folder / ".complete").exists():
        return []
    return [str(j) for j in sorted(folder.glob("*.jar")) if j.name.startswith(KAFKA_READ_JARS)]


_LOG4J = """\
rootLogger.level = INFO
rootLogger.appenderRef.console.ref = ConsoleAppender
appender.console.name = ConsoleAppender
appender.console.type = CONSOLE
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yyyy-MM-dd HH:mm:ss,SSS} %-5p %-60c %x - %m%n
logger.netty.name = org.jboss.netty.channel.DefaultChannelPipeline
logger.netty.level = OFF
"""


def slot_memory(slots: int) -> dict:
    """A TaskManager's memory options for ``slots`` task slots running Beam's Python stages:
    :data:`SLOT_HEAP_MB` of task heap and :data:`SLOT_DIRECT_MB` of task off-heap memory per slot,
    :data:`MANAGED_MB` of managed memory; Flink derives the process size from them (with its defaults
    for metaspace and JVM overhead: about 6.4 GB of process memory for 2 slots, of which a small job
    touches little)."""
    return {"taskmanager.memory.task.heap.size": f"{SLOT_HEAP_MB * slots}m",
            "taskmanager.memory.task.off-heap.size": f"{SLOT_DIRECT_MB * slots}m",
            "taskmanager.memory.managed.size": f"{MANAGED_MB}m"}


def _flink_config(conf: Path, state: Path, rpc: int, rest: int, slots: int,
                  tm_memory: str | None = TASKMANAGER_MEMORY) -> None:
    conf.mkdir(parents=True, exist_ok=True)
    tmp = state / "flink-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    settings = {
        "jobmanager.rpc.address": HOST, "jobmanager.rpc.port": rpc, "jobmanager.bind-host": HOST,
        "jobmanager.memory.process.size": "1024m",
        "taskmanager.bind-host": HOST, "taskmanager.host": HOST, "taskmanager.numberOfTaskSlots": slots,
        # the batch job on Flink deploys its ~20 tasks at once, each blocking result partition taking
        # taskmanager.network.sort-shuffle.min-buffers (512) network buffers: neither the 3481 buffers
        # (108 MB) of a 1.5 GB TaskManager nor 8192 (256 MB) were enough ("Insufficient number of
        # network buffers: required 512"); 64 per partition, and 256 MB of network memory
        "taskmanager.memory.network.min": "256m", "taskmanager.memory.network.max": "256m",
        # Beam's data plane to the SDK workers (gRPC over netty) takes heap and direct memory outside
        # Flink's pools (SLOT_HEAP_MB, SLOT_DIRECT_MB): sized per slot, unless the process size is given.
        # With it: 512 MB of task off-heap memory (with the defaults, no task off-heap memory and 128 MB of
        # framework off-heap, the batch job at 10 M impressions failed its tasks with "OutOfMemoryError:
        # Cannot reserve 2097152 bytes of direct buffer memory"), the managed memory a quarter of Flink's
        # memory (the batch job's sorts; Flink's default is 0.4)
        **(slot_memory(slots) if tm_memory is None else {
            "taskmanager.memory.process.size": tm_memory, "taskmanager.memory.task.off-heap.size": "512m",
            "taskmanager.memory.managed.fraction": 0.25}),
        "taskmanager.network.sort-shuffle.min-buffers": 64,
        "rest.address": HOST, "rest.bind-address": HOST, "rest.port": rest,
        "blob.server.port": "0", "taskmanager.rpc.port": "0", "taskmanager.data.port": "0",
        "parallelism.default": 1, "io.tmp.dirs": str(tmp),
        # a lost TaskManager restarts the job's tasks (docs/deploy.md). Not fixed-delay: there every
        # failed task of a pipelined region counts as an attempt, and a TaskManager running four
        # regions' tasks used 3 attempts up in 60 ms ("Recovery is suppressed by
        # FixedDelayRestartBackoffTimeStrategy(maxNumberRestartAttempts=3"); the exponential-delay
        # strategy counts the failures that arrive while the job is restarting as one (FLIP-364)
        "restart-strategy.type": "exponential-delay",
        "restart-strategy.exponential-delay.initial-backoff": "1 s",
        "restart-strategy.exponential-delay.max-backoff": "20 s",
        "restart-strategy.exponential-delay.backoff-multiplier": 2.0,
        "restart-strategy.exponential-delay.attempts-before-reset-backoff": 3,
        "restart-strategy.exponential-delay.jitter-factor": 0.0,
        "heartbeat.timeout": 20000,
        # a job restarted when no TaskManager is left (each exits when out of memory: TASKMANAGER_JVM_OPTS;
        # nothing starts them again on this cluster) waits this long for slots per attempt: Flink's 5
        # minutes made the batch job at 30 M impressions on 2.5 GB TaskManagers fail after 11 minutes
        "slot.request.timeout": 60000,
    }
    (conf / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in settings.items()))
    (conf / "log4j-console.properties").write_text(_LOG4J)


def _launcher(args, jar: Path) -> tuple[Path | None, str]:
    """With ``--runner-on-classpath``: Beam's runner on the Flink processes' own classpath and a job server
    that stages no jars with each job (java/StreamevalFlinkJobServer.java; docs/deploy.md, "Jobs without
    jars"): ``(the compiled launcher, "none")``; else ``(None, why the job server's classpath is staged)``
    and Beam's own driver runs. Opt-in: with Beam's runner in the TaskManagers' own class loader, its cache
    of SDK environments outlives a job's restart, and a job whose worker pool was killed hung after Flink
    restarted it (a CI trial of 2026-12-07)."""
    launcher, why = None, "the shaded job server jar or --job-server-jar"
    if not getattr(args, "runner_on_classpath", False):
        why = "the default; --runner-on-classpath stages none"
    elif not args.no_job_server and not args.job_server_jar and jar.is_dir():
        launcher, why = engines.job_server_launcher()
    return launcher, ("none" if launcher is not None else f"the job server's classpath, staged with each job ({why})")


def _runner_jars(folder: Path) -> list[str]:
    """Beam's Flink runner for the JobManager's and TaskManagers' classpath: the cached runner classpath
    (``folder``) without Flink's own jars and logging (the distribution's ``lib/`` has them), and Kafka's
    read, whose classes run on the TaskManagers when a job reads Kafka natively."""
    jars = [str(j) for j in sorted(folder.glob("*.jar")) if not j.name.startswith(("flink-", "log4j-"))]
    return jars + _kafka_read_jars()


def _bash_java_utils(home: Path, conf: Path, what: str) -> tuple[list[str], list[str]]:
    """Flink's BashJavaUtils (what Flink's scripts run): the JVM flags and ``-D`` options of a
    TaskManager (GET_TM_RESOURCE_PARAMS) or JobManager (GET_JM_RESOURCE_PARAMS)."""
    cp = f"{home / 'bin' / 'bash-java-utils.jar'}{os.pathsep}{home / 'lib'}/*"
    done = subprocess.run(["java", "-cp", cp, "org.apache.flink.runtime.util.bash.BashJavaUtils", what,
                           "--configDir", str(conf)], capture_output=True, text=True, timeout=120)
    results = [line.split("BASH_JAVA_UTILS_EXEC_RESULT:", 1)[1] for line in done.stdout.splitlines()
               if "BASH_JAVA_UTILS_EXEC_RESULT:" in line]
    if done.returncode != 0 or not results:
        raise ClusterError(f"Flink's BashJavaUtils {what} failed: {one_line(done.stderr or done.stdout)[-300:]}")
    jvm = results[0].split()
    dyn = results[1].split() if len(results) > 1 else []
    return jvm, dyn


def _up_flink(c: Cluster, logs: Path, state: Path, args) -> None:
    lacking = engines.missing(["flink"])
    jar = Path(args.job_server_jar) if args.job_server_jar else (engines.job_server_ready() or engines.job_server_jar())
    if not args.no_job_server and not jar.exists():
        if args.job_server_jar:
            raise ClusterError(f"--job-server-jar {jar}: no such file")
        lacking += engines.missing(["job_server"])
        lacking.append("or pass --job-server-jar JAR (Beam's Flink job server for Flink "
                       f"{engines.FLINK_MINOR}), or --no-job-server to start Flink and the worker pool only")
    if lacking:
        raise ClusterError("; ".join(lacking))
    home = engines.flink_home()
    conf = state / "flink-conf"
    rpc, rest = free_port(), free_port()
    _flink_config(conf, state, rpc, rest, args.slots, getattr(args, "taskmanager_memory", TASKMANAGER_MEMORY))
    launcher, c.job_jars = _launcher(args, jar)
    runner = _runner_jars(jar) if launcher is not None else []
    classpath = os.pathsep.join([f"{home / 'lib'}/*", *runner])
    log4j = f"-Dlog4j.configurationFile=file:{conf / 'log4j-console.properties'}"
    env = child_env()
    jm_jvm, jm_dyn = _bash_java_utils(home, conf, "GET_JM_RESOURCE_PARAMS")
    jm = spawn("jobmanager", ["java", *jm_jvm, *FLINK_JAVA17_OPTS, log4j, "-cp", classpath,
                               "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint",
                               "--configDir", conf, *jm_dyn], logs, env, state / "jobmanager")
    c.processes["jobmanager"] = jm
    c.web_ui = f"http://{HOST}:{rest}"
    c.ports.update(rpc=rpc, rest=rest)
    wait_ready("jobmanager", jm, lambda: listens(jm, rest) and http_json(f"{c.web_ui}/overview"))
    tm_jvm, tm_dyn = _bash_java_utils(home, conf, "GET_TM_RESOURCE_PARAMS")
    for i in range(1, args.taskmanagers + 1):
        name = f"taskmanager-{i}"
        c.processes[name] = spawn(name, ["java", *tm_jvm, *FLINK_JAVA17_OPTS, *TASKMANAGER_JVM_OPTS, log4j,
                                          "-cp", classpath,
                                          "org.apache.flink.runtime.taskexecutor.TaskManagerRunner",
                                          "--configDir", conf, *tm_dyn,
                                          "-D", f"taskmanager.resource-id={name}"], logs, env, state / name)

    def registered():
        for i in range(1, args.taskmanagers + 1):
            if not alive(c.processes[f"taskmanager-{i}"]):
                raise ClusterError(f"taskmanager-{i} exited while starting (log {c.processes[f'taskmanager-{i}'].log})")
        o = http_json(f"{c.web_ui}/overview")
        return o.get("taskmanagers") == args.taskmanagers and o.get("slots-total") == args.taskmanagers * args.slots

    wait_ready("the taskmanagers", jm, registered)
    pool = _start_pool(c, logs, state)
    flink = ["--flink_master", f"{HOST}:{rest}", "--flink_version", engines.FLINK_MINOR,
             "--environment_type", "EXTERNAL", "--environment_config", pool]
    if args.no_job_server:
        c.runner_args = ["--runner", "FlinkRunner", *flink]
        return
    job_port, artifact_port, expansion_port = free_port(), free_port(), free_port()
    if jar.is_dir():
        # the unshaded runner's classpath (engines.job_server_classpath), logging through Flink's log4j jars
        cp = os.pathsep.join([f"{jar}/*", *map(str, sorted((home / "lib").glob("log4j-*.jar"))), *_kafka_read_jars()])
        main = ([log4j, "-cp", cp, engines.JOB_SERVER_MAIN] if launcher is None
                else [log4j, "-cp", os.pathsep.join([cp, str(launcher)]), engines.JOB_SERVER_LAUNCHER])
    else:  # the shaded jar (its main class named, so that Kafka's read can join its classpath)
        main = ["-cp", os.pathsep.join([str(jar), *_kafka_read_jars()]), engines.JOB_SERVER_MAIN]
    js = spawn("job_server", ["java", *FLINK_JAVA17_OPTS, *main, "--flink-master", f"{HOST}:{rest}",
                               "--job-host", HOST,
                               "--job-port", job_port, "--artifact-port", artifact_port,
                               "--expansion-port", expansion_port, "--flink-conf-dir", conf,
                               "--artifacts-dir", state / "job_server" / "artifacts"],
                logs, env, state / "job_server")
    c.processes["job_server"] = js
    wait_ready("job_server", js, lambda: listens(js, job_port) and accepts(f"{HOST}:{job_port}"))
    c.ports.update(job=job_port)
    # --flink_master: the cluster the job server submits to (the same), and the stream job's sign that
    # it runs on Flink (its event timers: jobs/stream_args.py engine_options)
    c.runner_args = ["--runner", "PortableRunner", "--job_endpoint", f"{HOST}:{job_port}",
                     "--flink_master", f"{HOST}:{rest}", "--environment_type", "EXTERNAL", "--environment_config", pool]


# ------------------------------------------------------------------------------------------------
# state


def _state_path(state_dir) -> Path:
    return Path(state_dir) / STATE_FILE


def load(state_dir) -> Cluster:
    try:
        raw = json.loads(_state_path(state_dir).read_text())
    except FileNotFoundError:
        raise ClusterError(f"no cluster in {state_dir} ({STATE_FILE} not found)") from None
    except (OSError, ValueError) as e:
        raise ClusterError(f"{_state_path(state_dir)}: {one_line(e)}") from None
    c = Cluster(**raw)
    c.processes = {n: Proc(**p) for n, p in c.processes.items()}
    return c


def _save(c: Cluster) -> None:
    path = _state_path(c.state_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(c), indent=1) + "\n")
    tmp.replace(path)


def report(c: Cluster, liveness: bool = False) -> dict:
    """What ``up`` and ``status`` print."""
    if c.engine == "kafka":
        out = {"engine": c.engine, "bootstrap_servers": c.bootstrap_servers,
               **({"expansion_service": c.expansion_service} if c.expansion_service else {}),
               **({"flink_expansion_service": c.flink_expansion_service} if c.flink_expansion_service else {}),
               "processes": {n: p.pid for n, p in c.processes.items()}, "logs": c.logs}
    else:
        out = {"engine": c.engine, "runner_args": c.runner_args,
               "processes": {n: p.pid for n, p in c.processes.items()}, "web_ui": c.web_ui, "logs": c.logs}
        if c.job_jars:
            out["job_jars"] = c.job_jars
    if liveness:
        out["alive"] = {n: alive(p) for n, p in c.processes.items()}
        out["running"] = all(out["alive"].values()) and bool(out["alive"])
    return out


def up(engine: str, state_dir, args) -> Cluster:
    """Start the cluster (see the module docstring); on any failure stop what was started."""
    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(ClusterError):
        old = load(state)
        if any(alive(p) for p in old.processes.values()):
            raise ClusterError(f"{state} already has a running cluster ({', '.join(old.processes)}): "
                               "`streameval cluster down --state-dir` it first")
    logs = state / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    c = Cluster(engine, str(state), logs=str(logs))
    try:
        {"flink": _up_flink, "prism": _up_prism, "kafka": _up_kafka}[engine](c, logs, state, args)
    except BaseException:
        for p in reversed(list(c.processes.values())):
            stop(p, grace=5)
        c.processes = {}
        raise
    finally:
        if c.processes:
            _save(c)
    return c


def down(state_dir) -> list[str]:
    """Stop every process of the cluster in ``state_dir`` by its PID; the names still running after
    (none, normally)."""
    c = load(state_dir)
    for p in reversed(list(c.processes.values())):
        stop(p)
    left = [n for n, p in c.processes.items() if ours(p)]
    if not left:
        _state_path(state_dir).unlink(missing_ok=True)
    return left


def status(state_dir) -> dict:
    return report(load(state_dir), liveness=True)


# ------------------------------------------------------------------------------------------------
# command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streameval cluster", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True)
    f = sub.add_parser("fetch", help="fetch Flink's jars, Beam's Flink job server, Prism, Kafka and the dashboard's "
                                     "chart library into the cache ($STREAMEVAL_CACHE, else ~/.cache/streameval)")
    f.add_argument("engines", nargs="*", metavar="ENGINE",
                   help="flink, prism, kafka and/or dashboard (default all): flink needs Flink's jars and Beam's "
                        "Flink job server (and the Java expansion service), prism the Prism binary, kafka the broker's "
                        "classpath and Beam's Kafka IO (expansion service) classpath, dashboard uPlot (npm)")
    f.add_argument("--retry", action="store_true", help="ask again for parts a previous fetch could not have")
    u = sub.add_parser("up", help="start a local cluster; prints its runner_args as JSON")
    u.add_argument("engine", help="flink, prism or kafka")
    u.add_argument("--state-dir", required=True, help="folder for the cluster's state, config and logs")
    u.add_argument("--taskmanagers", type=int, default=2, help="Flink TaskManagers (default 2)")
    u.add_argument("--slots", type=int, default=2, help="task slots per TaskManager (default 2)")
    u.add_argument("--runner-on-classpath", action="store_true",
                   help="flink: Beam's runner on the Flink processes' classpath and a job server that stages no "
                        "jars with each job (faster; a killed worker pool can hang a restarted job: docs/deploy.md)")
    u.add_argument("--taskmanager-memory", default=TASKMANAGER_MEMORY,
                   help=f"each TaskManager's process memory, in Flink's units (default: sized per slot, "
                        f"{SLOT_HEAP_MB} MB of heap and {SLOT_DIRECT_MB} MB of direct memory each, for Beam's "
                        f"data plane: docs/deploy.md)")
    u.add_argument("--job-server-jar", default=None,
                   help="Beam's Flink job server jar, or a folder of the unshaded runner's jars (its classpath) "
                        "(default: the one `cluster fetch` cached)")
    u.add_argument("--no-job-server", action="store_true",
                   help="Flink: start no job server; runner_args then name FlinkRunner with --flink_master "
                        "(the SDK starts a job server itself: add --flink_job_server_jar)")
    u.add_argument("--expansion-service", action="store_true",
                   help="kafka: also start Beam's Java expansion service (Kafka IO) and a Java SDK worker pool")
    for name, text in (("status", "the cluster's processes and whether each is alive"),
                       ("args", "the cluster's runner_args as one shell-quoted line, for $(...)"),
                       ("down", "stop every process of the cluster by its PID")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--state-dir", required=True)
    return p


def _closest(word: str, choices) -> str:
    import difflib

    near = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {near[0]}?)" if near else ""


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.action == "fetch":
            bad = [e for e in args.engines if e not in FETCHABLE]
            if bad:
                print(f"streameval cluster fetch: unknown engine {bad[0]!r}{_closest(bad[0], FETCHABLE)}; "
                      f"choose from {', '.join(FETCHABLE)}", file=sys.stderr)
                return EXIT_USAGE
            wanted = tuple(p for e in (args.engines or FETCHABLE) for p in PARTS[e])
            parts = {n: p for n, p in engines.fetch(retry=args.retry, only=wanted).items() if n in wanted}
            print(json.dumps({"cache": str(engines.cache_dir()), "beam": engines.beam_version(),
                              "parts": {n: asdict(p) for n, p in parts.items()}}, indent=1))
            for p in parts.values():
                if not p.ok:
                    print(f"streameval cluster fetch: {p.name} {p.version}: {p.reason}", file=sys.stderr)
            return EXIT_OK if all(p.ok for p in parts.values()) else EXIT_FAILED
        if args.action == "up":
            if args.engine not in ENGINES:
                print(f"streameval cluster up: unknown engine {args.engine!r}{_closest(args.engine, ENGINES)}; "
                      f"choose one of {', '.join(ENGINES)}", file=sys.stderr)
                return EXIT_USAGE
            if args.taskmanagers < 1 or args.slots < 1:
                print("streameval cluster up: --taskmanagers and --slots must be at least 1", file=sys.stderr)
                return EXIT_USAGE
            print(json.dumps(report(up(args.engine, args.state_dir, args))))
            return EXIT_OK
        if args.action == "args":
            import shlex

            print(shlex.join(load(args.state_dir).runner_args))
            return EXIT_OK
        if args.action == "status":
            s = status(args.state_dir)
            print(json.dumps(s))
            return EXIT_OK if s["running"] else EXIT_FAILED
        left = down(args.state_dir)
        if left:
            print(f"streameval cluster down: still running: {', '.join(left)}", file=sys.stderr)
            return EXIT_FAILED
        return EXIT_OK
    except ClusterError as e:
        print(f"streameval cluster {args.action}: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE if args.action in ("status", "args", "down") and "no cluster in" in str(e) else EXIT_FAILED
