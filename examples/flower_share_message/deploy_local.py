"""Run this app on Flower's deployment engine on one machine: a SuperLink and N SuperNodes,
each its own process, TLS between them, sharefl's signed mode on top.

    python examples/flower_share_message/deploy_local.py --supernodes 20

What it does, in order (every step as Flower 1.42 documents it, on loopback):

1. ``sharefl keygen --clients N --hosts 127.0.0.1,localhost`` into the work folder: a
   throwaway CA, the SuperLink's TLS certificate for 127.0.0.1/localhost, and one Ed25519
   identity per client with the directory {client id → public key} (signed mode).
2. ``flower-superlink --ssl-ca-certfile ca.pem --ssl-certfile server.pem --ssl-keyfile
   server.key --host 127.0.0.1 --port P`` (Fleet, Control and Runtime APIs over HTTPS on
   one port; ServerApps run in a subprocess, in this environment:
   ``--disable-runtime-dependency-installation``).
3. N × ``flower-supernode --root-certificates ca.pem --superlink 127.0.0.1:P --port Q_i
   --node-config "partition-id=i num-partitions=N sharefl-identity='client-i.identity'
   sharefl-directory='directory.json' sharefl-state-dir='state-i'"`` (Q_i: the SuperNode's
   own Runtime API, loopback; the state directory keeps the client's memory of rounds),
   then waits until ``flwr supernode list`` shows all N online.
4. A SuperLink connection in a private ``FLWR_HOME`` (``address``, ``root-certificates``:
   the CA) and ``flwr run APP deploy-local --stream``, where APP is a copy of this example
   whose components are ``flower_share_message.signed_app`` and whose run config names the
   server's copy of the directory (``--unsigned``: the example as it is).
5. Reads the streamed log: the run fails loudly (exit 1 and the reason) on an ``Exit
   Code:`` line, a missing final accuracy, or a run that does not finish within
   ``--timeout`` (``flwr run`` itself exits 0 whatever happens).
6. Reports, from ``/proc/PID/status`` sampled every ``--sample`` seconds, each SuperNode's
   peak memory (VmHWM of the SuperNode, of its SuperExec and of the largest of the
   ClientApp processes Flower starts for it — one per message — and the peak of their
   summed RSS), and the same for the SuperLink and its ServerApp.
7. Stops every process it started (SuperNodes, SuperLink, and the SuperExec, ServerApp and
   ClientApp processes under them), also on Ctrl-C, SIGTERM or an error: each process it
   starts leads a process group of its own, and it signals those groups (SIGTERM, then
   SIGKILL after 10 s) and nothing else — never a process chosen by its command line, so
   a wrapper around it (``timeout``, ``sh -c``) or another user's process naming the same
   port or folder is left alone. (A SIGKILL gives it no chance to: then stop each group
   by hand, ``kill -- -PGID``.)
8. Without ``--work`` it works in a new temporary folder (keys included) and removes it at
   exit — unless the deployment or the run failed: then it keeps the folder for its logs
   and prints its path (remove it when done).

Exit status: 0 the run finished with its accuracy, 1 the run failed (the reason is printed
last), 2 the deployment did not come up, 130 interrupted. ``--json FILE`` writes the
summary (accuracy, round times, memory) as one JSON object.

Flower's deployment engine runs every message a SuperNode receives in a fresh
``flwr-clientapp`` process, which must report back within 30 s of being launched (else the
SuperNode launches another one). sharefl's round is 5–6 messages per client, so one
machine needs roughly N × (a Python start with flwr, numpy and sharefl) of CPU per stage;
see docs/deployment.md ("On Flower's deployment engine") for the figures measured here.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

APP = Path(__file__).resolve().parent
CONNECTION = "deploy-local"
SIGNED_COMPONENTS = {
    "serverapp": "flower_share_message.signed_app:serverapp",
    "clientapp": "flower_share_message.signed_app:clientapp",
}
DIRECTORY_KEY = "sharefl-directory"
FINAL_ACCURACY = r"(\d+): \{'accuracy': '([0-9.e+-]+)'"
ROUND_MARK = re.compile(r"\[ROUND (\d+)/(\d+)\]")
FINISHED_MARK = "Strategy execution finished"
RELAUNCH_MARK = "Runtime task-token authentication failed"
HEARTBEAT_ENDPOINT = "send-task-heartbeat"
"""A task's heartbeat may reach the SuperNode just after the task finished and its token
was revoked: Flower logs the same authentication error then, but nothing is relaunched."""


def relaunches(log: str) -> int:
    """ClientApp processes a SuperNode's ``log`` shows taken back and launched again: the
    task-token refusals other than those of a late heartbeat."""
    return sum(
        RELAUNCH_MARK in line and HEARTBEAT_ENDPOINT not in line for line in log.splitlines()
    )


class DeploymentError(RuntimeError):
    """The deployment did not come up (a process exited, a port never opened, the
    SuperNodes did not all register): exit status 2."""


class RunFailed(RuntimeError):
    """The run failed or did not finish: exit status 1."""


class Interrupted(BaseException):
    """SIGTERM (SIGINT raises ``KeyboardInterrupt``): exit status 130."""


# ---- processes and memory -----------------------------------------------------------------


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (KiB) of ``pid``; empty when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            key, value = line.split(":", 1)
            out[key] = int(value.split()[0])
    return out


@dataclass(frozen=True)
class Proc:
    """One line of ``/proc/PID/stat``: what identifies a process and its place."""

    pid: int
    ppid: int
    pgid: int
    state: str
    """``Z``: a zombie (exited, not yet waited for)."""
    start: int
    """Its start time (clock ticks after boot): ``(pid, start)`` names one process for
    good, where a pid alone may be reused."""


def _processes() -> dict[int, Proc]:
    """Every process now, by pid (read from ``/proc/PID/stat``; never its command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        pid = int(entry.name)
        found[pid] = Proc(pid, int(fields[1]), int(fields[2]), fields[0], int(fields[19]))
    return found


def _children(procs: dict[int, Proc] | None = None) -> dict[int, list[int]]:
    """ppid → pids of every process now (or in ``procs``)."""
    tree: dict[int, list[int]] = {}
    for proc in (procs if procs is not None else _processes()).values():
        tree.setdefault(proc.ppid, []).append(proc.pid)
    return tree


def _descendants(pid: int, tree: dict[int, list[int]]) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _role(cmdline: str) -> str:
    for role in ("flwr-clientapp", "flwr-serverapp", "flower-superexec"):
        if role in cmdline:
            return role
    return "other"


@dataclass
class TreeMemory:
    """Peak memory of one process and the processes under it (MiB)."""

    main_hwm_mb: float = 0.0
    superexec_hwm_mb: float = 0.0
    app_hwm_mb: float = 0.0
    """The largest VmHWM among its app processes (``flwr-clientapp`` / ``flwr-serverapp``)."""
    app_processes: int = 0
    """App processes seen (sampling misses those that live shorter than one period)."""
    peak_total_rss_mb: float = 0.0
    """The largest sum of VmRSS over the whole tree at one sample."""
    _seen: set[int] = field(default_factory=set, repr=False)

    def sample(self, pid: int, tree: dict[int, list[int]], executor: int | None = None) -> None:
        """One sample of ``pid``'s tree; ``executor``: a warm executor's pid (not a child
        of the SuperNode; it runs the ClientApps itself), counted as its SuperExec."""
        total = 0
        main = _status(pid)
        if main:
            self.main_hwm_mb = max(self.main_hwm_mb, main.get("VmHWM", 0) / 1024)
            total += main.get("VmRSS", 0)
        others = _descendants(pid, tree)
        if executor is not None:
            others = [executor, *others, *_descendants(executor, tree)]
        for child in others:
            status = _status(child)
            if not status:
                continue
            total += status.get("VmRSS", 0)
            role = "flower-superexec" if child == executor else _role(_cmdline(child))
            hwm = status.get("VmHWM", 0) / 1024
            if role == "flower-superexec":
                self.superexec_hwm_mb = max(self.superexec_hwm_mb, hwm)
            elif role in ("flwr-clientapp", "flwr-serverapp"):
                self.app_hwm_mb = max(self.app_hwm_mb, hwm)
                if child not in self._seen:
                    self._seen.add(child)
                    self.app_processes += 1
        self.peak_total_rss_mb = max(self.peak_total_rss_mb, total / 1024)

    def report(self) -> dict[str, float | int]:
        return {k: round(v, 1) for k, v in asdict(self).items() if not k.startswith("_")}


class MemoryMonitor:
    """Samples the SuperLink's and each SuperNode's process tree in a thread."""

    def __init__(
        self,
        superlink: int,
        supernodes: Sequence[int],
        period: float,
        executors: Sequence[int | None] | None = None,
        shared: int | None = None,
    ) -> None:
        self.superlink = superlink
        self.shared = shared
        self.shared_memory = TreeMemory()
        self.supernodes = list(supernodes)
        self.executors = list(executors) if executors else [None] * len(supernodes)
        self.period = period
        self.server = TreeMemory()
        self.nodes = [TreeMemory() for _ in supernodes]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> MemoryMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            tree = _children()
            self.server.sample(self.superlink, tree)
            for pid, executor, memory in zip(
                self.supernodes, self.executors, self.nodes, strict=True
            ):
                memory.sample(pid, tree, executor)
            if self.shared is not None:
                self.shared_memory.sample(self.shared, tree)
            self._stop.wait(self.period)


# ---- the deployment -----------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def exit_status(process: subprocess.Popen) -> int | None:
    """``process``'s exit status (minus the signal that ended it), or None while it runs.
    Unlike ``Popen.poll`` it does not reap the process: until :meth:`Deployment.stop`
    waits for it, its pid — the id of the process group it leads — cannot be reused, so
    signalling that group can only reach processes of ours."""
    if process.returncode is not None:
        return process.returncode
    flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
    try:
        info = os.waitid(os.P_PID, process.pid, flags)
    except ChildProcessError:  # already waited for
        return process.poll()
    if info is None:
        return None
    return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status


def wait_for_port(port: int, process: subprocess.Popen, timeout: float) -> None:
    """Return once 127.0.0.1:``port`` accepts connections; raises
    :class:`DeploymentError` when ``process`` exits or ``timeout`` s pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = exit_status(process)
        if status is not None:
            raise DeploymentError(f"the SuperLink exited with status {status}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise DeploymentError(f"the SuperLink did not listen on 127.0.0.1:{port} in {timeout:.0f} s")


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


@dataclass
class Deployment:
    """The processes of one local deployment, and how to stop them — and only them.

    Each process it starts leads a process group of its own (a new session), which the
    processes it starts in turn inherit (a SuperNode's SuperExec and ClientApps, even
    those that outlive their parent). Flower starts the SuperLink's SuperExec in a new
    session of its own: that group is found under the SuperLink (by parent pid) and
    remembered by (pid, start time). Stopping signals these groups and nothing else: no
    process is ever chosen by its command line."""

    work: Path
    env: dict[str, str]
    ports: list[int]
    processes: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    _found: dict[int, int] = field(default_factory=dict, repr=False)
    """Groups led by processes under ours: leader pid → its start time."""

    def start(self, name: str, command: list[str]) -> subprocess.Popen:
        """Start ``command`` in a process group of its own, its output to
        ``logs/NAME.log`` under the work folder."""
        log = self.work / "logs" / f"{name}.log"
        log.parent.mkdir(exist_ok=True)
        with log.open("wb") as out:
            process = subprocess.Popen(
                command,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.work,
                start_new_session=True,
            )
        self.processes.append(process)
        self.logs.append(log)
        return process

    def groups(self, procs: dict[int, Proc]) -> set[int]:
        """The process groups that are ours: one per started process, and those led by a
        process under one of them (found now or before, and still the same process)."""
        tree = _children(procs)
        for process in self.processes:
            for pid in _descendants(process.pid, tree):
                proc = procs[pid]
                if proc.pgid == pid:
                    self._found.setdefault(pid, proc.start)
        for leader, start in list(self._found.items()):
            if leader in procs and procs[leader].start != start:
                del self._found[leader]  # gone, and its pid now names another process
        return {p.pid for p in self.processes} | set(self._found)

    def alive(self) -> list[int]:
        """The pids of our process groups' members that have not exited."""
        procs = _processes()
        ours = self.groups(procs)
        return sorted(p.pid for p in procs.values() if p.pgid in ours and p.state != "Z")

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every process group of ours."""
        for pgid in self.groups(_processes()):
            _signal_group(pgid, signum)

    def stop(self, grace: float = 10.0) -> list[int]:
        """SIGTERM our process groups, SIGKILL them when members are left after
        ``grace`` s, then wait for the processes it started; returns the pids of our
        groups still alive after that (none, unless the kernel refuses)."""
        self.signal(signal.SIGTERM)
        if not self._gone_within(grace):
            self.signal(signal.SIGKILL)
            self._gone_within(5.0)
        left = self.alive()
        for process in self.processes:
            if exit_status(process) is not None:
                process.wait()
        self.processes.clear()  # waited for: their pids may name other processes now
        self._found.clear()
        return left

    def _gone_within(self, seconds: float) -> bool:
        """Whether every member of our groups exits within ``seconds``."""
        deadline = time.monotonic() + seconds
        while self.alive():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True


def stage_app(work: Path, directory: Path, signed: bool, serverapp: Path | None = None) -> Path:
    """A copy of this example to run: with ``signed``, its components are the signed ones
    and its run config names the server's directory; with ``serverapp`` (a Python file
    defining ``serverapp``, a ``ServerApp``), that file joins the package and is the app's
    server component."""
    import tomllib

    import tomli_w  # flwr's own dependency

    target = work / "app"
    shutil.copytree(
        APP,
        target,
        ignore=shutil.ignore_patterns(
            "__pycache__", "deploy_local.py", "warm_superexec.py", "*.md"
        ),
    )
    pyproject = target / "pyproject.toml"
    data = tomllib.loads(pyproject.read_text())
    app = data["tool"]["flwr"]["app"]
    if signed:
        app["components"] = dict(SIGNED_COMPONENTS)
        app["config"][DIRECTORY_KEY] = str(directory)
    if serverapp is not None:
        module = f"sharefl_custom_{serverapp.stem}"
        shutil.copyfile(serverapp, target / "flower_share_message" / f"{module}.py")
        app["components"]["serverapp"] = f"flower_share_message.{module}:serverapp"
    pyproject.write_text(tomli_w.dumps(data))
    return target


def write_connection(home: Path, port: int, ca: Path) -> None:
    """The SuperLink connection ``flwr`` uses (``$FLWR_HOME/config.toml``)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        "[superlink]\n"
        f'default = "{CONNECTION}"\n\n'
        f"[superlink.{CONNECTION}]\n"
        f'address = "127.0.0.1:{port}"\n'
        f'root-certificates = "{ca}"\n'
    )


