"""A long-lived ClientApp executor for one SuperNode started with ``--isolation process``:
it runs each of the SuperNode's ClientApp tasks in this process, instead of a fresh
``flwr-clientapp`` process per message (what ``flower-superexec`` does).

    flower-supernode ... --isolation process --port Q
    python warm_superexec.py --runtime-api-address 127.0.0.1:Q --parent-pid SUPERNODE_PID

Given several ``--runtime-api-address`` it serves those SuperNodes in turn from one process
(a pool for many SuperNodes on one machine: one Python's memory instead of N; their tasks
run one at a time).

Why: Flower 1.42's SuperExec launches one ``flwr-clientapp`` process per message, and the
SuperNode takes the task back when that process has not pulled its input within 30 s of
being launched (``HEARTBEAT_DEFAULT_INTERVAL``), launching another. A process start with
flwr, numpy and sharefl costs about 4 CPU-seconds, so N SuperNodes on c cores need
about 4N/c seconds per protocol stage: past 30 s (N ≈ 15 on two idle cores, fewer on a
loaded machine) every launch is taken back before it reports and the round never ends.
This executor pays the start once per SuperNode. It does what ``flwr-clientapp`` does,
with the same Runtime API calls, in the same order: acquire a task (its token), pull the
task input (message, context, run, FAB) — which activates the task at once — install the
FAB and load its ClientApp (once per FAB), call it, push the reply and the context.

It uses Flower's internal Runtime API client (``flwr.supercore``, ``flwr.supernode``), so
it is tied to flwr 1.42 (the example's pinned version); the SuperNode's Runtime API stays on
loopback, without TLS, as Flower's own SuperExec does by default.
"""

from __future__ import annotations

import argparse
import logging
import time

from flwr.app import Context, Message
from flwr.app.error import Error
from flwr.cli.install import install_from_fab
from flwr.clientapp.client_app import ClientApp
from flwr.clientapp.utils import get_load_client_app_fn
from flwr.common.constant import ErrorCode, SubStatus
from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
from flwr.supercore.app_utils import start_parent_process_monitor
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
from flwr.supercore.interceptors import (
    RuntimeTokenHttpInterceptor,
    RuntimeVersionHttpInterceptor,
)
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supernode.runtime.run_clientapp import (
    pull_task_input,
    push_message,
    push_task_output,
)

log = logging.getLogger("warm_superexec")


def _client(address: str, *interceptors) -> RuntimeHttpClient:
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,
        root_certificates=None,
        interceptors=list(interceptors),
        retry_invoker=make_simple_http_retry_invoker(),
    )


class WarmExecutor:
    """Runs the ClientApp tasks of the SuperNode whose Runtime API is ``address``."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.apps: dict[str, ClientApp] = {}
        self.load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
        self.tasks = 0

    def run_task(self, token: str) -> None:
        """One task, as ``flwr-clientapp`` runs it; an exception of the ClientApp becomes
        an error reply (``CLIENT_APP_RAISED_EXCEPTION``), as there."""
        client = _client(
            self.address,
            RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
            RuntimeTokenHttpInterceptor(token),
        )
        heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
        heartbeat.start()
        message: Message | None = None
        context: Context | None = None
        reply: Message | None = None
        status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
        try:
            message, context, run, fab = pull_task_input(client)
            app = self.apps.get(fab.hash_str)
            if app is None:
                install_from_fab(fab.content, skip_prompt=True)
                app = self.load(run.fab_id, run.fab_version, fab.hash_str)
                self.apps[fab.hash_str] = app
            reply = app(message=message, context=context)
            status, details = SubStatus.COMPLETED, ""
        except Exception as exc:  # reported to the server, as flwr-clientapp does
            log.exception("the ClientApp raised an exception")
            details = f"{type(exc)}:<'{exc}'>"
            if message is not None:
                error = Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details)
                reply = Message(error, reply_to=message)
        finally:
            try:
                if reply is not None and context is not None:
                    push_message(client, reply, context)
                push_task_output(client=client, context=context, sub_status=status, details=details)
            finally:
                heartbeat.stop()
                client.close()
                self.tasks += 1


def serve(executors: list[WarmExecutor], poll: float) -> None:
    """Serve several SuperNodes in turn: each pass asks every one for a task and runs it;
    a pass that found none sleeps ``poll`` s."""
    controls = [
        _client(e.address, RuntimeVersionHttpInterceptor(component_name="SuperExec"))
        for e in executors
    ]
    request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
    while True:
        ran = False
        for executor, control in zip(executors, controls, strict=True):
            acquired = control.AcquireTask(request)
            if acquired.HasField("task") and acquired.token:
                executor.run_task(acquired.token)
                ran = True
        if not ran:
            time.sleep(poll)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--runtime-api-address",
        required=True,
        action="append",
        help="a SuperNode's host:port (repeat to serve several from this process)",
    )
    parser.add_argument("--parent-pid", type=int, default=None, help="exit when it exits")
    parser.add_argument("--poll", type=float, default=0.2, help="seconds between task polls")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per Runtime API call
    if args.parent_pid is not None:
        start_parent_process_monitor(args.parent_pid)
    executors = [WarmExecutor(address) for address in args.runtime_api_address]
    apps: dict[str, ClientApp] = {}
    for executor in executors:
        executor.apps = apps  # one FAB, loaded once for all
    serve(executors, args.poll)


if __name__ == "__main__":
    main()
