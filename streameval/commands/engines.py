"""The engines' parts, fetched once into a cache (``streameval cluster fetch``).

Everything comes from a package registry through its own client, never at run time:

* **Flink** 1.20.x (1.19.x under Beam before 2.72, whose Python SDK accepts 1.19 at most): the jars of Flink's distribution from PyPI's ``apache-flink-libraries`` source
  archive (``pip download --no-deps``; only its ``deps/lib`` and ``deps/bin/bash-java-utils.jar``
  are kept; PyFlink itself pins an older Beam and is never installed);
* **Beam's Flink job server** ``org.apache.beam:beam-runners-flink-1.20-job-server`` and the Java
  expansion service, from Maven Central (``mvn dependency:get``), at the installed Beam's version;
  when the shaded job server jar is not served, the unshaded runner ``beam-runners-flink-<minor>``
  with its runtime classpath (``mvn dependency:copy-dependencies``; served at 2.62.0), whose
  ``FlinkJobServerDriver`` is the same job server;
* **the job server's launcher** (not fetched: compiled): ``java/StreamevalFlinkJobServer.java``, Beam's
  ``FlinkJobServerDriver`` with a job invoker that stages no jars, compiled with ``javac`` against the
  runner classpath above (:func:`job_server_launcher`);
* **Prism** at the installed Beam's version: ``go install
  github.com/apache/beam/sdks/v2/go/cmd/prism@v<version>`` with GOPATH, GOMODCACHE and GOCACHE in
  the cache (the Go module proxy);
* **Apache Kafka**'s broker (KRaft mode) and its command-line tools: the runtime classpath of
  ``org.apache.kafka:kafka_2.13`` and ``kafka-tools`` at :data:`KAFKA_VERSION` from Maven Central
  (``mvn dependency:copy-dependencies`` on a generated pom), under ``kafka/<version>``;
* **Beam's Kafka IO for Python** (``kafka_io``): the shaded ``beam-sdks-java-io-expansion-service`` is
  not served at 2.62.0, so the runtime classpath of ``beam-sdks-java-expansion-service`` and
  ``beam-sdks-java-io-kafka`` at the installed Beam's version, without Confluent's schema-registry
  artifacts (their repository, packages.confluent.io, is not Maven Central), with ``kafka-clients``,
  ``jamm`` (the Java SDK harness needs it and declares it ``provided``) and ``slf4j-simple``. It runs
  both the expansion service and each Java SDK worker (``FnHarness``, one JVM per worker).
* **uPlot** (``uplot``), the chart library of ``streameval dashboard``: its npm package at
  :data:`UPLOT_VERSION` (``npm pack`` from the npm registry, which checks the tarball's integrity); only
  ``dist/uPlot.iife.min.js``, ``dist/uPlot.min.css`` and its ``LICENSE`` (MIT) are kept, under
  ``uplot/<version>``. The page loads them from the dashboard's own server, never from a CDN.

The cache is ``$STREAMEVAL_CACHE``, else ``~/.cache/streameval``. Each part lands in a folder of its
own version and is marked complete only once whole, so a second call finds it and returns in
seconds. A part that cannot be had is recorded in ``fetch.json`` with the reason (and tried again
only with ``--retry``); the engines that need it then refuse to start, saying which part is missing.
This module imports no Beam (it asks the installed distribution's metadata for Beam's version).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

__all__ = ["FLINK_VERSION", "FLINK_MINOR", "Part", "cache_dir", "beam_version", "flink_home", "prism_binary",
           "job_server_jar", "job_server_classpath", "job_server_launcher", "expansion_service_jar", "fetch", "status",
           "missing",
           "KAFKA_VERSION", "kafka_classpath", "kafka_io_classpath", "UPLOT_VERSION", "UPLOT_FILES", "uplot_dir"]


def _flink_for_beam() -> str:
    """The Flink release whose jars we run, for the installed Beam: Beam 2.72-2.77's Python SDK
    accepts --flink_version 1.17-1.20, 2.62's 1.17-1.19 (the versions between were not checked)."""
    try:
        major, minor = (int(x) for x in metadata.version("apache-beam").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return "1.20.3"
    return "1.19.3" if (major, minor) < (2, 72) else "1.20.3"


#: the Flink release whose jars we run (:func:`_flink_for_beam`)
FLINK_VERSION = _flink_for_beam()
FLINK_MINOR = FLINK_VERSION.rsplit(".", 1)[0]
#: the job server's main class, in the unshaded runner's jar
JOB_SERVER_MAIN = "org.apache.beam.runners.flink.FlinkJobServerDriver"
#: the same job server with a job invoker that stages no jars (``java/StreamevalFlinkJobServer.java``,
#: compiled into the cache by :func:`job_server_launcher`)
JOB_SERVER_LAUNCHER = "streameval.flink.StreamevalFlinkJobServer"
_LAUNCHER_SOURCE = Path(__file__).resolve().parent / "java" / "StreamevalFlinkJobServer.java"
PRISM_PACKAGE = "github.com/apache/beam/sdks/v2/go/cmd/prism"
#: Apache Kafka's broker (KRaft mode; Java 17 for 4.x brokers), from Maven Central
KAFKA_VERSION = "4.1.0"
#: the Kafka client inside Beam's Kafka IO classpath (Beam 2.62's io-kafka declares it ``provided``)
KAFKA_CLIENTS_FOR_BEAM = "3.9.1"
#: uPlot's npm version (the dashboard's charts) and the files kept of its package
UPLOT_VERSION = "1.6.32"
UPLOT_FILES = ("dist/uPlot.iife.min.js", "dist/uPlot.min.css", "LICENSE")
_COMPLETE = ".complete"


@dataclass
class Part:
    """One fetched part: ``ok`` with its ``path``, or not with the ``reason``."""

    name: str
    version: str
    ok: bool
    path: str = ""
    reason: str = ""
    seconds: float = 0.0


def cache_dir() -> Path:
    """``$STREAMEVAL_CACHE``, else ``~/.cache/streameval``."""
    env = os.environ.get("STREAMEVAL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "streameval"


def beam_version() -> str:
    """The installed apache-beam's version (its distribution metadata; Beam is not imported)."""
    return metadata.version("apache-beam")


def flink_home(root: Path | None = None) -> Path:
    """Where Flink's jars are: ``lib/*.jar`` and ``bin/bash-java-utils.jar``."""
    return (root or cache_dir()) / "flink" / FLINK_VERSION


def prism_binary(root: Path | None = None, version: str | None = None) -> Path:
    return (root or cache_dir()) / "prism" / (version or beam_version()) / "prism"


def _maven_jar(artifact: str, root: Path | None, version: str | None) -> Path:
    version = version or beam_version()
    return (root or cache_dir()) / "beam" / version / f"{artifact}-{version}.jar"


def job_server_jar(root: Path | None = None, version: str | None = None) -> Path:
    return _maven_jar(f"beam-runners-flink-{FLINK_MINOR}-job-server", root, version)


def job_server_classpath(root: Path | None = None, version: str | None = None) -> Path:
    """The folder of the unshaded runner's jars (``beam-runners-flink-<minor>`` and its runtime
    dependencies): the job server when no shaded jar is served (``java -cp 'DIR/*' JOB_SERVER_MAIN``)."""
    version = version or beam_version()
    return (root or cache_dir()) / "beam" / version / f"beam-runners-flink-{FLINK_MINOR}-classpath"


def job_server_ready(root: Path | None = None, version: str | None = None) -> Path | None:
    """The cached job server: the shaded jar, else the complete classpath folder, else None."""
    jar = job_server_jar(root, version)
    if jar.exists():
        return jar
    cp = job_server_classpath(root, version)
    return cp if (cp / _COMPLETE).exists() else None


def job_server_launcher(root: Path | None = None, version: str | None = None) -> tuple[Path | None, str]:
    """``(folder, "")``: the compiled :data:`JOB_SERVER_LAUNCHER` (``javac`` against the cached runner
    classpath, once per version of its source: ``beam/<version>/job-server-launcher-<hash>``), or
    ``(None, reason)`` when it cannot be had (no runner classpath, no ``javac``, or a Beam whose runner API
    it does not compile against); the cluster then starts Beam's own driver, which stages its jars with
    every job. Compiling is local: nothing is downloaded."""
    version = version or beam_version()
    runner = job_server_classpath(root, version)
    if not (runner / _COMPLETE).exists():
        return None, f"no unshaded runner classpath in the cache ({runner})"
    source = _LAUNCHER_SOURCE.read_bytes()
    folder = runner.parent / f"job-server-launcher-{hashlib.sha256(source).hexdigest()[:12]}"
    if (folder / _COMPLETE).exists():
        return folder, ""
    javac = shutil.which("javac")
    if not javac:
        return None, "no javac on PATH (a JDK compiles the job server's launcher)"
    with tempfile.TemporaryDirectory(dir=runner.parent, prefix="launcher-") as tmp:
        staging = Path(tmp) / "classes"
        done = subprocess.run([javac, "-nowarn", "-d", str(staging), "-cp", f"{runner}/*", str(_LAUNCHER_SOURCE)],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            return None, f"javac could not compile {_LAUNCHER_SOURCE.name}: {_tail(done.stderr, 2)[:300]}"
        _put_in_place(staging, folder)
    return folder, ""


def expansion_service_jar(root: Path | None = None, version: str | None = None) -> Path:
    return _maven_jar("beam-sdks-java-io-expansion-service", root, version)


def kafka_classpath(root: Path | None = None) -> Path:
    """The folder of the Kafka broker's and tools' jars (``java -cp 'DIR/*' kafka.Kafka ...``)."""
    return (root or cache_dir()) / "kafka" / KAFKA_VERSION


def kafka_io_classpath(root: Path | None = None, version: str | None = None) -> Path:
    """The folder of Beam's expansion service, its Kafka IO and the Java SDK harness (their runtime
    classpath): ``ExpansionService PORT`` and the Java workers (``FnHarness``) run from it."""
    return (root or cache_dir()) / "beam" / (version or beam_version()) / "kafka-io-classpath"


def uplot_dir(root: Path | None = None) -> Path:
    """The folder of uPlot's kept files (``uPlot.iife.min.js``, ``uPlot.min.css``, ``LICENSE``)."""
    return (root or cache_dir()) / "uplot" / UPLOT_VERSION


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())


def _fetch_flink(root: Path) -> Part:
    home = flink_home(root)
    if (home / _COMPLETE).exists():
        return Part("flink", FLINK_VERSION, True, str(home))
    if not shutil.which("java"):
        return Part("flink", FLINK_VERSION, False, reason="no java on PATH (Flink needs Java 11 or 17)")
    with tempfile.TemporaryDirectory(dir=root, prefix="flink-download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               f"apache-flink-libraries=={FLINK_VERSION}", "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        archives = list(Path(tmp).glob("apache-flink-libraries-*.tar.gz"))
        if done.returncode != 0 or not archives:
            return Part("flink", FLINK_VERSION, False,
                        reason=f"pip download apache-flink-libraries=={FLINK_VERSION} failed: "
                               f"{_tail(done.stderr or done.stdout)}")
        staging = Path(tmp) / "home"
        with tarfile.open(archives[0]) as tar:
            for member in tar:
                parts = Path(member.name).parts
                # apache-flink-libraries-X/deps/lib/... and deps/bin/bash-java-utils.jar only
                if len(parts) < 4 or parts[1] != "deps" or not member.isfile():
                    continue
                rel = Path(*parts[2:])
                if not (parts[2] == "lib" or rel == Path("bin", "bash-java-utils.jar")):
                    continue
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        if not list((staging / "lib").glob("flink-dist*.jar")):
            return Part("flink", FLINK_VERSION, False, reason="the archive has no deps/lib/flink-dist*.jar")
        _put_in_place(staging, home)
    return Part("flink", FLINK_VERSION, True, str(home))


def _put_in_place(staging: Path, target: Path) -> None:
    """Replace ``target`` by the whole ``staging`` folder and mark it complete (a part is found in the
    cache only once whole)."""
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(target)
    (target / _COMPLETE).touch()


def _fetch_maven(name: str, jar: Path, coordinates: str) -> Part:
    version = coordinates.rsplit(":", 1)[1]
    if jar.exists():
        return Part(name, version, True, str(jar))
    if not shutil.which("mvn"):
        return Part(name, version, False, reason="no mvn on PATH (Maven fetches Beam's Java artifacts)")
    jar.parent.mkdir(parents=True, exist_ok=True)
    # -U: a previous refusal cached in ~/.m2 is asked again (only on a cold or --retry call)
    cmd = ["mvn", "-B", "-U", "dependency:get", "-Dtransitive=false", f"-Dartifact={coordinates}",
           f"-Ddest={jar}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not jar.exists():
        with_reason = [line for line in done.stdout.splitlines() if "Could not" in line or "not found" in line
                       or "Couldn't download" in line]
        why = _tail(with_reason[0] if with_reason else done.stdout, 1)
        why = why.split("Couldn't download artifact: ", 1)[-1]
        return Part(name, version, False, reason=f"Maven could not resolve {coordinates}: {why[:300]}")
    return Part(name, version, True, str(jar))


_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>streameval</groupId><artifactId>flink-job-server</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.beam</groupId><artifactId>{artifact}</artifactId><version>{version}</version></dependency>
  </dependencies>
</project>
"""


def _fetch_job_server(root: Path, version: str) -> Part:
    """The shaded job server jar; when Maven Central does not serve it, the unshaded runner's
    runtime classpath (the same ``FlinkJobServerDriver``)."""
    shaded = _fetch_maven("job_server", job_server_jar(root, version),
                          f"org.apache.beam:beam-runners-flink-{FLINK_MINOR}-job-server:{version}")
    if shaded.ok:
        return shaded
    folder = job_server_classpath(root, version)
    if (folder / _COMPLETE).exists():
        job_server_launcher(root, version)
        return Part("job_server", version, True, str(folder))
    if not shutil.which("mvn"):
        return shaded
    artifact = f"beam-runners-flink-{FLINK_MINOR}"
    with tempfile.TemporaryDirectory(dir=root, prefix="job-server-") as tmp:
        (Path(tmp) / "pom.xml").write_text(_POM.format(artifact=artifact, version=version))
        staging = Path(tmp) / "lib"
        done = subprocess.run(["mvn", "-B", "-q", "dependency:copy-dependencies", f"-DoutputDirectory={staging}",
                               "-DincludeScope=runtime"], cwd=tmp, capture_output=True, text=True)
        if done.returncode != 0 or not list(staging.glob(f"{artifact}-{version}.jar")):
            why = [line for line in done.stdout.splitlines() if "Could not" in line or "not found" in line]
            return Part("job_server", version, False,
                        reason=f"{shaded.reason}; and the unshaded org.apache.beam:{artifact}:{version}'s runtime "
                               f"classpath could not be had: {_tail(why[0] if why else done.stdout, 1)[:300]}")
        _put_in_place(staging, folder)
    job_server_launcher(root, version)  # compiled now, so that `cluster up` finds it (or says why not)
    return Part("job_server", version, True, str(folder))


def _dependency(group: str, artifact: str, version: str, exclude: str = "") -> str:
    out = f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version>"
    if exclude:
        out += f"<exclusions><exclusion><groupId>{exclude}</groupId><artifactId>*</artifactId></exclusion></exclusions>"
    return out + "</dependency>"


def _fetch_classpath(name: str, version: str, folder: Path, dependencies: list[str], marker: str) -> Part:
    """The runtime classpath of ``dependencies`` (``mvn dependency:copy-dependencies`` on a generated
    pom) into ``folder``, complete once ``marker`` (a jar's name) is among them."""
    if (folder / _COMPLETE).exists():
        return Part(name, version, True, str(folder))
    if not shutil.which("mvn"):
        return Part(name, version, False, reason="no mvn on PATH (Maven fetches the Java artifacts)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    pom = ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
           f"<groupId>streameval</groupId><artifactId>{name}</artifactId><version>1</version>"
           f"<dependencies>{''.join(dependencies)}</dependencies></project>\n")
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f"{name}-") as tmp:
        (Path(tmp) / "pom.xml").write_text(pom)
        staging = Path(tmp) / "lib"
        done = subprocess.run(["mvn", "-B", "-q", "dependency:copy-dependencies", f"-DoutputDirectory={staging}",
                               "-DincludeScope=runtime"], cwd=tmp, capture_output=True, text=True)
        if done.returncode != 0 or not (staging / marker).exists():
            why = [line for line in done.stdout.splitlines() if "Could not" in line or "not found" in line]
            return Part(name, version, False, reason=f"Maven could not resolve the classpath of {name}: "
                                                     f"{_tail(why[0] if why else done.stdout, 1)[:300]}")
        _put_in_place(staging, folder)
    return Part(name, version, True, str(folder))


def _fetch_kafka(root: Path) -> Part:
    deps = [_dependency("org.apache.kafka", a, KAFKA_VERSION) for a in ("kafka_2.13", "kafka-tools")]
    deps.append(_dependency("org.slf4j", "slf4j-simple", "1.7.36"))  # the broker's log (else SLF4J's NOP)
    return _fetch_classpath("kafka", KAFKA_VERSION, kafka_classpath(root), deps, f"kafka_2.13-{KAFKA_VERSION}.jar")


def _fetch_kafka_io(root: Path, version: str) -> Part:
    deps = [_dependency("org.apache.beam", "beam-sdks-java-expansion-service", version),
            # io-kafka's Confluent schema-registry dependencies live on packages.confluent.io, not Maven Central
            _dependency("org.apache.beam", "beam-sdks-java-io-kafka", version, exclude="io.confluent"),
            _dependency("org.apache.kafka", "kafka-clients", KAFKA_CLIENTS_FOR_BEAM),
            _dependency("com.github.jbellis", "jamm", "0.4.0"),
            _dependency("org.slf4j", "slf4j-simple", "1.7.36")]
    return _fetch_classpath("kafka_io", version, kafka_io_classpath(root, version), deps,
                            f"beam-sdks-java-io-kafka-{version}.jar")


def _fetch_prism(root: Path, version: str) -> Part:
    binary = prism_binary(root, version)
    if binary.exists():
        return Part("prism", version, True, str(binary))
    if not shutil.which("go"):
        return Part("prism", version, False, reason="no go on PATH (Prism is built with go install)")
    go = root / "go"
    env = dict(os.environ, GOPATH=str(go), GOMODCACHE=str(go / "mod"), GOCACHE=str(go / "cache"),
               GOBIN=str(binary.parent), GOFLAGS="-modcacherw", GOTOOLCHAIN="local", CGO_ENABLED="0")
    done = subprocess.run(["go", "install", f"{PRISM_PACKAGE}@v{version}"], capture_output=True, text=True, env=env)
    if done.returncode != 0 or not binary.exists():
        return Part("prism", version, False,
                    reason=f"go install {PRISM_PACKAGE}@v{version} failed: {_tail(done.stderr or done.stdout)}")
    # the binary is all we run: the module and build caches (1.5 GB) go
    shutil.rmtree(go, ignore_errors=True)
    return Part("prism", version, True, str(binary))


def _fetch_uplot(root: Path) -> Part:
    folder = uplot_dir(root)
    if (folder / _COMPLETE).exists():
        return Part("uplot", UPLOT_VERSION, True, str(folder))
    npm = shutil.which("npm")
    if not npm:
        return Part("uplot", UPLOT_VERSION, False, reason="no npm on PATH (uPlot comes from the npm registry)")
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        done = subprocess.run([npm, "pack", f"uplot@{UPLOT_VERSION}", "--pack-destination", tmp, "--silent"],
                              capture_output=True, text=True, cwd=tmp)
        tarballs = list(Path(tmp).glob("uplot-*.tgz"))
        if done.returncode != 0 or len(tarballs) != 1:
            return Part("uplot", UPLOT_VERSION, False,
                        reason=f"npm pack uplot@{UPLOT_VERSION} failed: {_tail(done.stderr or done.stdout)}")
        staging = Path(tmp) / "staging"
        staging.mkdir()
        with tarfile.open(tarballs[0]) as tar:
            for name in UPLOT_FILES:
                member = tar.extractfile(f"package/{name}")
                if member is None:
                    return Part("uplot", UPLOT_VERSION, False, reason=f"uplot {UPLOT_VERSION}'s package has no {name}")
                (staging / Path(name).name).write_bytes(member.read())
        _put_in_place(staging, folder)
    return Part("uplot", UPLOT_VERSION, True, str(folder))


def _record_path(root: Path) -> Path:
    return root / "fetch.json"


def status(root: Path | None = None) -> dict[str, Part]:
    """The parts as the last fetch left them (``fetch.json``), by name."""
    try:
        raw = json.loads(_record_path(root or cache_dir()).read_text())
    except (OSError, ValueError):
        return {}
    return {name: Part(**p) for name, p in raw.get("parts", {}).items()}


def fetch(root: Path | None = None, retry: bool = False, only: tuple[str, ...] = ()) -> dict[str, Part]:
    """Fetch what is missing (see the module docstring) and record the outcome; a part recorded as
    unavailable for this version is asked again only with ``retry``. ``only``: these parts' names."""
    root = root or cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    version = beam_version()
    before = status(root)
    jobs = {
        "flink": lambda: _fetch_flink(root),
        "job_server": lambda: _fetch_job_server(root, version),
        "expansion_service": lambda: _fetch_maven("expansion_service", expansion_service_jar(root, version),
                                                  f"org.apache.beam:beam-sdks-java-io-expansion-service:{version}"),
        "prism": lambda: _fetch_prism(root, version),
        "kafka": lambda: _fetch_kafka(root),
        "kafka_io": lambda: _fetch_kafka_io(root, version),
        "uplot": lambda: _fetch_uplot(root),
    }
    parts = {}
    for name, job in jobs.items():
        if only and name not in only:
            if name in before:
                parts[name] = before[name]
            continue
        old = before.get(name)
        expected = {"flink": FLINK_VERSION, "kafka": KAFKA_VERSION, "uplot": UPLOT_VERSION}.get(name, version)
        if old is not None and not old.ok and old.version == expected and not retry:
            parts[name] = old  # refused before: not asked again on a warm call
            continue
        start = time.monotonic()
        part = job()
        part.seconds = round(time.monotonic() - start, 2)
        parts[name] = part
    _record_path(root).write_text(json.dumps(
        {"beam": version, "flink": FLINK_VERSION, "parts": {n: asdict(p) for n, p in parts.items()}}, indent=1) + "\n")
    return parts


def missing(names, root: Path | None = None) -> list[str]:
    """One line for each of ``names`` that is not in the cache: what is missing and why."""
    root = root or cache_dir()
    version = beam_version()
    where = {"flink": flink_home(root) / _COMPLETE, "prism": prism_binary(root, version),
             "job_server": job_server_jar(root, version), "expansion_service": expansion_service_jar(root, version),
             "kafka": kafka_classpath(root) / _COMPLETE, "kafka_io": kafka_io_classpath(root, version) / _COMPLETE,
             "uplot": uplot_dir(root) / _COMPLETE}
    known = status(root)
    lines = []
    for name in names:
        if where[name].exists() or (name == "job_server" and job_server_ready(root, version)):
            continue
        if name in known and not known[name].ok:
            lines.append(f"{name} is not in the cache ({where[name]}): `streameval cluster fetch` could not have "
                         f"it: {known[name].reason}")
        else:
            lines.append(f"{name} is not in the cache ({where[name]}): run `streameval cluster fetch`")
    return lines