def online_supernodes(flwr: str, env: dict[str, str]) -> int:
    """SuperNodes the SuperLink lists as online (0 when ``flwr`` does not answer in
    120 s: a loaded machine)."""
    try:
        done = subprocess.run(
            [flwr, "supernode", "list", CONNECTION, "--format", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        nodes = json.loads(done.stdout).get("nodes", [])
    except (subprocess.TimeoutExpired, json.JSONDecodeError):
        return 0
    return sum(node.get("status") == "online" for node in nodes)


@dataclass
class RunLog:
    """The streamed log of ``flwr run``, with each line's arrival time."""

    lines: list[tuple[float, str]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(line for _, line in self.lines)

    def run_id(self) -> str | None:
        match = re.search(r"Successfully started run (\d+)", self.text)
        return match.group(1) if match else None

    def round_seconds(self) -> list[float]:
        """Each round's wall time as the log shows it: from its ``[ROUND k/R]`` line to
        the next one (the last: to ``Strategy execution finished``)."""
        marks = [t for t, line in self.lines if ROUND_MARK.search(line)]
        end = [t for t, line in self.lines if FINISHED_MARK in line]
        marks += end[:1]
        return [round(b - a, 2) for a, b in itertools.pairwise(marks)]

    def final_accuracy(self, rounds: int) -> float | None:
        found = {int(r): float(a) for r, a in re.findall(FINAL_ACCURACY, self.text)}
        return found.get(rounds)


def stream(command: list[str], env: dict[str, str], timeout: float, echo: bool) -> RunLog:
    """Run ``command``, keeping (and with ``echo`` printing) its output line by line;
    raises :class:`RunFailed` when it runs past ``timeout`` s."""
    log = RunLog()
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        process.kill()

    timer = threading.Timer(timeout, expire)
    timer.start()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            log.lines.append((time.monotonic(), line))
            if echo:
                print(line, end="", flush=True)
        process.wait()
    finally:
        timer.cancel()
        if process.poll() is None:
            process.kill()
    if expired.is_set():
        raise RunFailed(f"the run did not finish within {timeout:.0f} s")
    return log


@dataclass(frozen=True)
class Options:
    supernodes: int
    rounds: int | None
    signed: bool
    timeout: float
    startup_timeout: float
    sample: float
    work: Path | None
    echo: bool
    run_config: tuple[str, ...]
    json: Path | None = None
    executor: str = "flower"
    """``"flower"``: Flower's SuperExec (a ``flwr-clientapp`` process per message);
    ``"warm"``: ``--isolation process`` and one ``warm_superexec.py`` per SuperNode;
    ``"shared"``: ``--isolation process`` and one ``warm_superexec.py`` for all."""
    serverapp: Path | None = None
    """A Python file whose ``serverapp`` replaces the app's ServerApp (``--serverapp``)."""


def flower_env(work: Path) -> dict[str, str]:
    """The environment of every Flower process of a deployment under ``work``: its own
    FLWR_HOME, the app run in this Python environment (no dependency installation), no
    telemetry or update check, one torch thread per process."""
    bin_dir = Path(sys.executable).parent
    return {
        **os.environ,
        "FLWR_HOME": str(work / "flwr-home"),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "OMP_NUM_THREADS": "1",
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def deploy(options: Options, work: Path) -> dict:
    """Run the deployment in the folder ``work`` (it exists); returns the summary.
    Raises :class:`DeploymentError`, :class:`RunFailed`, ``KeyboardInterrupt`` and
    :class:`Interrupted`; stops every process it started before returning or raising."""
    from sharefl.deploy.keygen import keygen

    n = options.supernodes
    work = work.resolve()
    bin_dir = Path(sys.executable).parent
    flwr = str(bin_dir / "flwr")
    env = flower_env(work)
    keys = keygen(work / "keys", range(n), hosts=("127.0.0.1", "localhost"))
    ports = free_ports(n + 1)
    link_port, node_ports = ports[0], ports[1:]
    write_connection(work / "flwr-home", link_port, keys / "ca.pem")
    app = stage_app(work, keys / "directory.json", options.signed, options.serverapp)
    deployment = Deployment(work, env, ports)
    summary: dict = {
        "supernodes": n,
        "signed": options.signed,
        "tls": True,
        "executor": options.executor,
        "ports": ports,
        "work": str(work),
        "ok": False,
    }
    try:
        started = time.monotonic()
        superlink = deployment.start(
            "superlink",
            [
                str(bin_dir / "flower-superlink"),
                "--ssl-ca-certfile",
                str(keys / "ca.pem"),
                "--ssl-certfile",
                str(keys / "server.pem"),
                "--ssl-keyfile",
                str(keys / "server.key"),
                "--host",
                "127.0.0.1",
                "--port",
                str(link_port),
                "--disable-runtime-dependency-installation",
            ],
        )
        wait_for_port(link_port, superlink, options.startup_timeout)
        supernodes, executors = [], []
        for i, port in enumerate(node_ports):
            node_config = f"partition-id={i} num-partitions={n}"
            if options.signed:
                node_config += (
                    f" sharefl-identity='{keys / f'client-{i}.identity'}'"
                    f" sharefl-directory='{keys / 'directory.json'}'"
                    f" sharefl-state-dir='{keys / f'state-{i}'}'"
                )
            supernodes.append(
                deployment.start(
                    f"supernode-{i}",
                    [
                        str(bin_dir / "flower-supernode"),
                        "--root-certificates",
                        str(keys / "ca.pem"),
                        "--superlink",
                        f"127.0.0.1:{link_port}",
                        "--port",
                        str(port),
                        "--node-config",
                        node_config,
                        *(["--isolation", "process"] if options.executor != "flower" else []),
                    ],
                )
            )
            if options.executor == "warm":
                executors.append(
                    deployment.start(
                        f"executor-{i}",
                        [
                            sys.executable,
                            str(APP / "warm_superexec.py"),
                            "--runtime-api-address",
                            f"127.0.0.1:{port}",
                            "--parent-pid",
                            str(supernodes[-1].pid),
                            "--poll",
                            "0.2",
                        ],
                    ).pid
                )
        shared = None
        if options.executor == "shared":
            addresses = [
                a for port in node_ports for a in ("--runtime-api-address", f"127.0.0.1:{port}")
            ]
            shared = deployment.start(
                "executor-shared",
                [
                    sys.executable,
                    str(APP / "warm_superexec.py"),
                    *addresses,
                    "--parent-pid",
                    str(os.getpid()),
                ],
            )
        with MemoryMonitor(
            superlink.pid,
            [p.pid for p in supernodes],
            options.sample,
            executors,
            shared and shared.pid,
        ) as memory:
            deadline = time.monotonic() + options.startup_timeout
            online = 0
            while online < n:
                dead = [i for i, p in enumerate(supernodes) if exit_status(p) is not None]
                if dead or exit_status(superlink) is not None:
                    raise DeploymentError(
                        f"SuperNodes {dead} exited (logs in {work / 'logs'})"
                        if dead
                        else f"the SuperLink exited (log: {work / 'logs' / 'superlink.log'})"
                    )
                if time.monotonic() > deadline:
                    raise DeploymentError(
                        f"{online} of {n} SuperNodes online after "
                        f"{options.startup_timeout:.0f} s (logs in {work / 'logs'})"
                    )
                time.sleep(2)
                online = online_supernodes(flwr, env)
            summary["startup_s"] = round(time.monotonic() - started, 1)
            command = [flwr, "run", str(app), CONNECTION, "--stream"]
            run_config = list(options.run_config)
            if options.rounds is not None:
                run_config.append(f"num-server-rounds={options.rounds}")
            if run_config:
                command += ["--run-config", " ".join(run_config)]
            run_started = time.monotonic()
            try:
                log = stream(command, env, options.timeout, options.echo)
            finally:
                summary["run_s"] = round(time.monotonic() - run_started, 1)
        (work / "logs" / "run.log").write_text(log.text)
        rounds = options.rounds or _configured_rounds(app)
        summary.update(
            run_id=log.run_id(),
            rounds=rounds,
            round_s=log.round_seconds(),
            accuracy=log.final_accuracy(rounds),
            clientapp_relaunches=sum(
                relaunches(path.read_text(errors="replace")) for path in deployment.logs
            ),
            memory={
                "superlink": memory.server.report(),
                "supernodes": [m.report() for m in memory.nodes],
                "shared_executor": memory.shared_memory.report() if shared else None,
            },
        )
        _check(log, summary)
        summary["ok"] = True
        return summary
    finally:
        left = deployment.stop()
        summary["left_running"] = left
        if left:
            print(f"deploy_local: processes still running: {left}", file=sys.stderr)


def _configured_rounds(app: Path) -> int:
    import tomllib

    config = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    return int(config["num-server-rounds"])


def _check(log: RunLog, summary: dict) -> None:
    """Raise :class:`RunFailed` with the reason when the log shows a failed run."""
    text = log.text
    if "Exit Code:" in text:
        tail = text[text.index("Exit Code:") - 2000 :]
        raise RunFailed(f"the run failed:\n{tail}")
    if summary["accuracy"] is None:
        raise RunFailed(
            f"the log has no accuracy after round {summary['rounds']} (the run did not "
            f"finish); its end:\n{text[-3000:]}"
        )


def memory_table(summary: dict) -> str:
    memory = summary["memory"]
    nodes = memory["supernodes"]

    def spread(key: str) -> str:
        values = sorted(node[key] for node in nodes)
        return f"{values[0]:.0f}–{values[-1]:.0f} (median {values[len(values) // 2]:.0f})"

    link = memory["superlink"]
    return "\n".join(
        [
            f"SuperNodes ({len(nodes)}), peak MiB per SuperNode:",
            f"  flower-supernode VmHWM      {spread('main_hwm_mb')}",
            f"  its SuperExec VmHWM         {spread('superexec_hwm_mb')}",
            f"  largest ClientApp VmHWM     {spread('app_hwm_mb')}",
            f"  peak summed RSS of the tree {spread('peak_total_rss_mb')}",
            "SuperLink, peak MiB:",
            f"  flower-superlink VmHWM      {link['main_hwm_mb']:.0f}",
            f"  its SuperExec VmHWM         {link['superexec_hwm_mb']:.0f}",
            f"  ServerApp VmHWM             {link['app_hwm_mb']:.0f}",
            f"  peak summed RSS of the tree {link['peak_total_rss_mb']:.0f}",
            *(
                [f"Shared executor, peak MiB:   {memory['shared_executor']['main_hwm_mb']:.0f}"]
                if memory.get("shared_executor")
                else []
            ),
        ]
    )


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog=Path(__file__).name,
        description=" ".join(__doc__.split("\n\n")[0].split()),
        epilog="Exit status: 0 the run finished with its accuracy, 1 the run failed, 2 the "
        "deployment did not come up (or a bad option), 130 interrupted. It stops exactly the "
        "processes it started. See the module's docstring for every step.",
    )
    parser.add_argument("--supernodes", "-n", type=int, default=20, help="N (at least 10)")
    parser.add_argument(
        "--rounds", type=int, default=None, help="num-server-rounds (default: the app's)"
    )
    parser.add_argument(
        "--unsigned", action="store_true", help="the example as it is (no signed mode)"
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for the run")
    parser.add_argument(
        "--startup-timeout", type=float, default=600, help="seconds for the SuperNodes to register"
    )
    parser.add_argument("--sample", type=float, default=0.25, help="memory sampling period, s")
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="work folder, kept (default: a temporary folder, removed at exit unless the run "
        "failed)",
    )
    parser.add_argument("--run-config", action="append", default=[], help="more run config")
    parser.add_argument("--quiet", action="store_true", help="do not echo the run's log")
    parser.add_argument("--json", type=Path, default=None, help="write the summary here")
    parser.add_argument(
        "--executor",
        choices=("flower", "warm", "shared"),
        default="flower",
        help="flower: Flower's SuperExec, a ClientApp process per message; warm: "
        "--isolation process and warm_superexec.py, one long-lived executor per SuperNode; "
        "shared: one warm_superexec.py serving every SuperNode",
    )
    parser.add_argument(
        "--serverapp",
        type=Path,
        default=None,
        help="a Python file defining `serverapp` (a ServerApp) to run instead of the "
        "example's, e.g. your own strategy; it may import the example's modules "
        "(flower_share_message.*)",
    )
    args = parser.parse_args(argv)
    if args.serverapp is not None and not args.serverapp.is_file():
        parser.error(f"--serverapp {args.serverapp}: no such file")
    if args.supernodes < 10:
        parser.error("the app needs at least 10 SuperNodes (its median tolerates 1 of 3 clusters)")
    options = Options(
        supernodes=args.supernodes,
        rounds=args.rounds,
        signed=not args.unsigned,
        timeout=args.timeout,
        startup_timeout=args.startup_timeout,
        sample=args.sample,
        work=args.work,
        echo=not args.quiet,
        run_config=tuple(args.run_config),
        json=args.json,
        executor=args.executor,
        serverapp=args.serverapp and args.serverapp.resolve(),
    )
    return options


@contextlib.contextmanager
def work_folder(given: Path | None) -> Iterator[Path]:
    """``given`` (``--work``: created if missing, always kept), or a new temporary folder
    that is removed on leaving — unless :class:`DeploymentError` or :class:`RunFailed`
    leaves: then it is kept for its logs, and its path (it holds throwaway keys) printed."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    work = Path(tempfile.mkdtemp(prefix="sharefl-flwr-deploy-"))
    try:
        yield work
    except (DeploymentError, RunFailed):
        print(f"deploy_local: logs (and throwaway keys) kept in {work}", file=sys.stderr)
        raise
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    def handler(signum, frame):
        raise Interrupted

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    json_path = options.json
    summary: dict = {}
    status = 0
    try:
        with sigterm_interrupts(), work_folder(options.work) as work:
            summary = deploy(options, work)
    except DeploymentError as exc:
        print(f"deploy_local: the deployment did not come up: {exc}", file=sys.stderr)
        summary, status = {"ok": False, "error": str(exc)}, 2
    except RunFailed as exc:
        print(f"deploy_local: {exc}", file=sys.stderr)
        summary, status = {"ok": False, "error": str(exc)[:4000]}, 1
    except (KeyboardInterrupt, Interrupted):
        print("deploy_local: interrupted; every process it started is stopped", file=sys.stderr)
        summary, status = {"ok": False, "error": "interrupted"}, 130
    if status == 0:
        print(memory_table(summary))
        print(
            f"deploy_local: OK — {summary['supernodes']} SuperNodes, "
            f"{'signed' if summary['signed'] else 'unsigned'}, TLS; accuracy after round "
            f"{summary['rounds']}: {summary['accuracy']:.4f}; rounds {summary['round_s']} s; "
            f"run {summary['run_s']} s"
        )
    if json_path is not None:
        json_path.write_text(json.dumps(summary, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
