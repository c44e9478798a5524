"""A stage's waiting policy (sharefl.integrations.collect): the clock restarts with every
reply, so a hung client costs ``idle`` seconds, while a slow start or an actor pool serving
clients one after the other loses nobody. Checked on a simulated clock against an
independent oracle: the clients whose replies come before the first gap the policy ends
the stage at."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("flwr")

from conftest import examples
from flwr.app import ConfigRecord, Message, RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st

from sharefl.integrations.collect import ReplyDeadlines, send_and_collect
from sharefl.protocol.errors import ConfigurationError

pytestmark = pytest.mark.usefixtures("flower_task_identity")

POLL = 0.01


class ScriptedGrid:
    """A grid whose node ``i`` replies ``arrival[i]`` seconds after the push (``inf``: never),
    on a simulated clock that only ``sleep`` advances."""

    pull_interval = POLL

    def __init__(self, arrival: list[float]) -> None:
        self.arrival = arrival
        self.now = 0.0
        self.sent: dict[str, Message] = {}

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += max(seconds, 1e-9)

    def push_messages(self, messages):
        ids = []
        for i, msg in enumerate(messages):
            msg.metadata.__dict__["_message_id"] = str(i)  # what the SuperLink assigns
            self.sent[str(i)] = msg
            ids.append(str(i))
        return ids

    def pull_messages(self, message_ids):
        out = []
        for mid in sorted(message_ids, key=int):
            if self.arrival[int(mid)] <= self.now:
                reply = Message(
                    RecordDict({"n": ConfigRecord({"i": int(mid)})}), reply_to=self.sent[mid]
                )
                out.append(reply)
        return out


def collect(arrival: list[float], deadlines: ReplyDeadlines) -> tuple[list[int], float]:
    grid = ScriptedGrid(arrival)
    messages = [
        Message(RecordDict(), dst_node_id=i + 1, message_type="train") for i in range(len(arrival))
    ]
    replies = send_and_collect(grid, messages, deadlines, clock=grid.clock, sleep=grid.sleep)
    return [int(r.content["n"]["i"]) for r in replies], grid.now


def test_every_reply_is_collected_in_the_order_it_came():
    got, now = collect([0.3, 0.1, 0.2], ReplyDeadlines(idle=1.0, first=1.0))
    assert got == [1, 2, 0]
    assert now == pytest.approx(0.3, abs=2 * POLL)


def test_a_hung_client_costs_the_idle_time_once():
    got, now = collect([1.0, 2.0, math.inf, 3.0], ReplyDeadlines(idle=5.0, first=60.0))
    assert got == [0, 1, 3]
    assert now == pytest.approx(3.0 + 5.0, abs=2 * POLL)


def test_steady_progress_is_never_cut_short():
    """An actor pool serving 20 clients two at a time, 4 s each: the last reply comes 40 s
    after the send, far beyond the idle time; everybody counts."""
    arrival = [4.0 * (1 + i // 2) for i in range(20)]
    got, _ = collect(arrival, ReplyDeadlines(idle=5.0, first=60.0))
    assert sorted(got) == list(range(20))


def test_a_slow_start_counts_nobody_out():
    got, _ = collect([50.0, 50.5, 51.0], ReplyDeadlines(idle=5.0, first=60.0))
    assert got == [0, 1, 2]


def test_nobody_answering_ends_at_the_first_reply_deadline():
    got, now = collect([math.inf] * 3, ReplyDeadlines(idle=5.0, first=60.0))
    assert got == []
    assert now == pytest.approx(60.0, abs=2 * POLL)


def test_an_old_style_absolute_timeout_would_have_lost_the_slow_start():
    """The failure this policy replaces: ``send_and_receive(timeout=30)`` counts every
    client of a 50-second first start as a drop-out; the idle clock loses none."""
    arrival = [50.0 + i for i in range(5)]
    assert [t for t in arrival if t <= 30.0] == []
    got, _ = collect(arrival, ReplyDeadlines(idle=30.0, first=120.0))
    assert got == list(range(5))


@pytest.mark.parametrize(
    "kwargs", [{"idle": 0}, {"idle": -1.0}, {"first": math.inf}, {"first": math.nan}, {"idle": "5"}]
)
def test_bad_deadlines_are_named(kwargs):
    with pytest.raises(ConfigurationError, match="timeout"):
        ReplyDeadlines(**kwargs)


def oracle(arrival: list[float], idle: float | None, first: float | None) -> set[int]:
    """The clients a waiting policy keeps: walk the replies in time order; the first must
    come within ``first``, each next one within ``idle`` of the one before."""
    kept: set[int] = set()
    last = None
    for t, i in sorted((t, i) for i, t in enumerate(arrival)):
        limit, since = (first, 0.0) if last is None else (idle, last)
        if math.isinf(t) or (limit is not None and t - since > limit):
            break
        kept.add(i)
        last = t
    return kept


gap = st.floats(0.0, 20.0).map(lambda x: round(x, 1))  # times on a 0.1 s grid


@settings(max_examples=examples(200), deadline=None)
@given(
    arrival=st.lists(st.one_of(gap, st.just(math.inf)), min_size=1, max_size=12),
    idle=st.one_of(st.none(), st.sampled_from([0.55, 2.05, 5.05])),
    first=st.one_of(st.none(), st.sampled_from([1.05, 10.05])),
)
def test_the_collected_replies_are_the_oracles(arrival, idle, first):
    """Deadlines sit off the 0.1 s grid of arrival times by more than a polling interval,
    so the polling granularity cannot decide a case; with no limit at all and a client
    that never answers the stage would wait forever, which the search skips."""
    if idle is None and math.inf in arrival and any(not math.isinf(t) for t in arrival):
        return
    if first is None and all(math.isinf(t) for t in arrival):
        return
    got, _ = collect(arrival, ReplyDeadlines(idle=idle, first=first))
    assert set(got) == oracle(arrival, idle, first)
    assert len(got) == len(set(got))


class CountingGrid(ScriptedGrid):
    pull_interval = 0.1  # Flower's in-memory grid

    def __init__(self, arrival: list[float]) -> None:
        super().__init__(arrival)
        self.pulls = 0

    def pull_messages(self, message_ids):
        self.pulls += 1
        return super().pull_messages(message_ids)


def test_a_quick_reply_is_pulled_within_its_latency_and_a_long_wait_polls_at_the_grids_rate():
    """Pulls start 2 ms after the send and after each reply, doubling up to the grid's
    ``pull_interval``: replies 5 and 7 ms after the send are in by 8 ms, not 100 ms later;
    waiting 10 s for the last costs the grid's 100 pulls plus the few short ones."""
    grid = CountingGrid([0.005, 0.007, 10.0])
    messages = [Message(RecordDict(), dst_node_id=i + 1, message_type="train") for i in range(3)]
    deadlines = ReplyDeadlines(idle=60.0, first=60.0)
    quick = CountingGrid([0.005, 0.007])
    send_and_collect(quick, messages[:2], deadlines, clock=quick.clock, sleep=quick.sleep)
    assert quick.now <= 0.008 + 1e-9
    replies = send_and_collect(grid, messages, deadlines, clock=grid.clock, sleep=grid.sleep)
    assert len(replies) == 3
    assert grid.now == pytest.approx(10.0, abs=0.1)
    assert grid.pulls <= 10.0 / 0.1 + 2 * math.ceil(math.log2(0.1 / 0.002)) + 2
